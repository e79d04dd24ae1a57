package policy

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestKVAwareStatsByPosition checks the per-position memory of endpoint
// stats (epStat) against a policy that looks every candidate up afresh:
// the same decisions while candidates keep their order, change it, come
// and go, get a new Endpoint with an old ID, and gain stats.
func TestKVAwareStatsByPosition(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	got, err := NewKVAware(nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := NewKVAware(nil, 3)
	fleet := make([]*kvroute.Endpoint, 12)
	for i := range fleet {
		fleet[i] = &kvroute.Endpoint{ID: "ep" + strconv.Itoa(i)}
	}
	order := r.Perm(len(fleet))[:8]
	var open []*kvroute.Request
	now := epoch
	for step := range 3000 {
		switch r.IntN(10) {
		case 0:
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		case 1:
			order = r.Perm(len(fleet))[:4+r.IntN(len(fleet)-4)]
		case 2:
			i := r.IntN(len(fleet)) // same ID, new Endpoint
			fleet[i] = &kvroute.Endpoint{ID: fleet[i].ID}
		}
		req, cands := randomState(r, len(order), true)
		req.ID = strconv.Itoa(step)
		for i, e := range order {
			cands[i].Endpoint = fleet[e]
		}
		want.byPos = nil
		dw := cloneDecision(want.Pick(now, req, cands))
		dg := cloneDecision(got.Pick(now, req, cands))
		if !reflect.DeepEqual(dg, dw) {
			t.Fatalf("step %d: got %+v, want %+v", step, dg, dw)
		}
		if dg.Index >= 0 {
			open = append(open, req)
		}
		for len(open) > 0 && r.IntN(3) != 0 {
			i := r.IntN(len(open))
			q, ep := open[i], ""
			if r.IntN(2) == 0 {
				got.FirstToken(now, q, ep)
				want.FirstToken(now, q, ep)
			} else {
				got.Release(now, q, ep)
				want.Release(now, q, ep)
				open = append(open[:i], open[i+1:]...)
			}
		}
		now = now.Add(time.Duration(r.IntN(20)) * time.Millisecond)
	}
	if len(got.eps) < len(fleet)/2 {
		t.Fatalf("stats for %d endpoints, want most of %d: the test did not exercise them", len(got.eps), len(fleet))
	}
}

// TestKVAwareRecycleScores checks the trade of explanation buffers
// (router.ScoreRecycler): the buffers handed over back the last decision's
// Scores, the next Pick explains itself in the buffers it was given, and
// the handed-over explanation is left as it was.
func TestKVAwareRecycleScores(t *testing.T) {
	k, err := NewKVAware(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 3))
	req, cands := randomState(r, 16, true)
	d1 := k.Pick(epoch, req, cands)
	spareScores, spareParts := make([]kvroute.Score, 16), make([]kvroute.Part, 16*kvAwareParts)
	s1, p1 := k.RecycleScores(spareScores, spareParts)
	if len(d1.Scores) == 0 || &s1[:1][0] != &d1.Scores[0] {
		t.Fatal("the buffers handed over do not back the decision's scores")
	}
	if sc := d1.Scores[0]; len(sc.Parts) > 0 && &p1[:1][0] != &sc.Parts[0] {
		t.Fatal("the parts handed over do not back the decision's parts")
	}
	want := cloneDecision(d1)
	req2, cands2 := randomState(r, 16, true)
	d2 := k.Pick(epoch, req2, cands2)
	if &d2.Scores[0] != &spareScores[0] || &d2.Scores[0].Parts[:1][0] != &spareParts[0] {
		t.Fatal("the next Pick did not explain itself in the buffers it was given")
	}
	if got := cloneDecision(d1); !reflect.DeepEqual(got, want) {
		t.Fatalf("the handed-over explanation changed: got %+v, want %+v", got.Scores, want.Scores)
	}
}

// TestKVAwareAveragesReachZero: a long run of fully cached requests decays
// the uncached-size averages to exactly zero, not to a denormal (where
// x0.95 rounds back to the same value and all arithmetic with it is slow).
func TestKVAwareAveragesReachZero(t *testing.T) {
	k, err := NewKVAware(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	req := &kvroute.Request{ID: "r"} // each record replaces the last (a retry)
	for range 20000 {
		k.record(epoch, req, 1, "ep0", &candState{credit: 4096}, 4096)
	}
	if k.meanUncached != 0 || k.uncachedFrac != 0 {
		t.Errorf("after 20,000 fully cached requests: mean uncached %g, uncached share %g; want 0", k.meanUncached, k.uncachedFrac)
	}
}

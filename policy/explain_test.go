package policy

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestKVAwareDeferredExplanation: with DeferExplanations, Pick decides as
// before and leaves Scores nil, and Explain renders from KeepExplanation's
// state exactly the Scores an explaining Pick returns, also for decisions
// whose state was kept while later Picks ran on recycled storage (a ring
// of 3, as the router's decision log keeps them). The decisions cover
// session targets, queue and KV caps, the in-flight bound, shedding and
// unhealthy candidates.
func TestKVAwareDeferredExplanation(t *testing.T) {
	for _, overload := range []string{OverloadLeastLoaded, OverloadShed} {
		t.Run(overload, func(t *testing.T) {
			p := DefaultKVAwareParams()
			p.Overload = overload
			p.QueueCap = 6
			eager, err := NewKVAwareWith(p, 7)
			if err != nil {
				t.Fatal(err)
			}
			lazy, _ := NewKVAwareWith(p, 7)
			lazy.DeferExplanations()
			type kept struct {
				state  any
				cands  []kvroute.Candidate
				want   []kvroute.Score
				reason string // the eager decision's
				own    string // the deferred decision's
			}
			// The reason Explain renders: the eager one, or "" when the
			// deferred decision's own is whole (it chose no endpoint).
			wantRendered := func(k *kept) string {
				if k.reason == k.own {
					return ""
				}
				return k.reason
			}
			var ring [3]kept
			r := rand.New(rand.NewPCG(3, 4))
			req, cands := benchState()
			sessions, shed, chosen := 0, 0, 0
			for step := range 400 {
				for i := range cands {
					l := &cands[i].Load
					l.Waiting, l.InFlight, l.KVUsage = r.IntN(8), r.IntN(12), r.Float64()
					cands[i].Healthy = r.IntN(20) != 0
					if step%7 == 3 {
						l.Waiting = p.QueueCap + r.IntN(3) // all over the queue cap
					}
					if step%97 == 13 {
						cands[i].Healthy = false // none healthy
					}
				}
				req.ID = strconv.Itoa(step)
				req.SessionKey = ""
				if step%3 == 0 {
					req.SessionKey = "s" + strconv.Itoa(step%11)
				}
				want := eager.Pick(epoch, req, cands)
				got := lazy.Pick(epoch, req, cands)
				if got.Scores != nil {
					t.Fatalf("step %d: deferred Pick set %d scores, want none", step, len(got.Scores))
				}
				// A deferred decision that chose an endpoint names how in its
				// Reason and leaves the figures after it to Explain.
				if want.Index >= 0 {
					if got.Reason == want.Reason || !strings.HasPrefix(want.Reason, got.Reason+": ") {
						t.Fatalf("step %d: deferred reason %q, want the head of %q", step, got.Reason, want.Reason)
					}
					chosen++
				}
				if wantScores, wantReason := want.Scores, want.Reason; true {
					want.Scores, want.Reason = nil, got.Reason
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("step %d: deferred decision\n%+v\nwant\n%+v", step, got, want)
					}
					want.Scores, want.Reason = wantScores, wantReason
				}
				if want.Shed {
					shed++
				}
				if strings.HasPrefix(want.Reason, "session") {
					sessions++
				}
				k := &ring[step%len(ring)]
				if k.state != nil { // about to be recycled: still intact?
					if s, r := lazy.Explain(k.state, k.cands); !reflect.DeepEqual(s, k.want) || r != wantRendered(k) {
						t.Fatalf("step %d: kept explanation of step %d changed", step, step-len(ring))
					}
				}
				k.state = lazy.KeepExplanation(k.state)
				k.cands = append(k.cands[:0], cands...)
				k.want, k.reason, k.own = deepScores(want.Scores), want.Reason, got.Reason
				if s, r := lazy.Explain(k.state, k.cands); !reflect.DeepEqual(s, k.want) || r != wantRendered(k) {
					t.Fatalf("step %d: rendered\n%+v\nreason %q\nwant\n%+v\nreason %q", step, s, r, k.want, wantRendered(k))
				}
				for _, pk := range []interface {
					FirstToken(time.Time, *kvroute.Request, string)
					Release(time.Time, *kvroute.Request, string)
				}{eager, lazy} {
					if step%2 == 0 {
						pk.FirstToken(epoch, req, "")
						pk.Release(epoch, req, "")
					}
				}
			}
			if sessions == 0 || chosen == 0 || overload == OverloadShed && shed == 0 {
				t.Fatalf("got %d session decisions, %d that chose an endpoint and %d sheds: the test misses a case", sessions, chosen, shed)
			}
		})
	}
}

// deepScores copies scores and their parts out of a policy's reused buffers.
func deepScores(scores []kvroute.Score) []kvroute.Score {
	if scores == nil {
		return nil
	}
	out := make([]kvroute.Score, len(scores))
	for i, s := range scores {
		if s.Parts != nil {
			s.Parts = append([]kvroute.Part{}, s.Parts...)
		}
		out[i] = s
	}
	return out
}

// TestKVAwareShedExplanation: a shed decision chooses no endpoint, and its
// explanation says so: no candidate eligible, each capped and the request
// shed (it used to call every candidate eligible, "affinity kept", as a
// least-loaded decision over the same fleet does). The explanation of the
// deferred decision (the router's decision log) is the same.
func TestKVAwareShedExplanation(t *testing.T) {
	for _, overload := range []string{OverloadShed, OverloadQueue, OverloadLeastLoaded} {
		t.Run(overload, func(t *testing.T) {
			p := DefaultKVAwareParams()
			p.Overload, p.QueueCap = overload, 4
			eager, _ := NewKVAwareWith(p, 1)
			lazy, _ := NewKVAwareWith(p, 1)
			lazy.DeferExplanations()
			req, cands := benchState()
			for i := range cands {
				cands[i].Healthy = true
				cands[i].Load.Waiting = p.QueueCap
			}
			d := eager.Pick(epoch, req, cands)
			lazy.Pick(epoch, req, cands)
			rendered, _ := lazy.Explain(lazy.KeepExplanation(nil), cands)
			if shed := overload != OverloadLeastLoaded; d.Shed != shed || (d.Index >= 0) == shed {
				t.Fatalf("decision %+v: want shed %v", d, shed)
			}
			for _, scores := range [][]kvroute.Score{d.Scores, rendered} {
				if len(scores) != len(cands) {
					t.Fatalf("%d scores for %d candidates", len(scores), len(cands))
				}
				for i, s := range scores {
					if d.Shed && (s.Eligible || !strings.Contains(s.Why, "request shed")) {
						t.Fatalf("shed decision: candidate %d eligible %v, why %q; want not eligible, capped, request shed", i, s.Eligible, s.Why)
					}
					if !d.Shed && (!s.Eligible || !strings.Contains(s.Why, "affinity kept")) {
						t.Fatalf("least-loaded decision: candidate %d eligible %v, why %q; want eligible, affinity kept", i, s.Eligible, s.Why)
					}
				}
			}
		})
	}
}

// TestKVAwareOverloadedReason: with every candidate over its queue cap and
// overload least-loaded, kv-aware picks as it does under the caps (here the
// one candidate caching the prompt, though it is not the least loaded), and
// its reason says how, after "overloaded, " (it read "overloaded, least
// loaded" whatever the pick was).
func TestKVAwareOverloadedReason(t *testing.T) {
	p := DefaultKVAwareParams()
	p.QueueCap = 4
	k, _ := NewKVAwareWith(p, 1)
	l := kvroute.Load{Waiting: p.QueueCap, Running: 8}
	req := &kvroute.Request{PromptTokens: 8192, BlockHashes: make([]uint64, 128)}
	cands := []kvroute.Candidate{cand("a", l, 0, 0), cand("b", l, 128, 8192), cand("c", l, 0, 0)}
	cands[1].Load.Waiting++ // the most loaded
	d := k.Pick(epoch, req, cands)
	if d.Index != 1 {
		t.Fatalf("chose %d (%s), want 1: the cached prompt", d.Index, d.Reason)
	}
	if !strings.HasPrefix(d.Reason, "overloaded, affinity") {
		t.Errorf("reason %q, want it to start with \"overloaded, affinity\"", d.Reason)
	}
}

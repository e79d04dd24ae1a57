package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

// weighted returns healthy, idle candidates e0, e1, ... of the given weights.
func weighted(ws ...int) []kvroute.Candidate {
	cands := make([]kvroute.Candidate, len(ws))
	for i, w := range ws {
		cands[i] = kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: "e" + strconv.Itoa(i), Weight: w}, Healthy: true}
	}
	return cands
}

// TestRoundRobinWeighted: smooth weighted round robin gives each candidate
// exactly its share of the weights in every cycle of their sum, spread
// out (nginx's order), skips unhealthy candidates, and starts again when
// the candidates change.
func TestRoundRobinWeighted(t *testing.T) {
	p, _ := New(NameRoundRobin, nil, 1)
	cands := weighted(1, 2, 1)
	var got []int
	for range 400 {
		d := p.Pick(epoch, nil, cands)
		got = append(got, d.Index)
	}
	want := []int{1, 0, 2, 1}
	for i, g := range got {
		if g != want[i%4] {
			t.Fatalf("pick %d: got e%d, want e%d (picks %v...)", i, g, want[i%4], got[:8])
		}
	}

	// Weights 5:1:1, nginx's own example: a a b a c a a.
	p, _ = New(NameRoundRobin, nil, 1)
	cands = weighted(5, 1, 1)
	var seq strings.Builder
	for range 7 {
		seq.WriteByte(byte('a' + p.Pick(epoch, nil, cands).Index))
	}
	if seq.String() != "aabacaa" {
		t.Errorf("5:1:1: got %s, want aabacaa", seq.String())
	}

	// An unhealthy candidate is skipped and its weight not counted.
	cands = weighted(1, 2, 1)
	cands[1].Healthy = false
	counts := make([]int, 3)
	for range 100 {
		counts[p.Pick(epoch, nil, cands).Index]++
	}
	if counts[0] != 50 || counts[1] != 0 || counts[2] != 50 {
		t.Errorf("1:(2 unhealthy):1: got %v, want [50 0 50]", counts)
	}
}

// TestWeightsEqualUnchanged: when every candidate has the same weight
// (unset, 1 or another), each weight-aware policy makes the decisions it
// makes without weights, and those of a naive reference of the unweighted
// algorithm (the baselines).
func TestWeightsEqualUnchanged(t *testing.T) {
	for _, name := range []string{NameRoundRobin, NameRandom, NameLeastRequest, NamePowerOfTwo, NameKVAware} {
		t.Run(name, func(t *testing.T) {
			var ps [3]kvroute.Picker
			for j := range ps {
				ps[j], _ = New(name, nil, 7)
			}
			ref := newRefBaseline(name, 7)
			r := rand.New(rand.NewPCG(3, 4))
			for k := range 500 {
				req, cands := randomState(r, 1+r.IntN(10), true)
				var idx [3]int
				for j, w := range []int{0, 1, 3} {
					for i := range cands {
						ep := *cands[i].Endpoint
						ep.Weight = w
						cands[i].Endpoint = &ep
					}
					c := *req
					idx[j] = ps[j].Pick(epoch, &c, cands).Index
				}
				if idx[0] != idx[1] || idx[0] != idx[2] {
					t.Fatalf("decision %d: weights 0, 1, 3 chose %v", k, idx)
				}
				if ref != nil {
					if want := ref(cands); idx[0] != want {
						t.Fatalf("decision %d: got %d, want the unweighted algorithm's %d", k, idx[0], want)
					}
				}
			}
		})
	}
}

// newRefBaseline returns a naive implementation of the unweighted
// baseline name, drawing from the generator the policy of that seed has
// (nil for kv-aware).
func newRefBaseline(name string, seed uint64) func([]kvroute.Candidate) int {
	rng := newRand(seed)
	next := 0
	healthy := func(cands []kvroute.Candidate) []int {
		var idx []int
		for i := range cands {
			if cands[i].Healthy {
				idx = append(idx, i)
			}
		}
		return idx
	}
	switch name {
	case NameRoundRobin:
		return func(cands []kvroute.Candidate) int {
			for k := range cands {
				if i := (next + k) % len(cands); cands[i].Healthy {
					next = (i + 1) % len(cands)
					return i
				}
			}
			return -1
		}
	case NameRandom:
		return func(cands []kvroute.Candidate) int {
			idx := healthy(cands)
			if len(idx) == 0 {
				return -1
			}
			return idx[rng.IntN(len(idx))]
		}
	case NameLeastRequest:
		return func(cands []kvroute.Candidate) int {
			var idx []int
			for _, i := range healthy(cands) {
				switch {
				case len(idx) == 0 || cands[i].Load.InFlight < cands[idx[0]].Load.InFlight:
					idx = []int{i}
				case cands[i].Load.InFlight == cands[idx[0]].Load.InFlight:
					idx = append(idx, i)
				}
			}
			if len(idx) == 0 {
				return -1
			}
			return idx[rng.IntN(len(idx))]
		}
	case NamePowerOfTwo:
		return func(cands []kvroute.Candidate) int {
			idx := healthy(cands)
			switch len(idx) {
			case 0:
				return -1
			case 1:
				return idx[0]
			}
			a, b := pickTwo(rng, idx)
			x, y := &cands[a].Load, &cands[b].Load
			if y.InFlight < x.InFlight || y.InFlight == x.InFlight && y.Queue() < x.Queue() {
				a = b
			}
			return a
		}
	}
	return nil
}

// serve runs picker p over cands for n arrivals, one per tick, each held
// for service ticks (the same for every endpoint), and returns each
// candidate's share of the arrivals after the first quarter (the warm-up).
// Requests carry one of keys session keys at random (0: none). check,
// when not nil, is called with each decision and the loads it was made
// from.
func serve(t *testing.T, p kvroute.Picker, cands []kvroute.Candidate, n, service, keys int,
	check func(d kvroute.Decision, cands []kvroute.Candidate)) []float64 {
	t.Helper()
	type open struct {
		req *kvroute.Request
		ep  int
		end int
	}
	var live []open
	counts := make([]int, len(cands))
	r := rand.New(rand.NewPCG(5, 6))
	for tick := range n {
		kept := live[:0]
		for _, o := range live {
			if o.end > tick {
				kept = append(kept, o)
				continue
			}
			cands[o.ep].Load.InFlight--
			if rel, ok := p.(kvroute.Releaser); ok {
				rel.Release(epoch, o.req, "")
			}
		}
		live = kept
		req := &kvroute.Request{ID: strconv.Itoa(tick), PromptTokens: 100}
		if keys > 0 {
			req.SessionKey = "s" + strconv.Itoa(r.IntN(keys))
		}
		d := p.Pick(epoch, req, cands)
		if d.Index < 0 {
			t.Fatalf("tick %d: no choice: %s", tick, d.Reason)
		}
		if check != nil {
			check(d, cands)
		}
		if tick >= n/4 {
			counts[d.Index]++
		}
		cands[d.Index].Load.InFlight++
		live = append(live, open{req, d.Index, tick + service})
	}
	shares := make([]float64, len(cands))
	for i, c := range counts {
		shares[i] = float64(c) / float64(n-n/4)
	}
	return shares
}

// TestWeightedShares: with equal service times, the long-run share of the
// requests each endpoint takes approaches its share of the weights under
// random, least_request and power_of_two.
func TestWeightedShares(t *testing.T) {
	for _, tc := range []struct {
		name    string
		weights []int
		tol     float64
	}{
		{NameRandom, []int{1, 2, 1}, 0.02},
		{NameLeastRequest, []int{1, 2, 1}, 0.02},
		{NameLeastRequest, []int{1, 3, 1, 1, 2}, 0.02},
		{NamePowerOfTwo, []int{1, 2, 1}, 0.02},
		// 8 of weight 1 and one of 8: a uniform draw of two would offer it
		// in 2 of 9 draws, under its half of the weights (0.47 seen).
		{NamePowerOfTwo, []int{1, 1, 1, 1, 1, 1, 1, 1, 8}, 0.03},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.name, tc.weights), func(t *testing.T) {
			p, _ := New(tc.name, nil, 9)
			shares := serve(t, p, weighted(tc.weights...), 40000, 40, 0, nil)
			sum := 0
			for _, w := range tc.weights {
				sum += w
			}
			for i, w := range tc.weights {
				if want := float64(w) / float64(sum); math.Abs(shares[i]-want) > tc.tol {
					t.Errorf("e%d (weight %d): share %.3f, want %.3f +- %.2f (shares %.3f)", i, w, shares[i], want, tc.tol, shares)
				}
			}
		})
	}
}

// TestKVAwareWeightedBoundedLoad: a session pick by kv-aware never puts an
// endpoint above its weighted share of the bound, C x mean x weight / mean
// weight (the mean counting the new request; inflight_slack 0 so that the
// bound is C x mean alone), and the bound is exercised.
func TestKVAwareWeightedBoundedLoad(t *testing.T) {
	// Without the queue and decode terms every estimate is the same, so
	// the ring alone places sessions, and a few keys pile onto their
	// targets until the bound walks them on.
	k, err := NewKVAware(map[string]any{"inflight_slack": 0, "queued_request_ms": 0, "decode_weight": 0}, 3)
	if err != nil {
		t.Fatal(err)
	}
	ws := []int{1, 2, 1, 4}
	meanW := 2.0
	sessions, atBound := 0, 0
	serve(t, k, weighted(ws...), 20000, 40, 5, func(d kvroute.Decision, cands []kvroute.Candidate) {
		if !strings.HasPrefix(d.Reason, "session") {
			return
		}
		sessions++
		total := 0
		for _, c := range cands {
			total += c.Load.InFlight
		}
		mean := float64(total+1) / float64(len(cands))
		bound := k.p.C * mean * float64(ws[d.Index]) / meanW
		load := float64(cands[d.Index].Load.InFlight + 1)
		if load > bound+1e-9 {
			t.Fatalf("session pick: e%d (weight %d) at %v in flight, over its bound %.3f (mean %.3f)", d.Index, ws[d.Index], load, bound, mean)
		}
		if load > bound-1 {
			atBound++
		}
	})
	if sessions < 1000 || atBound < 100 {
		t.Errorf("%d session picks, %d of them within 1 of the bound: the bound is not exercised", sessions, atBound)
	}
}

// TestKVAwareWeightedRing: kv-aware's session ring gives an endpoint
// points in proportion to its weight, so sessions spread by weight when
// no load bound or cache says otherwise; KubeAI's ring stays unweighted.
func TestKVAwareWeightedRing(t *testing.T) {
	k, _ := NewKVAware(nil, 1)
	cands := weighted(1, 2, 1)
	counts := make([]int, 3)
	const n = 20000
	for i := range n {
		d := k.Pick(epoch, &kvroute.Request{SessionKey: "s" + strconv.Itoa(i), PromptTokens: 100}, cands)
		if !strings.HasPrefix(d.Reason, "session") {
			t.Fatalf("session %d: %s, want a session pick on an idle fleet", i, d.Reason)
		}
		counts[d.Index]++
	}
	for i, want := range []float64{0.25, 0.5, 0.25} {
		if got := float64(counts[i]) / n; math.Abs(got-want) > 0.03 {
			t.Errorf("sessions on e%d (weight %d): share %.3f, want %.2f +- 0.03 (counts %v)", i, weight(&cands[i]), got, want, counts)
		}
	}

	r := newRing(256, vnodeHash, true)
	r.sync(cands)
	pts := make([]int, 3)
	for _, pt := range r.points {
		pts[pt.cand]++
	}
	if pts[0] != 128 || pts[1] != 256 || pts[2] != 128 {
		t.Errorf("weighted ring points %v, want [128 256 128]", pts)
	}
	// A weight change rebuilds it.
	cands[1].Endpoint.Weight = 1
	r.sync(cands)
	if len(r.points) != 3*256 {
		t.Errorf("after weights 1:1:1: %d points, want %d", len(r.points), 3*256)
	}
	u := newRing(256, vnodeHash, false)
	u.sync(weighted(1, 2, 1))
	if len(u.points) != 3*256 {
		t.Errorf("unweighted ring: %d points, want %d", len(u.points), 3*256)
	}
}

// TestKVAwareTieByWeight: among tied estimates kv-aware prefers the
// candidate with fewer in-flight requests per unit of weight.
func TestKVAwareTieByWeight(t *testing.T) {
	// Without the queue and decode terms in-flight counts do not move the
	// estimate: both candidates tie.
	k, _ := NewKVAware(map[string]any{"queued_request_ms": 0, "decode_weight": 0}, 1)
	cands := weighted(1, 2)
	cands[0].Load.InFlight, cands[1].Load.InFlight = 2, 3 // 2 and 1.5 per unit of weight
	for i := range 20 {
		d := k.Pick(epoch, &kvroute.Request{ID: strconv.Itoa(i), PromptTokens: 100}, cands)
		if d.Index != 1 {
			t.Fatalf("pick %d: got e%d (%s), want e1: 3 in flight on weight 2 is less than 2 on weight 1", i, d.Index, d.Reason)
		}
	}
}

package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// sharedInput is a P/D plan input whose requests share long prefixes: 90%
// of 4000-token prompts come from a few hot prefixes, so a decode engine
// that holds a prefix pulls only the rest of the prompt.
func sharedInput(t testing.TB) Input {
	t.Helper()
	w, err := Summary{Rate: 30, Duration: 30 * time.Second, PromptMean: 4000, OutputMean: 100, SharedFraction: 0.9, Zipf: 1}.Workload(1)
	if err != nil {
		t.Fatal(err)
	}
	in := Input{Profile: mustProfile(t, "llama-3.1-8b-h100"), Workload: w, Seed: 1, SimRequests: -1, ConfirmRequests: -1,
		PDMode: disagg.ModeAlways, SLO: SLO{TTFT: Target{0.99, 2 * time.Second}, TPOT: Target{0.99, 100 * time.Millisecond}}}
	in.defaults()
	return in
}

// TestFabricEstimateMatchesSimulation: the analytical fabric bandwidth of a
// disaggregated fleet is within 10% of what the simulator charges the same
// fleet on a workload with long shared prefixes. The simulator (as kvroute
// serve) moves only the prompt blocks the decode engine lacks; pricing
// whole prompts put the estimate about 9x too high here.
func TestFabricEstimateMatchesSimulation(t *testing.T) {
	in := sharedInput(t)
	d := analyse(in.Workload, in.Profile.BlockSize)
	b, err := computeBounds(&in, d)
	if err != nil {
		t.Fatal(err)
	}
	s := newSearch(&in)
	// The model's prefix hits come from a simulated aggregated fleet, as
	// Plan takes them.
	agg, err := s.eval(t.Context(), layout{A: 4}, false)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(&in, d, b.Costs, agg.HitRate, s.reqs, agg.cached)
	for _, l := range []layout{{P: 2, D: 2}, {P: 3, D: 1}} {
		pd, err := s.eval(t.Context(), l, false)
		if err != nil {
			t.Fatal(err)
		}
		b, _, _ := m.decodeOK(l.D)
		got := m.fabric(l.P, l.D, b, disagg.ShapeOf(in.Profile), in.Fabric)
		want := pd.Fabric
		t.Logf("%s: analytical %s/s (mean per decode node %s/s, handoff p50 %v), simulated %s/s (%s/s, %v); hit rate %.1f%%",
			l, fmtBytes(got.Total), fmtBytes(got.PerDecodeMean), got.TransferP50, fmtBytes(want.Total), fmtBytes(want.PerDecodeMean), want.TransferP50, 100*agg.HitRate)
		if e := got.Total/want.Total - 1; math.Abs(e) > 0.10 {
			t.Errorf("%s: analytical fabric total %s/s, simulated %s/s: error %+.1f%% over 10%%", l, fmtBytes(got.Total), fmtBytes(want.Total), 100*e)
		}
		if e := got.PerDecodeMean/want.PerDecodeMean - 1; math.Abs(e) > 0.10 {
			t.Errorf("%s: analytical fabric per decode node %s/s, simulated %s/s: error %+.1f%% over 10%%", l, fmtBytes(got.PerDecodeMean), fmtBytes(want.PerDecodeMean), 100*e)
		}
	}
}

// TestBandwidthBoundBelowSimulation: the closed-form bandwidth bound stays a
// lower bound: its bytes over the workload's span are at most the bytes the
// simulator moves through the fabric, on workloads with and without shared
// prefixes, for fleets of several shapes.
func TestBandwidthBoundBelowSimulation(t *testing.T) {
	shared := sharedInput(t)
	half := sizedInput(t, 60, 20*time.Second, -1)
	half.PDMode = disagg.ModeAlways
	half.defaults()
	none := Input{Profile: shared.Profile, Workload: constWorkload(300, 20, 3000, 50), PDMode: disagg.ModeAlways, SLO: shared.SLO}
	none.defaults()
	for _, tc := range []struct {
		name string
		in   Input
	}{{"long shared prefixes", shared}, {"half shared", half}, {"no sharing", none}} {
		in := tc.in
		d := analyse(in.Workload, in.Profile.BlockSize)
		b, err := computeBounds(&in, d)
		if err != nil {
			t.Fatal(err)
		}
		bound := b.Bandwidth.Engines * in.Fabric.BytesPerSecond() * in.MaxUtilisation * d.Span.Seconds()
		for _, fleet := range []string{"2/prefill,2/decode", "3/prefill,1/decode", "1/prefill,4/decode"} {
			f, err := sim.ParseFleet(fleet, in.Profile.Name)
			if err != nil {
				t.Fatal(err)
			}
			r, err := sim.Run(t.Context(), sim.Config{Fleet: f, Seed: 1, PD: sim.PDConfig{Mode: disagg.ModeAlways, Links: uniformLinks(&in)}}, in.Workload.Requests)
			if err != nil {
				t.Fatal(err)
			}
			got := r.FabricLoad(time.Second).Bytes
			t.Logf("%s on %s: bound %.4g bytes, simulated %d", tc.name, fleet, bound, got)
			if bound > float64(got) {
				t.Errorf("%s on %s: the bandwidth bound's %.4g bytes over the span exceed the %d bytes the simulator moved: not a lower bound",
					tc.name, fleet, bound, got)
			}
		}
	}
}

// minPulled is the naive reference for pulledFloor: the fewest prompt
// tokens the handoffs of reqs move over every order they could reach one
// decode engine with an infinite prefix cache in (one engine holding
// everything pulled or prefilled there before is the best case for every
// order), each handed-off request (handed[i], every one when handed is nil)
// pulling disagg.PulledTokens of its hit, each request's full blocks cached
// after it.
func minPulled(reqs []workload.Request, bs int, handed []bool) int {
	best := math.MaxInt
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	var perm func(k int)
	perm = func(k int) {
		if k == len(idx) {
			cache := map[uint64]bool{}
			total := 0
			for _, i := range idx {
				hs := reqs[i].BlockHashes(bs, nil)
				hit := 0
				for hit < len(hs) && cache[hs[hit]] {
					hit++
				}
				if handed == nil || handed[i] {
					total += disagg.PulledTokens(reqs[i].PromptLen, hit*bs, bs)
				}
				for _, h := range hs {
					cache[h] = true
				}
			}
			best = min(best, total)
			return
		}
		for j := k; j < len(idx); j++ {
			idx[k], idx[j] = idx[j], idx[k]
			perm(k + 1)
			idx[k], idx[j] = idx[j], idx[k]
		}
	}
	perm(0)
	return best
}

// TestPulledFloorHandWorked: the floor on the tokens the handoffs move holds
// whatever order requests reach their decode engines in. Request a is two
// blocks (32 tokens), b its first block (16 tokens), arriving after it, e a
// and 5 more tokens. In arrival order a pulls 32, b, whose whole prompt was
// seen, still pulls its last block (16), and e its partial block (5): 53.
// But if b's handoff comes first on the engine that then takes a and e, b
// pulls 16, a only its second block and e 5: 37, the floor (every distinct
// block once, and every partial last block).
func TestPulledFloorHandWorked(t *testing.T) {
	seg := func(id string, at, n int) workload.Request {
		return workload.Request{ID: id, Arrival: time.Duration(at) * time.Second, PromptLen: n, OutputLen: 4,
			Segments: []workload.Segment{{Key: 7, Len: n}}}
	}
	for _, tc := range []struct {
		name           string
		reqs           []workload.Request
		arrival, floor int
		tight          bool
	}{
		{"nested", []workload.Request{seg("a", 0, 32), seg("b", 1, 16), seg("e", 2, 37)}, 53, 37, true},
		// c repeats a: in any order one of them pulls the last block the
		// other brought (the last token is computed again), which the
		// floor does not count (it cannot tell a repeat from a prompt
		// seen up to its last block): a floor, not the minimum.
		{"repeat", []workload.Request{seg("a", 0, 32), seg("b", 1, 16), seg("c", 2, 32), seg("e", 3, 37)}, 69, 37, false},
	} {
		w := &workload.Workload{Name: tc.name, Requests: tc.reqs}
		d := analyse(w, 16)
		arrival := 0
		for i := range d.reqs {
			arrival += disagg.PulledTokens(d.reqs[i].PromptLen, d.cached[i], 16)
		}
		if arrival != tc.arrival {
			t.Errorf("%s: pulled in arrival order = %d, want %d", tc.name, arrival, tc.arrival)
		}
		floor, least := d.pulledFloor(16, nil), minPulled(tc.reqs, 16, nil)
		if floor != int64(tc.floor) || floor > int64(least) || tc.tight && floor != int64(least) {
			t.Errorf("%s: pulledFloor = %d, want %d (the least over every order is %d)", tc.name, floor, tc.floor, least)
		}
	}
}

// TestPulledFloorDifferential: on random small workloads of nested and
// branching prompts (some of whole blocks), pulledFloor is never above the
// least the handoffs move over every order (minPulled), with every request
// handed off and with some run whole on the decode engine instead.
func TestPulledFloorDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 2 + rng.IntN(5)
		w := &workload.Workload{Name: "random"}
		for i := range n {
			// One to three segments; keys from a small set so that
			// prompts nest and branch; lengths often whole blocks.
			var segs []workload.Segment
			plen := 0
			for range 1 + rng.IntN(3) {
				l := 16 * (1 + rng.IntN(3))
				if rng.IntN(3) == 0 {
					l += 1 + rng.IntN(15)
				}
				segs = append(segs, workload.Segment{Key: uint64(rng.IntN(3)), Len: l})
				plen += l
			}
			w.Requests = append(w.Requests, workload.Request{ID: itoa(i), Arrival: time.Duration(i) * time.Second,
				PromptLen: plen, OutputLen: 4, Segments: segs})
		}
		d := analyse(w, 16)
		if floor, least := d.pulledFloor(16, nil), minPulled(w.Requests, 16, nil); floor > int64(least) {
			t.Fatalf("trial %d: pulledFloor = %d, above the least over every order %d; requests %+v", trial, floor, least, w.Requests)
		}
		// Marked requests handed off, counted block by block: every one,
		// and some (the others prefilled on a decode engine, leaving their
		// blocks there), in any order.
		all, some := make([]bool, n), make([]bool, n)
		for i := range some {
			all[i], some[i] = true, rng.IntN(2) == 0
		}
		for _, handed := range [][]bool{all, some} {
			if floor, least := d.pulledFloor(16, handed), minPulled(w.Requests, 16, handed); floor > int64(least) {
				t.Fatalf("trial %d: pulledFloor of %v = %d, above the least over every order %d; requests %+v", trial, handed, floor, least, w.Requests)
			}
		}
	}
}

// TestHandoffLatencyPulled: the analytical TTFT of a disaggregated request
// prices the KV handoff of the prompt tokens past its prefix hit, not the
// whole prompt: prefill of the uncached part + the handoff of the pulled
// tokens on the link + the first decode step + the network hops.
func TestHandoffLatencyPulled(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	w := constWorkload(3, 1, 4000, 50)
	in := Input{Profile: p, Workload: w, SLO: SLO{TTFT: Target{0.99, 2 * time.Second}},
		Fabric: disagg.Link{Name: "eth", Gbps: 10, Setup: time.Millisecond}}
	in.defaults()
	d := analyse(w, p.BlockSize)
	b, err := computeBounds(&in, d)
	if err != nil {
		t.Fatal(err)
	}
	cached := []int{0, 2000, 3990}
	m := newModel(&in, d, b.Costs, 0.5, w.Requests, cached)
	got := m.handoffLatency(1) // sorted
	shape := disagg.ShapeOf(p)
	first := p.DecodeTime(1, m.c.DecodeContext)
	var want, whole []time.Duration
	for _, c := range cached {
		// 3990 cached: 3984 in whole blocks (249 x 16), 16 tokens pulled.
		pulled := disagg.PulledTokens(4000, c, p.BlockSize)
		want = append(want, chunkedPrefill(p, 4000-c, c)+in.Fabric.Duration(shape.Bytes(pulled))+first+netRTT+netRTT/2)
		whole = append(whole, chunkedPrefill(p, 4000-c, c)+in.Fabric.Duration(shape.Bytes(4000))+first+netRTT+netRTT/2)
	}
	slices.Sort(want)
	slices.Sort(whole)
	if !slices.Equal(got, want) {
		t.Errorf("handoff latencies %v, want %v (pricing whole prompts: %v)", got, want, whole)
	}
}

// TestConditionalFabricEstimateMatchesSimulation: in conditional P/D mode
// (kvroute serve's default) the router runs short, mostly cached and
// cheaper-locally requests whole on their decode nodes, and only the rest
// move KV. The analytical fabric bandwidth counts the handoffs the same
// rule (disagg.Planner.WhatIf) makes and is within 10% of what the
// simulator moves on the same fleets: on short prompts half of which share
// prefixes (a tenth handed off), and on the conversation trace's long
// prompts (where the prefill queue sends medium ones to the decode nodes).
// Counting every request put it at 3.4x the simulated figure on the first
// and 23% over it on the second at 2:2.
func TestConditionalFabricEstimateMatchesSimulation(t *testing.T) {
	half, conv := conditionalInputs(t)
	for _, tc := range []struct {
		name    string
		in      Input
		agg     int
		layouts []layout
		tol     float64
	}{
		{"half shared", half, 4, []layout{{P: 2, D: 2}, {P: 3, D: 1}}, 0.10},
		{"conversation trace", conv, 5, []layout{{P: 2, D: 2}, {P: 3, D: 1}}, 0.15},
	} {
		c := conditional(t, tc.in, tc.agg)
		in, m := c.in, c.m
		c.prefetch(t, tc.layouts...)
		for _, l := range tc.layouts {
			r := c.run(t, l)
			batch, _, _ := m.decodeOK(l.D)
			got, want := m.fabric(l.P, l.D, batch, disagg.ShapeOf(in.Profile), in.Fabric), r.FabricLoad(time.Second)
			t.Logf("%s, %s: analytical %s/s, simulated %s/s (%d of %d requests handed off)", tc.name, l, fmtBytes(got.Total), fmtBytes(want.Total), want.Transfers, len(r.Records))
			if e := got.Total/want.Total - 1; math.Abs(e) > tc.tol {
				t.Errorf("%s, %s: analytical fabric total %s/s, simulated %s/s: error %+.1f%% over %.0f%%", tc.name, l, fmtBytes(got.Total), fmtBytes(want.Total), 100*e, 100*tc.tol)
			}
		}
	}
}

// TestConditionalBandwidthBoundBelowHandoffs: in conditional P/D mode the
// router runs short, mostly cached and cheaper-locally requests whole on
// their decode nodes, so the bandwidth bound counts only the requests its
// rule hands off whatever the load (disagg.Planner.WhatIf with the prefill
// node saturated): its bytes over the span are at most what the simulator
// moves and what the analytical model estimates, on fleets of several
// shapes. Counting every request put it at 3.3x the simulated bytes on
// half-shared 800-token prompts (a tenth handed off).
func TestConditionalBandwidthBoundBelowHandoffs(t *testing.T) {
	half, conv := conditionalInputs(t)
	for _, tc := range []struct {
		name string
		in   Input
		agg  int
	}{{"half shared", half, 4}, {"conversation trace", conv, 5}} {
		c := conditional(t, tc.in, tc.agg)
		in, d, b, m := c.in, c.d, c.b, c.m
		if !strings.Contains(b.Bandwidth.Explain, "hands off") {
			t.Errorf("%s: bandwidth explain %q does not say which requests it counts", tc.name, b.Bandwidth.Explain)
		}
		bound := b.Bandwidth.Engines * in.Fabric.BytesPerSecond() * in.MaxUtilisation * d.Span.Seconds()
		layouts := []layout{{P: 2, D: 2}, {P: 3, D: 1}, {P: 1, D: 4}}
		c.prefetch(t, layouts...)
		for _, l := range layouts {
			got := c.run(t, l).FabricLoad(time.Second).Bytes
			batch, _, _ := m.decodeOK(l.D)
			model := m.fabric(l.P, l.D, batch, disagg.ShapeOf(in.Profile), in.Fabric).Total * d.Span.Seconds()
			t.Logf("%s on %s: bound %.4g bytes, simulated %d, analytical %.4g", tc.name, l, bound, got, model)
			if bound > float64(got) {
				t.Errorf("%s on %s: the bandwidth bound's %.4g bytes over the span exceed the %d bytes the simulator moved: not a lower bound",
					tc.name, l, bound, got)
			}
			if bound > model {
				t.Errorf("%s on %s: the bandwidth bound's %.4g bytes over the span exceed the analytical model's %.4g", tc.name, l, bound, model)
			}
		}
	}
}

// conditionalInputs are the conditional P/D tests' two workloads: short
// prompts half of which share prefixes (sizedInput), and the first 3,000
// requests of the conversation trace with its long prompts, on the same
// profile and SLO.
func conditionalInputs(t *testing.T) (half, conv Input) {
	t.Helper()
	half = sizedInput(t, 60, 20*time.Second, -1)
	trace, err := sim.DefaultWorkload()
	if err != nil {
		t.Fatal(err)
	}
	trace.Requests = trace.Requests[:3000]
	conv = Input{Profile: half.Profile, Workload: trace, Seed: 1, SimRequests: -1,
		SLO: SLO{TTFT: Target{0.9, 2 * time.Second}, TPOT: Target{0.99, 100 * time.Millisecond}}}
	return half, conv
}

// conditionalCase is a conditional P/D test's set-up: the input in
// conditional mode with its defaults, its demand and bounds, the search
// (the simulator's runs) and the analytical model calibrated on the
// aggregated fleet of agg engines.
type conditionalCase struct {
	in Input
	d  *Demand
	b  Bounds
	s  *search
	m  *model

	mu   sync.Mutex // guards runs
	runs map[layout]*sim.Result
}

// run returns the simulation of the whole workload on the P/D fleet l in
// conditional mode with seed 1 (sim.Run, the router and engines as kvroute
// serve runs them), run once per case: TestConditionalFabricEstimateMatchesSimulation
// and TestConditionalBandwidthBoundBelowHandoffs read the same fleets.
func (c *conditionalCase) run(t *testing.T, l layout) *sim.Result {
	t.Helper()
	c.prefetch(t, l)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[l]
}

// prefetch simulates the fleets ls not run yet (run), up to GOMAXPROCS at
// once: they are independent and each is deterministic.
func (c *conditionalCase) prefetch(t *testing.T, ls ...layout) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[layout]*sim.Result{}
	}
	var todo []layout
	for _, l := range ls {
		if _, ok := c.runs[l]; !ok && !slices.Contains(todo, l) {
			todo = append(todo, l)
		}
	}
	got := make([]*sim.Result, len(todo))
	g, ctx := errgroup.WithContext(t.Context())
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, l := range todo {
		g.Go(func() error {
			f, err := sim.ParseFleet(fmt.Sprintf("%d/prefill,%d/decode", l.P, l.D), c.in.Profile.Name)
			if err != nil {
				return err
			}
			got[i], err = sim.Run(ctx, sim.Config{Fleet: f, Seed: 1, PD: sim.PDConfig{Mode: disagg.ModeConditional, Links: uniformLinks(&c.in)}}, c.in.Workload.Requests)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for i, l := range todo {
		c.runs[l] = got[i]
	}
}

// conditionalCases holds the set-ups conditional has built, by input and
// aggregated fleet: the four tests on these workloads
// (TestConditionalSplitMatchesSimulation, TestModelMatchesSimulation,
// TestConditionalFabricEstimateMatchesSimulation,
// TestConditionalBandwidthBoundBelowHandoffs) share one, so each fleet is
// simulated once per package run, not once per test (the search caches its
// runs by fleet; every run is deterministic for its key, so a test reads
// what it would have simulated itself). Under -race on a 2-core machine,
// with the fleets simulated at once (prefetch), the four tests took 115s
// together where they had taken 215s.
var conditionalCases = struct {
	mu sync.Mutex // guards m
	m  map[string]*conditionalCase
}{m: map[string]*conditionalCase{}}

// conditional returns the conditional P/D set-up of in with the model
// calibrated on agg aggregated engines, built once per input (its workload's
// name and size, seed, SLO and request caps) and agg.
func conditional(t *testing.T, in Input, agg int) *conditionalCase {
	t.Helper()
	key := fmt.Sprintf("%s|%d|%d|%v|%d|%d|%d", in.Workload.Name, len(in.Workload.Requests), in.Seed, in.SLO, in.SimRequests, in.ConfirmRequests, agg)
	conditionalCases.mu.Lock()
	defer conditionalCases.mu.Unlock()
	if c, ok := conditionalCases.m[key]; ok {
		return c
	}
	c := newConditional(t, in, agg)
	conditionalCases.m[key] = c
	return c
}

func newConditional(t *testing.T, in Input, agg int) *conditionalCase {
	t.Helper()
	c := &conditionalCase{in: in}
	c.in.PDMode = disagg.ModeConditional
	c.in.defaults()
	c.d = analyse(c.in.Workload, c.in.Profile.BlockSize)
	var err error
	if c.b, err = computeBounds(&c.in, c.d); err != nil {
		t.Fatal(err)
	}
	c.s = newSearch(&c.in)
	a, err := c.s.eval(t.Context(), layout{A: agg}, false)
	if err != nil {
		t.Fatal(err)
	}
	c.m = newModel(&c.in, c.d, c.b.Costs, a.HitRate, c.s.reqs, a.cached)
	return c
}

package planner

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// mixedWorkload alternates long unshared prompts and prompts mostly
// cached: n requests at rate req/s, the even ones of long unshared tokens,
// the odd ones a shared prefix of prefix tokens and own unshared tokens.
func mixedWorkload(n int, rate float64, long, prefix, own, out int) *workload.Workload {
	w := &workload.Workload{Name: "mixed"}
	gap := time.Duration(float64(time.Second) / rate)
	for i := range n {
		r := workload.Request{ID: "r" + itoa(i), Arrival: time.Duration(i) * gap, PromptLen: long, OutputLen: out,
			Segments: []workload.Segment{{Key: uint64(1000 + i), Len: long}}}
		if i%2 == 1 {
			r.PromptLen = prefix + own
			r.Segments = []workload.Segment{{Key: 7, Len: prefix}, {Key: uint64(1000 + i), Len: own}}
		}
		w.Requests = append(w.Requests, r)
	}
	return w
}

// TestConditionalPoolsHandWorked: in conditional P/D mode the requests the
// router runs whole on a decode node are prefilled there, not on the
// prefill pool. Half the requests have 20000-token unshared prompts (over
// max_local_tokens: always handed off), half 10000-token ones of which a
// decode node holds the shared 8000 (mostly cached: always run on the
// decode node), 4 req/s: the prefill pool is busy with the 200 long
// prefills, S each (their chunked prefill), over its engines for the run's
// 99.75s of arrivals and the last request's end (under a second more:
// within 1%), and the decode
// pool's batch is the one whose steps the other 2 req/s of 2000-token
// prefills steal from (within 1%: the first mostly-cached request finds
// nothing cached). The model had every request prefilled on the prefill
// pool (its utilisation 10% higher) and the decode pool only decoding.
func TestConditionalPoolsHandWorked(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	in := Input{Profile: p, Workload: mixedWorkload(400, 4, 20000, 8000, 2000, 50), PDMode: disagg.ModeConditional,
		SLO: SLO{TTFT: Target{0.9, 10 * time.Second}, TPOT: Target{0.99, 200 * time.Millisecond}}}
	b, m := testModel(t, &in)
	perTok := b.Costs.PrefillPerToken.Seconds()
	S := chunkedPrefill(p, 20000, 0).Seconds()
	for _, l := range []layout{{P: 2, D: 2}, {P: 3, D: 1}} {
		var f Fleet
		m.disaggAt(&f, l.P, l.D)
		if want := 200 * S / (float64(l.P) * 99.75); !near(f.PrefillUtil, want, 0.01) {
			t.Errorf("%s: prefill utilisation %.4f, want %.4f (the handed-off half only)", l, f.PrefillUtil, want)
		}
		steal := 2 * 2000 * perTok / float64(l.D)
		if want, _ := m.decodeBatch(l.D, steal); !near(f.DecodeBatch, want, 0.01) {
			t.Errorf("%s: decode batch %.4f, want %.4f (with the local prefills' %.4f of the steps)", l, f.DecodeBatch, want, steal)
		}
		if !near(f.SplitFraction, 0.5, 0.01) {
			t.Errorf("%s: split fraction %.3f, want 0.5", l, f.SplitFraction)
		}
	}
}

// TestConditionalDecodePoolSaturated: 250-token prompts at 300 req/s are
// all short, so the router prefills every one on its decode node: one
// decode node is saturated by those prefills (300 x 250 tokens x the
// per-token prefill time is over 1), whatever the prefill pool, and the
// simulator agrees (TTFT p90 over the limit). The model had the prefill
// pool take them and the 3:1 fleet meeting the SLO.
func TestConditionalDecodePoolSaturated(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	in := Input{Profile: p, Workload: constWorkload(3000, 300, 250, 20), PDMode: disagg.ModeConditional, Seed: 1,
		SLO: SLO{TTFT: Target{0.9, time.Second}, TPOT: Target{0.99, 100 * time.Millisecond}}}
	in.defaults()
	d := analyse(in.Workload, p.BlockSize)
	b, err := computeBounds(&in, d)
	if err != nil {
		t.Fatal(err)
	}
	if rho := 300 * 250 * b.Costs.PrefillPerToken.Seconds(); rho <= 1 {
		t.Fatalf("local prefill load %.2f: the workload does not saturate a decode node", rho)
	}
	m := newModel(&in, d, b.Costs, 0, nil, nil)
	var f Fleet
	if m.disaggAt(&f, 3, 1) {
		t.Errorf("3:1 meets the SLO in the model (prefill util %.2f, TTFT p90 %v, TPOT p99 %v), but its decode node prefills every request", f.PrefillUtil, f.TTFT.P90, f.TPOT.P99)
	}
	fl, err := sim.ParseFleet("3/prefill,1/decode", p.Name)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sim.Run(t.Context(), sim.Config{Fleet: fl, Seed: 1, PD: sim.PDConfig{Mode: disagg.ModeConditional, Links: uniformLinks(&in)}}, in.Workload.Requests)
	if err != nil {
		t.Fatal(err)
	}
	var ttft []time.Duration
	for _, rec := range r.Records {
		ttft = append(ttft, rec.TTFT)
	}
	t.Logf("simulated 3:1: TTFT p90 %v; model: TTFT p90 %v, prefill util %.2f", quantileDur(ttft, 0.9), f.TTFT.P90, f.PrefillUtil)
	if got := quantileDur(ttft, 0.9); got <= in.SLO.TTFT.Limit {
		t.Errorf("simulated 3:1 TTFT p90 %v meets the %v limit: the workload does not show the decode pool's prefills", got, in.SLO.TTFT.Limit)
	}
}

// TestConditionalSplitMatchesSimulation: the share of requests the
// analytical P/D model expects the router's conditional rule to hand off
// (Fleet.SplitFraction) is within 5 points of the share the simulator's
// router hands off on the same fleet. The rule weighs the nodes' queues as
// the router sees them, their in-flight prompt tokens (the prefills running
// as well as those waiting); the model took the prefill node idle unless an
// Erlang C arrival found every node busy (74% of the arrivals at 2:2 on the
// conversation trace, whose arrivals come in bursts; the router found its
// prefill node idle for 24%) and the decode node idle, and so expected 63%
// handed off at 2:2, 74% at 3:2 and 35% at 1:3 where the simulator hands
// off 43%, 55% and 25%. The replay is within 3 points; 5 leaves room for
// what it leaves out (the engines batch several prefills in a step, and the
// P/D fleet's nodes hold less of the prompts than the aggregated fleet the
// prefix hits come from).
func TestConditionalSplitMatchesSimulation(t *testing.T) {
	half, conv := conditionalInputs(t)
	for _, tc := range []struct {
		name    string
		in      Input
		agg     int
		layouts []layout
	}{
		{"conversation trace", conv, 5, []layout{{P: 2, D: 2}, {P: 3, D: 2}, {P: 1, D: 3}}},
		{"half shared", half, 4, []layout{{P: 2, D: 2}, {P: 1, D: 3}}},
	} {
		c := conditional(t, tc.in, tc.agg)
		s, m := c.s, c.m
		// The fleets at once (Input.Parallel), then read one by one.
		if err := s.prefetch(t.Context(), false, tc.layouts...); err != nil {
			t.Fatal(err)
		}
		for _, l := range tc.layouts {
			pd, err := s.eval(t.Context(), l, false)
			if err != nil {
				t.Fatal(err)
			}
			var f Fleet
			m.disaggFit(&f, l.P, l.D)
			t.Logf("%s on %s: analytical split %.1f%%, simulated %.1f%%", tc.name, l, 100*f.SplitFraction, 100*pd.Disaggregated)
			if e := f.SplitFraction - pd.Disaggregated; math.Abs(e) > 0.05 {
				t.Errorf("%s on %s: analytical split %.1f%%, simulated %.1f%%: %+.1f points, over 5", tc.name, l,
					100*f.SplitFraction, 100*pd.Disaggregated, 100*e)
			}
		}
	}
}

// burstWorkload is n requests arriving in bursts of k at the same instant,
// one burst every gap, each with its own unshared prompt of prompt tokens.
func burstWorkload(n, k int, gap time.Duration, prompt, out int) *workload.Workload {
	w := &workload.Workload{Name: "bursts"}
	for i := range n {
		w.Requests = append(w.Requests, workload.Request{ID: "r" + itoa(i), Arrival: time.Duration(i/k) * gap,
			PromptLen: prompt, OutputLen: out, Segments: []workload.Segment{{Key: uint64(1000 + i), Len: prompt}}})
	}
	return w
}

// TestDisaggQueueBurstsHandWorked: the prefill pool's queue of the
// analytical P/D model on arrivals whose answer is known by hand. Bursts of
// 4 requests arrive at the same instant every 10 prefill services S (every
// prompt the same, none shared, always handed off), so a burst is served
// before the next one arrives: on one prefill node its requests wait 0, S,
// 2S and 3S (first come first served), on two nodes 0, 0, S and S. Every
// request's TTFT is that wait plus the same unqueued handoff latency x
// (prefill + KV handoff + first decode step), so over 400 requests the
// nearest-rank TTFT p50, p90 and p99 are x+S, x+3S, x+3S on one node and x,
// x+S, x+S on two. The M/G/c model (Erlang C for Poisson arrivals, the
// waits' mean scaled by Allen-Cunneen for the arrivals' CV^2) put the
// one-node p50 at x: no wait for more than half the requests, where three
// in four wait.
func TestDisaggQueueBurstsHandWorked(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	const prompt = 8000
	S := chunkedPrefill(p, prompt, 0)
	in := Input{Profile: p, Workload: burstWorkload(400, 4, 10*S, prompt, 10), PDMode: disagg.ModeAlways,
		SLO: SLO{TTFT: Target{0.9, 10 * time.Second}, TPOT: Target{0.99, 200 * time.Millisecond}}}
	in.defaults()
	d := analyse(in.Workload, p.BlockSize)
	b, err := computeBounds(&in, d)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(&in, d, b.Costs, 0, nil, nil)
	for _, tc := range []struct {
		pn            int
		p50, p90, p99 time.Duration // waits
	}{
		{1, S, 3 * S, 3 * S},
		{2, 0, S, S},
	} {
		var f Fleet
		m.disaggFit(&f, tc.pn, 1)
		x := m.handoffTimes(f.DecodeBatch)[0]
		for _, c := range []struct {
			name      string
			got, want time.Duration
		}{{"p50", f.TTFT.P50, x + tc.p50}, {"p90", f.TTFT.P90, x + tc.p90}, {"p99", f.TTFT.P99, x + tc.p99}} {
			if d := c.got - c.want; d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("%d prefill node(s): TTFT %s %v, want %v (handoff %v + wait %v; S = %v)", tc.pn, c.name, c.got, c.want, x, c.want-x, S)
			}
		}
	}
}

// TestModelMatchesSimulation: on the conversation trace's first 3,000
// requests, whose arrivals come in bursts (inter-arrival CV^2 over 9), the
// analytical models, set up as the plan sets them up (each request's
// prefix hit from the simulated aggregated fleet of 5 engines), are close
// to the simulator on the same fleets.
//
// Aggregated, 5 engines: TTFT at p90 and p99 within 20%, TPOT p99 within
// 40% and utilisation within 5 points (measured: -6.4%, +1.2%, +38.2%).
// The simulated TPOT p99 varies with the seed (kvroute sim --limit 3000
// --engines 5, the same fleet): 95.6-115.1ms at seeds 1-4
// (89.8-119.1ms before kv-aware's cache-room tie break), so the model's
// 132ms is 15-38% above it. The TPOT tail is short outputs decoding while their
// engine prefills the long prompts of the same burst, a chunk step a
// token. The M/G/c queue and a Poisson count of the prefills met
// (TestAggregatedQueueBurstsHandWorked) put TTFT p90 at 0.86s against
// 1.18s (-27%), TPOT p99 at 19ms against 106ms and utilisation at 100%.
//
// Conditional P/D, 2:2 and 3:2: TTFT at the SLO quantile (p90) and at p99
// within 20%. The pools' M/G/c queues, with the variability term
// calibrated on the aggregated fleet (clamped at x4: there the model's
// error is the Erlang C chance of waiting, too small for bursts, not the
// waits' scale), put the 2:2 prefill pool's p90 wait at 4.7s where the
// simulated one is 1.5s, and had the local prefills on the decode nodes
// almost never wait (simulated p90 0.4s); the model sized 3:2 where the
// simulation needs 2:2. Its TPOT p99 is within 30% too (2:2 +7%, 3:2
// +17%): the decode nodes' steps shared with the prefills they run, which
// come in the trace's bursts; a Poisson count of them put it at 17ms and
// 14ms where the simulator's is 46ms and 30ms.
func TestModelMatchesSimulation(t *testing.T) {
	_, conv := conditionalInputs(t)
	const agg = 5
	c := conditional(t, conv, agg)
	s, m := c.s, c.m
	wc, _ := s.run(runKey{l: layout{A: agg}, seed: s.seeds[0], scale: 1})
	t.Log(queueNote(m, agg, wc))
	type check struct {
		name      string
		got, want time.Duration
		tol       float64
	}
	compare := func(t *testing.T, fleet string, cs []check) {
		for _, q := range cs {
			e := float64(q.got-q.want) / float64(q.want)
			t.Logf("%s: analytical %s %v, simulated %v (%+.1f%%)", fleet, q.name, q.got, q.want, 100*e)
			if math.Abs(e) > q.tol {
				t.Errorf("%s: analytical %s %v, simulated %v: %+.1f%%, over %.0f%%", fleet, q.name, q.got, q.want, 100*e, 100*q.tol)
			}
		}
	}
	t.Run("aggregated", func(t *testing.T) {
		var f Fleet
		m.aggregatedAt(&f, agg)
		compare(t, itoa(agg)+" engines", []check{{"TTFT p90", f.TTFT.P90, wc.TTFT.P90, 0.2}, {"TTFT p99", f.TTFT.P99, wc.TTFT.P99, 0.2},
			{"TPOT p99", f.TPOT.P99, wc.TPOT.P99, 0.4}})
		if d := f.Utilisation - wc.Utilisation; math.Abs(d) > 0.05 {
			t.Errorf("%d engines: analytical utilisation %.1f%%, simulated %.1f%%: over 5 points apart", agg, 100*f.Utilisation, 100*wc.Utilisation)
		}
	})
	t.Run("conditional P/D", func(t *testing.T) {
		layouts := []layout{{P: 2, D: 2}, {P: 3, D: 2}}
		if err := s.prefetch(t.Context(), false, layouts...); err != nil {
			t.Fatal(err)
		}
		for _, l := range layouts {
			pd, err := s.eval(t.Context(), l, false)
			if err != nil {
				t.Fatal(err)
			}
			var f Fleet
			m.disaggFit(&f, l.P, l.D)
			compare(t, l.String(), []check{{"TTFT p90", f.TTFT.P90, pd.TTFT.P90, 0.2}, {"TTFT p99", f.TTFT.P99, pd.TTFT.P99, 0.2},
				{"TPOT p99", f.TPOT.P99, pd.TPOT.P99, 0.3}})
		}
	})
}

// TestDisaggTPOTStallsHandWorked: a decode node's TPOT in the analytical
// P/D model on arrivals whose answer is known by hand. One request a
// second, each a shared 8000-token prefix the decode node holds and 2000
// tokens of its own (mostly cached: the router runs it whole on its decode
// node), each decoding 351 tokens on one decode node: its prefill of s
// starts on arrival (the previous one is long done), its first token
// comes at s plus the round trip, and its 350 decode steps last about
// 2.5s, in which the next two requests' prefills (at 1s and 2s after its
// arrival, one chunk each) take two of its steps, of s each, and no third
// (at 3s). Every request but the last ones has TPOT (348 steps of the
// batch + 2s) / 350, so that is its p50 and p99. The model drew the
// prefills met from a Poisson law of the same mean (2.5 of them), whose
// p99 meets 7.
func TestDisaggTPOTStallsHandWorked(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	const o = 350
	w := &workload.Workload{Name: "one a second"}
	for i := range 400 {
		w.Requests = append(w.Requests, workload.Request{ID: "r" + itoa(i), Arrival: time.Duration(i) * time.Second,
			PromptLen: 10000, OutputLen: o + 1, Segments: []workload.Segment{{Key: 7, Len: 8000}, {Key: uint64(1000 + i), Len: 2000}}})
	}
	in := Input{Profile: p, Workload: w, PDMode: disagg.ModeConditional,
		SLO: SLO{TTFT: Target{0.9, 10 * time.Second}, TPOT: Target{0.99, 200 * time.Millisecond}}}
	b, m := testModel(t, &in)
	var f Fleet
	m.disaggFit(&f, 1, 1)
	if f.SplitFraction > 0.01 {
		t.Fatalf("split %.3f: the router does not run the requests on their decode node", f.SplitFraction)
	}
	step := p.DecodeTime(max(1, int(math.Ceil(f.DecodeBatch))), b.Costs.DecodeContext)
	s := m.pre[1]
	life := o * step
	if end := s + netRTT + life + 2*s; end < 2*time.Second+s || end >= 3*time.Second {
		t.Fatalf("a request decodes from %v to %v after its arrival: not two prefills met", s+netRTT, end)
	}
	want := (life - 2*step + 2*s) / o
	for _, c := range []struct {
		name string
		got  time.Duration
	}{{"p50", f.TPOT.P50}, {"p99", f.TPOT.P99}} {
		if d := c.got - want; d < -10*time.Microsecond || d > 10*time.Microsecond {
			t.Errorf("TPOT %s %v, want %v ((%d steps of %v + 2 prefills of %v) / %d)", c.name, c.got, want, o-2, step, s, o)
		}
	}
}

// testModel applies in's defaults and returns its bounds and the analytic
// model the planner builds on them (without the simulated requests).
func testModel(t *testing.T, in *Input) (Bounds, *model) {
	t.Helper()
	in.defaults()
	d := analyse(in.Workload, in.Profile.BlockSize)
	b, err := computeBounds(in, d)
	if err != nil {
		t.Fatal(err)
	}
	return b, newModel(in, d, b.Costs, d.OracleHitRate, nil, nil)
}

// TestAggregatedQueueBurstsHandWorked: the analytical aggregated model on
// arrivals whose answer is known by hand. Bursts of 8 requests arrive at
// the same instant every 10 prefill services S (every prompt the same
// single chunk, none shared, 3 output tokens), so a burst is served
// before the next one arrives. The router spreads a burst over the
// engines by the prompt tokens in flight, so on n engines each takes 8/n
// of it, first come first served: on 2 engines they wait 0, S, 2S and 3S,
// on 4 engines 0 and S. Every request's TTFT is that wait plus its
// prefill and the round trip x, so over 400 requests the nearest-rank
// TTFT p50 and p90 are x+S and x+3S on 2 engines, x and x+S on 4; with a
// TTFT p90 target of x+1.5S the smallest fleet meeting it is 4 engines (3
// take 3, 3 and 2 of a burst: p90 x+2S). The first request of a burst on
// each engine decodes its 2 tokens while the engine prefills the others,
// one chunk step of S a token, so on 2 engines TPOT p99 is S. The M/G/c
// model took the arrivals to be Poisson (Erlang C: at 27% utilisation, on
// 3 engines, 90% of the requests never wait) and the prefills met a
// Poisson count: it sized 3 engines, their TTFT p90 x, and put TPOT p99 on
// 2 engines at 96ms where S is 179ms.
func TestAggregatedQueueBurstsHandWorked(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	const prompt = 8000
	S := chunkedPrefill(p, prompt, 0)
	in := Input{Profile: p, Workload: burstWorkload(400, 8, 10*S, prompt, 3),
		SLO: SLO{TTFT: Target{0.9, netRTT + S + 3*S/2}, TPOT: Target{0.99, 10 * time.Second}}}
	_, m := testModel(t, &in)
	x := m.localTimes()[0]
	for _, tc := range []struct {
		n        int
		p50, p90 time.Duration // waits
		meets    bool
	}{
		{2, S, 3 * S, false},
		{3, S, 2 * S, false},
		{4, 0, S, true},
	} {
		var f Fleet
		meets := m.aggregatedAt(&f, tc.n)
		for _, c := range []struct {
			name      string
			got, want time.Duration
		}{{"p50", f.TTFT.P50, x + tc.p50}, {"p90", f.TTFT.P90, x + tc.p90}} {
			if d := c.got - c.want; d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("%d engines: TTFT %s %v, want %v (prefill and round trip %v + wait %v; S = %v)", tc.n, c.name, c.got, c.want, x, c.want-x, S)
			}
		}
		if meets != tc.meets {
			t.Errorf("%d engines: meets the TTFT p90 target %v: %v, want %v (TTFT p90 %v)", tc.n, in.SLO.TTFT.Limit, meets, tc.meets, f.TTFT.P90)
		}
		if tc.n == 2 {
			if d := f.TPOT.P99 - S; d < -2*time.Millisecond || d > 2*time.Millisecond {
				t.Errorf("2 engines: TPOT p99 %v, want S = %v (a chunk step a token)", f.TPOT.P99, S)
			}
		}
	}
	if f := m.analyticAggregated(1); !f.Meets || f.Engines != 4 {
		t.Errorf("analytical aggregated fleet: %d engines (meets %v), want 4", f.Engines, f.Meets)
	}
}

// TestDecodeEnd: a sequence decoding o tokens from t=1 with decode steps of
// 0.01s, on a node whose prefills are known, takes a token per decode step
// outside them and a token per chunk step inside (a stretch's time over
// its ceil(tokens/budget) chunks, budget 100 tokens).
func TestDecodeEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		sp   []span
		o    float64
		want float64
	}{
		{"no prefills", nil, 10, 1.1},
		{"prefills done before", []span{{0, 0.5, 100}}, 10, 1.1},
		{"ends before the prefill", []span{{1.2, 2, 100}}, 10, 1.1},
		// 5 steps to 1.05, the 1s stretch's 4 chunk steps of 0.25s, then 1 step.
		{"through a prefill", []span{{1.05, 2.05, 400}}, 10, 2.06},
		// Inside from the start: 2 of the 4 chunk steps of 0.5s.
		{"inside a prefill", []span{{0.5, 2.5, 400}}, 2, 2},
		// 350 tokens are 4 chunks of 0.1s: 1 token to 1.01, 3 chunk steps.
		{"partial chunk", []span{{1.01, 1.41, 350}}, 4, 1.31},
		{"empty stretch", []span{{1.05, 1.05, 0}}, 10, 1.1},
	} {
		if got := decodeEnd(tc.sp, 1, tc.o, 0.01, 100); !near(got, tc.want, 1e-9) {
			t.Errorf("%s: end %v, want %v", tc.name, got, tc.want)
		}
	}
}

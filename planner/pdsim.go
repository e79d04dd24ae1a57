package planner

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// prefillCandidate is one simulated prefill pool.
type prefillCandidate struct {
	engines     int
	ttft        Latency
	hit, util   float64
	failed      int
	meets       bool
	attainment  float64
	preemptions int
}

// simulatePrefillPool sizes the prefill pool of the disaggregated fleet f
// (whose decode pool the analytical model sized) with the simulator: the
// window's requests run as prefill-only requests (one output token) through
// the router's policy on the prefill engines, and each request's TTFT is its
// simulated prefill-stage TTFT plus its KV handoff on an idle link, the first
// decode step at the decode pool's mean batch and the extra hop. The search
// starts at the analytical pool and steps down while the smaller pool passes,
// or grows (doubling, then bisecting) until one passes.
func (s *search) simulatePrefillPool(ctx context.Context, m *model, f *Fleet) ([]prefillCandidate, prefillEval, error) {
	in := s.in
	p := in.Profile
	shape := disagg.ShapeOf(p)
	firstStep := p.DecodeTime(max(1, int(math.Ceil(f.DecodeBatch))), m.c.DecodeContext)
	reqs := make([]workload.Request, len(s.reqs))
	copy(reqs, s.reqs)
	extra := make([]time.Duration, len(reqs))
	for i := range reqs {
		reqs[i].OutputLen = 1
		extra[i] = in.Fabric.Duration(shape.Bytes(reqs[i].PromptLen)) + firstStep + netRTT/2
	}
	type key struct {
		n     int
		scale float64
	}
	runs := map[key]prefillCandidate{}
	eval := func(n int, scale float64) (prefillCandidate, error) {
		if c, ok := runs[key{n, scale}]; ok {
			return c, nil
		}
		g := sim.Group{Count: n, Profile: p.Name}
		if in.KVCapacityTokens > 0 {
			g.NumGPUBlocks = in.KVCapacityTokens / p.BlockSize
		}
		oracle := s.oracle
		r, err := sim.Run(ctx, sim.Config{Fleet: sim.Fleet{g}, Policy: in.Policy, Seed: s.seed, RateScale: scale, OracleHitRate: &oracle}, reqs)
		if err != nil {
			return prefillCandidate{}, fmt.Errorf("planner: simulate %d prefill engines: %w", n, err)
		}
		c := prefillCandidate{engines: n}
		ttft := make([]time.Duration, 0, len(r.Records))
		var prompt, cached int64
		met := 0
		for i := range r.Records {
			rec := &r.Records[i]
			if !rec.OK() {
				c.failed++
				ttft = append(ttft, infDur)
				continue
			}
			t := rec.TTFT + extra[i]
			ttft = append(ttft, t)
			if !in.SLO.TTFT.Set() || t <= in.SLO.TTFT.Limit {
				met++
			}
			prompt += int64(rec.PromptTokens)
			cached += int64(rec.CachedTokens)
		}
		c.ttft = Latency{P50: quantileDur(ttft, 0.5), P90: quantileDur(ttft, 0.9), P99: quantileDur(ttft, 0.99)}
		if in.SLO.TTFT.Set() {
			c.ttft.AtSLO = quantileDur(ttft, in.SLO.TTFT.Quantile)
		}
		if prompt > 0 {
			c.hit = float64(cached) / float64(prompt)
		}
		if len(r.Records) > 0 {
			c.attainment = float64(met) / float64(len(r.Records))
		}
		for _, e := range r.Engines {
			c.util += e.Utilisation / float64(len(r.Engines))
			c.preemptions += e.Preemptions
		}
		c.meets = c.failed == 0 && meets(c.ttft, in.SLO.TTFT)
		runs[key{n, scale}] = c
		s.done++
		if in.Progress != nil {
			in.Progress(s.done, max(s.done+1, 8))
		}
		return c, nil
	}
	best, err := smallestPassing(max(1, f.Prefill), in.MaxEngines, func(n int) (bool, error) {
		c, err := eval(n, 1)
		return c.meets, err
	})
	var out []prefillCandidate
	for n := 1; n <= in.MaxEngines && len(out) < len(runs); n++ {
		if c, ok := runs[key{n, 1}]; ok {
			out = append(out, c)
		}
	}
	if err != nil || best == 0 {
		return out, eval, err
	}
	c := runs[key{best, 1}]
	f.Method = "prefill simulated, decode analytical"
	f.Prefill, f.Engines = best, best+f.Decode
	f.TTFT, f.HitRate, f.PrefillUtil = c.ttft, c.hit, c.util
	f.Utilisation = (min(1, f.PrefillUtil)*float64(f.Prefill) + min(1, f.DecodeUtil)*float64(f.Decode)) / float64(f.Engines)
	f.Meets = f.TPOT.AtSLO <= in.SLO.TPOT.Limit || !in.SLO.TPOT.Set()
	f.Meets = f.Meets && f.Fabric != nil && f.Fabric.LinkUtilMean <= in.MaxUtilisation
	return out, eval, nil
}

// prefillEval simulates a prefill pool of n engines at a rate scale.
type prefillEval func(n int, scale float64) (prefillCandidate, error)

// smallestPassing returns the smallest n in [1, maxN] for which pass holds,
// assuming pass is monotone in n, starting the search at start: step down
// while the next smaller passes, or grow by doubling steps and bisect. It
// returns 0 when nothing up to maxN passes.
func smallestPassing(start, maxN int, pass func(int) (bool, error)) (int, error) {
	start = min(max(1, start), maxN)
	ok, err := pass(start)
	if err != nil {
		return 0, err
	}
	if ok {
		best := start
		for n := start - 1; n >= 1; n-- {
			ok, err := pass(n)
			if err != nil {
				return 0, err
			}
			if !ok {
				break
			}
			best = n
		}
		return best, nil
	}
	lo, hi, step := start, 0, 1
	for n := start + 1; n <= maxN; {
		ok, err := pass(n)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = n
			break
		}
		lo = n
		if n == maxN {
			break
		}
		step *= 2
		n = min(n+step, maxN)
	}
	if hi == 0 {
		return 0, nil
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		ok, err := pass(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

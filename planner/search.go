package planner

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// search finds the smallest aggregated fleet that meets the SLO with the
// fleet simulator: start at the closed-form bound; if it fails, grow by
// doubling steps until a fleet passes, then bisect; if it passes, step down
// while the next smaller fleet passes (the bound is not strict: mixed
// chunked-prefill steps share one weight read).
type search struct {
	in     *Input
	reqs   []workload.Request
	seed   uint64
	oracle float64
	runs   map[int]Candidate
	done   int
	warm   int // leading requests simulated but not measured
}

func newSearch(in *Input, d *Demand) *search {
	s := &search{in: in, reqs: simWorkload(in.Workload, in.SimRequests), seed: in.Seed, runs: map[int]Candidate{}}
	s.oracle = sim.OracleHitRate(s.reqs, in.Profile.BlockSize)
	s.warm = int(in.WarmUp * float64(len(s.reqs)))
	return s
}

func (s *search) describe() string {
	all := len(s.in.Workload.Requests)
	span := s.reqs[len(s.reqs)-1].Arrival - s.reqs[0].Arrival
	what := "the whole workload"
	if len(s.reqs) < all {
		what = fmt.Sprintf("the first %s of the workload", fmtDur(span.Round(time.Second)))
	}
	warm := ""
	if s.warm > 0 {
		warm = fmt.Sprintf(", the first %d not measured (cache warm-up)", s.warm)
	}
	return fmt.Sprintf("%s: %d of %d requests (%.2f req/s)%s, policy %s, seed %d, router and engines as kvroute serve runs them (sim.Run)",
		what, len(s.reqs), all, float64(len(s.reqs)-1)/max(span.Seconds(), 1e-9), warm, s.in.Policy, s.seed)
}

// offeredRate is the simulated window's arrival rate.
func (s *search) offeredRate() float64 {
	span := (s.reqs[len(s.reqs)-1].Arrival - s.reqs[0].Arrival).Seconds()
	if span <= 0 || len(s.reqs) < 2 {
		return math.Inf(1)
	}
	return float64(len(s.reqs)-1) / span
}

func (s *search) sorted() []Candidate {
	out := make([]Candidate, 0, len(s.runs))
	for _, c := range s.runs {
		out = append(out, c)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Engines < out[b].Engines })
	return out
}

func (s *search) eval(ctx context.Context, n int) (Candidate, error) {
	if c, ok := s.runs[n]; ok {
		return c, nil
	}
	c, err := s.simulate(ctx, n, 1)
	if err != nil {
		return c, err
	}
	s.runs[n] = c
	s.done++
	if s.in.Progress != nil {
		s.in.Progress(s.done, max(s.done+1, 8))
	}
	return c, nil
}

// run returns the smallest passing fleet, with its burst and node-lost
// headroom simulated.
func (s *search) run(ctx context.Context, start int) (Fleet, error) {
	maxN := s.in.MaxEngines
	start = min(max(1, start), maxN)
	c, err := s.eval(ctx, start)
	if err != nil {
		return Fleet{}, err
	}
	best := 0
	if c.Meets {
		best = start
		for n := start - 1; n >= 1; n-- {
			c, err := s.eval(ctx, n)
			if err != nil {
				return Fleet{}, err
			}
			if !c.Meets {
				break
			}
			best = n
		}
	} else {
		lo, step := start, 1 // lo fails
		hi := 0
		for n := start + 1; n <= maxN; {
			c, err := s.eval(ctx, n)
			if err != nil {
				return Fleet{}, err
			}
			if c.Meets {
				hi = n
				break
			}
			if prev, ok := s.half(n); ok && plateau(prev, c, s.in.SLO) {
				return Fleet{Mode: "aggregated", Method: "simulated", Notes: []string{fmt.Sprintf(
					"the SLO latencies stop improving with more engines (%d engines: TTFT %s, TPOT %s; %d engines: TTFT %s, TPOT %s): "+
						"the tail is the slowest requests' own prefill at the hit rate the router achieves, which no fleet size shortens",
					prev.Engines, fmtLat(atOr99(prev.TTFT, s.in.SLO.TTFT)), fmtLat(atOr99(prev.TPOT, s.in.SLO.TPOT)),
					c.Engines, fmtLat(atOr99(c.TTFT, s.in.SLO.TTFT)), fmtLat(atOr99(c.TPOT, s.in.SLO.TPOT)))}}, nil
			}
			lo = n
			step *= 2
			if n == maxN {
				break
			}
			n = min(n+step, maxN)
		}
		if hi == 0 {
			return Fleet{Mode: "aggregated", Method: "simulated", Notes: []string{
				fmt.Sprintf("no aggregated fleet of up to %d engines meets the SLO in simulation", maxN)}}, nil
		}
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			c, err := s.eval(ctx, mid)
			if err != nil {
				return Fleet{}, err
			}
			if c.Meets {
				hi = mid
			} else {
				lo = mid
			}
		}
		best = hi
	}
	bc := s.runs[best]
	f := Fleet{Mode: "aggregated", Method: "simulated", Meets: true, Engines: best,
		KVCapacityTokens: s.in.kvCapacity(), HitRate: bc.HitRate, TTFT: bc.TTFT, TPOT: bc.TPOT,
		ThroughputRPS: bc.ThroughputRPS, OutputTPS: bc.OutputTPS, Utilisation: bc.Utilisation}
	f.DecodeBatch = bc.decodeBatch
	// Headroom.
	bu, err := s.simulate(ctx, best, s.in.Burst)
	if err != nil {
		return f, err
	}
	f.Burst = &Headroom{Factor: s.in.Burst, Engines: best, Method: "simulated", Utilisation: bu.Utilisation,
		TTFT: bu.TTFT, TPOT: bu.TPOT, Meets: bu.Meets}
	if best > 1 {
		nl, err := s.eval(ctx, best-1)
		if err != nil {
			return f, err
		}
		f.NodeLost = &Headroom{Factor: 1, Engines: best - 1, Method: "simulated", Utilisation: nl.Utilisation,
			TTFT: nl.TTFT, TPOT: nl.TPOT, Meets: nl.Meets}
	} else {
		f.NodeLost = &Headroom{Factor: 1, Note: "a one-engine fleet has nothing left when its engine is lost"}
	}
	s.done++
	if s.in.Progress != nil {
		s.in.Progress(s.done, s.done)
	}
	return f, nil
}

// simulate runs n engines at the rate scale and summarises the run.
func (s *search) simulate(ctx context.Context, n int, scale float64) (Candidate, error) {
	in := s.in
	g := sim.Group{Count: n, Profile: in.Profile.Name}
	if in.KVCapacityTokens > 0 {
		g.NumGPUBlocks = in.KVCapacityTokens / in.Profile.BlockSize
	}
	oracle := s.oracle
	cfg := sim.Config{Fleet: sim.Fleet{g}, Policy: in.Policy, Seed: s.seed, RateScale: scale,
		SLO: sim.SLO{TTFT: in.SLO.TTFT.Limit, TPOT: in.SLO.TPOT.Limit}, OracleHitRate: &oracle}
	r, err := sim.Run(ctx, cfg, s.reqs)
	if err != nil {
		return Candidate{}, fmt.Errorf("planner: simulate %d engines: %w", n, err)
	}
	return summarise(in, n, r, s.warm), nil
}

// summarise turns a run into a candidate: failed requests count as missing
// every target.
//
// The first warm requests are simulated but not measured: they run on cold
// caches and an empty fleet, which a long-running fleet does not have.
func summarise(in *Input, n int, r *sim.Result, warm int) Candidate {
	c := Candidate{Engines: n}
	var ttft, tpot []time.Duration
	met, metTTFT, metTPOT, nTPOT := 0, 0, 0, 0
	var prompt, cached int64
	// Sustained throughput: completions per second between the first
	// completion and the last arrival, where a fleet that keeps up
	// completes as fast as requests arrive (the start-up lag and the drain
	// tail after the last arrival are left out).
	var firstDone, lastArrival time.Duration = -1, 0
	for i := warm; i < len(r.Records); i++ {
		rec := &r.Records[i]
		lastArrival = max(lastArrival, rec.Arrival)
		if rec.OK() && (firstDone < 0 || rec.Arrival+rec.E2E < firstDone) {
			firstDone = rec.Arrival + rec.E2E
		}
	}
	var doneIn int
	var outIn int64
	var batchSeconds float64 // decode time summed over requests
	c.cached = make([]int, len(r.Records))
	for i := range r.Records {
		rec := &r.Records[i]
		c.cached[i] = rec.CachedTokens
		if i < warm {
			continue
		}
		if !rec.OK() {
			c.Failed++
			ttft = append(ttft, infDur)
			tpot = append(tpot, infDur)
			continue
		}
		ttft = append(ttft, rec.TTFT)
		if rec.OutputTokens >= 2 {
			tpot = append(tpot, rec.TPOT)
		}
		okT := !in.SLO.TTFT.Set() || rec.TTFT <= in.SLO.TTFT.Limit
		okP := !in.SLO.TPOT.Set() || rec.OutputTokens < 2 || rec.TPOT <= in.SLO.TPOT.Limit
		if okT && okP {
			met++
		}
		if okT {
			metTTFT++
		}
		if rec.OutputTokens >= 2 {
			nTPOT++
			if okP {
				metTPOT++
			}
		}
		prompt += int64(rec.PromptTokens)
		cached += int64(rec.CachedTokens)
		if end := rec.Arrival + rec.E2E; end > firstDone && end <= lastArrival {
			doneIn++
			outIn += int64(rec.OutputTokens)
		}
		batchSeconds += (rec.E2E - rec.TTFT).Seconds()
	}
	lat := func(v []time.Duration, t Target) Latency {
		l := Latency{P50: quantileDur(v, 0.5), P90: quantileDur(v, 0.9), P99: quantileDur(v, 0.99)}
		if t.Set() {
			l.AtSLO = quantileDur(v, t.Quantile)
		}
		return l
	}
	c.TTFT, c.TPOT = lat(ttft, in.SLO.TTFT), lat(tpot, in.SLO.TPOT)
	if len(r.Records) > warm {
		c.Attainment = float64(met) / float64(len(r.Records)-warm)
		c.TTFTAttainment = float64(metTTFT) / float64(len(r.Records)-warm)
	}
	if nTPOT > 0 {
		// Failed requests count against TPOT too.
		c.TPOTAttainment = float64(metTPOT) / float64(nTPOT+c.Failed)
	}
	if span := (lastArrival - firstDone).Seconds(); firstDone >= 0 && span > 0 {
		c.ThroughputRPS = float64(doneIn) / span
		c.OutputTPS = float64(outIn) / span
		c.decodeBatch = batchSeconds / span / float64(n)
	}
	if prompt > 0 {
		c.HitRate = float64(cached) / float64(prompt)
	}
	var u float64
	for _, e := range r.Engines {
		u += e.Utilisation
		c.Preemptions += e.Preemptions
	}
	if len(r.Engines) > 0 {
		c.Utilisation = u / float64(len(r.Engines))
	}
	c.Meets = c.Failed == 0 && meets(c.TTFT, in.SLO.TTFT) && meets(c.TPOT, in.SLO.TPOT)
	return c
}

// half returns the largest simulated fleet of at most n/2 engines.
func (s *search) half(n int) (Candidate, bool) {
	best, ok := Candidate{}, false
	for m, c := range s.runs {
		if 2*m <= n && (!ok || m > best.Engines) {
			best, ok = c, true
		}
	}
	return best, ok
}

// plateau reports whether doubling the fleet (or more) from a to b (both
// failing) improved neither latency at the SLO quantile by
// more than 2% while every request completed: more engines will not help.
func plateau(a, b Candidate, slo SLO) bool {
	if a.Failed > 0 || b.Failed > 0 || b.Engines < 2*a.Engines {
		return false
	}
	flat := func(x, y time.Duration) bool { return x == infDur || float64(y) >= 0.98*float64(x) }
	failing := func(l Latency, t Target) bool { return t.Set() && l.AtSLO > t.Limit }
	return (!failing(b.TTFT, slo.TTFT) || flat(a.TTFT.AtSLO, b.TTFT.AtSLO)) &&
		(!failing(b.TPOT, slo.TPOT) || flat(a.TPOT.AtSLO, b.TPOT.AtSLO))
}

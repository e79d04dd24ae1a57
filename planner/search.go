package planner

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// layout is a fleet's shape: A aggregated engines, or P prefill and D
// decode engines.
type layout struct{ A, P, D int }

func (l layout) pd() bool    { return l.P > 0 || l.D > 0 }
func (l layout) size() int   { return l.A + l.P + l.D }
func (l layout) valid() bool { return l.pd() && l.P >= 1 && l.D >= 1 || !l.pd() && l.A >= 1 }

func (l layout) String() string {
	if l.pd() {
		return fmt.Sprintf("%d:%d", l.P, l.D)
	}
	return fmt.Sprint(l.A)
}

// runKey names one simulation: a layout on the search window or the
// confirming workload, with a seed and a rate scale.
type runKey struct {
	l       layout
	confirm bool
	seed    uint64
	scale   float64
}

// search finds the smallest fleets that meet the SLO with the fleet
// simulator, in two stages.
//
// The search proper runs candidate fleets on a window of the workload (its
// first Input.SimRequests requests, one seed): aggregated from the
// closed-form bound (grow by doubling steps, bisect; step down while the
// bound itself passes), disaggregated from the analytical P:D estimate
// (grow the pool the SLO misses point at, then shrink each pool).
//
// The confirmation runs the chosen fleet on the confirming workload (the
// first Input.ConfirmRequests requests, by default the whole workload) with
// Input.Seeds seeds, and each fleet one engine smaller with the first seed:
// a window is not the whole workload (a busier or calmer stretch moves the
// tail by 10% and more), so the prediction is the mean over the seeds of the
// longer run and the spread is reported. A chosen fleet that misses grows; a
// smaller one that passes is taken instead.
//
// Runs may go on concurrently (the aggregated confirmation beside the
// disaggregated search); at most Input.Parallel simulate at once. Each run
// is deterministic for its key, so the plan does not depend on timing.
type search struct {
	in            *Input
	reqs          []workload.Request // the search window
	confirm       []workload.Request // the confirming workload
	seeds         []uint64
	oracle        float64 // of the window
	confirmOracle float64 // of the confirming workload
	warm          int     // leading window requests simulated but not measured
	sem           chan struct{}

	mu    sync.Mutex // guards runs, asked and done
	runs  map[runKey]Candidate
	asked map[runKey]bool // the runs the plan asked for (not only prefetched): the ones it lists
	done  int

	// evalHook, when set, replaces the search-window simulation (tests of
	// the search logic).
	evalHook func(layout) Candidate
}

func newSearch(in *Input) *search {
	s := &search{in: in, reqs: simWorkload(in.Workload, in.SimRequests), confirm: simWorkload(in.Workload, in.ConfirmRequests),
		runs: map[runKey]Candidate{}, asked: map[runKey]bool{}}
	for k := range in.Seeds {
		s.seeds = append(s.seeds, in.Seed+uint64(k))
	}
	s.oracle = sim.OracleHitRate(s.reqs, in.Profile.BlockSize)
	s.confirmOracle = s.oracle
	if len(s.confirm) != len(s.reqs) {
		s.confirmOracle = sim.OracleHitRate(s.confirm, in.Profile.BlockSize)
	}
	s.sem = make(chan struct{}, in.Parallel)
	s.warm = int(in.WarmUp * float64(len(s.reqs)))
	return s
}

func (s *search) describe() string {
	all := len(s.in.Workload.Requests)
	what := func(reqs []workload.Request) string {
		span := reqs[len(reqs)-1].Arrival - reqs[0].Arrival
		w := "the whole workload"
		if len(reqs) < all {
			w = fmt.Sprintf("the first %s of the workload", fmtDur(span.Round(time.Second)))
		}
		return fmt.Sprintf("%s (%d of %d requests, %.2f req/s)", w, len(reqs), all, float64(len(reqs)-1)/max(span.Seconds(), 1e-9))
	}
	warm := ""
	if s.warm > 0 {
		warm = fmt.Sprintf(", the first %d not measured (cache warm-up)", s.warm)
	}
	lora := ""
	if adapters(s.in.Workload.Requests) > 0 {
		lora = fmt.Sprintf(", --max-loras %d (engines batch at most %s a step; the policy prices their slots)", s.in.MaxLoRAs, plural(s.in.MaxLoRAs, "adapter"))
	}
	return fmt.Sprintf("search on %s%s with seed %d; the chosen fleets confirmed on %s with seeds %v; policy %s, P/D mode %s%s, router and engines as kvroute serve runs them (sim.Run)",
		what(s.reqs), warm, s.seeds[0], what(s.confirm), s.seeds, s.in.Policy, s.in.PDMode, lora)
}

// simulate runs one layout (uncached).
func (s *search) simulate(ctx context.Context, k runKey) (Candidate, error) {
	in := s.in
	prof := in.Profile
	group := func(n int, role string) sim.Group {
		g := sim.Group{Count: n, Spec: &prof, Role: role}
		if in.KVCapacityTokens > 0 {
			// The capacity's blocks and the null block (Input.KVCapacityTokens).
			g.NumGPUBlocks = in.KVCapacityTokens/prof.BlockSize + 1
		}
		return g
	}
	var fleet sim.Fleet
	if k.l.pd() {
		fleet = sim.Fleet{group(k.l.P, "prefill"), group(k.l.D, "decode")}
	} else {
		fleet = sim.Fleet{group(k.l.A, "")}
	}
	reqs, warm := s.reqs, s.warm
	oracle := s.oracle
	if k.confirm {
		reqs, warm, oracle = s.confirm, 0, s.confirmOracle
	}
	cfg := sim.Config{Fleet: fleet, Policy: in.Policy, Seed: k.seed, RateScale: k.scale,
		SLO: sim.SLO{TTFT: in.SLO.TTFT.Limit, TPOT: in.SLO.TPOT.Limit}, OracleHitRate: &oracle, MaxLoRAs: in.MaxLoRAs,
		PD: sim.PDConfig{Mode: in.PDMode, Links: uniformLinks(in)}}
	r, err := sim.Run(ctx, cfg, reqs)
	if err != nil {
		return Candidate{}, fmt.Errorf("planner: simulate %s: %w", fleet, err)
	}
	c := summarise(in, k.l, r, warm)
	c.Seed, c.Scale, c.Requests = k.seed, k.scale, len(reqs)-warm
	return c, nil
}

// runAll simulates the keys not yet run, up to Input.Parallel at once
// (across concurrent callers), and returns every key's candidate.
func (s *search) runAll(ctx context.Context, keys []runKey) ([]Candidate, error) {
	return s.simulateAll(ctx, keys, true)
}

// simulateAll is runAll; ask records the keys as asked for (listed in the
// plan), which a prefetch does not.
func (s *search) simulateAll(ctx context.Context, keys []runKey, ask bool) ([]Candidate, error) {
	var todo []runKey
	seen := map[runKey]bool{}
	s.mu.Lock()
	for _, k := range keys {
		if ask {
			s.asked[k] = true
		}
		if _, ok := s.runs[k]; !ok && !seen[k] {
			seen[k] = true
			todo = append(todo, k)
		}
	}
	s.mu.Unlock()
	got := make([]Candidate, len(todo))
	g, gctx := errgroup.WithContext(ctx)
	for i, k := range todo {
		g.Go(func() error {
			select {
			case s.sem <- struct{}{}:
			case <-gctx.Done():
				return gctx.Err()
			}
			defer func() { <-s.sem }()
			c, err := s.simulate(gctx, k)
			got[i] = c
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range todo {
		s.runs[k] = got[i]
		s.done++
		if s.in.Progress != nil {
			s.in.Progress(s.done, max(s.done+1, 12))
		}
	}
	out := make([]Candidate, len(keys))
	for i, k := range keys {
		out[i] = s.runs[k]
	}
	return out, nil
}

// run returns a finished run's candidate.
func (s *search) run(k runKey) (Candidate, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.runs[k]
	return c, ok
}

// eval runs a layout at rate scale 1 with the first seed, on the search
// window or (confirm) the confirming workload.
func (s *search) eval(ctx context.Context, l layout, confirm bool) (Candidate, error) {
	k := runKey{l: l, confirm: confirm, seed: s.seeds[0], scale: 1}
	if s.evalHook != nil {
		c := s.evalHook(l)
		s.mu.Lock()
		s.runs[k], s.asked[k] = c, true
		s.mu.Unlock()
		return c, nil
	}
	c, err := s.runAll(ctx, []runKey{k})
	if err != nil {
		return Candidate{}, err
	}
	return c[0], nil
}

// prefetch runs layouts the search will probably ask for next, at once
// (they fill Input.Parallel cores instead of one). They are listed in the
// plan only if the search asks for them, so that it prints the same
// whatever Input.Parallel.
func (s *search) prefetch(ctx context.Context, confirm bool, ls ...layout) error {
	if s.evalHook != nil || s.in.Parallel < 2 {
		return nil
	}
	var keys []runKey
	for _, l := range ls {
		if l.valid() {
			keys = append(keys, runKey{l: l, confirm: confirm, seed: s.seeds[0], scale: 1})
		}
	}
	_, err := s.simulateAll(ctx, keys, false)
	return err
}

// window returns the search-window candidates of aggregated (pd false) or
// disaggregated fleets, by size.
func (s *search) window(pd bool) []Candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Candidate
	for k, c := range s.runs {
		if s.asked[k] && !k.confirm && k.scale == 1 && k.l.pd() == pd {
			out = append(out, c)
		}
	}
	sortCands(out)
	return out
}

// confirmations returns the confirming runs, by fleet and seed.
func (s *search) confirmations() []Candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Candidate
	for k, c := range s.runs {
		if s.asked[k] && k.confirm {
			out = append(out, c)
		}
	}
	sortCands(out)
	return out
}

func sortCands(c []Candidate) {
	sort.Slice(c, func(a, b int) bool {
		x, y := c[a], c[b]
		if x.Prefill > 0 != (y.Prefill > 0) {
			return y.Prefill > 0
		}
		if x.Engines != y.Engines {
			return x.Engines < y.Engines
		}
		if x.Prefill != y.Prefill {
			return x.Prefill < y.Prefill
		}
		if x.Scale != y.Scale {
			return x.Scale < y.Scale
		}
		return x.Seed < y.Seed
	})
}

// searchAggregated returns the smallest aggregated fleet meeting the SLO,
// from start, on the search window or (confirm) the confirming workload,
// or a note saying why there is none. A passing start steps down (one
// engine, then doubling steps, then bisecting), never below floor (the
// closed-form bound: smaller fleets cannot keep up, and their runs are
// long); a failing one grows by doubling steps and bisects. Growing stops at a plateau: a fleet twice as
// large that improves the missed latency by less than 2%.
func (s *search) searchAggregated(ctx context.Context, start, floor int, confirm bool) (int, string, error) {
	maxN := s.in.MaxEngines
	floor = min(max(1, floor), maxN)
	start = min(max(floor, start), maxN)
	eval := func(n int) (Candidate, error) { return s.eval(ctx, layout{A: n}, confirm) }
	if confirm { // start is the window's answer: it and one fewer are next
		if err := s.prefetch(ctx, confirm, layout{A: start}, layout{A: start - 1}); err != nil {
			return 0, "", err
		}
	}
	c, err := eval(start)
	if err != nil {
		return 0, "", err
	}
	lo, hi := 0, 0 // largest failing, smallest passing
	if c.Meets {
		hi = start
		// Steps of 1, 1, 2, 4, ...: the answer is usually at or next to
		// the start.
		for step, ok := 1, 0; hi > floor; {
			n := max(floor, hi-step)
			c, err := eval(n)
			if err != nil {
				return 0, "", err
			}
			if !c.Meets {
				lo = n
				break
			}
			hi = n
			if ok++; ok >= 2 {
				step *= 2
			}
		}
		// Stepping down reached the floor without a failure: the
		// bisection below must not go under it.
		lo = max(lo, floor-1)
	} else {
		lo = start
		tried := []Candidate{c}
		for step, n := 1, start+1; n <= maxN; {
			c, err := eval(n)
			if err != nil {
				return 0, "", err
			}
			if c.Meets {
				hi = n
				break
			}
			for _, h := range tried {
				if plateau(h, c, s.in.SLO) {
					return 0, fmt.Sprintf("the SLO latencies stop improving with more engines (%d engines: TTFT %s, TPOT %s; %d engines: TTFT %s, TPOT %s): "+
						"the tail is the slowest requests' own prefill at the hit rate the router achieves, which no fleet size shortens",
						h.Engines, fmtLat(atOr99(h.TTFT, s.in.SLO.TTFT)), fmtLat(atOr99(h.TPOT, s.in.SLO.TPOT)),
						c.Engines, fmtLat(atOr99(c.TTFT, s.in.SLO.TTFT)), fmtLat(atOr99(c.TPOT, s.in.SLO.TPOT))), nil
				}
			}
			tried = append(tried, c)
			lo = n
			step *= 2
			if n == maxN {
				break
			}
			n = min(n+step, maxN)
		}
		if hi == 0 {
			return 0, fmt.Sprintf("no aggregated fleet of up to %d engines meets the SLO in simulation", maxN), nil
		}
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		c, err := eval(mid)
		if err != nil {
			return 0, "", err
		}
		if c.Meets {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, "", nil
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

// maxPDEvals bounds the disaggregated search's window runs.
const maxPDEvals = 40

// grow returns a larger layout for a candidate that misses the SLO:
// aggregated one engine more; disaggregated, the pool its misses point at
// grows by half (at least one engine): decode when TPOT misses, and for a
// TTFT miss the pool where the slow requests spent most of their time to
// first token (queue and prefill on the prefill engine, or the transfer and
// the first decode step; a request the router ran whole on a decode node
// counts for decode). Failed requests grow both.
func grow(l layout, c Candidate, slo SLO) layout {
	if !l.pd() {
		return layout{A: l.A + 1}
	}
	growP, growD := false, false
	if c.Failed > 0 {
		growP, growD = true, true
	}
	if slo.TPOT.Set() && c.TPOT.AtSLO > slo.TPOT.Limit {
		growD = true
	}
	if slo.TTFT.Set() && c.TTFT.AtSLO > slo.TTFT.Limit {
		if c.tailPrefill >= c.tailDecode {
			growP = true
		} else {
			growD = true
		}
	}
	if !growP && !growD {
		growP, growD = true, true
	}
	if growP {
		l.P += max(1, l.P/2)
	}
	if growD {
		l.D += max(1, l.D/2)
	}
	return l
}

// searchDisaggregated returns the smallest P:D fleet it finds meeting the
// SLO with at most maxN engines, on the search window or (confirm) the
// confirming workload, from start: grow (see grow; at maxN, see fitCap) until a fleet passes, then shrink each pool in
// turn (one fewer, then bisection) while the fleet still passes, until
// neither pool can shrink. A pool whose growth improved the missed latency
// by less than 2% is at a plateau: the other pool grows instead, and when
// both are, there is no fleet (the note says why).
func (s *search) searchDisaggregated(ctx context.Context, start layout, maxN int, confirm bool) (layout, string, error) {
	maxN = min(maxN, s.in.MaxEngines)
	slo := s.in.SLO
	l := layout{P: max(1, start.P), D: max(1, start.D)}
	evals := 0
	eval := func(l layout) (Candidate, error) {
		evals++
		return s.eval(ctx, l, confirm)
	}
	// A pool is at a plateau when the latency that made it grow (TTFT for
	// prefill; TPOT, or TTFT on the decode side, for decode) improved by
	// less than 5% while the pool at least doubled since that latency last
	// improved by more.
	type ref struct {
		n   int
		lat time.Duration
	}
	var refP, refD ref
	var flatP, flatD bool
	var flatNote string
	check := func(r *ref, flat *bool, n int, lat time.Duration, what string) {
		switch {
		case r.n == 0 || lat == infDur || float64(lat) < 0.95*float64(r.lat):
			*r = ref{n, lat}
		case n >= 2*r.n:
			*flat = true
			flatNote += fmt.Sprintf("; %s: %s at %d engines, %s at %d", what, fmtLat(r.lat), r.n, fmtLat(lat), n)
		}
	}
	if maxN < 2 {
		// Nothing to try: the note named a fleet it never simulated.
		return layout{}, fmt.Sprintf("a disaggregated fleet needs two engines at least (a prefill and a decode engine): the search is capped at %d", maxN), nil
	}
	prevTried := l
	for {
		if l.size() > maxN || evals >= maxPDEvals {
			return layout{}, fmt.Sprintf("no disaggregated fleet of up to %d engines meets the SLO in simulation (last tried %s prefill:decode)", maxN, prevTried), nil
		}
		c, err := eval(l)
		if err != nil {
			return layout{}, "", err
		}
		prevTried = l
		if c.Meets {
			break
		}
		next := grow(l, c, slo)
		switch {
		case flatP && next.P > l.P:
			next = layout{P: l.P, D: l.D + max(1, l.D/2)}
		case flatD && next.D > l.D:
			next = layout{P: l.P + max(1, l.P/2), D: l.D}
		}
		if c.Failed == 0 {
			if next.P > l.P {
				check(&refP, &flatP, l.P, c.TTFT.AtSLO, "prefill pool, TTFT")
			}
			if next.D > l.D {
				lat, what := c.TTFT.AtSLO, "decode pool, TTFT"
				if slo.TPOT.Set() && c.TPOT.AtSLO > slo.TPOT.Limit {
					lat, what = c.TPOT.AtSLO, "decode pool, TPOT"
				}
				check(&refD, &flatD, l.D, lat, what)
			}
		}
		if flatP && flatD {
			return layout{}, "the SLO latencies stop improving with more prefill or decode engines" + flatNote +
				": the tail is the slowest requests' own prefill, handoff and first step, which no fleet size shortens", nil
		}
		l = fitCap(l, next, maxN)
	}
	// Shrink: the smallest passing count of each pool with the other
	// fixed, until neither changes: steps down of 1, 1, 2, 4, ... (the
	// answer is usually next to the start) until one fails, then bisect.
	// After a pass, the fleets one engine smaller than it run together
	// (the next trials, and the node-lost runs if it is the answer).
	for changed := true; changed && evals < maxPDEvals; {
		changed = false
		for _, pool := range []*int{&l.P, &l.D} {
			hi := *pool
			lo := 0 // largest known failing count (0: none known)
			down := true
			for step, ok := 1, 0; hi-lo > 1 && evals < maxPDEvals; {
				mid := (lo + hi) / 2
				if down {
					mid = max(lo+1, hi-step)
					if ok++; ok >= 2 {
						step *= 2
					}
				}
				trial := l
				if pool == &l.P {
					trial.P = mid
				} else {
					trial.D = mid
				}
				c, err := eval(trial)
				if err != nil {
					return layout{}, "", err
				}
				if c.Meets {
					hi = mid
					if err := s.prefetch(ctx, confirm, neighbours(trial)...); err != nil {
						return layout{}, "", err
					}
				} else {
					lo, down = mid, false
				}
			}
			if hi != *pool {
				*pool, changed = hi, true
			}
		}
	}
	return l, "", nil
}

// fitCap returns next, the growth of l, within maxN engines: a pool that
// grows alone takes the room left, or, with none left, one engine from the
// other pool. Without it a start at the cap (the plan scales the
// analytical start down to it) ended the search after one candidate. When
// both pools grow there is nothing to move: next is returned as it is.
func fitCap(l, next layout, maxN int) layout {
	if next.size() <= maxN || l.size() > maxN {
		return next
	}
	room := maxN - l.size()
	switch {
	case next.P > l.P && next.D == l.D:
		if room > 0 {
			return layout{P: l.P + room, D: l.D}
		}
		if l.D > 1 {
			return layout{P: l.P + 1, D: l.D - 1}
		}
	case next.D > l.D && next.P == l.P:
		if room > 0 {
			return layout{P: l.P, D: l.D + room}
		}
		if l.P > 1 {
			return layout{P: l.P - 1, D: l.D + 1}
		}
	}
	return next
}

// neighbours are the layouts one engine smaller (one lost node).
func neighbours(l layout) []layout {
	var out []layout
	switch {
	case !l.pd():
		if l.A > 1 {
			out = append(out, layout{A: l.A - 1})
		}
	default:
		if l.P > 1 {
			out = append(out, layout{P: l.P - 1, D: l.D})
		}
		if l.D > 1 {
			out = append(out, layout{P: l.P, D: l.D - 1})
		}
	}
	return out
}

// confirmed is a fleet confirmed on the confirming workload: the mean over
// the seeds, each seed's run, the fleets one engine smaller (first seed)
// and the burst (first seed).
type confirmed struct {
	l      layout
	mean   Candidate
	seeds  []Candidate
	lost   []Candidate // one per neighbour, first seed
	burst  Candidate
	note   string
	passes bool
}

// confirmFleet finishes a fleet found on the confirming workload with the
// first seed: it runs the other seeds and the burst, and the fleets one
// engine smaller (node lost) with the first seed, at once. When the mean
// over the seeds misses (the fleet passed with the first seed only), the
// fleet grows and is confirmed again; bounded to a few rounds.
func (s *search) confirmFleet(ctx context.Context, l layout) (*confirmed, error) {
	in := s.in
	key := func(l layout, seed uint64, scale float64) runKey {
		return runKey{l: l, confirm: true, seed: seed, scale: scale}
	}
	var c *confirmed
	for round := 0; round < 4 && l.valid() && l.size() <= in.MaxEngines; round++ {
		var keys []runKey
		for _, sd := range s.seeds {
			keys = append(keys, key(l, sd, 1))
		}
		nbs := neighbours(l)
		for _, nb := range nbs {
			keys = append(keys, key(nb, s.seeds[0], 1))
		}
		keys = append(keys, key(l, s.seeds[0], in.Burst))
		got, err := s.runAll(ctx, keys)
		if err != nil {
			return nil, err
		}
		ns := len(s.seeds)
		c = &confirmed{l: l, seeds: got[:ns], lost: got[ns : ns+len(nbs)], burst: got[len(got)-1]}
		c.mean = combine(in, c.seeds)
		c.passes = c.mean.Meets
		if c.passes {
			return c, nil
		}
		l = grow(l, c.mean, in.SLO)
	}
	if c != nil {
		c.note = fmt.Sprintf("the fleet found with seed %d misses the SLO on the mean over seeds %v, and so do the larger fleets tried up to %s",
			s.seeds[0], s.seeds, c.l)
	}
	return c, nil
}

// combine averages a fleet's runs over seeds: each latency percentile and
// rate is the mean of the runs' values; the fleet meets the SLO when the
// mean latencies at the SLO quantiles do and no request failed.
func combine(in *Input, cs []Candidate) Candidate {
	out := cs[0]
	if len(cs) == 1 {
		return out
	}
	n := float64(len(cs))
	avgD := func(get func(*Candidate) time.Duration) time.Duration {
		var s float64
		for i := range cs {
			v := get(&cs[i])
			if v == infDur {
				return infDur
			}
			s += float64(v)
		}
		return time.Duration(s / n)
	}
	avgF := func(get func(*Candidate) float64) float64 {
		var s float64
		for i := range cs {
			s += get(&cs[i])
		}
		return s / n
	}
	avgL := func(get func(*Candidate) *Latency) Latency {
		return Latency{
			P50:   avgD(func(c *Candidate) time.Duration { return get(c).P50 }),
			P90:   avgD(func(c *Candidate) time.Duration { return get(c).P90 }),
			P99:   avgD(func(c *Candidate) time.Duration { return get(c).P99 }),
			AtSLO: avgD(func(c *Candidate) time.Duration { return get(c).AtSLO }),
		}
	}
	out.TTFT = avgL(func(c *Candidate) *Latency { return &c.TTFT })
	out.TPOT = avgL(func(c *Candidate) *Latency { return &c.TPOT })
	out.Attainment = avgF(func(c *Candidate) float64 { return c.Attainment })
	out.TTFTAttainment = avgF(func(c *Candidate) float64 { return c.TTFTAttainment })
	out.TPOTAttainment = avgF(func(c *Candidate) float64 { return c.TPOTAttainment })
	out.ThroughputRPS = avgF(func(c *Candidate) float64 { return c.ThroughputRPS })
	out.OutputTPS = avgF(func(c *Candidate) float64 { return c.OutputTPS })
	out.HitRate = avgF(func(c *Candidate) float64 { return c.HitRate })
	out.Utilisation = avgF(func(c *Candidate) float64 { return c.Utilisation })
	out.PrefillUtil = avgF(func(c *Candidate) float64 { return c.PrefillUtil })
	out.DecodeUtil = avgF(func(c *Candidate) float64 { return c.DecodeUtil })
	out.Disaggregated = avgF(func(c *Candidate) float64 { return c.Disaggregated })
	out.decodeBatch = avgF(func(c *Candidate) float64 { return c.decodeBatch })
	out.tailPrefill = avgF(func(c *Candidate) float64 { return c.tailPrefill })
	out.tailDecode = avgF(func(c *Candidate) float64 { return c.tailDecode })
	out.Preemptions, out.Failed = 0, 0
	for i := range cs {
		out.Preemptions += cs[i].Preemptions
		out.Failed += cs[i].Failed
	}
	if out.Fabric != nil {
		f := *out.Fabric
		fab := func(get func(*FabricNeed) float64) float64 {
			return avgF(func(c *Candidate) float64 {
				if c.Fabric == nil {
					return 0
				}
				return get(c.Fabric)
			})
		}
		f.Total = fab(func(x *FabricNeed) float64 { return x.Total })
		f.PerDecodeMean = fab(func(x *FabricNeed) float64 { return x.PerDecodeMean })
		f.PerDecodeP99 = fab(func(x *FabricNeed) float64 { return x.PerDecodeP99 })
		f.PerDecodeMax = fab(func(x *FabricNeed) float64 { return x.PerDecodeMax })
		f.LinkUtilMean = fab(func(x *FabricNeed) float64 { return x.LinkUtilMean })
		f.LinkUtilP99 = fab(func(x *FabricNeed) float64 { return x.LinkUtilP99 })
		f.TransferP50 = time.Duration(fab(func(x *FabricNeed) float64 { return float64(x.TransferP50) }))
		f.TransferP99 = time.Duration(fab(func(x *FabricNeed) float64 { return float64(x.TransferP99) }))
		f.QueueP99 = time.Duration(fab(func(x *FabricNeed) float64 { return float64(x.QueueP99) }))
		out.Fabric = &f
	}
	out.Seed = 0
	out.Meets = out.Failed == 0 && meets(out.TTFT, in.SLO.TTFT) && meets(out.TPOT, in.SLO.TPOT)
	return out
}

// spread is the range of a confirmed fleet's runs over the seeds.
func spread(in *Input, cs []Candidate) *Spread {
	sp := &Spread{Requests: cs[0].Requests}
	for i, c := range cs {
		sp.Seeds = append(sp.Seeds, c.Seed)
		t, p := atOr99(c.TTFT, in.SLO.TTFT), atOr99(c.TPOT, in.SLO.TPOT)
		if i == 0 {
			sp.TTFT = [2]time.Duration{t, t}
			sp.TTFTP90 = [2]time.Duration{c.TTFT.P90, c.TTFT.P90}
			sp.TTFTP99 = [2]time.Duration{c.TTFT.P99, c.TTFT.P99}
			sp.TPOT = [2]time.Duration{p, p}
			sp.ThroughputRPS = [2]float64{c.ThroughputRPS, c.ThroughputRPS}
			continue
		}
		sp.TTFT = [2]time.Duration{min(sp.TTFT[0], t), max(sp.TTFT[1], t)}
		sp.TTFTP90 = [2]time.Duration{min(sp.TTFTP90[0], c.TTFT.P90), max(sp.TTFTP90[1], c.TTFT.P90)}
		sp.TTFTP99 = [2]time.Duration{min(sp.TTFTP99[0], c.TTFT.P99), max(sp.TTFTP99[1], c.TTFT.P99)}
		sp.TPOT = [2]time.Duration{min(sp.TPOT[0], p), max(sp.TPOT[1], p)}
		sp.ThroughputRPS = [2]float64{min(sp.ThroughputRPS[0], c.ThroughputRPS), max(sp.ThroughputRPS[1], c.ThroughputRPS)}
	}
	return sp
}

// summarise turns a run into a candidate: failed requests count as missing
// every target.
//
// The first warm requests are simulated but not measured: they run on cold
// caches and an empty fleet, which a long-running fleet does not have.
func summarise(in *Input, l layout, r *sim.Result, warm int) Candidate {
	c := Candidate{Engines: l.size(), Prefill: l.P, Decode: l.D}
	var ttft, tpot []time.Duration
	met, metTTFT, metTPOT, nTPOT, ok, disagg := 0, 0, 0, 0, 0, 0
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
		ok++
		if rec.PrefillEngine != "" {
			disagg++
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
		} else {
			// Where the slow requests waited: the prefill pool, or the
			// handoff and the decode node.
			if rec.PrefillEngine != "" {
				c.tailPrefill += (rec.Queue + rec.Prefill).Seconds()
				c.tailDecode += (rec.Transfer + rec.FirstDecode).Seconds()
			} else {
				c.tailDecode += rec.TTFT.Seconds()
			}
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
	decoders := l.A + l.D
	if span := (lastArrival - firstDone).Seconds(); firstDone >= 0 && span > 0 {
		c.ThroughputRPS = float64(doneIn) / span
		c.OutputTPS = float64(outIn) / span
		c.decodeBatch = batchSeconds / span / float64(decoders)
	}
	if prompt > 0 {
		c.HitRate = float64(cached) / float64(prompt)
	}
	if ok > 0 {
		c.Disaggregated = float64(disagg) / float64(ok)
	}
	var u, up, ud float64
	for _, e := range r.Engines {
		u += e.Utilisation
		c.Preemptions += e.Preemptions
		switch e.Role {
		case "prefill":
			up += e.Utilisation
		case "decode":
			ud += e.Utilisation
		}
	}
	if len(r.Engines) > 0 {
		c.Utilisation = u / float64(len(r.Engines))
	}
	if l.pd() {
		c.PrefillUtil, c.DecodeUtil = up/float64(l.P), ud/float64(l.D)
		fl := r.FabricLoad(time.Second)
		link := in.Fabric
		bw := link.BytesPerSecond()
		c.Fabric = &FabricNeed{Link: link.Name, Gbps: link.Gbps, Total: fl.Total, PerDecodeMean: fl.PerDecodeMean,
			PerDecodeP99: fl.PerDecodeP99, PerDecodeMax: fl.PerDecodeMax, LinkUtilMean: fl.PerDecodeMean / bw,
			LinkUtilP99: fl.PerDecodeP99 / bw, TransferP50: fl.TimeP50, TransferP99: fl.TimeP99, QueueP99: fl.QueueP99,
			Source: fmt.Sprintf("simulated: %d KV handoffs through disagg.Fabric (setup, queueing behind transfers on the same ports, wire), one-second windows", fl.Transfers)}
	}
	c.Meets = c.Failed == 0 && meets(c.TTFT, in.SLO.TTFT) && meets(c.TPOT, in.SLO.TPOT)
	return c
}

// simWorkload returns the first limit requests of w (a time window from the
// start, arrival offsets kept), or all of them when limit is negative or
// larger.
func simWorkload(w *workload.Workload, limit int) []workload.Request {
	if limit < 0 || len(w.Requests) <= limit {
		return w.Requests
	}
	return w.Requests[:limit]
}

package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

// TTFTBounds returns, for each request of reqs (in the same order), a lower
// bound on its time to first token on the fleet's engines that no routing
// policy can beat under the engine model, not counting the network (Run
// adds the router<->engine round trip, Record.TTFTBound):
//
//   - a perfect cache: the prompt tokens the oracle serves (every block an
//     earlier request had, anywhere in the fleet, is a hit, at most
//     (L-1)/blockSize blocks of an L-token prompt, requests taken in arrival
//     order; see OracleHitRate) cost nothing;
//   - no queueing: the rest of the prompt is prefilled on an idle engine,
//     alone in every batch, in vLLM's chunks of at most
//     max_num_batched_tokens, each step timed by engine.Profile.StepTime
//     (divided by the group's Speed), the first token coming at the end of
//     the last chunk's step, as engine.Engine runs a lone request.
//
// That lone prefill is the bound, except where the cost model lets a busy
// engine do better. A step's attention costs the larger of its FLOPs and
// the read of the cached context it attends to, so a last chunk of a few
// tokens over a long context costs its KV read, and a schedule whose last
// chunk is longer finishes sooner: the earlier chunks shared their steps
// with other requests (8,193 uncached tokens as 8,132 + 61 instead of 8,192
// + 1), or the engine had fewer blocks cached, so the last chunk starts
// earlier and reads less. The bound takes the cheapest such schedule,
// knowing what any schedule must pay: every step before the last is full
// (the engine cuts a request's chunk short only when the step's token
// budget is spent) and costs at least a full budget's GEMMs plus the
// attention FLOPs of the prompt positions it computes, and the last step
// costs at least what its chunk costs alone. The difference is small (the
// KV read of the context, at most a few ms for a 100k-token prompt) and
// only ever lowers the bound.
//
// A fleet of several groups (other profiles, overrides or speeds, or the
// prefill and decode groups of a P/D fleet) gives each request its lowest
// bound over the groups that can hold it: any engine may run its prefill,
// and a disaggregated request's first token also waits for the KV
// transfer and the decode engine's step. A request no group can hold
// (longer than every engine's context) gets 0.
//
// Like OracleHitRate, the bounds depend on the workload and the fleet, not
// on the policy: compute them once and pass them in Config.TTFTBounds to
// several runs.
func TTFTBounds(fleet Fleet, reqs []workload.Request) ([]time.Duration, error) {
	if err := fleet.Validate(); err != nil {
		return nil, fmt.Errorf("sim: ttft bounds: %w", err)
	}
	pd := (&Config{Fleet: fleet}).pdOn()
	out := make([]time.Duration, len(reqs))
	hits := map[int][]int{} // oracle hits per request, by block size
	var done []boundModel
	for gi := range fleet {
		m, err := newBoundModel(&fleet[gi], pd)
		if err != nil {
			return nil, fmt.Errorf("sim: ttft bounds: group %d (%s): %w", gi, fleet[gi].name(), err)
		}
		dup := false
		for _, d := range done {
			dup = dup || d == m
		}
		if dup {
			continue
		}
		done = append(done, m)
		h, ok := hits[m.bs]
		if !ok {
			h = oracleHits(reqs, m.bs)
			hits[m.bs] = h
		}
		for i := range reqs {
			r := &reqs[i]
			if !m.fits(r) {
				continue
			}
			if b := m.ttft(r.PromptLen, h[i]); out[i] == 0 || b < out[i] {
				out[i] = b
			}
		}
	}
	return out, nil
}

// boundModel is one fleet group's engine, as TTFTBounds times it.
type boundModel struct {
	prof   engine.Profile // with the group's overrides
	speed  float64
	budget int // max_num_batched_tokens
	bs     int
	maxLen int
	// prefillLeg: a P/D fleet's prefill group, which runs prefill legs
	// (max_tokens 1) only.
	prefillLeg bool
	full       time.Duration // a step of a full budget of prompt tokens and no attention
}

func newBoundModel(g *Group, pd bool) (boundModel, error) {
	prof, err := g.profile()
	if err != nil {
		return boundModel{}, err
	}
	// The engine applies the group's overrides (and checks them) exactly
	// as newSimulation's engines do.
	e, err := engine.New(engine.Config{Profile: prof, NumGPUBlocks: g.NumGPUBlocks, MaxNumSeqs: g.MaxNumSeqs,
		MaxNumBatchedTokens: g.MaxNumBatchedTokens, Speed: g.Speed, NoEvents: true})
	if err != nil {
		return boundModel{}, err
	}
	p := e.Profile()
	role, _ := kvroute.ParseRole(g.Role) // Validate checked it
	m := boundModel{prof: p, speed: g.Speed, budget: p.MaxNumBatchedTokens, bs: p.BlockSize, maxLen: p.MaxModelLen,
		prefillLeg: pd && role == kvroute.RolePrefill}
	if m.speed == 0 {
		m.speed = 1
	}
	m.full = m.step(engine.Batch{PrefillTokens: m.budget, Seqs: 1})
	return m, nil
}

// fits reports whether the group's engines accept r (engine.Engine.Add's
// length check, with the sim's max_tokens: the output length, 1 for a
// prefill leg).
func (m *boundModel) fits(r *workload.Request) bool {
	n, out := r.PromptLen, r.OutputLen
	if m.prefillLeg {
		out = 1
	}
	if n <= 0 {
		return false
	}
	if out == 0 {
		return n < m.maxLen
	}
	return n+out <= m.maxLen
}

// step is the modelled duration of one step of batch b. The engine rounds
// seconds/speed to the nanosecond; StepTime rounds seconds, so with a
// speed other than 1 the result is the least the engine's can be.
func (m *boundModel) step(b engine.Batch) time.Duration {
	d := m.prof.StepTime(b)
	if m.speed != 1 {
		d = time.Duration(math.Round((float64(d) - 0.5) / m.speed))
	}
	return d
}

// pairs is the attention work (query x key pairs) of computing prompt
// positions [x, x+n) in one chunk, as the engine counts it.
func pairs(x, n int) float64 { return float64(n) * (float64(x) + float64(n)/2) }

// chunk is a lone request's step computing positions [x, x+n); the last
// chunk samples the first token.
func chunk(x, n int, last bool) engine.Batch {
	b := engine.Batch{PrefillTokens: n, PrefillAttnPairs: pairs(x, n), PrefillContext: x, Seqs: 1}
	if last {
		b.Sampled = 1
	}
	return b
}

// ttft returns the bound for a prompt of L tokens of which the oracle
// serves c (see TTFTBounds).
func (m *boundModel) ttft(L, c int) time.Duration {
	B := m.budget
	// The lone prefill, step by step as the engine runs it.
	var best time.Duration
	for x := c; x < L; {
		n := min(L-x, B)
		best += m.step(chunk(x, n, x+n == L))
		x += n
	}
	// Schedules whose last chunk is the last n positions, at context L-n,
	// after j full steps that compute positions [c, L-n) (j = 0 when the
	// last chunk starts in the cached prefix). A full step costs at least
	// m.full plus the attention FLOPs of what it computes (their KV reads
	// are left out); the attention FLOPs add up over chunks, so they go on
	// the first. floor leaves out the last chunk's KV read as well: within
	// a range of n with the same j it does not decrease with n (the
	// attention FLOPs of all the positions are the same, the last step's
	// GEMMs grow), so once it reaches best no longer last chunk can win.
	try := func(lo, hi, j int) {
		for n := lo; n <= hi; n++ {
			x := L - n
			var early time.Duration
			if j > 0 {
				early = m.step(engine.Batch{PrefillTokens: B, PrefillAttnPairs: pairs(c, x-c), Seqs: 1}) +
					time.Duration(j-1)*m.full
			}
			last := chunk(x, n, true)
			cost := early + m.step(last)
			last.PrefillContext = 0
			if floor := early + m.step(last); floor >= best {
				return
			}
			best = min(best, cost)
		}
	}
	N := L - c
	steps := (N + B - 1) / B
	r := N - (steps-1)*B // the lone prefill's last chunk
	try(r+1, min(B, N), steps-1)
	try(1, r-1, steps)
	try(N+1, min(B, L), 0)
	return best
}

// boundResult fills the records' TTFT bounds (the engines' plus the
// network round trip) and their distribution.
func (s *simulation) boundResult(res *Result) {
	var d []time.Duration
	for i := range res.Records {
		if b := s.bounds[i]; b > 0 {
			res.Records[i].TTFTBound = b + 2*s.cfg.NetLatency
			if res.Records[i].OK() {
				d = append(d, res.Records[i].TTFTBound)
			}
		}
	}
	res.TTFTBound = boundDist(d)
}

// boundDist summarises bounds with the report's nearest-rank percentiles,
// as the TTFT of a report.Row.
func boundDist(d []time.Duration) report.Dist {
	if len(d) == 0 {
		return report.Dist{}
	}
	var sum float64
	hi := d[0]
	for _, v := range d {
		sum += float64(v)
		hi = max(hi, v)
	}
	return report.Dist{N: len(d), Mean: time.Duration(sum / float64(len(d))), P50: report.Percentile(d, 0.50),
		P90: report.Percentile(d, 0.90), P99: report.Percentile(d, 0.99), Max: hi}
}

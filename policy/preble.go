package policy

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute"
)

// PrebleParams configures the preble-e2 baseline.
type PrebleParams struct {
	// Window is the load history window H. Default 3m (Preble's
	// global_scheduler_with_time.py).
	Window time.Duration `param:"window"`
	// PrefillUsPerToken is the prefill time per missed token (Preble fits
	// per-model equations; a linear rate stands in). Default 60.
	PrefillUsPerToken float64 `param:"prefill_us_per_token"`
	// TPOTMs is the time per output token used for the decode part of the
	// load (Preble uses the median of observed TPOTs). Default 20.
	TPOTMs float64 `param:"tpot_ms"`
	// OutputTokens is the expected output length when the request sets no
	// max_tokens (Preble uses the median observed output length). Default 256.
	OutputTokens int `param:"output_tokens"`
}

// Preble reproduces Preble's per-request E2 (exploitation + exploration)
// decision (Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling
// for LLM Serving", ICLR 2025, §3.2; WukLab/preble
// preble/global_scheduler_with_time.py):
//
//   - Exploit when the longest cached prefix is longer than the part that must
//     be computed (cached > new tokens): among the endpoints holding that
//     prefix, pick the lowest load cost.
//   - Explore otherwise: the lowest load cost over all endpoints.
//
// Load cost of endpoint i = L_i + P_i: L_i is the prefill time of the missed
// tokens of the requests routed to i within the window H, plus the decode
// time of its in-flight requests (in flight x output tokens x TPOT); P_i is
// the prefill time of this request's tokens not cached on i. The eviction
// cost M_i (behind Preble's enable_eviction), post-assignment rebalancing and
// hot-prefix autoscaling are not part of E2 and are left out. Defaults:
// window 3m, prefill_us_per_token 60, tpot_ms 20, output_tokens 256.
// Not safe for concurrent use.
type Preble struct {
	buf  scoreBuf // explanation buffers, reused
	p    PrebleParams
	rng  *rand.Rand
	hist map[string]*prebleHist
	tie  []int
}

type prebleHist struct {
	at  []time.Time
	ms  []float64
	sum float64
}

// load drops entries older than since and returns the windowed sum.
func (h *prebleHist) load(since time.Time) float64 {
	k := 0
	for k < len(h.at) && h.at[k].Before(since) {
		h.sum -= h.ms[k]
		k++
	}
	if k > 0 {
		h.at = append(h.at[:0], h.at[k:]...)
		h.ms = append(h.ms[:0], h.ms[k:]...)
		if len(h.at) == 0 {
			h.sum = 0 // no drift from float subtraction
		}
	}
	return math.Max(h.sum, 0)
}

var _ kvroute.Picker = (*Preble)(nil)

func newPreble(params map[string]any, seed uint64) (*Preble, error) {
	p := PrebleParams{Window: 3 * time.Minute, PrefillUsPerToken: 60, TPOTMs: 20, OutputTokens: 256}
	if err := decodeParams(NamePrebleE2, params, &p); err != nil {
		return nil, err
	}
	for _, c := range []error{
		check(NamePrebleE2, "window", p.Window > 0, "must be > 0, got %v", p.Window),
		check(NamePrebleE2, "prefill_us_per_token", p.PrefillUsPerToken >= 0, "must be >= 0, got %v", p.PrefillUsPerToken),
		check(NamePrebleE2, "prefill_us_per_token", p.PrefillUsPerToken <= maxNumberParam, "must be at most %g, got %v", maxNumberParam, p.PrefillUsPerToken),
		check(NamePrebleE2, "tpot_ms", p.TPOTMs >= 0, "must be >= 0, got %v", p.TPOTMs),
		check(NamePrebleE2, "tpot_ms", p.TPOTMs <= maxNumberParam, "must be at most %g, got %v", maxNumberParam, p.TPOTMs),
		check(NamePrebleE2, "output_tokens", p.OutputTokens >= 0, "must be >= 0, got %d", p.OutputTokens),
	} {
		if c != nil {
			return nil, c
		}
	}
	return &Preble{p: p, rng: newRand(seed), hist: make(map[string]*prebleHist)}, nil
}

// ForgetEndpoint implements router.EndpointForgetter: an endpoint removed
// from the pool takes its load window with it, so that an engine added
// later under its ID does not inherit it.
func (pr *Preble) ForgetEndpoint(id string) {
	delete(pr.hist, id)
}

// Pick implements kvroute.Picker.
func (pr *Preble) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	req = orEmpty(req)
	scores := pr.buf.get(cands, 4)
	P := max(req.PromptTokens, 0)
	out := req.MaxTokens
	if out <= 0 {
		out = pr.p.OutputTokens
	}
	maxCached := -1
	for i := range cands {
		if cands[i].Healthy {
			maxCached = max(maxCached, min(max(cands[i].CachedTokens, 0), P))
		}
	}
	if maxCached < 0 {
		return noneHealthy(NamePrebleE2, cands, scores)
	}
	exploit := maxCached > 0 && maxCached > P-maxCached
	since := now.Add(-pr.p.Window)
	tok := pr.p.PrefillUsPerToken / 1000
	best := math.Inf(1)
	for i := range cands {
		c := &cands[i]
		if !c.Healthy {
			continue
		}
		cached := min(max(c.CachedTokens, 0), P)
		hist := 0.0
		if h := pr.hist[endpointID(c)]; h != nil {
			hist = h.load(since)
		}
		decode := float64(max(c.Load.InFlight, 0)) * float64(out) * pr.p.TPOTMs
		prefill := float64(P-cached) * tok
		cost := round3(hist + decode + prefill)
		s := &scores[i]
		s.Value = cost
		s.Parts = append(s.Parts,
			kvroute.Part{Name: "window_prefill_ms", Value: round3(hist)},
			kvroute.Part{Name: "decode_ms", Value: round3(decode)},
			kvroute.Part{Name: "prefill_ms", Value: round3(prefill)},
			kvroute.Part{Name: "cached_tokens", Value: float64(cached)})
		if exploit && cached < maxCached {
			s.Eligible = false
			s.Why = "does not hold the exploited prefix"
			continue
		}
		best = math.Min(best, cost)
	}
	pr.tie = pr.tie[:0]
	for i := range cands {
		if scores[i].Eligible && scores[i].Value == best {
			pr.tie = append(pr.tie, i)
		}
	}
	choice := pr.tie[pr.rng.IntN(len(pr.tie))]
	c := &cands[choice]
	id := endpointID(c)
	h := pr.hist[id]
	if h == nil {
		h = &prebleHist{}
		pr.hist[id] = h
	}
	ms := float64(P-min(max(c.CachedTokens, 0), P)) * tok
	h.at = append(h.at, now)
	h.ms = append(h.ms, ms)
	h.sum += ms
	reason := "explore: lowest load cost"
	if exploit {
		reason = "exploit: cached prefix longer than new tokens, lowest load cost among holders"
	}
	return chose(NamePrebleE2, cands, choice, reason, scores)
}

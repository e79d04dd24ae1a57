package planner

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/workload"
)

// Demand is the workload as the planner sees it: rates, length
// distributions, the oracle hit rate and the hot prefixes.
type Demand struct {
	Requests int           `json:"requests"`
	Span     time.Duration `json:"span_ns"`
	// Rate is requests per second over the span.
	Rate float64 `json:"rate"`
	// ArrivalCV2 is the squared coefficient of variation of inter-arrival
	// gaps (1 for Poisson).
	ArrivalCV2 float64 `json:"arrival_cv2"`
	PromptMean float64 `json:"prompt_mean"`
	PromptP50  int     `json:"prompt_p50"`
	PromptP99  int     `json:"prompt_p99"`
	OutputMean float64 `json:"output_mean"`
	OutputP50  int     `json:"output_p50"`
	OutputP99  int     `json:"output_p99"`
	// MaxContext is the largest prompt + output.
	MaxContext int `json:"max_context"`
	// OracleHitRate is the fraction of prompt tokens an infinite cache
	// shared by the fleet would serve (the upper bound on the hit rate);
	// an adapter's blocks are keyed with its name, as the engine keys
	// them, so no adapter hits another's.
	OracleHitRate float64 `json:"oracle_hit_rate"`
	// Adapters is the number of distinct LoRA adapters the requests name
	// (0: every request is the base model's); AdapterRequests the share of
	// the requests that name one.
	Adapters        int     `json:"adapters,omitempty"`
	AdapterRequests float64 `json:"adapter_requests,omitempty"`
	// HotPrefixes are the most requested shared prefixes (branch points of
	// the prompt tree), most requested first (ties: the longer, then the
	// one requested first).
	HotPrefixes []HotPrefix `json:"hot_prefixes,omitempty"`

	reqs   []workload.Request
	cached []int // oracle-cached tokens per request
}

// HotPrefix is one popular shared prefix and the replicas its load needs.
type HotPrefix struct {
	// Rank is 1 for the most requested prefix.
	Rank int `json:"rank"`
	// Requests is how many requests start with it; Share their fraction.
	Requests int     `json:"requests"`
	Share    float64 `json:"share"`
	// Tokens is the prefix's length.
	Tokens int `json:"tokens"`
	// Load is the engine-seconds per second its requests need (prefill
	// of the uncached part plus decode) at the ideal batch.
	Load float64 `json:"load_engines"`
	// Copies is how many engines must hold the prefix so that none runs
	// above the target utilisation serving it: ceil(Load / MaxUtilisation).
	Copies int `json:"copies"`
}

// analyse computes the demand of w at the engine block size.
func analyse(w *workload.Workload, blockSize int) *Demand {
	reqs := w.Requests
	d := &Demand{Requests: len(reqs), reqs: reqs}
	prompts := make([]int, len(reqs))
	outputs := make([]int, len(reqs))
	var psum, osum float64
	var promptSum int64
	for i := range reqs {
		r := &reqs[i]
		prompts[i], outputs[i] = r.PromptLen, r.OutputLen
		psum += float64(r.PromptLen)
		osum += float64(r.OutputLen)
		promptSum += int64(r.PromptLen)
		d.MaxContext = max(d.MaxContext, r.PromptLen+r.OutputLen)
	}
	d.Adapters = adapters(reqs)
	for i := range reqs {
		if reqs[i].Adapter != "" {
			d.AdapterRequests++
		}
	}
	d.AdapterRequests /= float64(max(1, len(reqs)))
	d.cached = oracleCached(reqs, blockSize)
	var cachedSum int64
	for _, c := range d.cached {
		cachedSum += int64(c)
	}
	if promptSum > 0 {
		d.OracleHitRate = float64(cachedSum) / float64(promptSum)
	}
	n := float64(len(reqs))
	d.PromptMean, d.OutputMean = psum/n, osum/n
	d.PromptP50, d.PromptP99 = quantileInt(prompts, 0.5), quantileInt(prompts, 0.99)
	d.OutputP50, d.OutputP99 = quantileInt(outputs, 0.5), quantileInt(outputs, 0.99)
	d.Span = reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	d.ArrivalCV2 = 1
	if d.Span > 0 && len(reqs) > 1 {
		d.Rate = float64(len(reqs)-1) / d.Span.Seconds()
	} else {
		d.Rate = math.Inf(1)
	}
	if len(reqs) > 2 {
		var m, m2 float64
		for i := 1; i < len(reqs); i++ {
			g := (reqs[i].Arrival - reqs[i-1].Arrival).Seconds()
			m += g
			m2 += g * g
		}
		k := float64(len(reqs) - 1)
		m /= k
		if m > 0 {
			d.ArrivalCV2 = max(0, (m2/k-m*m)/(m*m))
		}
	}
	return d
}

// oracleCached returns, per request in arrival order, the prompt tokens an
// infinite cache shared by the fleet would serve: the leading blocks seen
// before, never the whole prompt (one token is always computed, as in vLLM).
func oracleCached(reqs []workload.Request, blockSize int) []int {
	out := make([]int, len(reqs))
	if segmentsOnly(reqs) {
		// On segments: two prompts share their first n tokens exactly when
		// their leading segments are equal and the next ones have the
		// same key (a shorter segment is a prefix of a longer one). Keep,
		// per chain of leading segments and next key, the longest
		// segment seen.
		longest := map[uint64]int{}
		for i := range reqs {
			shared, matching := 0, true
			// An adapter's chain roots in its name (the engine keys its
			// blocks with it): no adapter shares a block with another.
			chain := uint64(0x706c616e6e6572) ^ adapterRoot(reqs[i].Adapter)
			for _, sg := range reqs[i].Segments {
				k := mix(chain ^ mix(sg.Key))
				l := longest[k]
				if sg.Len > l {
					longest[k] = sg.Len
				}
				if matching {
					shared += min(l, sg.Len)
					matching = l >= sg.Len
				}
				chain = mix(k ^ uint64(sg.Len))
			}
			out[i] = min(shared/blockSize, (reqs[i].PromptLen-1)/blockSize) * blockSize
		}
		return out
	}
	seen := map[uint64]struct{}{}
	var buf []uint64
	for i := range reqs {
		buf = reqs[i].BlockHashes(blockSize, buf[:0])
		lead := true
		hit := 0
		for _, h := range buf {
			if _, ok := seen[h]; ok {
				if lead {
					hit++
				}
				continue
			}
			lead = false
			seen[h] = struct{}{}
		}
		out[i] = min(hit*blockSize, (reqs[i].PromptLen-1)/blockSize*blockSize)
	}
	return out
}

// pulledFloor returns the fewest prompt tokens the KV handoffs of a
// disaggregated fleet serving d can move in all, in whatever order the
// requests reach their decode engines, when the requests with handed[i]
// set are handed off (every request when handed is nil) and the others may
// run whole on a decode node. A decode engine pulls a prompt's tokens past
// its own prefix-cache hit (disagg.PulledTokens: whole blocks, never the
// last token), and its cache holds only full blocks of prompts that
// reached it before, pulled or prefilled there. So every handed-off prompt
// pulls its partial last block, and each distinct full block of the
// handed-off prompts that no other prompt has crosses the fabric at least
// once. With every request handed off that sum is each prompt less the
// most a decode engine can hold of it on arrival (mostCached): the blocks
// are chained, so a block seen before is a leading one. It is a floor on
// the sum, not on each request.
func (d *Demand) pulledFloor(blockSize int, handed []bool) int64 {
	var n int64
	if handed == nil {
		for i := range d.reqs {
			n += int64(max(d.reqs[i].PromptLen-d.mostCached(i, blockSize), 0))
		}
		return n
	}
	if blockSize <= 0 {
		return 0
	}
	// The full blocks of the handed-off prompts, true once a prompt run
	// whole has it (its prefill may leave it on a decode engine).
	shared := map[uint64]bool{}
	var buf []uint64
	for i := range d.reqs {
		if handed[i] {
			buf = d.reqs[i].BlockHashes(blockSize, buf[:0])
			for _, h := range buf {
				shared[h] = false
			}
			n += int64(d.reqs[i].PromptLen % blockSize)
		}
	}
	for i := range d.reqs {
		if handed[i] || len(shared) == 0 {
			continue
		}
		buf = d.reqs[i].BlockHashes(blockSize, buf[:0])
		for _, h := range buf {
			if _, ok := shared[h]; !ok {
				break // chained: no later block of this prompt is there either
			}
			shared[h] = true
		}
	}
	for _, other := range shared {
		if !other {
			n += int64(blockSize)
		}
	}
	return n
}

// mostCached returns the most prompt tokens of request i a decode engine
// can hold when it arrives: the leading blocks an earlier prompt had (the
// oracle's hit before it is capped below the whole prompt), d.cached,
// except that a prompt of whole blocks whose capped hit stops one block
// short may have been seen whole.
func (d *Demand) mostCached(i, blockSize int) int {
	p, c := d.reqs[i].PromptLen, d.cached[i]
	if blockSize > 0 && p > 0 && p%blockSize == 0 && c == p-blockSize {
		return p
	}
	return c
}

// tokenShare is the share of reqs' prompt tokens that cached covers.
func tokenShare(reqs []workload.Request, cached []int) float64 {
	var c, p int64
	for i := range reqs {
		c += int64(cached[i])
		p += int64(reqs[i].PromptLen)
	}
	if p == 0 {
		return 0
	}
	return float64(c) / float64(p)
}

// adapterRoot is 0 for the base model and a key derived from an adapter's
// name (FNV-1a, mixed) otherwise: what the planner's segment chains start
// from, so that two adapters' prompts of the same segments share nothing.
func adapterRoot(name string) uint64 {
	if name == "" {
		return 0
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	return mix(h ^ 0x6c6f7261)
}

// adapters returns the number of distinct LoRA adapters reqs name.
func adapters(reqs []workload.Request) int {
	named := map[string]bool{}
	for i := range reqs {
		if a := reqs[i].Adapter; a != "" {
			named[a] = true
		}
	}
	return len(named)
}

// segmentsOnly reports whether every prompt is given as segments only.
func segmentsOnly(reqs []workload.Request) bool {
	for i := range reqs {
		if reqs[i].Tokens != nil || reqs[i].Text != "" || len(reqs[i].Segments) == 0 {
			return false
		}
	}
	return true
}

// mix is SplitMix64's finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Costs are the per-engine rates the closed-form bounds use, from the engine
// cost model (engine.Profile.StepTime).
type Costs struct {
	// Chunk is the per-step token budget (max_num_batched_tokens).
	Chunk int `json:"chunk_tokens"`
	// PrefillPerToken is the time per prompt token in a full chunk on top
	// of the mean cached context: PrefillTime(Chunk, cached) / Chunk.
	PrefillPerToken time.Duration `json:"prefill_per_token_ns"`
	// PrefillTokensPerSec is 1 / PrefillPerToken.
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_s"`
	// DecodeContext is the mean context of a decoding sequence (prompt +
	// half the output).
	DecodeContext int `json:"decode_context"`
	// DecodeBatch is the largest batch whose step meets the TPOT target
	// and fits the KV cache and max_num_seqs; DecodeStep its step time.
	DecodeBatch int           `json:"decode_batch"`
	DecodeStep  time.Duration `json:"decode_step_ns"`
	// DecodeTokensPerSec is DecodeBatch / DecodeStep.
	DecodeTokensPerSec float64 `json:"decode_tokens_per_s"`
	// KVCapacity is one engine's KV capacity in tokens; KVBytesPerToken
	// the KV bytes a handoff moves per token (disagg.KVShape.BytesPerToken:
	// the model's, or more where the engine's TP ranks replicate KV heads
	// or an MLA latent).
	KVCapacity      int   `json:"kv_capacity_tokens"`
	KVBytesPerToken int64 `json:"kv_bytes_per_token"`
}

func costs(p engine.Profile, capTokens int, d *Demand, slo SLO) Costs {
	c := Costs{Chunk: p.MaxNumBatchedTokens, KVCapacity: capTokens, KVBytesPerToken: disagg.ShapeOf(p).BytesPerToken()}
	meanCached := int(d.OracleHitRate * d.PromptMean)
	pt := p.PrefillTime(c.Chunk, meanCached)
	c.PrefillPerToken = pt / time.Duration(c.Chunk)
	c.PrefillTokensPerSec = float64(c.Chunk) / pt.Seconds()
	c.DecodeContext = int(d.PromptMean + d.OutputMean/2)
	perSeq := max(1, int(d.PromptMean+d.OutputMean))
	maxB := max(1, min(p.MaxNumSeqs, capTokens/perSeq))
	b := maxB
	if slo.TPOT.Set() {
		// The largest batch whose step meets the TPOT target.
		lo, hi := 1, maxB
		if p.DecodeTime(1, c.DecodeContext) > slo.TPOT.Limit {
			hi = 1
		}
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if p.DecodeTime(mid, c.DecodeContext) <= slo.TPOT.Limit {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		b = lo
	}
	c.DecodeBatch = b
	c.DecodeStep = p.DecodeTime(b, c.DecodeContext)
	c.DecodeTokensPerSec = float64(b) / c.DecodeStep.Seconds()
	return c
}

// chunkedPrefill is the time to prefill q uncached tokens on top of cached
// ones on an otherwise idle engine, in chunks of the step budget; the last
// chunk's step also produces the first token. q < 1 is taken as 1 (the
// token computed again for its logits). See chunkedPrefiller.
func chunkedPrefill(p engine.Profile, q, cached int) time.Duration {
	return chunkedPrefiller(p)(q, cached)
}

// chunkedPrefiller returns chunkedPrefill for p with its cost constants
// derived once: engine.StepCost.ChunkedPrefill with no decodes, which sums
// the budget-sized steps (each p.PrefillTime of its chunk at the tokens
// before it) in closed form, O(1) whatever the prompt, within half a
// nanosecond per full chunk (and 2 ns) of adding them one by one.
func chunkedPrefiller(p engine.Profile) func(q, cached int) time.Duration {
	s := engine.NewStepCost(p)
	budget := max(1, p.MaxNumBatchedTokens)
	return func(q, cached int) time.Duration {
		return s.ChunkedPrefill(max(q, 1), cached, budget, 0, 0)
	}
}

func quantileInt(v []int, q float64) int {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[rankIndex(len(s), q)]
}

func quantileDur(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[rankIndex(len(s), q)]
}

// rankIndex is the nearest-rank index of quantile q among n sorted values.
func rankIndex(n int, q float64) int {
	i := int(math.Ceil(q*float64(n))) - 1
	return min(max(i, 0), n-1)
}

package policy

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute"
)

// LLMDParams configures the llm-d baseline: the weights of llm-d's default
// scheduling profile (llm-d/llm-d guides, "well-lit path" EPP config).
type LLMDParams struct {
	// PrefixWeight weighs prefix-cache-scorer. Default 3.
	PrefixWeight float64 `param:"prefix_weight"`
	// QueueWeight weighs queue-scorer. Default 2.
	QueueWeight float64 `param:"queue_weight"`
	// KVWeight weighs kv-cache-utilization-scorer. Default 2.
	KVWeight float64 `param:"kv_weight"`
}

// LLMD reproduces the llm-d / Gateway API Inference Extension endpoint picker
// with its default weighted scorers (llm-d-router
// pkg/epp/framework/plugins/scorer/*/README.md) and max-score-picker:
//
//	prefix-cache-scorer (3): matchBlocks / totalBlocks of the request
//	queue-scorer (2):        (maxQ - q) / (maxQ - minQ) over the candidates, 1 for all when equal
//	kv-cache-utilization (2): 1 - KV usage
//
// The endpoint with the highest weighted sum wins; max-score-picker shuffles
// before sorting, so ties break at random. The prefix match is the
// approximate producer's: the router's record of what it routed, per
// endpoint (Candidate.CachedBlocks over len(Request.BlockHashes); llm-d
// clamps its block size up to 64 tokens, configure the router's index
// accordingly for a like-for-like run). q is the engine's waiting queue.
// A request's LoRA adapter plays no part: llm-d's lora-affinity-scorer
// (adapter active 1, not loaded with a free slot 0.8, waiting 0.6) is not
// in that default profile (the router still offers only the endpoints
// that serve the adapter). Not safe for concurrent use.
type LLMD struct {
	buf scoreBuf // explanation buffers, reused
	p   LLMDParams
	rng *rand.Rand
	tie []int
}

var _ kvroute.Picker = (*LLMD)(nil)

func newLLMD(params map[string]any, seed uint64) (*LLMD, error) {
	p := LLMDParams{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2}
	if err := decodeParams(NameLLMD, params, &p); err != nil {
		return nil, err
	}
	for _, c := range []error{
		check(NameLLMD, "prefix_weight", p.PrefixWeight >= 0, "must be >= 0, got %v", p.PrefixWeight),
		check(NameLLMD, "queue_weight", p.QueueWeight >= 0, "must be >= 0, got %v", p.QueueWeight),
		check(NameLLMD, "kv_weight", p.KVWeight >= 0, "must be >= 0, got %v", p.KVWeight),
	} {
		if c != nil {
			return nil, c
		}
	}
	return &LLMD{p: p, rng: newRand(seed)}, nil
}

// Pick implements kvroute.Picker.
func (l *LLMD) Pick(_ time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	req = orEmpty(req)
	scores := l.buf.get(cands, 3)
	minQ, maxQ := math.MaxInt, math.MinInt
	for i := range cands {
		if cands[i].Healthy {
			q := cands[i].Load.Waiting
			minQ, maxQ = min(minQ, q), max(maxQ, q)
		}
	}
	if minQ == math.MaxInt {
		return noneHealthy(NameLLMD, cands, scores)
	}
	total := len(req.BlockHashes)
	best := math.Inf(-1)
	for i := range cands {
		c := &cands[i]
		if !c.Healthy {
			continue
		}
		prefix := 0.0
		if total > 0 {
			prefix = float64(min(max(c.CachedBlocks, 0), total)) / float64(total)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-c.Load.Waiting) / float64(maxQ-minQ)
		}
		u := c.Load.KVUsage
		if math.IsNaN(u) {
			u = 1 // unknown: scored as full, not NaN (no candidate would equal a NaN best)
		}
		kv := 1 - math.Min(math.Max(u, 0), 1)
		v := round3(l.p.PrefixWeight*prefix + l.p.QueueWeight*queue + l.p.KVWeight*kv)
		s := &scores[i]
		s.Value = v
		s.Parts = append(s.Parts,
			kvroute.Part{Name: "prefix", Value: round3(prefix)},
			kvroute.Part{Name: "queue", Value: round3(queue)},
			kvroute.Part{Name: "kv_cache_utilization", Value: round3(kv)})
		best = math.Max(best, v)
	}
	l.tie = l.tie[:0]
	for i := range cands {
		if cands[i].Healthy && scores[i].Value == best {
			l.tie = append(l.tie, i)
		}
	}
	return chose(NameLLMD, cands, l.tie[l.rng.IntN(len(l.tie))], "max weighted score (higher is better)", scores)
}

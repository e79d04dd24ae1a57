package policy

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute"
)

// DynamoParams configures the dynamo baseline; defaults are Dynamo's
// (KvRouterConfig::default, docs/components/router/router-configuration.md).
type DynamoParams struct {
	// BlockSize is the KV block size in tokens; 0 (default) uses the
	// request's BlockSize, or 16 when that is unset too.
	BlockSize int `param:"block_size"`
	// PrefillLoadScale weighs the prefill blocks (the old
	// overlap_score_weight). Default 1.
	PrefillLoadScale float64 `param:"prefill_load_scale"`
	// OverlapScoreCredit is the credit per cached device block. Default 1.
	OverlapScoreCredit float64 `param:"overlap_score_credit"`
	// HostCacheHitWeight is the credit per block cached in host memory.
	// Default 0.75.
	HostCacheHitWeight float64 `param:"host_cache_hit_weight"`
	// Temperature 0 (default) picks the lowest cost; above 0 the costs are
	// normalised to [-1/T, 0] and sampled by softmax.
	Temperature float64 `param:"temperature"`
}

// Dynamo reproduces NVIDIA Dynamo's KV router selection
// (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector.rs,
// docs/components/router/router-concepts.md):
//
//	prefill_blocks = max(active_prefill_blocks + prompt_blocks - overlap_credit, 0)
//	decode_blocks  = active_decode_blocks + prompt_blocks
//	cost           = prefill_load_scale x prefill_blocks + decode_blocks   (lowest wins)
//
// with overlap_credit = overlap_score_credit x cached device blocks +
// host_cache_hit_weight x cached host blocks. Active prefill blocks are, as
// Dynamo's ActiveSequences counts them (new_tokens, mark_prefill_completed),
// the uncached tokens of the requests in flight that have not produced a
// first token: the router's in-flight prompt tokens (Load.InFlightTokens)
// less the tokens cached for the requests this picker sent there, which it
// keeps until their first token (FirstToken) or end (Release). Active decode
// blocks are the router's decoding context (Load.DecodeTokens), both in
// blocks. At temperature 0 the argmin wins;
// Dynamo breaks ties by the smaller radix tree, which a picker cannot see,
// so ties break at random here. Defaults: prefill_load_scale 1,
// overlap_score_credit 1, host_cache_hit_weight 0.75, temperature 0.
// Not safe for concurrent use.
type Dynamo struct {
	buf scoreBuf // explanation buffers, reused
	p   DynamoParams
	rng *rand.Rand
	tie []int

	// pending holds the requests sent that have no first token yet (by
	// request), and cached, per endpoint, the sum of their cached tokens:
	// the part of Load.InFlightTokens that is no prefill work.
	pending map[pendingKey]dynamoPending
	cached  map[string]int
	picks   uint64
	sweepAt int // pending's size above which a Pick sweeps (past pendingSweepMin)
	sweeps  int // sweeps done
}

type dynamoPending struct {
	endpoint string
	cached   int
	at       time.Time
}

// dynamoPendingTTL bounds how long a request waits for its first token or
// Release before it is dropped (a driver that reports neither cannot grow
// pending without bound).
const dynamoPendingTTL = 10 * time.Minute

var (
	_ kvroute.Picker   = (*Dynamo)(nil)
	_ kvroute.Releaser = (*Dynamo)(nil)
	_ interface {
		FirstToken(time.Time, *kvroute.Request, string)
	} = (*Dynamo)(nil) // router.FirstTokenObserver
	_ interface{ ForgetEndpoint(string) } = (*Dynamo)(nil) // router.EndpointForgetter
)

func newDynamo(params map[string]any, seed uint64) (*Dynamo, error) {
	p := DynamoParams{PrefillLoadScale: 1, OverlapScoreCredit: 1, HostCacheHitWeight: 0.75}
	if err := decodeParams(NameDynamo, params, &p); err != nil {
		return nil, err
	}
	for _, c := range []error{
		check(NameDynamo, "block_size", p.BlockSize >= 0, "must be >= 0, got %d", p.BlockSize),
		check(NameDynamo, "prefill_load_scale", p.PrefillLoadScale >= 0, "must be >= 0, got %v", p.PrefillLoadScale),
		check(NameDynamo, "prefill_load_scale", p.PrefillLoadScale <= maxNumberParam, "must be at most %g, got %v", maxNumberParam, p.PrefillLoadScale),
		check(NameDynamo, "overlap_score_credit", p.OverlapScoreCredit >= 0, "must be >= 0, got %v", p.OverlapScoreCredit),
		check(NameDynamo, "host_cache_hit_weight", p.HostCacheHitWeight >= 0, "must be >= 0, got %v", p.HostCacheHitWeight),
		check(NameDynamo, "temperature", p.Temperature >= 0, "must be >= 0, got %v", p.Temperature),
	} {
		if c != nil {
			return nil, c
		}
	}
	return &Dynamo{p: p, rng: newRand(seed), pending: make(map[pendingKey]dynamoPending), cached: make(map[string]int)}, nil
}

// Pick implements kvroute.Picker.
func (d *Dynamo) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	req = orEmpty(req)
	scores := d.buf.get(cands, 4)
	bs := d.p.BlockSize
	if bs == 0 {
		bs = req.BlockSize
	}
	if bs <= 0 {
		bs = 16
	}
	fbs := float64(bs)
	promptBlocks := math.Ceil(float64(max(req.PromptTokens, 0)) / fbs)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range cands {
		c := &cands[i]
		if !c.Healthy {
			continue
		}
		credit := d.p.OverlapScoreCredit
		if c.Tier == kvroute.TierCPU {
			credit = d.p.HostCacheHitWeight
		}
		// CachedBlocks counts the request's blocks (req.BlockSize tokens each).
		overlap := float64(max(c.CachedTokens, 0)) / fbs * credit
		activePrefill := float64(max(c.Load.InFlightTokens-d.cached[endpointID(c)], 0)) / fbs
		prefill := math.Max(activePrefill+promptBlocks-overlap, 0)
		activeDecode := float64(max(c.Load.DecodeTokens, 0)) / fbs
		decode := activeDecode + promptBlocks
		cost := d.p.PrefillLoadScale*prefill + decode
		s := &scores[i]
		s.Value = round3(cost)
		s.Parts = append(s.Parts,
			kvroute.Part{Name: "overlap_blocks", Value: round3(overlap)},
			kvroute.Part{Name: "prefill_blocks", Value: round3(prefill)},
			kvroute.Part{Name: "active_decode_blocks", Value: round3(activeDecode)},
			kvroute.Part{Name: "decode_blocks", Value: round3(decode)})
		lo, hi = math.Min(lo, cost), math.Max(hi, cost)
	}
	if math.IsInf(lo, 1) {
		return noneHealthy(NameDynamo, cands, scores)
	}
	if d.p.Temperature > 0 {
		i := d.softmax(cands, scores, lo, hi)
		d.record(now, req, &cands[i])
		return chose(NameDynamo, cands, i, "softmax sample over costs", scores)
	}
	d.tie = d.tie[:0]
	for i := range cands {
		if cands[i].Healthy && scores[i].Value == round3(lo) {
			d.tie = append(d.tie, i)
		}
	}
	i := d.tie[d.rng.IntN(len(d.tie))]
	d.record(now, req, &cands[i])
	return chose(NameDynamo, cands, i, "lowest cost", scores)
}

// record notes that req goes to c: its cached tokens count against c's
// in-flight prompt tokens until its first token or end.
func (d *Dynamo) record(now time.Time, req *kvroute.Request, c *kvroute.Candidate) {
	key := reqKey(req)
	d.drop(key) // a retry of the same request: replace
	pr := dynamoPending{endpoint: endpointID(c), cached: min(max(c.CachedTokens, 0), max(req.PromptTokens, 0)), at: now}
	d.pending[key] = pr
	d.cached[pr.endpoint] += pr.cached
	if d.picks++; d.picks%4096 == 0 || len(d.pending) > max(d.sweepAt, pendingSweepMin) {
		d.sweeps++
		for k, p := range d.pending {
			if now.Sub(p.at) > dynamoPendingTTL {
				d.drop(k)
			}
		}
		d.sweepAt = 2 * len(d.pending)
	}
}

// drop forgets the pending request key, if any.
func (d *Dynamo) drop(key pendingKey) {
	pr, ok := d.pending[key]
	if !ok {
		return
	}
	delete(d.pending, key)
	if d.cached[pr.endpoint] -= pr.cached; d.cached[pr.endpoint] <= 0 {
		delete(d.cached, pr.endpoint)
	}
}

// FirstToken implements router.FirstTokenObserver: req's prefill is done
// (Dynamo's mark_prefill_completed), and its prompt no longer counts in
// Load.InFlightTokens.
func (d *Dynamo) FirstToken(_ time.Time, req *kvroute.Request, _ string) {
	if req != nil {
		d.drop(reqKey(req))
	}
}

// Release implements kvroute.Releaser: the request ended (any outcome).
func (d *Dynamo) Release(_ time.Time, req *kvroute.Request, _ string) {
	if req != nil {
		d.drop(reqKey(req))
	}
}

// ForgetEndpoint implements router.EndpointForgetter: the requests in
// flight on a removed endpoint no longer count against an engine added
// later under its ID.
func (d *Dynamo) ForgetEndpoint(id string) {
	for k, p := range d.pending {
		if p.endpoint == id {
			delete(d.pending, k)
		}
	}
	delete(d.cached, id)
}

// softmax samples a candidate as selector.rs softmax_sample does: logits =
// (cost - min) x -1/((max-min) x T), uniform when all costs are equal.
func (d *Dynamo) softmax(cands []kvroute.Candidate, scores []kvroute.Score, lo, hi float64) int {
	d.tie = healthyIdx(d.tie[:0], cands)
	if hi == lo {
		return d.tie[d.rng.IntN(len(d.tie))]
	}
	scale := -1 / ((hi - lo) * d.p.Temperature)
	sum := 0.0
	for _, i := range d.tie {
		sum += math.Exp((scores[i].Value - lo) * scale)
	}
	x := d.rng.Float64() * sum
	for _, i := range d.tie {
		if x -= math.Exp((scores[i].Value - lo) * scale); x <= 0 {
			return i
		}
	}
	return d.tie[len(d.tie)-1]
}

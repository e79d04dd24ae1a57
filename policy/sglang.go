package policy

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/kvroute/kvroute"
)

// SGLangParams configures the sglang-cache-aware baseline; defaults are the
// SGLang router's CLI defaults (sgl-model-gateway bindings/python
// sglang_router/router_args.py).
type SGLangParams struct {
	// CacheThreshold is the match rate above which the request follows the
	// cache. Default 0.3.
	CacheThreshold float64 `param:"cache_threshold"`
	// BalanceAbsThreshold and BalanceRelThreshold define imbalance:
	// max-min > abs AND max > min x rel. Defaults 64 and 1.5.
	BalanceAbsThreshold int     `param:"balance_abs_threshold"`
	BalanceRelThreshold float64 `param:"balance_rel_threshold"`
	// EvictionInterval is how often trees are trimmed. Default 60s.
	EvictionInterval time.Duration `param:"eviction_interval"`
	// MaxTreeSize is the number of characters each worker may hold in the
	// tree before eviction trims its least recently used leaves; a worker
	// reaching twice this is trimmed at once. Default 67108864 (2^26).
	MaxTreeSize int `param:"max_tree_size"`
}

// SGLang reproduces the SGLang router's cache_aware policy in its classic
// form (sgl-model-gateway/src/policies/cache_aware.rs, tree.rs; sglang PR
// #2114):
//
//  1. Loads are the router's own in-flight counts. If max-min >
//     balance_abs_threshold AND max > min x balance_rel_threshold the fleet is
//     imbalanced: pick the least loaded healthy worker (first on ties) and
//     still insert the text into the tree for it.
//  2. Otherwise match the text against the character radix tree:
//     match_rate = matched chars / text chars. Above cache_threshold, pick the
//     worker holding the deepest matched node (the most recent toucher); if it
//     is unhealthy, the first healthy worker; if it no longer exists, forget
//     it and treat the request as a miss.
//  3. On a miss, the worker with the smallest tree (fewest characters), first
//     on ties: the classic fallback later replaced by least-load after the
//     "death spiral" report (sglang PR #14305).
//  4. Insert the text for the chosen worker.
//
// Trees are bounded: every eviction_interval each worker over max_tree_size
// characters loses its least recently used leaves until it fits, and one
// reaching twice the bound is trimmed immediately. The text is
// Request.Prompt (bytes rather than Rust chars); a request without text uses
// its block hashes, 8 bytes per block, so simulated traces still match.
// Defaults: cache_threshold 0.3, balance_abs_threshold 64,
// balance_rel_threshold 1.5, eviction_interval 60s, max_tree_size 2^26.
// Not safe for concurrent use.
type SGLang struct {
	sbuf      scoreBuf // explanation buffers, reused
	p         SGLangParams
	tree      *radixTree
	lastEvict time.Time
	buf       []byte
}

var (
	_ kvroute.Picker                      = (*SGLang)(nil)
	_ interface{ ForgetEndpoint(string) } = (*SGLang)(nil) // router.EndpointForgetter
)

// ForgetEndpoint drops what the tree holds for a worker removed from the
// pool (the SGLang router's remove_tenant when a worker is removed), so
// that an engine added later under its name does not inherit it. The
// router calls it (router.EndpointForgetter).
func (s *SGLang) ForgetEndpoint(id string) { s.tree.removeTenant(id) }

func newSGLang(params map[string]any, _ uint64) (*SGLang, error) {
	p := SGLangParams{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5,
		EvictionInterval: 60 * time.Second, MaxTreeSize: 1 << 26}
	if err := decodeParams(NameSGLangCacheAware, params, &p); err != nil {
		return nil, err
	}
	for _, c := range []error{
		check(NameSGLangCacheAware, "cache_threshold", p.CacheThreshold >= 0 && p.CacheThreshold <= 1, "must be in [0, 1], got %v", p.CacheThreshold),
		check(NameSGLangCacheAware, "balance_abs_threshold", p.BalanceAbsThreshold >= 0, "must be >= 0, got %d", p.BalanceAbsThreshold),
		check(NameSGLangCacheAware, "balance_rel_threshold", p.BalanceRelThreshold >= 1, "must be >= 1, got %v", p.BalanceRelThreshold),
		check(NameSGLangCacheAware, "eviction_interval", p.EvictionInterval > 0, "must be > 0, got %v", p.EvictionInterval),
		check(NameSGLangCacheAware, "max_tree_size", p.MaxTreeSize >= 1, "must be >= 1, got %d", p.MaxTreeSize),
	} {
		if c != nil {
			return nil, c
		}
	}
	return &SGLang{p: p, tree: newRadixTree()}, nil
}

// text returns the request's routing text.
func (s *SGLang) text(req *kvroute.Request) string {
	if req.Prompt != "" || len(req.BlockHashes) == 0 {
		return req.Prompt
	}
	s.buf = s.buf[:0]
	for _, h := range req.BlockHashes {
		s.buf = binary.LittleEndian.AppendUint64(s.buf, h)
	}
	return string(s.buf)
}

// Pick implements kvroute.Picker.
func (s *SGLang) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	req = orEmpty(req)
	scores := s.sbuf.get(cands, 2)
	minL, maxL, minI, firstHealthy := math.MaxInt, math.MinInt, -1, -1
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		l := cands[i].Load.InFlight
		if firstHealthy < 0 {
			firstHealthy = i
		}
		if l < minL {
			minL, minI = l, i
		}
		maxL = max(maxL, l)
		scores[i].Value = float64(l)
		scores[i].Parts = append(scores[i].Parts,
			kvroute.Part{Name: "load", Value: float64(l)},
			kvroute.Part{Name: "tree_chars", Value: float64(s.tree.size[endpointID(&cands[i])])})
	}
	if minI < 0 {
		return noneHealthy(NameSGLangCacheAware, cands, scores)
	}
	s.maybeEvict(now)
	text := s.text(req)
	choice, reason := -1, ""
	if maxL-minL > s.p.BalanceAbsThreshold && float64(maxL) > float64(minL)*s.p.BalanceRelThreshold {
		choice, reason = minI, "imbalanced: least loaded"
	} else {
		matched, node := s.tree.match(text)
		rate := 0.0
		if len(text) > 0 {
			rate = float64(matched) / float64(len(text))
		}
		if rate > s.p.CacheThreshold {
			tenant := node.mostRecent()
			idx := indexOfID(cands, tenant)
			switch {
			case idx >= 0 && cands[idx].Healthy:
				choice, reason = idx, "cache hit: worker holding the deepest match"
			case idx >= 0:
				choice, reason = firstHealthy, "cache hit on an unhealthy worker: first healthy"
			default:
				s.tree.removeTenant(tenant)
			}
		}
		if choice < 0 {
			best := math.MaxInt
			for i := range cands {
				if cands[i].Healthy {
					if sz := s.tree.size[endpointID(&cands[i])]; sz < best {
						best, choice = sz, i
					}
				}
			}
			reason = "cache miss: smallest tree"
		}
	}
	id := endpointID(&cands[choice])
	s.tree.insert(text, id)
	if s.tree.size[id] >= 2*s.p.MaxTreeSize {
		s.tree.evict(id, s.p.MaxTreeSize)
	}
	return chose(NameSGLangCacheAware, cands, choice, reason, scores)
}

func (s *SGLang) maybeEvict(now time.Time) {
	if s.lastEvict.IsZero() {
		s.lastEvict = now
		return
	}
	if now.Sub(s.lastEvict) < s.p.EvictionInterval {
		return
	}
	s.lastEvict = now
	for tenant := range s.tree.size {
		s.tree.evict(tenant, s.p.MaxTreeSize)
	}
}

func indexOfID(cands []kvroute.Candidate, id string) int {
	if id == "" {
		return -1
	}
	for i := range cands {
		if endpointID(&cands[i]) == id {
			return i
		}
	}
	return -1
}

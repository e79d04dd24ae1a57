package sim

import (
	"cmp"
	"slices"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/workload"
)

// OracleHitRate returns the upper bound on the prefix-cache hit rate (in
// prompt tokens) of reqs, taken in arrival order, for engines with
// blockSize-token blocks: an infinite cache shared by the whole fleet, so
// every block seen before anywhere is a hit (a LoRA adapter's blocks only
// by requests for the same adapter). A prompt of L tokens hits at
// most (L-1)/blockSize blocks, as in vLLM. It is what Run reports in
// Result.OracleHitRate; pass it in Config.OracleHitRate to compute it once
// for several runs of the same workload.
func OracleHitRate(reqs []workload.Request, blockSize int) float64 {
	var queried, hit int64
	for i, h := range oracleHits(reqs, blockSize) {
		queried += int64(reqs[i].PromptLen)
		hit += int64(h)
	}
	if blockSize <= 0 || queried == 0 {
		return 0
	}
	return float64(hit) / float64(queried)
}

// oracleHits returns, for each request of reqs (in workload order), the
// prompt tokens the oracle serves from cache, taking the requests in
// arrival order (ties in workload order) as OracleHitRate does. All zero
// when blockSize is not positive.
func oracleHits(reqs []workload.Request, blockSize int) []int {
	hits := make([]int, len(reqs))
	if blockSize <= 0 {
		return hits
	}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Arrival, reqs[b].Arrival) })
	if segmentsOnly(reqs) {
		o := newSegOracle()
		for _, i := range order {
			hits[i] = o.observe(reqs[i].Segments, reqs[i].Adapter, blockSize, reqs[i].PromptLen)
		}
		return hits
	}
	o := newOracle()
	var buf []uint64
	for _, i := range order {
		buf = reqs[i].BlockHashes(blockSize, buf[:0])
		hits[i] = o.observe(buf, blockSize, reqs[i].PromptLen)
	}
	return hits
}

// segmentsOnly reports whether every request's prompt is given as synthetic
// segments only (no literal tokens or text), so segOracle applies.
func segmentsOnly(reqs []workload.Request) bool {
	for i := range reqs {
		if reqs[i].Tokens != nil || reqs[i].Text != "" || (len(reqs[i].Segments) == 0 && reqs[i].PromptLen > 0) {
			return false
		}
	}
	return true
}

// segOracle is the oracle for segment prompts, computed on segments rather
// than blocks: one hash-table probe per segment instead of one per 16-token
// block. Two prompts share their first n tokens exactly when their leading
// segments are equal and the next ones have the same key (a shorter segment
// is a prefix of a longer one with the same key). So the oracle keeps, for
// each chain of leading segments (keys and lengths) seen and each key, the
// longest segment with that key that followed the chain; a prompt walks its
// segments, adding min(longest, length) to its shared prefix while the
// longest is at least its own segment's length (after an exact match the
// next lookup is under the extended chain, which exists only if an earlier
// prompt had exactly this segment). The hit is that prefix in whole blocks,
// capped like oracle's; a differential test checks that both agree. The
// chains of a LoRA adapter's prompts start from a root of its own, as its
// blocks are keyed by its name (workload.Request.BlockHashes): no prompt
// hits another adapter's or the base model's.
type segOracle struct {
	longest u64max
}

func newSegOracle() *segOracle { return &segOracle{} }

func (o *segOracle) observe(segs []workload.Segment, adapter string, blockSize, promptLen int) int {
	shared, matching := 0, true
	var chain uint64 = 0x6b76726f75746573
	if adapter != "" {
		chain = mix64(chain ^ xxh3.HashString(adapter))
	}
	for _, sg := range segs {
		l := o.longest.update(mix64(chain^mix64(sg.Key)), int64(sg.Len))
		if matching {
			shared += int(min(l, int64(sg.Len)))
			matching = l >= int64(sg.Len)
		}
		chain = segChain(chain, sg)
	}
	n := 0
	if blockSize > 0 {
		n = min(shared/blockSize, max((promptLen-1)/blockSize, 0))
	}
	hit := n * blockSize
	return hit
}

// segChain extends a segment chain hash by one segment.
func segChain(chain uint64, sg workload.Segment) uint64 {
	return mix64(mix64(chain^sg.Key)+uint64(sg.Len)) + 0x9e3779b97f4a7c15
}

// oracle computes the upper bound on the prefix-cache hit rate for a
// request stream: an infinite cache shared by the whole fleet (perfect
// affinity), where every block seen before anywhere is a hit. Blocks are
// chained hashes, so a block is a hit only if its whole prefix was seen.
//
// Like vLLM, at least the prompt's last token is always computed: a prompt
// of L tokens can hit at most (L-1)/blockSize full blocks.
type oracle struct {
	seen u64set
}

func newOracle() *oracle { return &oracle{} }

// observe records a request's prompt (its chained full-block hashes at
// blockSize tokens per block, and its length) and returns the tokens the
// oracle would have served from cache.
//
// Because the hashes are chained and every prompt's blocks are all
// recorded, the seen blocks of a prompt are a prefix of it: the hit count is
// found by binary search, and only the unseen tail is inserted.
func (o *oracle) observe(hashes []uint64, blockSize, promptLen int) int {
	// n = number of leading blocks seen: the first unseen index.
	lo, hi := 0, len(hashes)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if o.seen.has(hashes[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	n := lo
	for _, h := range hashes[n:] {
		o.seen.add(h)
	}
	if blockSize > 0 {
		n = min(n, max((promptLen-1)/blockSize, 0))
	}
	hit := n * blockSize
	return hit
}

// u64set is an open-addressing hash set of uint64 keys that are already
// well-mixed hashes (they index the table directly). It is several times
// faster than a Go map for the oracle's millions of blocks.
type u64set struct {
	slots   []uint64 // 0 = empty
	n       int
	hasZero bool
}

func (s *u64set) has(k uint64) bool {
	if k == 0 {
		return s.hasZero
	}
	if len(s.slots) == 0 {
		return false
	}
	mask := uint64(len(s.slots) - 1)
	for i := mix64(k) & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case k:
			return true
		case 0:
			return false
		}
	}
}

func (s *u64set) add(k uint64) {
	if k == 0 {
		s.hasZero = true
		return
	}
	if 4*(s.n+1) > 3*len(s.slots) {
		s.grow()
	}
	mask := uint64(len(s.slots) - 1)
	for i := mix64(k) & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case k:
			return
		case 0:
			s.slots[i] = k
			s.n++
			return
		}
	}
}

func (s *u64set) grow() {
	old := s.slots
	size := max(2*len(old), 1<<12)
	s.slots = make([]uint64, size)
	mask := uint64(size - 1)
	for _, k := range old {
		if k == 0 {
			continue
		}
		i := mix64(k) & mask
		for s.slots[i] != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = k
	}
}

// mix64 is a cheap finaliser, so that keys with poor low bits still spread.
func mix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	return k ^ k>>33
}

// u64max is an open-addressing map from well-mixed uint64 keys to the
// largest value stored under each.
type u64max struct {
	slots []u64maxSlot // key 0 = empty
	n     int
	zero  int64 // the value under key 0
}

type u64maxSlot struct {
	k uint64
	v int64
}

// update stores max(old, v) under k and returns old (0 when absent).
func (m *u64max) update(k uint64, v int64) int64 {
	if k == 0 {
		old := m.zero
		m.zero = max(old, v)
		return old
	}
	if 4*(m.n+1) > 3*len(m.slots) {
		m.grow()
	}
	mask := uint64(len(m.slots) - 1)
	for i := k & mask; ; i = (i + 1) & mask {
		sl := &m.slots[i]
		switch sl.k {
		case k:
			old := sl.v
			sl.v = max(old, v)
			return old
		case 0:
			sl.k, sl.v = k, v
			m.n++
			return 0
		}
	}
}

func (m *u64max) grow() {
	old := m.slots
	m.slots = make([]u64maxSlot, max(2*len(old), 1<<12))
	mask := uint64(len(m.slots) - 1)
	for _, sl := range old {
		if sl.k == 0 {
			continue
		}
		i := sl.k & mask
		for m.slots[i].k != 0 {
			i = (i + 1) & mask
		}
		m.slots[i] = sl
	}
}

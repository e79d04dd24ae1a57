package kvindex

import (
	"testing"

	"github.com/kvroute/kvroute"
)

// TestIndexCopiesBoundedByCapacity: an engine that stores every block twice
// (vLLM reports each copy it computes) and never removes one is held to
// Capacity by random eviction, but the counts of the evicted blocks' extra
// copies stayed behind, one per block ever stored, so the index's memory
// grew without bound. Eviction now drops them with their blocks.
func TestIndexCopiesBoundedByCapacity(t *testing.T) {
	const bs, capacity = 4, 64
	x := NewIndex(IndexConfig{BlockSize: bs, Capacity: capacity, Shards: 2})
	tokens := make([]uint32, bs)
	for i := range 10 * capacity {
		tokens[0] = uint32(i)
		s := Stored{BlockHashes: []uint64{uint64(i) + 1}, Tokens: tokens, BlockSize: bs, Tier: kvroute.TierGPU}
		for range 2 {
			if _, err := x.Store("a", s); err != nil {
				t.Fatalf("Store(%d): %v", i, err)
			}
		}
	}
	st := x.Stats()
	if st.Entries > capacity {
		t.Fatalf("entries %d, want <= %d", st.Entries, capacity)
	}
	checkCopiesHeld(t, x, "a")
}

// TestIndexCopiesDroppedWithBlock: a BlockRemoved that drops a block from
// the index (here of the CPU tier, its GPU key having been cleared by
// another engine hash of the same contents) left that block's count of
// extra GPU copies behind, one per such block for good. A block's copies
// now go with it.
func TestIndexCopiesDroppedWithBlock(t *testing.T) {
	const bs = 4
	x := NewIndex(IndexConfig{BlockSize: bs, Shards: 2})
	tokens := make([]uint32, bs)
	for i := range 100 {
		tokens[0] = uint32(i)
		eh := 2*uint64(i) + 1
		s := Stored{BlockHashes: []uint64{eh}, Tokens: tokens, BlockSize: bs, Tier: kvroute.TierGPU}
		for range 2 { // two copies
			if _, err := x.Store("a", s); err != nil {
				t.Fatalf("Store(%d): %v", i, err)
			}
		}
		// The same contents under another engine hash, removed: the key's
		// GPU bit goes.
		s.BlockHashes = []uint64{eh + 1}
		if _, err := x.Store("a", s); err != nil {
			t.Fatalf("Store(%d): %v", i, err)
		}
		x.Evict("a", []uint64{eh + 1}, kvroute.TierGPU)
		x.Evict("a", []uint64{eh}, kvroute.TierCPU)
	}
	checkCopiesHeld(t, x, "a")
}

// checkCopiesHeld fails t when endpoint ep of x counts extra copies for
// more engine hashes than it holds: counts left behind by blocks gone.
func checkCopiesHeld(t *testing.T, x *Index, ep string) {
	t.Helper()
	x.mu.RLock()
	e := x.eps[ep]
	x.mu.RUnlock()
	e.mu.Lock()
	copies, held := len(e.copies), e.blocks.Len()
	e.mu.Unlock()
	if copies > held {
		t.Fatalf("copies counted for %d engine hashes, only %d held", copies, held)
	}
}

package kvindex

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestIndexStoreWithoutTokens: vLLM's OffloadingConnector reports the
// blocks it copies to host memory as BlockStored events without token ids
// (hashes only, no parent, medium CPU). The index rejected them as
// malformed, so the CPU tier of an engine with offloading was never
// indexed. Blocks the endpoint stored with their tokens now gain the tier;
// unknown ones are skipped and reported; no endpoint is added and no block
// size learned by such an event.
func TestIndexStoreWithoutTokens(t *testing.T) {
	const bs = 4
	tokens := seqTokens(4*bs, 1)
	eh := engineChain(tokens, bs)
	q := HashTokens(tokens, bs, nil)
	x := NewIndex(IndexConfig{Shards: 2})
	cpu := func(hs ...uint64) Stored {
		return Stored{BlockHashes: hs, BlockSize: bs, Tier: kvroute.TierCPU}
	}
	if n, err := x.Store("a", cpu(eh[0])); n != 0 || !errors.Is(err, ErrUnknownBlocks) {
		t.Fatalf("before any store: %d, %v; want 0, ErrUnknownBlocks", n, err)
	}
	if st := x.Stats(); st.BlockSize != 0 || st.Endpoints != 0 {
		t.Fatalf("stats %+v: learned a block size or added an endpoint", st)
	}
	storeChain(t, x, "a", tokens, bs, 0, 3, kvroute.TierGPU)
	if n, err := x.Store("b", cpu(eh[0])); n != 0 || !errors.Is(err, ErrUnknownBlocks) {
		t.Fatalf("unknown endpoint: %d, %v; want 0, ErrUnknownBlocks", n, err)
	}
	if n, err := x.Store("a", cpu(eh[0], eh[1], eh[3])); n != 2 || !errors.Is(err, ErrUnknownBlocks) {
		t.Fatalf("two known, one unknown: %d, %v; want 2, ErrUnknownBlocks", n, err)
	}
	if _, err := x.Store("a", Stored{BlockHashes: eh[:1], BlockSize: 2 * bs, Tier: kvroute.TierCPU}); !errors.Is(err, ErrBlockSize) {
		t.Fatalf("other block size: %v, want ErrBlockSize", err)
	}
	x.Evict("a", eh[:3], kvroute.TierGPU)
	want := Hit{Endpoint: "a", Blocks: 2, Tier: kvroute.TierCPU, GPUBlocks: 0}
	if hits := x.Match(q, nil); len(hits) != 1 || hits[0] != want {
		t.Fatalf("after the GPU evicted them: hits %+v, want [%+v]", hits, want)
	}
	x.Evict("a", eh[:2], kvroute.TierCPU)
	if hits := x.Match(q, nil); len(hits) != 0 {
		t.Fatalf("after the CPU evicted them: hits %+v", hits)
	}
	if st := x.Stats(); st.Entries != 0 || st.Keys != 0 || st.Endpoints != 1 {
		t.Fatalf("stats %+v, want no entries and keys, 1 endpoint", st)
	}
}

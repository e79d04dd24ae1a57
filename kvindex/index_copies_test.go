package kvindex

import (
	"testing"

	"github.com/kvroute/kvroute"
)

// TestIndexCopies: vLLM caches a block once per copy it computes (it does
// not de-duplicate: two requests that miss the same prefix in one step both
// cache it, and a fully cached prompt recomputes and caches its last block
// again) and reports a BlockStored and, on eviction, a BlockRemoved for each
// copy. The block stays cached, and must stay in the index, until the last
// GPU copy is removed. (The index dropped it at the first BlockRemoved, so
// the router lost a hot prefix the engine still held.)
func TestIndexCopies(t *testing.T) {
	const bs = 4
	tokens := seqTokens(6*bs, 1)
	eh := engineChain(tokens, bs)
	q := HashTokens(tokens, bs, nil)
	held := func(x *Index) int {
		for _, h := range x.Match(q, nil) {
			if h.Endpoint == "a" {
				return h.Blocks
			}
		}
		return 0
	}
	for _, tc := range []struct {
		name  string
		steps func(t *testing.T, x *Index)
		want  int
	}{
		{"burst: two copies, one evicted", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			x.Evict("a", eh[3:], kvroute.TierGPU)
		}, 6},
		{"burst: both copies evicted", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			x.Evict("a", eh[3:], kvroute.TierGPU)
			x.Evict("a", eh[3:], kvroute.TierGPU)
		}, 3},
		{"last block recomputed, first copy evicted", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 5, 6, kvroute.TierGPU)
			x.Evict("a", eh[5:], kvroute.TierGPU)
		}, 6},
		{"copy stored, evicted, stored again", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 5, 6, kvroute.TierGPU)
			x.Evict("a", eh[5:], kvroute.TierGPU)
			x.Evict("a", eh[5:], kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 5, 6, kvroute.TierGPU)
			x.Evict("a", eh[5:], kvroute.TierGPU)
		}, 5},
		{"cleared: copies forgotten", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			x.Clear("a")
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			x.Evict("a", eh[2:], kvroute.TierGPU)
		}, 2},
		{"GPU and CPU are one copy each", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierGPU)
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierCPU)
			x.Evict("a", eh[4:], kvroute.TierGPU)
			x.Evict("a", eh[4:], kvroute.TierCPU)
		}, 4},
		{"CPU stores are idempotent", func(t *testing.T, x *Index) {
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierCPU)
			storeChain(t, x, "a", tokens, bs, 0, 6, kvroute.TierCPU)
			x.Evict("a", eh[4:], kvroute.TierCPU)
		}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex(IndexConfig{BlockSize: bs, Shards: 2})
			tc.steps(t, x)
			if got := held(x); got != tc.want {
				t.Errorf("a holds %d blocks, want %d", got, tc.want)
			}
			if got, want := x.Stats().Entries, tc.want; got != want {
				t.Errorf("entries %d, want %d", got, want)
			}
		})
	}
}

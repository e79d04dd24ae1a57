package kvindex

import (
	"testing"

	"github.com/kvroute/kvroute"
)

// TestIndexClearAfterRemove: a Clear that looked its endpoint up just before
// a Remove of it ran on after the Remove had freed the endpoint's bit; when
// another endpoint was added meanwhile it took that bit, and the Clear wiped
// the new endpoint's blocks from the tables (its own map still counting
// them). The Clear of a removed endpoint now does nothing.
func TestIndexClearAfterRemove(t *testing.T) {
	const bs = 4
	tokens := seqTokens(3*bs, 1)
	x := NewIndex(IndexConfig{BlockSize: bs, Shards: 2})
	storeChain(t, x, "a", tokens, bs, 0, 3, kvroute.TierGPU)
	x.mu.RLock()
	stale := x.eps["a"] // what a Clear("a") racing with Remove("a") holds
	x.mu.RUnlock()
	x.Remove("a")
	storeChain(t, x, "b", tokens, bs, 0, 3, kvroute.TierGPU)
	x.mu.RLock()
	if b := x.eps["b"]; b.g != stale.g || b.bit != stale.bit {
		t.Fatalf("b did not reuse a's bit: the race needs it")
	}
	x.mu.RUnlock()
	x.clear(stale)
	want := Hit{Endpoint: "b", Blocks: 3, Tier: kvroute.TierGPU, GPUBlocks: 3}
	if hits := x.Match(HashTokens(tokens, bs, nil), nil); len(hits) != 1 || hits[0] != want {
		t.Fatalf("hits %+v, want [%+v]", hits, want)
	}
	if st := x.Stats(); st.Entries != 3 || st.Keys != 3 {
		t.Fatalf("stats %+v, want 3 entries and keys", st)
	}
}

package engine_test

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
)

// TestXXH3MatchesKVIndex: the engine's default block hash is the router's
// kvindex.HashTokens chain, so KV events carry the keys the router computes.
func TestXXH3MatchesKVIndex(t *testing.T) {
	for _, bs := range []int{1, 16, 64} {
		toks := make([]uint32, 1000)
		for i := range toks {
			toks[i] = uint32(i*7919) % 128256
		}
		want := kvindex.HashTokens(toks, bs, nil)
		h := engine.XXH3()
		var got []uint64
		parent := h.None()
		for i := 0; i+bs <= len(toks); i += bs {
			parent = h.Block(parent, toks[i:i+bs])
			got = append(got, parent.Key())
		}
		if !slices.Equal(got, want) {
			t.Errorf("block size %d: engine chain differs from kvindex.HashTokens", bs)
		}
	}
}

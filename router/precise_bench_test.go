package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
)

// BenchmarkRoutePrecise64 is BenchmarkRoute64Endpoints32KiB with KV events:
// 64 endpoints whose prefix matches come from the precise index, each
// request 8,000 tokens in 500 blocks of 16, the first quarter shared by
// every request and stored (by event) on every endpoint. Route matches
// the precise index and the gap index, and records the request in the gap
// index and the chosen endpoint's write log (its room and turnover).
func BenchmarkRoutePrecise64(b *testing.B) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 16})
	list := eps(64)
	ids := make([]string, len(list))
	for i := range list {
		ids[i] = list[i].ID
	}
	r, err := New(Config{Model: "m", Endpoints: list, Picker: &pickFirstHealthy{}, DecisionLog: 256,
		Precise: idx, PreciseEndpoints: ids})
	if err != nil {
		b.Fatal(err)
	}
	const bs, blocks, shared = 16, 500, 125
	tokens := make([]uint32, blocks*bs)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	engineHashes := make([]uint64, shared) // the engine's own names for the shared blocks
	for i := range engineHashes {
		engineHashes[i] = uint64(1_000_000 + i)
	}
	for _, id := range ids {
		if _, err := idx.Store(id, kvindex.Stored{BlockHashes: engineHashes, Tokens: tokens[:shared*bs], BlockSize: bs}); err != nil {
			b.Fatal(err)
		}
	}
	// 1,024 requests with their own tails, a request every 10ms: the gap
	// index (5s) has let each go before it comes round again.
	reqs := make([][]uint64, 1024)
	for i := range reqs {
		for j := shared * bs; j < len(tokens); j++ {
			tokens[j] = uint32(i)<<13 | uint32(j)
		}
		reqs[i] = kvindex.HashTokens(tokens, bs, nil)
	}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(10 * time.Millisecond)
		hashes := reqs[i%len(reqs)]
		req := &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: len(tokens), BlockSize: bs, BlockHashes: hashes}
		f, err := r.Route(now, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		r.Done(now, f, kvroute.Outcome{})
	}
}

package signals

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
)

// TestHybridNullBlocksKeepIndex: vLLM's BlockPool.cache_full_blocks (the
// group_idx era, hybrid models) skips null blocks in block_hashes ("Some
// blocks may be null blocks when enabling sparse attention like sliding
// window attention, or Mamba models with prefix-caching in align mode. We
// skip null blocks here.") but sends the token ids of every block, null
// ones included: a Mamba group's BlockStored has fewer hashes than
// tokens/block_size. That group is not the one the subscriber follows: its
// event is skipped, and the full-attention group's entries stay (the
// decoder rejected the whole batch, and the resync cleared them). An event
// of the followed group whose counts disagree is a store error, not a
// resync.
func TestHybridNullBlocksKeepIndex(t *testing.T) {
	s, held := indexedSubscriber(t)
	full := stored(0, 3) // group 1: full attention
	full.GroupIdx, full.SpecKind = 1, "full_attention"
	mamba := KVEvent{Kind: EventBlockStored, BlockSize: 4, Medium: "GPU", GroupIdx: 0, SpecKind: "mamba",
		BlockHashes: []uint64{7002}, // blocks 0 and 1 are null blocks: skipped
		TokenIDs:    prompt[0:12]}   // the tokens of all 3 blocks
	for seq, evs := range [][]KVEvent{{full}, {stored3(), mamba}} {
		b := EventBatch{Events: evs, HasDPRank: true}
		p, err := EncodeEventBatch(nil, &b, EventEncoding{MapEvents: true})
		if err != nil {
			t.Fatal(err)
		}
		s.handle(context.Background(), uint64(seq), p)
	}
	st := s.Status()
	if got := held(); got != 4 || st.DecodeErrors != 0 || st.Resyncs != 0 {
		t.Fatalf("full-attention blocks held after a batch with a Mamba group's BlockStored: %d, want 4 (decode errors %d, resyncs %d, last error %q)",
			got, st.DecodeErrors, st.Resyncs, st.LastError)
	}
	bad := stored3()
	bad.BlockHashes = append(bad.BlockHashes, 9999) // two hashes for one block's tokens
	b := EventBatch{Events: []KVEvent{bad}, HasDPRank: true}
	p, err := EncodeEventBatch(nil, &b, EventEncoding{MapEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	s.handle(context.Background(), 2, p)
	if st := s.Status(); held() != 4 || st.StoreErrors != 1 || st.Resyncs != 0 {
		t.Errorf("a followed group's event with 2 hashes for 4 tokens: held %d, store errors %d, resyncs %d; want 4, 1, 0",
			held(), st.StoreErrors, st.Resyncs)
	}
}

// stored3 is block 3 of the prompt in the full-attention group 1.
func stored3() KVEvent {
	ev := stored(3, 4)
	ev.GroupIdx, ev.SpecKind = 1, "full_attention"
	return ev
}

// indexedSubscriber returns a subscriber of endpoint e1 feeding an index of
// blocks of 4 tokens, and a function that says how many leading blocks of
// prompt the index holds there.
func indexedSubscriber(t *testing.T) (*Subscriber, func() int) {
	t.Helper()
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: idx})
	if err != nil {
		t.Fatal(err)
	}
	q := kvindex.HashTokens(prompt, 4, nil)
	return s, func() int {
		if h := idx.Match(q, nil); len(h) > 0 {
			return h[0].Blocks
		}
		return 0
	}
}

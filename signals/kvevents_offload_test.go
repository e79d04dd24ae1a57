package signals

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
)

// offloaded is the BlockStored vLLM's OffloadingConnector publishes for the
// blocks it copies to host memory (offloading/scheduler.py take_events):
// hashes only, token_ids=[], parent None, medium "CPU".
func offloaded(blocks ...int) KVEvent {
	ev := KVEvent{Kind: EventBlockStored, BlockSize: 4, Medium: "CPU", TokenIDs: []uint32{}}
	for _, b := range blocks {
		ev.BlockHashes = append(ev.BlockHashes, uint64(1000+b))
	}
	return ev
}

// TestSubscriberOffloadedBlocks: with CPU offloading, vLLM publishes its CPU
// copies as BlockStored events without token ids, in the same batch as the
// step's GPU events. The decoder rejected such an event ("0 token ids for 3
// blocks of 4"), which failed the whole batch: the batch's GPU events were
// lost and the endpoint's entries dropped (resync) at every offload, so an
// engine with offloading had an almost empty precise index. The CPU copies
// are now indexed under the keys the blocks' GPU stores gave them.
func TestSubscriberOffloadedBlocks(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: idx})
	if err != nil {
		t.Fatal(err)
	}
	q := kvindex.HashTokens(prompt, 4, nil)
	hit := func() kvindex.Hit {
		t.Helper()
		hits := idx.Match(q, nil)
		if len(hits) == 0 {
			return kvindex.Hit{}
		}
		return hits[0]
	}
	for i, step := range []struct {
		events []KVEvent
		want   kvindex.Hit
	}{
		{[]KVEvent{stored(0, 3)}, kvindex.Hit{Endpoint: "e1", Blocks: 3, Tier: kvroute.TierGPU, GPUBlocks: 3}},
		// The step stores block 3 on the GPU and offloads blocks 0-2.
		{[]KVEvent{stored(3, 4), offloaded(0, 1, 2)}, kvindex.Hit{Endpoint: "e1", Blocks: 4, Tier: kvroute.TierGPU, GPUBlocks: 4}},
		// The GPU evicts blocks 0-3: 0-2 are still in host memory.
		{[]KVEvent{removed(0, 1, 2, 3)}, kvindex.Hit{Endpoint: "e1", Blocks: 3, Tier: kvroute.TierCPU, GPUBlocks: 0}},
		{[]KVEvent{{Kind: EventBlockRemoved, Medium: "CPU", BlockHashes: []uint64{1001}}},
			kvindex.Hit{Endpoint: "e1", Blocks: 1, Tier: kvroute.TierCPU, GPUBlocks: 0}},
	} {
		b := EventBatch{Events: step.events, HasDPRank: true}
		for _, enc := range []EventEncoding{{}, {MapEvents: true}} {
			p, err := EncodeEventBatch(nil, &b, enc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeEventBatch(p); err != nil {
				t.Fatalf("step %d, %+v: decode: %v", i, enc, err)
			}
			if enc.MapEvents {
				continue
			}
			s.handle(context.Background(), uint64(i), p)
		}
		if got := hit(); got != step.want {
			t.Fatalf("step %d: hit %+v, want %+v", i, got, step.want)
		}
	}
	if st := s.Status(); st.Resyncs != 0 || st.DecodeErrors != 0 || st.StoreErrors != 0 {
		t.Fatalf("status %+v: want no resync, decode or store error", st)
	}
}

// TestSubscriberOffloadedUnknown: an offloaded block the router never saw
// stored with its tokens (it subscribed late) is skipped and counted as an
// orphan; the known ones in the same event are indexed; the block size is
// not learned from such an event.
func TestSubscriberOffloadedUnknown(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{Shards: 4})
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: idx})
	if err != nil {
		t.Fatal(err)
	}
	big := offloaded(0)
	big.BlockSize = 64 // an offloaded block size larger than the GPU's
	for i, events := range [][]KVEvent{{big}, {stored(0, 2)}, {offloaded(1, 5)}} {
		b := EventBatch{Events: events}
		p, err := EncodeEventBatch(nil, &b, EventEncoding{})
		if err != nil {
			t.Fatal(err)
		}
		s.handle(context.Background(), uint64(i), p)
	}
	if bs := idx.BlockSize(); bs != 4 {
		t.Fatalf("block size %d, want 4 (learned from the GPU store)", bs)
	}
	hits := idx.Match(kvindex.HashTokens(prompt, 4, nil), nil)
	want := kvindex.Hit{Endpoint: "e1", Blocks: 2, Tier: kvroute.TierGPU, GPUBlocks: 2}
	if len(hits) != 1 || hits[0] != want {
		t.Fatalf("hits %+v, want [%+v]", hits, want)
	}
	if st := s.Status(); st.Orphans != 2 || st.Resyncs != 0 || st.StoredBlocks != 3 {
		t.Fatalf("status %+v: want 2 orphans, 3 stored blocks, no resync", st)
	}
}

// TestSubscriberHybridGroups: a hybrid model (Gemma 3: five sliding-window
// layers to one full-attention layer, the first layer sliding) has its
// sliding-window KV cache group first; vLLM publishes every group's blocks,
// tagging BlockStored events with the group's kind. The subscriber took
// group 0's events only, so the index followed the sliding-window group,
// which frees and evicts a long prompt's early blocks while the
// full-attention group still holds them: prefixes the engine would hit were
// reported gone. It now follows the full-attention group.
func TestSubscriberHybridGroups(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: idx})
	if err != nil {
		t.Fatal(err)
	}
	inGroup := func(ev KVEvent, g int, kind string) KVEvent {
		ev.GroupIdx, ev.SpecKind = g, kind
		return ev
	}
	q := kvindex.HashTokens(prompt, 4, nil)
	for i, step := range []struct {
		events []KVEvent
		want   int
	}{
		{[]KVEvent{inGroup(stored(0, 4), 0, "sliding_window"), inGroup(stored(0, 4), 1, "full_attention")}, 4},
		// The sliding window moved past blocks 0-2: the sliding group
		// evicts them, the full-attention group keeps them.
		{[]KVEvent{inGroup(removed(0, 1, 2), 0, "")}, 4},
		{[]KVEvent{inGroup(stored(4, 5), 0, "sliding_window"), inGroup(stored(4, 5), 1, "full_attention")}, 5},
		{[]KVEvent{inGroup(removed(3), 1, "")}, 3},
		{[]KVEvent{{Kind: EventAllBlocksCleared}}, 0},
	} {
		b := EventBatch{Events: step.events}
		p, err := EncodeEventBatch(nil, &b, EventEncoding{MapEvents: true})
		if err != nil {
			t.Fatal(err)
		}
		s.handle(context.Background(), uint64(i), p)
		got := 0
		if hits := idx.Match(q, nil); len(hits) > 0 {
			got = hits[0].Blocks
		}
		if got != step.want {
			t.Fatalf("step %d: %d blocks held, want %d", i, got, step.want)
		}
	}
}

// TestSubscriberHybridBlockSize: when group 0 is a Mamba group (its blocks
// are far larger), an index that learns its block size from the first
// BlockStored must learn the full-attention group's, not group 0's.
func TestSubscriberHybridBlockSize(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{Shards: 4})
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: idx})
	if err != nil {
		t.Fatal(err)
	}
	mamba := KVEvent{Kind: EventBlockStored, BlockHashes: []uint64{2000}, TokenIDs: prompt[:16], BlockSize: 16,
		Medium: "GPU", SpecKind: "mamba"}
	full := stored(0, 4)
	full.GroupIdx, full.SpecKind = 1, "full_attention"
	b := EventBatch{Events: []KVEvent{mamba, full}}
	p, err := EncodeEventBatch(nil, &b, EventEncoding{MapEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	s.handle(context.Background(), 0, p)
	if bs := idx.BlockSize(); bs != 4 {
		t.Fatalf("block size %d, want the full-attention group's 4", bs)
	}
	if hits := idx.Match(kvindex.HashTokens(prompt, 4, nil), nil); len(hits) != 1 || hits[0].Blocks != 4 {
		t.Fatalf("hits %+v, want 4 blocks of e1", hits)
	}
	if st := s.Status(); st.Skipped != 1 || st.StoreErrors != 0 {
		t.Fatalf("status %+v, want 1 skipped event and no store error", st)
	}
}

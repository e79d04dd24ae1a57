package signals

import (
	"context"
	"testing"
)

// TestCatchUpHistoryWithHole: a catch-up (the engine's history replayed
// from seq 0) takes what the engine's buffer still holds, its oldest
// batches possibly gone, but a replay with a hole inside (a batch the
// engine's ROUTER socket dropped at its high-water mark, or a seq the
// publisher consumed without buffering) is not whole history: the batches
// before the hole are not applied, since the hole may hold their blocks'
// BlockRemoved (here batch 1 evicts what batch 0 stored, and the index
// claimed three blocks the engine no longer had). The same holds for the
// history replayed before a first batch seen on the SUB socket, whose
// replay must end just before it.
func TestCatchUpHistoryWithHole(t *testing.T) {
	enc := func(evs ...KVEvent) []byte {
		b := EventBatch{TS: 1.5, Events: evs, HasDPRank: true}
		p, err := EncodeEventBatch(nil, &b, EventEncoding{MapEvents: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	b0, b2, b3 := enc(stored(0, 3)), enc(removed(5)), enc(removed(4))
	// Batch 1 (removed(0, 1, 2)) is missing from every answer.

	t.Run("catch-up on connect", func(t *testing.T) {
		s, held := indexedSubscriber(t)
		s.replay = func(ctx context.Context, from uint64) ([]replayed, error) {
			return []replayed{{0, b0}, {2, b2}}, nil
		}
		s.catchUp(context.Background())
		if got := held(); got != 0 {
			t.Errorf("after a catch-up whose replay lacks batch 1 the index claims %d blocks, want 0", got)
		}
		if st := s.Status(); st.LastSeq != 2 {
			t.Errorf("last seq %d, want 2", st.LastSeq)
		}
	})
	t.Run("first batch", func(t *testing.T) {
		s, held := indexedSubscriber(t)
		s.replay = func(ctx context.Context, from uint64) ([]replayed, error) {
			return []replayed{{0, b0}, {2, b2}}, nil
		}
		s.handle(context.Background(), 3, b3) // the first batch seen
		if got := held(); got != 0 {
			t.Errorf("after a first batch whose catch-up lacks batch 1 the index claims %d blocks, want 0", got)
		}
		if st := s.Status(); st.LastSeq != 3 {
			t.Errorf("last seq %d, want 3", st.LastSeq)
		}
	})
	t.Run("tail missing", func(t *testing.T) {
		s, held := indexedSubscriber(t)
		s.replay = func(ctx context.Context, from uint64) ([]replayed, error) {
			return []replayed{{0, b0}}, nil // batches 1 and 2 dropped
		}
		s.handle(context.Background(), 3, b3)
		if got := held(); got != 0 {
			t.Errorf("after a first batch whose catch-up ends at batch 0 (not 2) the index claims %d blocks, want 0", got)
		}
	})
	t.Run("oldest gone", func(t *testing.T) {
		// The engine's buffer lost batch 0: what it holds is applied.
		s, held := indexedSubscriber(t)
		b1s, b2s := enc(stored(0, 2)), enc(stored(2, 3))
		s.replay = func(ctx context.Context, from uint64) ([]replayed, error) {
			return []replayed{{1, b1s}, {2, b2s}}, nil
		}
		s.handle(context.Background(), 3, b3)
		if got := held(); got != 3 {
			t.Errorf("after a catch-up of batches 1 and 2 the index claims %d blocks, want 3", got)
		}
	})
}

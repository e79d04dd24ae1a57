package signals

import (
	"context"
	"testing"
)

// TestVerifyAppliesMissedBatches: a dialled connection that follows a
// failed one is verified at once (verify): the replay from next-1 is asked
// for and, the engine being the same, the batches it published while the
// router was disconnected (here: the eviction of the prompt's blocks) are
// in the answer and applied then, not when the engine publishes again (an
// idle engine may not for long, and the index claimed the evicted
// blocks). The same batch delivered again by the new subscription is
// skipped, not taken for a restarted engine's.
func TestVerifyAppliesMissedBatches(t *testing.T) {
	s, held := indexedSubscriber(t)
	enc := func(evs ...KVEvent) []byte {
		b := EventBatch{TS: 1.5, Events: evs, HasDPRank: true}
		p, err := EncodeEventBatch(nil, &b, EventEncoding{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	b0, b1 := enc(stored(0, 3)), enc(removed(0, 1, 2))
	s.replay = func(ctx context.Context, from uint64) ([]replayed, error) {
		all := []replayed{{0, b0}, {1, b1}}
		return all[from:], nil
	}
	s.started = true // the subscription had caught up ...
	s.handle(context.Background(), 0, b0)
	if held() != 3 {
		t.Fatalf("setup: %d held", held())
	}
	// ... then the connection failed; the engine published batch 1 (it
	// evicted the blocks) and went idle; the router re-dials.
	s.verify(context.Background())
	if got := held(); got != 0 {
		t.Fatalf("after verifying the reconnection (replay had batch 1) the index still claims %d evicted blocks", got)
	}
	s.handle(context.Background(), 1, b1) // the subscription's copy of batch 1
	if st := s.Status(); st.Restarts != 0 || st.Resyncs != 0 || st.Batches != 2 {
		t.Errorf("batch 1 delivered again: restarts %d, resyncs %d, batches applied %d; want 0, 0, 2", st.Restarts, st.Resyncs, st.Batches)
	}
}

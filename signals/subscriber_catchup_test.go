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
	// Batch 1 (removed(0, 1, 2), evicting what batch 0 stored) is missing
	// from the first three answers; the last is another history.
	catchUp := func(s *Subscriber) { s.catchUp(context.Background()) }
	firstBatch := func(s *Subscriber) { s.handle(context.Background(), 3, b3) }
	for _, tc := range []struct {
		name     string
		replayed []replayed
		run      func(*Subscriber)
		held     int   // blocks the index claims after
		seq      int64 // last seq after (0: not checked)
	}{
		{"catch-up on connect", []replayed{{0, b0}, {2, b2}}, catchUp, 0, 2},
		{"first batch", []replayed{{0, b0}, {2, b2}}, firstBatch, 0, 3},
		{"tail missing", []replayed{{0, b0}}, firstBatch, 0, 0}, // batches 1 and 2 dropped
		// The engine's buffer lost batch 0: what it holds is applied.
		{"oldest gone", []replayed{{1, enc(stored(0, 2))}, {2, enc(stored(2, 3))}}, firstBatch, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, held := indexedSubscriber(t)
			s.replay = func(ctx context.Context, from uint64) ([]replayed, error) { return tc.replayed, nil }
			tc.run(s)
			if got := held(); got != tc.held {
				t.Errorf("the index claims %d blocks, want %d", got, tc.held)
			}
			if st := s.Status(); tc.seq != 0 && st.LastSeq != tc.seq {
				t.Errorf("last seq %d, want %d", st.LastSeq, tc.seq)
			}
		})
	}
}

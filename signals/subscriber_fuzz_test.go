package signals

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
)

// FuzzSubscriberMessages feeds a subscriber (without replay) ZMQ messages
// built from the input: splitFrames takes each apart, handle checks its
// sequence number and applies its batch to a real index. Whatever the
// frames, sequence numbers and payloads, nothing panics, every message
// that splits is applied (LastSeq), and the index stays consistent: an
// endpoint it reports holding a prompt's blocks holds no more than the
// prompt has, and its counters never go negative.
func FuzzSubscriberMessages(f *testing.F) {
	var seeds [][]byte
	for _, fx := range fixtures() {
		p, err := EncodeEventBatch(nil, &fx.b, fx.enc)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, p)
	}
	for _, evs := range [][]KVEvent{
		{stored(0, 3)}, {stored(3, 6), offloaded(0, 1, 2)}, {removed(0, 1, 2, 3)},
		{{Kind: EventBlockRemoved, Medium: "CPU", BlockHashes: []uint64{1001}}}, {{Kind: EventAllBlocksCleared}},
	} {
		b := EventBatch{Events: evs, HasDPRank: true}
		p, err := EncodeEventBatch(nil, &b, EventEncoding{MapEvents: true})
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, p)
	}
	f.Add([]byte{0, 1, 2}, uint8(3), seeds[0], seeds[4], seeds[5])
	f.Add([]byte{0, 1, 2}, uint8(3), seeds[4], seeds[5], seeds[6])
	f.Add([]byte{0, 5, 1}, uint8(2), seeds[6], seeds[7], seeds[8])
	f.Add([]byte{7, 7, 0}, uint8(1), seeds[1], seeds[2], seeds[3])
	q := kvindex.HashTokens(prompt, 4, nil)
	f.Fuzz(func(t *testing.T, seqs []byte, frames uint8, p0, p1, p2 []byte) {
		idx := kvindex.NewIndex(kvindex.IndexConfig{Shards: 2, Capacity: 64})
		s, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: idx})
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range [][]byte{p0, p1, p2} {
			var seq [8]byte
			if i < len(seqs) {
				binary.BigEndian.PutUint64(seq[:], uint64(seqs[i]))
			}
			msg := [][]byte{[]byte(testTopic), seq[:], p}
			switch frames % 4 {
			case 0:
				msg = msg[1:] // [seq, payload]
			case 1:
				msg[1] = seq[:int(frames)%8] // a short sequence frame
			case 2:
				msg = append(msg, p) // 4 frames
			}
			n, payload, err := splitFrames(msg)
			if err != nil {
				continue
			}
			s.handle(context.Background(), n, payload)
			if st := s.Status(); st.LastSeq != int64(n) {
				t.Fatalf("message %d (seq %d): LastSeq %d", i, n, st.LastSeq)
			}
			for _, h := range idx.Match(q, nil) {
				if h.Blocks > len(q) || h.GPUBlocks > h.Blocks || h.Endpoint != "e1" {
					t.Fatalf("hit %+v for a prompt of %d blocks", h, len(q))
				}
			}
			if st := idx.Stats(); st.Entries < 0 || st.Keys < 0 {
				t.Fatalf("index stats %+v", st)
			}
		}
	})
}

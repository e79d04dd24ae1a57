package signals

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/internal/cputime"
	"github.com/kvroute/kvroute/kvindex"
)

// BenchmarkIngest measures the KV-event path after the socket: decode a
// batch and apply it to a precise index, on one goroutine. Each batch holds
// 8 BlockStored events of 16 blocks of 16 tokens continuing one sequence
// (128 blocks) and one BlockRemoved of the 128 blocks stored 64 batches
// earlier, so the index stays at a steady size: 256 block events a batch.
func BenchmarkIngest(b *testing.B) {
	for _, enc := range []EventEncoding{{}, {MapEvents: true}} {
		name := "array"
		if enc.MapEvents {
			name = "map"
		}
		b.Run(name, func(b *testing.B) { benchIngest(b, enc) })
	}
}

func benchIngest(b *testing.B, enc EventEncoding) {
	const (
		bs, perEvent, events, lag, ring = 16, 16, 8, 64, 256
		perBatch                        = perEvent * events
	)
	rng := rand.New(rand.NewPCG(1, 2))
	hashOf := func(batch, block int) uint64 { return uint64(batch)*perBatch + uint64(block) + 1 }
	payloads := make([][]byte, ring)
	for r := 0; r < ring; r++ {
		var batch EventBatch
		for e := 0; e < events; e++ {
			ev := KVEvent{Kind: EventBlockStored, BlockSize: bs, Medium: "GPU"}
			for k := 0; k < perEvent; k++ {
				ev.BlockHashes = append(ev.BlockHashes, hashOf(r, e*perEvent+k))
			}
			for k := 0; k < perEvent*bs; k++ {
				ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(150000)))
			}
			if e > 0 {
				ev.Parent, ev.HasParent = hashOf(r, e*perEvent-1), true
			}
			batch.Events = append(batch.Events, ev)
		}
		old := (r - lag + ring) % ring
		rm := KVEvent{Kind: EventBlockRemoved, Medium: "GPU"}
		for k := 0; k < perBatch; k++ {
			rm.BlockHashes = append(rm.BlockHashes, hashOf(old, k))
		}
		batch.Events = append(batch.Events, rm)
		p, err := EncodeEventBatch(nil, &batch, enc)
		if err != nil {
			b.Fatal(err)
		}
		payloads[r] = p
	}
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: bs})
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e", Address: "tcp://127.0.0.1:1", Sink: idx})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var bytes int64
	for _, p := range payloads {
		bytes += int64(len(p))
	}
	b.SetBytes(bytes / ring)
	b.ReportAllocs()
	seq := uint64(0)
	cpu0 := cputime.Process()
	for b.Loop() {
		s.handle(ctx, seq, payloads[seq%ring])
		seq++
	}
	cpu := cputime.Process() - cpu0
	st := s.Status()
	if st.StoreErrors != 0 || st.Resyncs != 0 || st.DecodeErrors != 0 {
		b.Fatalf("status %+v", st)
	}
	b.ReportMetric(float64(b.N*2*perBatch)/b.Elapsed().Seconds(), "block-events/s")
	if cpu > 0 {
		b.ReportMetric(float64(b.N*2*perBatch)/cpu.Seconds(), "block-events/cpu-s")
	}
	b.ReportMetric(float64(idx.Stats().Entries), "entries")
}

package emulator

import (
	"log/slog"
	"testing"
)

// TestPublisherQueue: KVEventsConfig.MaxQueue bounds the batches waiting
// to be sent, whatever its size (a channel capped at 4096 dropped 904 of
// a burst of 5000 under the default of 100000); the batches go out in
// order, and those beyond MaxQueue are dropped and counted.
func TestPublisherQueue(t *testing.T) {
	cfg := KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}
	cfg.setDefaults()
	p := newPublisher(cfg, slog.New(slog.DiscardHandler))
	for i := range 5000 {
		p.publish([]byte{byte(i), byte(i >> 8)})
	}
	if p.dropped != 0 {
		t.Fatalf("MaxQueue=%d, 5000 batches queued: %d dropped", cfg.MaxQueue, p.dropped)
	}
	q := p.take()
	if len(q) != 5000 {
		t.Fatalf("took %d batches, want 5000", len(q))
	}
	for i, b := range q {
		if b[0] != byte(i) || b[1] != byte(i>>8) {
			t.Fatalf("batch %d out of order: %v", i, b)
		}
	}
	if n := len(p.take()); n != 0 {
		t.Errorf("queue not emptied: %d left", n)
	}

	cfg.MaxQueue = 3
	p = newPublisher(cfg, slog.New(slog.DiscardHandler))
	for i := range 5 {
		p.publish([]byte{byte(i)})
	}
	if q := p.take(); len(q) != 3 || p.dropped != 2 || q[2][0] != 2 {
		t.Errorf("MaxQueue 3, 5 published: kept %d (last %v), dropped %d; want 3 kept (last [2]), 2 dropped", len(q), q[len(q)-1], p.dropped)
	}
	p.publish([]byte{9}) // room again once taken
	if q := p.take(); len(q) != 1 || q[0][0] != 9 {
		t.Errorf("after a take: got %v, want [[9]]", q)
	}
}

package signals

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
)

// TestReplayAnswerBounded: a replay peer that streams batches and never
// sends the end marker must not make the subscriber gather them without
// bound until ReplayTimeout (here long): the answer fails once it passes
// MaxReplayBatches batches or MaxReplayBytes bytes, and a catch-up on it
// applies nothing. (Before the bound, zmqReplay read until the timeout:
// "replay: recv after 61235 batches: context deadline exceeded".)
func TestReplayAnswerBounded(t *testing.T) {
	big := make([]KVEvent, 0, 64) // a batch of about 8 KiB
	for range 64 {
		big = append(big, stored(0, 6))
	}
	for _, tc := range []struct {
		name    string
		events  []KVEvent
		batches int
		bytes   int64
		want    string
	}{
		{"batches", []KVEvent{stored(0, 2)}, 50, 0, "more than 50 batches"},
		{"bytes", big, 0, 64 << 10, "more than 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine(t, true, EventEncoding{MapEvents: true})
			eng.endless = true
			eng.publish(true, tc.events...)
			s, held := indexedSubscriber(t)
			s.cfg.ReplayAddress = eng.replayAddr
			s.cfg.ReplayTimeout = 5 * time.Second
			if tc.batches > 0 {
				s.cfg.MaxReplayBatches = tc.batches
			}
			if tc.bytes > 0 {
				s.cfg.MaxReplayBytes = tc.bytes
			}
			s.replay = s.zmqReplay
			got, err := s.replayRetry(context.Background(), 0)
			if !errors.Is(err, errReplayTooLong) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("replay of an endless answer: %d batches, err %v; want errReplayTooLong, %q", len(got), err, tc.want)
			}
			s.catchUp(context.Background())
			if n, st := held(), s.Status(); n != 0 || st.Batches != 0 || !strings.Contains(st.LastError, "too long") {
				t.Fatalf("catch-up on an endless answer: %d blocks held, %d batches applied, last error %q; want none applied, the error",
					n, st.Batches, st.LastError)
			}
		})
	}
}

func TestSubscriberConfigReplayBounds(t *testing.T) {
	for _, mutate := range []func(*SubscriberConfig){
		func(c *SubscriberConfig) { c.MaxReplayBatches = -1 },
		func(c *SubscriberConfig) { c.MaxReplayBytes = -1 },
	} {
		c := SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1", Sink: kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})}
		mutate(&c)
		if _, err := NewSubscriber(c); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("NewSubscriber(%+v): err %v, want a negative bound's", c, err)
		}
	}
}

// blockingSink holds every Store until release is closed.
type blockingSink struct {
	release chan struct{}
	stores  atomic.Int64
}

func (b *blockingSink) Store(string, kvindex.Stored) (int, error) {
	b.stores.Add(1)
	<-b.release
	return 0, nil
}
func (b *blockingSink) Evict(string, []uint64, kvroute.Tier) {}
func (b *blockingSink) Clear(string)                         {}
func (b *blockingSink) Remove(string)                        {}

// TestSubscriberReadAheadBounded: the messages a session reads ahead of
// their handling were bounded in number (64) only, so a peer sending
// large ones while a batch was being applied had up to 64 x MaxFrameSize
// (4 GiB by default) held; they are now bounded by MaxFrameSize bytes
// too. Without the bound the reader never waits (the test times out
// waiting for it): "timed out waiting for the reader to wait".
func TestSubscriberReadAheadBounded(t *testing.T) {
	eng := newFakeEngine(t, false, EventEncoding{})
	sink := &blockingSink{release: make(chan struct{})}
	const limit = 1 << 20
	h := startSub(t, eng, func(c *SubscriberConfig) {
		c.Sink, c.MaxFrameSize = sink, limit
	})
	t.Cleanup(func() { close(sink.release) })
	eng.publish(false, stored(0, 1))
	waitFor(t, "the first batch's Store", func() bool { return sink.stores.Load() == 1 })
	big := make([]byte, 400<<10)
	for i := range 6 {
		if err := eng.pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(uint64(1+i)), big)); err != nil {
			t.Fatal(err)
		}
	}
	var queued int64
	waitFor(t, "the reader to wait", func() bool {
		g := h.sub.gate.Load()
		if g == nil {
			return false
		}
		var waiting bool
		queued, waiting = g.state()
		return waiting
	})
	if queued > limit {
		t.Errorf("bytes read ahead: got %d, want at most %d", queued, limit)
	}
}

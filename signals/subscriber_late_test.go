package signals

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/kvindex"
)

// TestSubscriberLateStartWarns: a subscription without a replay socket
// whose first batch is not seq 0 (the router subscribed after the engine
// had published: the router started, or reconnected, after the engine
// served requests) cannot recover the batches before it, and every block
// later stored on top of theirs is an orphan that the index never holds:
// that must be a warning naming the endpoint and the batches missed, not
// silence. (It was silent: a test router that dialled an engine before its
// PUB socket was bound missed its first request's batches, and the precise
// index stayed empty with nothing in the log but the first failed dial.)
// With a replay socket the history is caught up and nothing is warned;
// with NoCatchUp, a deliberate choice, the loss is logged at info.
func TestSubscriberLateStartWarns(t *testing.T) {
	for _, tc := range []struct {
		name            string
		replay, noCatch bool
		want            string // the level of the line about the missed batches; "" none
		wantMatched     int
	}{
		{"no replay", false, false, "WARN", 0},
		{"replay", true, false, "", 6},
		{"replay, NoCatchUp", true, true, "INFO", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine(t, tc.replay, EventEncoding{})
			// Published before the router subscribed.
			eng.publish(true, stored(0, 2))
			eng.publish(true, stored(2, 4))
			var logs syncbuf.Buffer
			h := startSub(t, eng, func(c *SubscriberConfig) {
				c.NoCatchUp = tc.noCatch
				c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			})
			eng.publish(false, stored(4, 6))
			st := h.waitSeq(t, 2)
			if got := matchedOn(h.idx, prompt); got != tc.wantMatched {
				t.Errorf("matched %d blocks, want %d; status %+v", got, tc.wantMatched, st)
			}
			var line string
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, "published before the subscription") {
					line = l
				}
			}
			switch {
			case tc.want == "" && line != "":
				t.Errorf("logged %q, want nothing about missed batches", line)
			case tc.want != "" && !strings.Contains(line, "level="+tc.want):
				t.Errorf("logged %q, want a %s line about the batches published before the subscription; logs:\n%s",
					line, tc.want, logs.String())
			case tc.want != "" && (!strings.Contains(line, "endpoint=e1") || !strings.Contains(line, "missed=2")):
				t.Errorf("logged %q, want endpoint=e1 missed=2", line)
			}
		})
	}
}

// TestSubscriberBeforeEngineBinds: the router subscribes to an engine that
// does not listen yet (the two start together; the engine restarts), so
// its dials fail; the engine then binds and serves requests before the
// subscriber's next dial, and their batches never reach the SUB socket.
// With a replay socket they must be caught up, when the subscriber
// connects or at the first batch it receives, and the engine's blocks
// indexed: the scenario of TestServeConfigWithSignalsAndPrecise's failure
// in cmd/kvroute, where the engines had no replay socket.
func TestSubscriberBeforeEngineBinds(t *testing.T) {
	pubAddr, replayAddr := freeTCPAddr(t), freeTCPAddr(t)
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	sub, _ := runSubscriber(t, SubscriberConfig{Endpoint: "e1", Address: pubAddr, ReplayAddress: replayAddr, Topic: testTopic,
		Sink: idx}, func(c *SubscriberConfig) { c.DialRetry = 10 * time.Millisecond })
	waitFor(t, "a failed dial", func() bool { return sub.Status().LastError != "" })

	eng := newFakeEngineAt(t, pubAddr, replayAddr, EventEncoding{})
	eng.publish(true, stored(0, 2)) // lost on the SUB socket, as if sent before the subscription
	eng.publish(true, stored(2, 4))
	eng.waitSubscribed()
	eng.publish(false, stored(4, 6))
	h := &harness{eng: eng, idx: idx, sub: sub}
	st := h.waitSeq(t, 2)
	if got := h.matched(t); got != 6 {
		t.Errorf("matched %d blocks, want 6 (the batches before the subscription caught up); status %+v", got, st)
	}
	if st.Batches != 3 || st.Orphans != 0 || st.Resyncs != 0 {
		t.Errorf("status %+v: want 3 batches, no orphan, no resync", st)
	}
}

package signals

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/kvindex"
)

// awaitNewConnection waits until the subscriber receives messages on a new
// connection after the one that ended with LastError containing why: it
// sends one-frame messages on the topic (counted as decode errors, which
// change no sequence state) until one arrives. The previous session's socket
// is closed before LastError is set, so an arrival proves that the new
// connection is subscribed and that the next batch reaches it.
func awaitNewConnection(t *testing.T, h *harness, why string) {
	t.Helper()
	waitFor(t, "a connection ended: "+why, func() bool { return strings.Contains(h.sub.Status().LastError, why) })
	before := h.sub.Status().DecodeErrors
	waitFor(t, "a message on the new connection", func() bool {
		if h.sub.Status().DecodeErrors > before {
			return true
		}
		if err := h.eng.pub.Send(zmq4.NewMsgFrom([]byte(testTopic))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		return h.sub.Status().DecodeErrors > before
	})
}

// TestSubscriberIdleKeepsEntriesWithoutReplay: an engine without a replay
// socket that publishes nothing for IdleReconnect is re-dialled; its next
// batch, continuing the sequence, must not drop the entries it still holds.
// (It did: every new connection without replay forced a resync, so every
// engine idle for 10s lost all its entries with its next request.)
func TestSubscriberIdleKeepsEntriesWithoutReplay(t *testing.T) {
	eng := newFakeEngine(t, false, EventEncoding{})
	var logs syncbuf.Buffer
	h := startSub(t, eng, func(c *SubscriberConfig) {
		// Long enough that the new connection does not go idle too
		// before the next batch is published.
		c.IdleReconnect = time.Second
		c.DialRetry = 10 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	eng.publish(false, stored(0, 3))
	h.waitSeq(t, 0)
	awaitNewConnection(t, h, "idle")
	eng.publish(false, stored(3, 6))
	st := h.waitSeq(t, 1)
	if got := matchedOn(h.idx, prompt); got != 6 {
		t.Errorf("matched %d blocks, want 6 (entries kept across the idle reconnect); status %+v", got, st)
	}
	if st.Resyncs != 0 || st.Restarts != 0 || st.Reconnects != 1 {
		t.Errorf("status %+v: want 1 reconnect, no resync, no restart", st)
	}
	// An idle engine reconnects every IdleReconnect: not a warning.
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("an idle reconnect logged a warning:\n%s", logs.String())
	}
}

// TestSubscriberRestartDetectedOnConnect: the engine is killed and a new
// one starts on the same addresses (an empty cache) but serves no request
// yet, so it publishes nothing. The old engine's entries must be dropped as
// soon as the subscriber reconnects, not when the new engine's first batch
// arrives (the router would send every request with a known prefix to the
// restarted engine meanwhile). The new engine's batches are then indexed.
func TestSubscriberRestartDetectedOnConnect(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			old := newFakeEngine(t, replay, EventEncoding{})
			h := startSub(t, old, func(c *SubscriberConfig) { c.DialRetry = 10 * time.Millisecond })
			old.publish(false, stored(0, 6))
			h.waitSeq(t, 0)
			pubAddr, replayAddr := old.pubAddr, old.replayAddr
			old.close()
			waitFor(t, "disconnect", func() bool { return !h.sub.Status().Connected })

			eng := newFakeEngineAt(t, pubAddr, replayAddr, EventEncoding{})
			h.eng = eng
			eng.waitSubscribed()
			waitFor(t, "the old engine's entries dropped", func() bool { return matchedOn(h.idx, prompt) == 0 })
			st := h.sub.Status()
			if st.Restarts+st.Resyncs != 1 {
				t.Errorf("status %+v: want one restart or resync", st)
			}

			// The new engine's first batches are a new sequence.
			eng.publish(false, stored2(0, 2))
			eng.publish(false, stored2(2, 3))
			st = h.waitSeq(t, 1)
			if got := matchedOn(h.idx, prompt2); got != 3 {
				t.Errorf("new engine: matched %d blocks, want 3; status %+v", got, st)
			}
			if st.Restarts+st.Resyncs != 1 || st.Orphans != 0 {
				t.Errorf("status %+v: want still one restart or resync, no orphan", st)
			}
		})
	}
}

// TestSubscriberReconnectVerifiedSameEngine: the connection to the engine
// fails (here: the PUB socket is replaced, the ROUTER socket and its
// history stay, as after a network failure) and the subscriber reconnects
// to the same engine: the check on connect finds the same history and the
// entries stay; the batch lost meanwhile is applied from a replay, the
// check's own when the engine had published it by then (applyMissed), else
// the gap's.
func TestSubscriberReconnectVerifiedSameEngine(t *testing.T) {
	old := newFakeEngine(t, true, EventEncoding{})
	h := startSub(t, old, func(c *SubscriberConfig) { c.DialRetry = 10 * time.Millisecond })
	old.publish(false, stored(0, 3))
	// The catch-up at the first connection replays batch 0 when the
	// engine had published it by then: a replay counted before the one
	// this test is about.
	before := h.waitSeq(t, 0).Replays
	// A new PUB socket at the same address, sharing the old one's
	// sequence and replay history.
	pubAddr := old.pubAddr
	old.pub.Close()
	waitFor(t, "disconnect", func() bool { return !h.sub.Status().Connected })
	pub := zmq4.NewPub(t.Context(), zmq4.WithLogger(newDiscardLogger()))
	if err := pub.Listen(pubAddr); err != nil {
		t.Fatal(err)
	}
	old.mu.Lock()
	old.pub = pub
	old.mu.Unlock()
	old.waitSubscribed()
	old.publish(true, stored(3, 4)) // lost
	old.publish(false, stored(4, 6))
	st := h.waitSeq(t, 2)
	if got := matchedOn(h.idx, prompt); got != 6 {
		t.Errorf("matched %d blocks, want 6; status %+v", got, st)
	}
	if st.Restarts != 0 || st.Resyncs != 0 || st.Reconnects != 1 || st.Replays-before != 1 || st.Gaps > 1 {
		t.Errorf("status %+v (%d replays before): want 1 reconnect, 1 replay (at the check or for a gap), no restart, no resync", st, before)
	}
}

// silentEngine accepts TCP connections and never answers, like a frozen
// engine process (SIGSTOP, a hung interpreter) whose kernel still accepts
// connections. It counts them.
type silentEngine struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newSilentEngine(t *testing.T) *silentEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &silentEngine{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		e.wg.Wait()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
	})
	return e
}

func (e *silentEngine) addr() string { return "tcp://" + e.ln.Addr().String() }

func (e *silentEngine) accepted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.conns)
}

// TestSubscriberFrozenEngine: dialling an engine that accepts connections
// but never completes the ZMTP handshake gives up after ReplayTimeout and
// tries again, and Run returns when its context is cancelled. (zmq4's Dial
// waited for the handshake forever: the subscriber stalled, and the
// router's shutdown with it.) The same holds for the replay socket.
func TestSubscriberFrozenEngine(t *testing.T) {
	t.Run("pub", func(t *testing.T) {
		frozen := newSilentEngine(t)
		idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
		sub, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: frozen.addr(), Sink: idx,
			ReplayTimeout: 50 * time.Millisecond, DialRetry: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- sub.Run(ctx) }()
		waitFor(t, "a second dial after a handshake that never came", func() bool { return frozen.accepted() >= 2 })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return 10s after its context was cancelled")
		}
		if st := sub.Status(); !strings.Contains(st.LastError, "dial") {
			t.Errorf("status %+v: want a dial error", st)
		}
	})
	t.Run("replay", func(t *testing.T) {
		frozen := newSilentEngine(t)
		eng := newFakeEngine(t, false, EventEncoding{})
		h := startSub(t, eng, func(c *SubscriberConfig) {
			c.ReplayAddress = frozen.addr()
			c.ReplayTimeout = 50 * time.Millisecond
		})
		eng.publish(false, stored(0, 2))
		h.waitSeq(t, 0)
		eng.publish(true, stored(2, 4)) // lost: the gap asks the frozen replay socket
		eng.publish(false, stored(4, 6))
		st := h.waitSeq(t, 2)
		if st.Gaps != 1 || st.Resyncs != 1 || !strings.Contains(st.LastError, "replay") {
			t.Errorf("status %+v: want a gap, a failed replay and a resync", st)
		}
		if frozen.accepted() < 2 {
			t.Errorf("replay dials: %d, want at least 2 (each attempt gave up)", frozen.accepted())
		}
	})
}

// TestSubscriberCatchUpOnConnect: the router starts after the engine has
// served requests and the engine is idle: its buffered history is caught
// up as soon as the subscriber connects, not at the engine's next batch
// (until then the router knew nothing of the cache the engine holds).
// Batches that arrive on the SUB socket too after the catch-up applied them
// are skipped, not taken for a restart.
func TestSubscriberCatchUpOnConnect(t *testing.T) {
	eng := newFakeEngine(t, true, EventEncoding{})
	eng.publish(true, stored(0, 3))
	eng.publish(true, stored(3, 5))
	h := startSub(t, eng, nil)
	waitFor(t, "history caught up without a new batch", func() bool { return matchedOn(h.idx, prompt) == 5 })

	// Batch 1 again, as if published between the connection and the
	// replay: a duplicate.
	eng.mu.Lock()
	dup := eng.buf[1]
	eng.mu.Unlock()
	if err := eng.pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(dup.seq), dup.payload)); err != nil {
		t.Fatal(err)
	}
	eng.publish(false, removed(4))
	st := h.waitSeq(t, 2)
	if got := matchedOn(h.idx, prompt); got != 4 {
		t.Errorf("matched %d blocks, want 4; status %+v", got, st)
	}
	if st.Restarts != 0 || st.Resyncs != 0 || st.Gaps != 0 || st.Batches != 3 {
		t.Errorf("status %+v: want 3 batches, no restart, resync or gap", st)
	}
}

// TestSubscriberDialFailuresLoggedOnce: an engine that stays down is
// re-dialled every DialRetry; the first failure is a warning, the next
// ones of the streak only debug lines (each was a warning: two a second
// per endpoint for as long as the engine was down). A connection made
// after them is logged, and its failure is a warning again.
func TestSubscriberDialFailuresLoggedOnce(t *testing.T) {
	addr := freeTCPAddr(t) // nothing listens there: every dial fails
	var logs syncbuf.Buffer
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	sub, _ := runSubscriber(t, SubscriberConfig{Endpoint: "e1", Address: addr, Topic: testTopic, Sink: idx}, func(c *SubscriberConfig) {
		c.DialRetry = time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	count := func(s string) int { return strings.Count(logs.String(), s) }
	waitFor(t, "5 failed dials", func() bool { return count("session ended") >= 5 })
	if n := count("level=WARN"); n != 1 {
		t.Fatalf("%d warnings for one streak of failed dials, want 1:\n%s", n, logs.String())
	}
	eng := newFakeEngineAt(t, addr, "", EventEncoding{})
	eng.waitSubscribed()
	waitFor(t, "the connection logged", func() bool { return count("connected again") == 1 })
	eng.close()
	waitFor(t, "the connection's failure warned", func() bool { return count("level=WARN") == 2 })
	waitFor(t, "disconnect", func() bool { return !sub.Status().Connected })
}

package emulator

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

// TestRunFailsQueuedRequests: a request posted while the loop sleeps
// through a quiet run, in the middle of a step, waits in the loop's queue
// for that step's end; when Run is stopped then, the request must still be
// failed with ErrStopped (Run fails every live request before it
// returns), not left with a handler waiting forever.
func TestRunFailsQueuedRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(Config{Model: "tiny", Engine: tinyEngine(t), Speed: 1})
		if err != nil {
			t.Fatal(err)
		}
		s.runtimeTimer = true // synctest's clock does not drive a timerfd
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()

		add := func(id string, every int) *stream {
			req := &engine.Request{ID: id, Prompt: []uint32{1, 2, 3, 4, 5}, MaxTokens: 900, IgnoreEOS: true}
			st := newStream(id, every, req.MaxTokens)
			if err := s.post(command{kind: cmdAdd, req: req, st: st}); err != nil {
				t.Fatal(err)
			}
			return st
		}
		a := add("a", 0) // not observed until it finishes: the loop sleeps through its decode run
		time.Sleep(100*time.Millisecond + s.minStep/3)
		synctest.Wait()
		b := add("b", 1) // streamed: wakes the loop in the middle of a step
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		for _, st := range []*stream{a, b} {
			p := st.take(nil)
			if !p.finished || !errors.Is(p.err, ErrStopped) {
				t.Errorf("request %s after Run returned: finished %v err %v, want ErrStopped", st.id, p.finished, p.err)
			}
		}
	})
}

// TestCloseStopsLeaseTimers: a prefill engine's KV leases end with the
// server: Close stops their timers, so none fires after it (each fired a
// "kv lease expired" warning up to --kv-lease after the engine stopped,
// from a timer nothing owned).
func TestCloseStopsLeaseTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		s, err := New(Config{Model: "tiny", Engine: tinyEngine(t), Speed: 1, Role: kvroute.RolePrefill,
			LeaseTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		st := newStream("p", 0, 1)
		st.leaseKey = "room-1"
		s.grantLease(st, 4*s.prof.BlockSize, []int{1, 2, 3, 4})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if strings.Contains(logs.String(), "lease expired") {
			t.Errorf("a lease timer fired after Close:\n%s", logs.String())
		}
		s.leases.mu.Lock()
		defer s.leases.mu.Unlock()
		if n := len(s.leases.m); n != 0 {
			t.Errorf("%d leases left after Close, want 0", n)
		}
	})
}

package emulator

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvroute/kvroute/engine"
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

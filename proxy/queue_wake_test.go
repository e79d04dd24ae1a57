package proxy

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestQueueWakesWhenRoomFrees: the head of the line routes again as soon
// as a flight of its pool ends (Router.Drained), not at the end of its
// pause. The pause is made an hour long here, so without the wake-up the
// held request would wait out its queue_wait instead.
func TestQueueWakesWhenRoomFrees(t *testing.T) {
	eng := newHeldEngine(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	}, "X", "A")
	sp := newSlotPicker()
	cfg := testConfig("slot", eng.URL)
	cfg.Retry.QueueWait = time.Hour
	tp := newTestProxyWith(t, cfg, onePicker(sp))
	tp.queuePause.first, tp.queuePause.max = time.Hour, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // on failure the held request ends with the test
	t.Cleanup(func() {
		for _, ch := range eng.release {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	})

	x := sendTo(ctx, tp.srv.URL, "m", "X")
	if got := recv(t, "X at the engine", eng.arrived); got != "X" {
		t.Fatalf("engine: got %q, want X", got)
	}
	a := sendTo(ctx, tp.srv.URL, "m", "A")
	waitFor(t, "A held", func() bool { return tp.metric(t, tp.metrics.queued, "m") == 1 })
	close(eng.release["X"])
	if ans := recv(t, "X's answer", x); ans.err != nil || ans.status != http.StatusOK {
		t.Fatalf("X: got %d %s (%v)", ans.status, ans.body, ans.err)
	}
	if got := recv(t, "A at the engine once X ended", eng.arrived); got != "A" {
		t.Fatalf("engine: got %q, want A", got)
	}
	close(eng.release["A"])
	if ans := recv(t, "A's answer", a); ans.err != nil || ans.status != http.StatusOK {
		t.Fatalf("A: got %d %s (%v)", ans.status, ans.body, ans.err)
	}
}

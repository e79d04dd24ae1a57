package silence

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestWatch: a read that waits Limit is cut; time between reads (a slow
// client) is not silence; a nil Watch does nothing.
func TestWatch(t *testing.T) {
	var cuts atomic.Int32
	w := &Watch{Limit: 20 * time.Millisecond, Cut: func() { cuts.Add(1) }}
	w.Arm()
	defer w.Stop()
	// Not reading for many limits: nothing is cut.
	time.Sleep(100 * time.Millisecond)
	if w.Fired() || cuts.Load() != 0 {
		t.Fatal("cut while no read was waiting on the upstream")
	}
	w.Waiting(true)
	deadline := time.Now().Add(10 * time.Second)
	for !w.Fired() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !w.Fired() || cuts.Load() != 1 {
		t.Fatalf("a read waiting past the limit: fired %v, %d cuts, want true and 1", w.Fired(), cuts.Load())
	}

	var nilWatch *Watch
	nilWatch.Arm()
	nilWatch.Waiting(true)
	nilWatch.Waiting(false)
	nilWatch.Stop()
	if nilWatch.Fired() {
		t.Error("a nil Watch fired")
	}
}

// TestWatchStopped: a stopped Watch never cuts.
func TestWatchStopped(t *testing.T) {
	w := &Watch{Limit: 10 * time.Millisecond, Cut: func() { t.Error("cut after Stop") }}
	w.Arm()
	w.Waiting(true)
	w.Stop()
	time.Sleep(50 * time.Millisecond)
	if w.Fired() {
		t.Error("fired after Stop")
	}
}

package silence

import (
	"errors"
	"io"
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

// TestReader: a read through Reader that blocks past the limit is cut (the
// cut closes the pipe, ending the read with an error); without a Watch it
// is the reader itself.
func TestReader(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	if Reader(pr, nil) != io.Reader(pr) {
		t.Error("Reader without a Watch wraps the reader")
	}
	w := &Watch{Limit: 20 * time.Millisecond, Cut: func() { pr.CloseWithError(errors.New("cut")) }}
	w.Arm()
	defer w.Stop()
	go func() { _, _ = pw.Write([]byte("first")) }()
	b, err := io.ReadAll(Reader(pr, w))
	if string(b) != "first" || err == nil || !w.Fired() {
		t.Errorf("read %q, %v, fired %v; want the bytes before the silence, an error and fired", b, err, w.Fired())
	}
}

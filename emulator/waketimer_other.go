//go:build !linux

package emulator

import "time"

// wakeTimer is the engine loop's timer: a time.Timer (on Linux, a timerfd;
// see waketimer_linux.go).
type wakeTimer struct {
	C <-chan time.Time
	t *time.Timer
}

// newWakeTimer returns a stopped timer (a time.Timer, whatever runtime).
func newWakeTimer(runtime bool) *wakeTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &wakeTimer{C: t.C, t: t}
}

// Reset arms the timer to signal C once d from now.
func (w *wakeTimer) Reset(d time.Duration) { w.t.Reset(d) }

// Stop disarms the timer.
func (w *wakeTimer) Stop() { w.t.Stop() }

// close releases the timer.
func (w *wakeTimer) close() { w.t.Stop() }

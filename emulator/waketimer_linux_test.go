package emulator

import "testing"

// TestWakeTimerIsTimerfd: on Linux the loop's timer is a timerfd in the
// poller (the CPU cost TestFleetCPU measures), a runtime timer only when
// asked for.
func TestWakeTimerIsTimerfd(t *testing.T) {
	w := newWakeTimer(false)
	defer w.close()
	if w.f == nil {
		t.Error("newWakeTimer(false) is not a timerfd")
	}
	r := newWakeTimer(true)
	defer r.close()
	if r.f != nil {
		t.Error("newWakeTimer(true) is a timerfd")
	}
}

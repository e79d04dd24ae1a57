package emulator

import (
	"testing"
	"time"
)

// TestWakeTimer: the loop's timer signals C once it is due, not before,
// again after a Reset, and its close returns (its goroutine, if any,
// ended).
func TestWakeTimer(t *testing.T) {
	for _, runtime := range []bool{false, true} {
		w := newWakeTimer(runtime)
		w.Reset(time.Hour)
		w.Stop()
		for range 3 {
			const d = 3 * time.Millisecond
			start := time.Now()
			w.Reset(d)
			<-w.C
			if since := time.Since(start); since < d {
				t.Errorf("runtime %v: signalled after %v, before the %v it was set to", runtime, since, d)
			}
		}
		w.close()
	}
}

package cputime

import (
	"runtime"
	"testing"
	"time"
)

// TestCPUAdvances: burning CPU moves both clocks forward (where they can be
// read at all).
func TestCPUAdvances(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p0, t0 := Process(), Thread()
	x := 0
	for i := range 50_000_000 {
		x += i ^ x>>3
	}
	p1, t1 := Process(), Thread()
	if runtime.GOOS == "linux" && (p1 <= p0 || t1 <= t0) {
		t.Errorf("process %v -> %v, thread %v -> %v: want both to advance (x=%d)", p0, p1, t0, t1, x)
	}
	if t1-t0 > p1-p0+time.Millisecond {
		t.Errorf("thread CPU %v above process CPU %v", t1-t0, p1-p0)
	}
}

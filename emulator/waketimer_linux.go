package emulator

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// wakeTimer is the engine loop's timer. On Linux it is a timerfd in Go's
// network poller rather than a runtime timer, for two reasons (measured
// in TestFleetCPU, see doc.go's CPU cost):
//
//   - Go's poller waits for its timers with epoll_wait, whose timeout is in
//     milliseconds: a runtime timer due in 6.4 ms wakes the process at 6 ms,
//     finds it not due, and sleeps 1 ms more, so it costs two wake-ups and
//     fires up to a millisecond late. A timerfd expires at its nanosecond,
//     and wakes the poller once.
//   - The runtime's sysmon thread, asleep while the process idles, sleeps
//     until the next runtime timer: each of the loop's timers woke it too,
//     and it then polled every 20 us through the loop's work. It sleeps
//     through the timerfd's expiry, until a system call wakes it.
//
// So the timer is armed and read with raw system calls (a syscall.Syscall
// enters the scheduler's syscall state, which wakes sysmon), and a
// goroutine of its own waits for the expiry in the poller and signals C.
// A signal may be stale (an expiry that raced Stop or Reset): the loop
// checks the clock, as after any wake-up. Where no timerfd can be made
// and polled, it is a time.Timer (as on other systems).
type wakeTimer struct {
	C    <-chan time.Time
	c    chan time.Time // C, with a timerfd
	fd   uintptr
	f    *os.File      // the timerfd, nil for a time.Timer
	t    *time.Timer   // without a timerfd
	done chan struct{} // closed when the timerfd's goroutine exits
}

// itimerspec is the kernel's struct itimerspec.
type itimerspec struct {
	interval, value syscall.Timespec
}

const clockMonotonic = 1 // CLOCK_MONOTONIC

// newWakeTimer returns a stopped timer, a time.Timer with runtime set.
// Its close stops the goroutine it may start.
func newWakeTimer(runtime bool) *wakeTimer {
	if !runtime {
		if w := newTimerfd(); w != nil {
			return w
		}
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &wakeTimer{C: t.C, t: t}
}

// newTimerfd returns a wakeTimer on a timerfd, or nil when none can be made
// and polled.
func newTimerfd() *wakeTimer {
	fd, _, errno := syscall.RawSyscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil
	}
	f := os.NewFile(fd, "timerfd")
	rc, err := f.SyscallConn()
	// A deadline can be set only on a file in the poller: without one, a
	// read would block its thread.
	if err != nil || f.SetReadDeadline(time.Time{}) != nil {
		f.Close()
		return nil
	}
	c := make(chan time.Time, 1)
	w := &wakeTimer{C: c, c: c, fd: fd, f: f, done: make(chan struct{})}
	go w.wait(rc)
	return w
}

// wait signals C at each expiry of the timerfd until it is closed.
func (w *wakeTimer) wait(rc syscall.RawConn) {
	defer close(w.done)
	var n [8]byte // the expirations since the last read
	for {
		err := rc.Read(func(fd uintptr) bool {
			_, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&n[0])), uintptr(len(n)))
			return errno != syscall.EAGAIN && errno != syscall.EINTR
		})
		if err != nil {
			return // closed
		}
		select {
		case w.c <- time.Time{}:
		default:
		}
	}
}

// Reset arms the timer to signal C once d from now (d > 0), dropping a
// signal not taken yet.
func (w *wakeTimer) Reset(d time.Duration) {
	if w.f == nil {
		w.t.Reset(d)
		return
	}
	w.drain()
	w.settime(syscall.NsecToTimespec(int64(max(d, 1))))
}

// Stop disarms the timer and drops a signal not taken yet.
func (w *wakeTimer) Stop() {
	if w.f == nil {
		w.t.Stop()
		return
	}
	w.settime(syscall.Timespec{})
	w.drain()
}

func (w *wakeTimer) drain() {
	select {
	case <-w.c:
	default:
	}
}

// settime sets the timerfd to expire once at v from now (zero: disarmed).
func (w *wakeTimer) settime(v syscall.Timespec) {
	its := itimerspec{value: v}
	_, _, errno := syscall.RawSyscall6(syscall.SYS_TIMERFD_SETTIME, w.fd, 0, uintptr(unsafe.Pointer(&its)), 0, 0, 0)
	if errno != 0 {
		panic("emulator: timerfd_settime: " + errno.Error()) // only a bad fd or value can fail
	}
}

// close releases the timer and waits for its goroutine.
func (w *wakeTimer) close() {
	if w.f == nil {
		w.t.Stop()
		return
	}
	w.f.Close()
	<-w.done
}

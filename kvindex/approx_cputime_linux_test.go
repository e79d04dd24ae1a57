//go:build linux

package kvindex

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPU returns the calling thread's CPU time (the caller locks its
// goroutine to the thread), so that two implementations interleaved in one
// benchmark loop can be charged separately.
func threadCPU() time.Duration {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

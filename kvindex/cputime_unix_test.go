//go:build unix

package kvindex

import (
	"syscall"
	"time"
)

// cpuTime returns the process's user+system CPU time: benchmarks report
// throughput per CPU-second too, since wall time on a shared machine
// includes waiting for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Package cputime reads CPU time for benchmarks and soak tests: on a shared
// machine wall time includes waiting for a core, CPU time does not.
package cputime

import "time"

// Process returns the process's user plus system CPU time, or 0 where it
// cannot be read.
func Process() time.Duration { return process() }

// Thread returns the calling OS thread's CPU time (the caller locks its
// goroutine to the thread with runtime.LockOSThread), or 0 where it cannot
// be read: two pieces of code interleaved in one loop can be charged
// separately.
func Thread() time.Duration { return thread() }

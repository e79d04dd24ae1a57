//go:build !linux

package kvindex

import "time"

// threadCPU is not available here: the interleaved benchmarks fall back to
// wall time.
func threadCPU() time.Duration { return 0 }

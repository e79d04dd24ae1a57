//go:build !unix

package kvindex

import "time"

func cpuTime() time.Duration { return 0 }

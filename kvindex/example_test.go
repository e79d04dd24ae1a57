package kvindex_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

func ExampleApprox() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	system := make([]uint32, 64) // a shared 64-token system prompt
	for i := range system {
		system[i] = uint32(i + 1)
	}
	conv1 := append(append([]uint32{}, system...), make([]uint32, 32)...)
	conv2 := append(append([]uint32{}, system...), 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7)

	a := kvindex.NewApprox(kvindex.ApproxConfig{})
	a.Record(now, "gpu-0", kvindex.HashTokens(conv1, 16, nil))

	for _, h := range a.Match(now, kvindex.HashTokens(conv2, 16, nil), nil) {
		fmt.Printf("%s holds %d of 5 blocks (%s)\n", h.Endpoint, h.Blocks, h.Tier)
	}
	// Output: gpu-0 holds 4 of 5 blocks (gpu)
}

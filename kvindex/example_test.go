package kvindex_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
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

func ExampleIndex() {
	x := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

	// The engine reports two blocks stored on the GPU (its own hashes 0xa1,
	// 0xa2), then the third one offloaded to host memory.
	x.Store("gpu-0", kvindex.Stored{BlockHashes: []uint64{0xa1, 0xa2}, Tokens: prompt[:8]})
	x.Store("gpu-0", kvindex.Stored{BlockHashes: []uint64{0xa3}, Parent: 0xa2, HasParent: true,
		Tokens: prompt[8:], Tier: kvroute.TierCPU})

	hashes := kvindex.HashTokens(prompt, 4, nil)
	for _, h := range x.Match(hashes, nil) {
		fmt.Printf("%s: %d blocks (%d on GPU), tier %s\n", h.Endpoint, h.Blocks, h.GPUBlocks, h.Tier)
	}

	// BlockRemoved for the second block cuts the run.
	x.Evict("gpu-0", []uint64{0xa2}, kvroute.TierGPU)
	for _, h := range x.Match(hashes, nil) {
		fmt.Printf("%s: %d blocks\n", h.Endpoint, h.Blocks)
	}
	// Output:
	// gpu-0: 3 blocks (2 on GPU), tier cpu
	// gpu-0: 1 blocks
}

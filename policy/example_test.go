package policy_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

func Example() {
	p, err := policy.New("kv-aware", map[string]any{"c": 1.25, "overload": "shed"}, 42)
	if err != nil {
		panic(err)
	}
	req := &kvroute.Request{ID: "req-1", PromptTokens: 4096, BlockSize: 16, BlockHashes: make([]uint64, 256)}
	cands := []kvroute.Candidate{
		{Endpoint: &kvroute.Endpoint{ID: "a"}, Healthy: true, Load: kvroute.Load{InFlight: 2, Running: 2}},
		{Endpoint: &kvroute.Endpoint{ID: "b"}, Healthy: true, Load: kvroute.Load{InFlight: 2, Running: 2},
			CachedBlocks: 192, CachedTokens: 3072, Tier: kvroute.TierGPU},
		{Endpoint: &kvroute.Endpoint{ID: "c"}, Healthy: false},
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := p.Pick(now, req, cands)
	fmt.Println(d.Endpoint)
	fmt.Println(d.Reason)
	for _, s := range d.Scores {
		fmt.Printf("%s eligible=%v score=%.1f why=%q\n", s.Endpoint, s.Eligible, s.Value, s.Why)
	}
	// The router tells the policy when the request ends.
	if r, ok := p.(kvroute.Releaser); ok {
		r.Release(now.Add(time.Second), req, d.Endpoint)
	}
	// Output:
	// b
	// affinity: est 31.1 ms (queue 2.0 + prefill 29.1), 3072/4096 tokens cached
	// a eligible=true score=342.1 why=""
	// b eligible=true score=212.6 why=""
	// c eligible=false score=0.0 why="unhealthy"
}

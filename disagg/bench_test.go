package disagg

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// BenchmarkPlan is one placement over 16 prefill and 16 decode candidates
// (the hot path under the router's lock).
func BenchmarkPlan(b *testing.B) {
	pl := newPlanner(b, ModeConditional, DefaultLinks())
	var specs []candSpec
	for i := range 16 {
		specs = append(specs, candSpec{ep: ep(fmt.Sprintf("p%d", i), kvroute.RolePrefill, "rack", "r1", "node", fmt.Sprintf("n%d", i)),
			load: kvroute.Load{InFlight: i % 3, InFlightTokens: (i % 3) * 4000}, cached: (i % 4) * 1024})
		specs = append(specs, candSpec{ep: ep(fmt.Sprintf("d%d", i), kvroute.RoleDecode, "rack", "r1", "node", fmt.Sprintf("n%d", i)),
			load: kvroute.Load{Running: 8 + i, DecodeTokens: (8 + i) * 3000, KVUsage: 0.3}})
	}
	benchPlan(b, pl, cands(specs...), req("b", 8192, 256))
}

// benchPlan times pl's placement of r over cs, one request a millisecond.
func benchPlan(b *testing.B, pl *Planner, cs []kvroute.Candidate, r *kvroute.Request) {
	t0 := time.Unix(1_700_000_000, 0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p := pl.Plan(t0.Add(time.Duration(i)*time.Millisecond), r, cs)
		pl.Finish(p.Ticket)
	}
}

// BenchmarkFabricEstimate prices a transfer with 64 others booked.
func BenchmarkFabricEstimate(b *testing.B) {
	f := NewFabric(DefaultLinks())
	t0 := time.Unix(0, 0)
	for i := range 64 {
		f.Reserve(t0, t0, ep(fmt.Sprintf("p%d", i%8), kvroute.RolePrefill), ep(fmt.Sprintf("d%d", i%4), kvroute.RoleDecode), 1<<30)
	}
	a, d := ep("p1", kvroute.RolePrefill), ep("d1", kvroute.RoleDecode)
	b.ReportAllocs()
	for b.Loop() {
		f.Estimate(t0, t0, a, d, 1<<30)
	}
}

// BenchmarkPlanDeepQueue is BenchmarkPlan with every node overloaded: 1 to
// 2.5 M prompt tokens queued on each prefill node and 2 to 2.8 M (waiting
// requests at the mean prompt size) on each decode node, so every queue
// estimate covers a few hundred budget-sized steps.
func BenchmarkPlanDeepQueue(b *testing.B) {
	pl := newPlanner(b, ModeConditional, DefaultLinks())
	var specs []candSpec
	for i := range 16 {
		specs = append(specs, candSpec{ep: ep(fmt.Sprintf("p%d", i), kvroute.RolePrefill, "rack", "r1", "node", fmt.Sprintf("n%d", i)),
			load: kvroute.Load{InFlight: 200 + i, InFlightTokens: 1_000_000 + i*100_000}, cached: (i % 4) * 1024})
		specs = append(specs, candSpec{ep: ep(fmt.Sprintf("d%d", i), kvroute.RoleDecode, "rack", "r1", "node", fmt.Sprintf("n%d", i)),
			load: kvroute.Load{Running: 64 + i, DecodeTokens: (64 + i) * 3000, Waiting: 2000 + 50*i, KVUsage: 0.9}})
	}
	benchPlan(b, pl, cands(specs...), req("b", 32768, 256))
}

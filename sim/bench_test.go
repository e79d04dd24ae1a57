package sim

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workload"
)

// loadTrace returns the embedded Mooncake conversation trace.
func loadTrace(tb testing.TB) []workload.Request {
	tb.Helper()
	w, err := DefaultWorkload()
	if err != nil {
		tb.Fatal(err)
	}
	return w.Requests
}

// BenchmarkMooncakeTrace simulates the whole shared conversation trace
// (12,031 requests) on 8 llama-3.1-8b-h100 engines, one policy per
// sub-benchmark, and reports simulated requests per wall second.
//
//	go test ./sim -run '^$' -bench MooncakeTrace -benchtime 1x -cpuprofile cpu.out
func BenchmarkMooncakeTrace(b *testing.B) {
	reqs := loadTrace(b)
	for _, pol := range []string{"round_robin", "kv-aware"} {
		b.Run(pol, func(b *testing.B) {
			b.ReportAllocs()
			cfg := Config{Fleet: Fleet{{Count: 8, Profile: "llama-3.1-8b-h100"}}, Policy: pol, Seed: 1}
			var res *Result
			start := time.Now()
			for b.Loop() {
				var err error
				if res, err = Run(context.Background(), cfg, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(reqs)*b.N)/time.Since(start).Seconds(), "req/s")
			b.ReportMetric(float64(res.Events), "events")
		})
	}
}

// TestMooncakeTraceFull runs the whole trace once per policy and logs the
// rows and the speed. It takes a few seconds per policy, so it runs only
// with KVROUTE_SOAK=1.
func TestMooncakeTraceFull(t *testing.T) {
	if os.Getenv("KVROUTE_SOAK") == "" {
		t.Skip("set KVROUTE_SOAK=1 to simulate the whole Mooncake trace")
	}
	reqs := loadTrace(t)
	for _, pol := range []string{"round_robin", "kv-aware"} {
		start := time.Now()
		res := mustRun(t, Config{Fleet: Fleet{{Count: 8, Profile: "llama-3.1-8b-h100"}}, Policy: pol, Seed: 1}, reqs)
		wall := time.Since(start)
		row := res.Row(0)
		steps := 0
		for _, e := range res.Engines {
			steps += e.Steps
		}
		t.Logf("%s: %v wall, %.0f req/s, %d events, %d engine steps; completed %d, ttft p50 %v p99 %v, hit %.3f (oracle %.3f)",
			pol, wall, float64(len(reqs))/wall.Seconds(), res.Events, steps, row.Completed, row.TTFT.P50, row.TTFT.P99,
			row.HitRate, row.OracleHitRate)
		if row.Completed != len(reqs) {
			t.Errorf("%s: completed %d of %d", pol, row.Completed, len(reqs))
		}
	}
}

// BenchmarkSegOracleTrace measures the segment oracle over the Mooncake
// trace (what Run uses for segment workloads).
func BenchmarkSegOracleTrace(b *testing.B) {
	reqs := loadTrace(b)
	b.ReportAllocs()
	for b.Loop() {
		o, hit := newSegOracle(), 0
		for i := range reqs {
			hit += o.observe(reqs[i].Segments, reqs[i].Adapter, 16, reqs[i].PromptLen)
		}
		if hit <= 0 {
			b.Fatal("no hits")
		}
	}
}

// BenchmarkOracleTrace measures the oracle bound over the Mooncake trace at
// 16-token blocks (block hashing included).
func BenchmarkOracleTrace(b *testing.B) {
	reqs := loadTrace(b)
	b.ReportAllocs()
	var buf []uint64
	for b.Loop() {
		o, hit := newOracle(), 0
		for i := range reqs {
			buf = reqs[i].BlockHashes(16, buf[:0])
			hit += o.observe(buf, 16, reqs[i].PromptLen)
		}
		if hit <= 0 {
			b.Fatal("no hits")
		}
	}
}

// BenchmarkRunChat simulates 2,000 chat requests on 4 toy engines: a quick
// regression check of the simulator's own overhead.
func BenchmarkRunChat(b *testing.B) {
	reqs := smallChat(b, 2000, 200, 1)
	cfg := Config{Fleet: tinyFleet(4), Policy: "round_robin", Seed: 1}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if _, err := Run(context.Background(), cfg, reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(reqs)*b.N)/time.Since(start).Seconds(), "req/s")
}

// BenchmarkLowRate simulates 500 chat requests at 0.1 requests per second
// (about 83 minutes of virtual time) on 8 llama-3.1-8b-h100 engines: a run
// whose fleet is idle most of the time, where the scrapes of idle engines
// used to dominate; with the default network latency (1ms) and one longer
// than the scrape interval (150ms, so scrapes are still in flight when the
// fleet goes idle).
func BenchmarkLowRate(b *testing.B) {
	w, err := workload.Generate("chat", workload.Options{Seed: 1, Requests: 500,
		Arrivals: workload.Arrivals{Kind: workload.Poisson, Rate: 0.1}})
	if err != nil {
		b.Fatal(err)
	}
	for _, lat := range []time.Duration{DefaultNetLatency, 150 * time.Millisecond} {
		b.Run("net="+lat.String(), func(b *testing.B) {
			cfg := Config{Fleet: Fleet{{Count: 8, Profile: "llama-3.1-8b-h100"}}, Policy: "kv-aware", Seed: 1, NetLatency: lat}
			b.ReportAllocs()
			var res *Result
			for b.Loop() {
				if res, err = Run(context.Background(), cfg, w.Requests); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(res.Events), "events")
		})
	}
}

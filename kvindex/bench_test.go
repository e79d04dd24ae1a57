package kvindex

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// buildBig fills an index with about entries (block, endpoint) entries over
// eps endpoints: each endpoint stores random 512-block prompts. Bulk stores
// go through Store with synthetic engine hashes.
func buildBig(entries, eps int, seed uint64) *Index {
	const bs = 16
	x := NewIndex(IndexConfig{BlockSize: bs, Capacity: entries + entries/8})
	per := entries / eps
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			toks := make([]uint32, 512*bs)
			hs := make([]uint64, 512)
			for e := w; e < eps; e += 2 {
				ep := fmt.Sprintf("endpoint-%02d", e)
				for n := 0; n < per; n += 512 {
					k := min(512, per-n)
					for j := range toks[:k*bs] {
						toks[j] = rng.Uint32()
					}
					for j := range hs[:k] {
						hs[j] = rng.Uint64()
					}
					if _, err := x.Store(ep, Stored{BlockHashes: hs[:k], Tokens: toks[:k*bs]}); err != nil {
						panic(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	return x
}

var (
	bigOnce sync.Once
	big     *Index
)

func bigIndex(b *testing.B) *Index {
	entries := 10_000_000
	if os.Getenv("KVROUTE_BENCH_SMALL") != "" {
		entries = 1_000_000
	}
	bigOnce.Do(func() { big = buildBig(entries, 64, 42) })
	return big
}

// BenchmarkIndexMatch8k matches an 8k-token prompt (512 blocks of 16)
// against an index of 10 million (block, endpoint) entries over 64
// endpoints. The prompt is fully cached on 3 endpoints, half on 5 more, and
// the reported p50/p99 come from timing each call.
func BenchmarkIndexMatch8k(b *testing.B) {
	x := bigIndex(b)
	rng := rand.New(rand.NewPCG(7, 7))
	prompt := make([]uint32, 512*16)
	for i := range prompt {
		prompt[i] = rng.Uint32()
	}
	eh := make([]uint64, 512)
	for i := range eh {
		eh[i] = rng.Uint64()
	}
	for e := 0; e < 8; e++ {
		n := 512
		if e >= 3 {
			n = 256
		}
		if _, err := x.Store(fmt.Sprintf("endpoint-%02d", e*7), Stored{BlockHashes: eh[:n], Tokens: prompt[:n*16]}); err != nil {
			b.Fatal(err)
		}
	}
	q := HashTokens(prompt, 16, nil)
	dst := make([]Hit, 0, 64)
	if got := x.Match(q, dst); len(got) != 8 || got[0].Blocks != 512 {
		b.Fatalf("Match = %+v", got)
	}
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for b.Loop() {
		t := time.Now()
		dst = x.Match(q, dst[:0])
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t))
		}
	}
	b.StopTimer()
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-us/op")
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
	b.ReportMetric(float64(x.Stats().Entries), "entries")
}

// BenchmarkIndexMatchMiss matches a prompt no endpoint holds.
func BenchmarkIndexMatchMiss(b *testing.B) {
	x := bigIndex(b)
	q := HashTokens(seqTokens(512*16, 99), 16, nil)
	dst := make([]Hit, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = x.Match(q, dst[:0])
	}
}

// BenchmarkIndexStore measures Store throughput in blocks per second (one
// core): BlockStored events of 16 blocks continuing a chain, with the
// matching BlockRemoved events keeping the index at a steady size.
func BenchmarkIndexStore(b *testing.B) {
	const bs, per = 16, 16
	x := NewIndex(IndexConfig{BlockSize: bs})
	rng := rand.New(rand.NewPCG(1, 1))
	const ring = 4096
	toks := make([]uint32, ring*per*bs)
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	var seq uint64
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	hs := make([]uint64, per)
	old := make([]uint64, per)
	for i := 0; b.Loop(); i++ {
		r := i % ring
		for j := range hs {
			seq++
			hs[j] = seq
		}
		if _, err := x.Store("e", Stored{BlockHashes: hs, Tokens: toks[r*per*bs : (r+1)*per*bs]}); err != nil {
			b.Fatal(err)
		}
		if i >= ring {
			for j := range old {
				old[j] = seq - uint64(ring*per) - uint64(j)
			}
			x.Evict("e", old, kvroute.TierGPU)
		}
	}
	// Each iteration is per BlockStored and (after warm-up) per BlockRemoved
	// block events.
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(2*b.N*per)/b.Elapsed().Seconds(), "block-events/s")
	if cpu > 0 {
		b.ReportMetric(float64(2*b.N*per)/cpu.Seconds(), "block-events/cpu-s")
	}
}

// BenchmarkApproxMatch8k matches a 512-block prompt against an Approx
// holding 64 endpoints x 8192 blocks, the prompt recorded on 4 of them.
func BenchmarkApproxMatch8k(b *testing.B) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 8192})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(3, 3))
	hs := make([]uint64, 512)
	for e := 0; e < 64; e++ {
		for n := 0; n < 16; n++ {
			for i := range hs {
				hs[i] = rng.Uint64() | 1
			}
			a.Record(now, fmt.Sprintf("endpoint-%02d", e), hs)
		}
	}
	q := HashTokens(seqTokens(512*16, 5), 16, nil)
	for e := 0; e < 4; e++ {
		a.Record(now, fmt.Sprintf("endpoint-%02d", e*13), q[:512-e*100])
	}
	dst := make([]Hit, 0, 64)
	b.ReportAllocs()
	var cpu0 time.Duration
	for i := 0; b.Loop(); i++ {
		if i == 0 {
			cpu0 = cpuTime()
		}
		dst = a.Match(now, q, dst[:0])
	}
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
	}
	if len(dst) != 4 || dst[0].Blocks != 512 {
		b.Fatalf("Match = %+v", dst)
	}
}

// BenchmarkApproxRecord8k records a 512-block prompt on one of 64
// endpoints at capacity (each Record evicts as much as it adds).
func BenchmarkApproxRecord8k(b *testing.B) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 4096})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(4, 4))
	const ring = 64
	prompts := make([][]uint64, ring)
	for i := range prompts {
		prompts[i] = make([]uint64, 512)
		for j := range prompts[i] {
			prompts[i][j] = rng.Uint64() | 1
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		a.Record(now, fmt.Sprintf("endpoint-%02d", i%64), prompts[i%ring])
	}
}

package kvindex

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/cputime"
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
	cpu0 := cputime.Process()
	for b.Loop() {
		t := time.Now()
		dst = x.Match(q, dst[:0])
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t))
		}
	}
	b.StopTimer()
	if cpu := cputime.Process() - cpu0; cpu > 0 {
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
	cpu0 := cputime.Process()
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
	cpu := cputime.Process() - cpu0
	b.ReportMetric(float64(2*b.N*per)/b.Elapsed().Seconds(), "block-events/s")
	if cpu > 0 {
		b.ReportMetric(float64(2*b.N*per)/cpu.Seconds(), "block-events/cpu-s")
	}
}

// approxImpl is what the Approx benchmarks drive, so that a candidate
// implementation can run side by side with the current one in one process:
// add it to approxImpls (the pre-rewrite one was compared this way; its
// figures are in the history of kvindex/approx_log.go).
type approxImpl interface {
	Record(now time.Time, endpoint string, hashes []uint64)
	Match(now time.Time, hashes []uint64, dst []Hit) []Hit
	SetCapacity(endpoint string, blocks int)
	Len() int
}

var approxImpls = []struct {
	name string
	new  func(ApproxConfig) approxImpl
}{
	{"cur", func(c ApproxConfig) approxImpl { return NewApprox(c) }},
	{"serialized", func(c ApproxConfig) approxImpl { c.Serialized = true; return NewApprox(c) }},
}

// benchApprox benchmarks op on each implementation (sub-benchmarks v0 and
// cur: ns/op, allocations, process CPU time per op and the median op's
// wall time per block) and then on both interleaved op by op (ab), which
// charges each its own thread CPU time, so that the load of the shared
// machine falls on both alike: v0-cpu-ns/block, cur-cpu-ns/block and
// speedup (v0 over cur) come from the same run. setup fills a new index
// (not timed); reset, when not nil, is called (not timed) before op i and
// a new index is built when it returns true.
func benchApprox(b *testing.B, blocksPerOp int, setup func(approxImpl), op func(a approxImpl, i int), reset func(i int) bool) {
	mk := func(i int) approxImpl {
		a := approxImpls[i].new(ApproxConfig{})
		setup(a)
		return a
	}
	for n, impl := range approxImpls {
		b.Run(impl.name, func(b *testing.B) {
			a := mk(n)
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, cpuPaused := cputime.Process(), time.Duration(0)
			for i := 0; b.Loop(); i++ {
				if reset != nil && i > 0 && reset(i) {
					b.StopTimer()
					c := cputime.Process()
					a = mk(n)
					cpuPaused += cputime.Process() - c
					b.StartTimer()
				}
				start := time.Now()
				op(a, i)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
			}
			b.StopTimer()
			if cpu := cputime.Process() - cpu0 - cpuPaused; cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*blocksPerOp), "cpu-ns/block")
			}
			// An op is short next to a scheduler time slice, so most ops
			// run without being preempted and the median barely sees the
			// machine's load.
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/float64(blocksPerOp), "p50-ns/block")
		})
	}
	if len(approxImpls) < 2 {
		return
	}
	b.Run("ab", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		clock := cputime.Thread
		if clock() == 0 {
			clock = func() time.Duration { return time.Duration(time.Now().UnixNano()) }
		}
		as := make([]approxImpl, len(approxImpls))
		for n := range as {
			as[n] = mk(n)
		}
		spent := make([]time.Duration, len(as))
		for i := 0; b.Loop(); i++ {
			if reset != nil && i > 0 && reset(i) {
				b.StopTimer()
				for n := range as {
					as[n] = mk(n)
				}
				b.StartTimer()
			}
			for n, a := range as {
				c := clock()
				op(a, i)
				spent[n] += clock() - c
			}
		}
		for n, impl := range approxImpls {
			b.ReportMetric(float64(spent[n].Nanoseconds())/float64(b.N*blocksPerOp), impl.name+"-cpu-ns/block")
		}
		b.ReportMetric(float64(spent[0])/float64(spent[len(spent)-1]), "speedup")
	})
}

func randomPrompts(rng *rand.Rand, n, blocks int) [][]uint64 {
	ps := make([][]uint64, n)
	for i := range ps {
		ps[i] = make([]uint64, blocks)
		for j := range ps[i] {
			ps[i][j] = rng.Uint64() | 1
		}
	}
	return ps
}

const (
	benchEndpoints = 8     // as the simulator's default fleet
	benchCapacity  = 16384 // router blocks per endpoint, about an 8B model's KV cache on an H100 in 32-token blocks
	benchBlocks    = 256   // a 32 KiB prompt in 128-character blocks
)

var benchEndpointNames = func() []string {
	s := make([]string, 64)
	for i := range s {
		s[i] = fmt.Sprintf("endpoint-%02d", i)
	}
	return s
}()

// BenchmarkApproxRecord records 256-block prompts round-robin on 8
// endpoints of 16384 blocks each, with the clock advancing 1 ms per Record:
//
//   - fresh: new random prompts on endpoints below capacity (the index is
//     rebuilt, untimed, before it fills);
//   - tail10: per endpoint one fixed 230-block prefix with a new 26-block
//     tail (multi-turn chat), at steady state (old tails are evicted);
//   - rotate16: 16 prompts sharing a 32-block prefix, round-robin on one
//     endpoint they all fit (the router's hit regime: every Record moves
//     256 held blocks to the front);
//   - rotate64: as rotate16 with 64 prompts, which overflow the endpoint
//     (the router's churn regime: every Record inserts and evicts 224
//     blocks);
//   - spread256: 256 such prompts on 64 endpoints, 4 each (the router's
//     loaded regime: as rotate16, but the endpoint's tree is rarely in
//     cache);
//   - evict: new random prompts on endpoints at capacity (each Record
//     evicts as many blocks as it adds).
func BenchmarkApproxRecord(b *testing.B) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	capacity := func(a approxImpl) {
		for _, ep := range benchEndpointNames[:benchEndpoints] {
			a.SetCapacity(ep, benchCapacity)
		}
	}
	b.Run("fresh", func(b *testing.B) {
		// One index takes benchEndpoints*benchCapacity/benchBlocks prompts
		// before it is full.
		perIndex := benchEndpoints * benchCapacity / benchBlocks
		prompts := randomPrompts(rand.New(rand.NewPCG(1, 1)), perIndex, benchBlocks)
		benchApprox(b, benchBlocks, capacity, func(a approxImpl, i int) {
			a.Record(at(i), benchEndpointNames[i%benchEndpoints], prompts[i%perIndex])
		}, func(i int) bool { return i%perIndex == 0 })
	})
	b.Run("tail10", func(b *testing.B) {
		const prefix = benchBlocks * 9 / 10
		prefixes := randomPrompts(rand.New(rand.NewPCG(2, 2)), benchEndpoints, prefix)
		prompt := make([][]uint64, benchEndpoints)
		for e := range prompt {
			prompt[e] = append(make([]uint64, benchBlocks), prefixes[e]...)[benchBlocks:]
		}
		// op i records endpoint i%8's prefix with a tail no op before used.
		op := func(a approxImpl, i int) {
			e := i % benchEndpoints
			p := prompt[e][:benchBlocks]
			for j := prefix; j < benchBlocks; j++ {
				p[j] = splitmix(uint64(i)<<16|uint64(j)) | 1
			}
			a.Record(at(i), benchEndpointNames[e], p)
		}
		// Fill to steady state: every endpoint at capacity.
		warm := 2 * benchEndpoints * benchCapacity / (benchBlocks - prefix)
		benchApprox(b, benchBlocks, func(a approxImpl) {
			capacity(a)
			for i := 0; i < warm; i++ {
				op(a, i)
			}
		}, func(a approxImpl, i int) { op(a, warm+i) }, nil)
	})
	// rotate16 and rotate64: prompts sharing a 32-block prefix round-robin
	// on one endpoint of 12500 blocks. 64 of them (the router benchmark's
	// sessions=64, BenchmarkDecisionKVAware64) overflow it, so every Record
	// refreshes the prefix and inserts and evicts 224 blocks.
	for _, rot := range []struct {
		prompts, warm int
		seed          uint64
	}{{16, 64, 4}, {64, 256, 5}} {
		b.Run(fmt.Sprintf("rotate%d", rot.prompts), func(b *testing.B) {
			prompts := randomPrompts(rand.New(rand.NewPCG(rot.seed, rot.seed)), rot.prompts, benchBlocks)
			for _, p := range prompts {
				copy(p[:32], prompts[0][:32])
			}
			benchApprox(b, benchBlocks, func(a approxImpl) {
				a.SetCapacity("e", 12500)
				for i := 0; i < rot.warm; i++ {
					a.Record(at(i), "e", prompts[i%rot.prompts])
				}
			}, func(a approxImpl, i int) {
				a.Record(at(rot.warm+i), "e", prompts[i%rot.prompts])
			}, nil)
		})
	}
	b.Run("spread256", func(b *testing.B) {
		// The router benchmark's loaded case: 256 prompts sharing a
		// 32-block prefix, each on one of 64 endpoints (4 per endpoint,
		// all held): every Record moves 256 held blocks to the front, on
		// an endpoint whose tree is rarely in cache.
		prompts := randomPrompts(rand.New(rand.NewPCG(6, 6)), 256, benchBlocks)
		for _, p := range prompts {
			copy(p[:32], prompts[0][:32])
		}
		benchApprox(b, benchBlocks, func(a approxImpl) {
			for i := 0; i < 1024; i++ {
				a.Record(at(i), benchEndpointNames[i%64], prompts[i%256])
			}
		}, func(a approxImpl, i int) {
			a.Record(at(1024+i), benchEndpointNames[i%64], prompts[i%256])
		}, nil)
	})
	b.Run("evict", func(b *testing.B) {
		const ring = 2048
		prompts := randomPrompts(rand.New(rand.NewPCG(3, 3)), ring, benchBlocks)
		warm := 2 * benchEndpoints * benchCapacity / benchBlocks
		benchApprox(b, benchBlocks, func(a approxImpl) {
			capacity(a)
			for i := 0; i < warm; i++ {
				a.Record(at(i), benchEndpointNames[i%benchEndpoints], prompts[(ring-1-i%ring)])
			}
		}, func(a approxImpl, i int) {
			a.Record(at(warm+i), benchEndpointNames[i%benchEndpoints], prompts[i%ring])
		}, nil)
	})
}

// BenchmarkApproxMatch8k matches a 512-block prompt against an Approx
// holding 64 endpoints x 8192 blocks, the prompt recorded on 4 of them.
func BenchmarkApproxMatch8k(b *testing.B) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := HashTokens(seqTokens(512*16, 5), 16, nil)
	var dst []Hit
	benchApprox(b, 512, func(a approxImpl) {
		rng := rand.New(rand.NewPCG(3, 3))
		hs := make([]uint64, 512)
		for e := 0; e < 64; e++ {
			a.SetCapacity(benchEndpointNames[e], 8192)
			for n := 0; n < 16; n++ {
				for i := range hs {
					hs[i] = rng.Uint64() | 1
				}
				a.Record(now, benchEndpointNames[e], hs)
			}
		}
		for e := 0; e < 4; e++ {
			a.Record(now, benchEndpointNames[e*13], q[:512-e*100])
		}
		dst = make([]Hit, 0, 64)
	}, func(a approxImpl, i int) {
		dst = a.Match(now, q, dst[:0])
		if i == 0 && (len(dst) != 4 || dst[0].Blocks != 512) {
			b.Fatalf("Match = %+v", dst)
		}
	}, nil)
}

// BenchmarkApproxRecord8k records a 512-block prompt on one of 64
// endpoints at capacity (each Record evicts as much as it adds).
func BenchmarkApproxRecord8k(b *testing.B) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prompts := randomPrompts(rand.New(rand.NewPCG(4, 4)), 64, 512)
	benchApprox(b, 512, func(a approxImpl) {
		for e := 0; e < 64; e++ {
			a.SetCapacity(benchEndpointNames[e], 4096)
		}
	}, func(a approxImpl, i int) {
		a.Record(now, benchEndpointNames[i%64], prompts[i%64])
	}, nil)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// BenchmarkHashText is the router's prefix hashing of a 32 KiB prompt in
// blocks of 128 characters (its default) and, for the library's general
// path, of 100; after=4KiB is HashTextAfter for prompts that share a
// 4 KiB system prompt with the one before (the router's case).
func BenchmarkHashText(b *testing.B) {
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 32<<10/44+1)[:32<<10]
	for _, chars := range []int{128, 100} {
		b.Run(fmt.Sprintf("chars=%d", chars), func(b *testing.B) {
			dst := make([]uint64, 0, len(text)/chars)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				dst = HashText(text, chars, dst[:0])
			}
		})
	}
	b.Run("chars=128/after=4KiB", func(b *testing.B) {
		system := text[:4<<10]
		var texts [2]string
		for i := range texts {
			texts[i] = (system + fmt.Sprintf("session %d: ", i) + text)[:32<<10]
		}
		dst := HashText(texts[1], 128, nil)
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			dst = HashTextAfter(texts[i%2], texts[(i+1)%2], 128, dst)
			i++
		}
	})
}

package kvindex

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
)

// engineHash simulates an engine's own chained block hash (a different
// function and seed from the router's).
func engineHash(parent uint64, block []uint32) uint64 {
	h := parent ^ 0xabcdef
	for _, t := range block {
		h = (h ^ uint64(t)) * 0x100000001b3
	}
	return h | 1
}

// engineChain returns the engine hashes of tokens' full blocks.
func engineChain(tokens []uint32, bs int) []uint64 {
	var out []uint64
	var p uint64
	for i := 0; i+bs <= len(tokens); i += bs {
		p = engineHash(p, tokens[i:i+bs])
		out = append(out, p)
	}
	return out
}

func storeChain(t testing.TB, x *Index, ep string, tokens []uint32, bs, from, to int, tier kvroute.Tier) {
	t.Helper()
	eh := engineChain(tokens, bs)
	s := Stored{BlockHashes: eh[from:to], Tokens: tokens[from*bs : to*bs], BlockSize: bs, Tier: tier}
	if from > 0 {
		s.Parent, s.HasParent = eh[from-1], true
	}
	if _, err := x.Store(ep, s); err != nil {
		t.Fatalf("Store(%s, %d..%d): %v", ep, from, to, err)
	}
}

func TestIndexMatch(t *testing.T) {
	x := NewIndex(IndexConfig{BlockSize: 4, Shards: 4})
	p := seqTokens(40, 1) // 10 blocks
	storeChain(t, x, "a", p, 4, 0, 3, kvroute.TierGPU)
	storeChain(t, x, "a", p, 4, 3, 6, kvroute.TierGPU) // continues from block 2
	storeChain(t, x, "b", p, 4, 0, 2, kvroute.TierGPU)
	storeChain(t, x, "c", p, 4, 0, 2, kvroute.TierGPU)
	storeChain(t, x, "c", p, 4, 2, 8, kvroute.TierCPU)
	q := HashTokens(p, 4, nil)
	got := x.Match(q, nil)
	want := []Hit{
		{Endpoint: "c", Blocks: 8, Tier: kvroute.TierCPU, GPUBlocks: 2},
		{Endpoint: "a", Blocks: 6, Tier: kvroute.TierGPU, GPUBlocks: 6},
		{Endpoint: "b", Blocks: 2, Tier: kvroute.TierGPU, GPUBlocks: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Match = %+v\nwant %+v", got, want)
	}
	// BlockRemoved of a's block 3 cuts its run to 3.
	eh := engineChain(p, 4)
	x.Evict("a", eh[3:4], kvroute.TierGPU)
	x.Evict("c", eh[2:8], kvroute.TierCPU)
	got = x.Match(q, nil)
	want = []Hit{
		{Endpoint: "a", Blocks: 3, Tier: kvroute.TierGPU, GPUBlocks: 3},
		{Endpoint: "b", Blocks: 2, Tier: kvroute.TierGPU, GPUBlocks: 2},
		{Endpoint: "c", Blocks: 2, Tier: kvroute.TierGPU, GPUBlocks: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after evict: Match = %+v\nwant %+v", got, want)
	}
	if s := x.Stats(); s.Entries != 5+2+2 || s.Endpoints != 3 {
		t.Fatalf("stats %+v, want 9 entries over 3 endpoints", s)
	}
	x.Clear("a")
	x.Remove("b")
	got = x.Match(q, nil)
	if want := []Hit{{Endpoint: "c", Blocks: 2, Tier: kvroute.TierGPU, GPUBlocks: 2}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after clear/remove: Match = %+v, want %+v", got, want)
	}
	if s := x.Stats(); s.Entries != 2 || s.Endpoints != 2 || s.Keys != 2 {
		t.Fatalf("stats %+v, want 2 entries, 2 endpoints, 2 keys", s)
	}
	// A different prompt matches nothing; an empty one returns dst.
	if got := x.Match(HashTokens(seqTokens(8, 100), 4, nil), nil); len(got) != 0 {
		t.Fatalf("other prompt: %+v", got)
	}
	if got := x.Match(nil, []Hit{{Endpoint: "z"}}); len(got) != 1 {
		t.Fatalf("empty prompt changed dst: %+v", got)
	}
}

func TestIndexStoreErrors(t *testing.T) {
	x := NewIndex(IndexConfig{})
	p := seqTokens(32, 1)
	eh := engineChain(p, 16)
	if _, err := x.Store("a", Stored{BlockHashes: eh[1:], Parent: eh[0], HasParent: true, Tokens: p[16:], BlockSize: 16}); !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("orphan: err = %v, want ErrUnknownParent", err)
	}
	if _, err := x.Store("a", Stored{BlockHashes: eh, Tokens: p[:20], BlockSize: 16}); !errors.Is(err, ErrBadStored) {
		t.Fatalf("short tokens: err = %v, want ErrBadStored", err)
	}
	if _, err := x.Store("a", Stored{BlockHashes: eh, Tokens: p, BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	if x.BlockSize() != 16 {
		t.Fatalf("BlockSize = %d, want 16 learned", x.BlockSize())
	}
	if _, err := x.Store("a", Stored{BlockHashes: eh[:1], Tokens: p[:8], BlockSize: 8}); !errors.Is(err, ErrBlockSize) {
		t.Fatalf("other block size: err = %v, want ErrBlockSize", err)
	}
	if _, err := x.Store("a", Stored{BlockHashes: eh, Tokens: p, Salts: []uint64{1}}); !errors.Is(err, ErrBadStored) {
		t.Fatalf("salts: err = %v, want ErrBadStored", err)
	}
	s := x.Stats()
	if s.Orphans != 1 || s.BlockSizeMismatches != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestIndexSalt(t *testing.T) {
	x := NewIndex(IndexConfig{BlockSize: 4})
	p := seqTokens(8, 1)
	eh := engineChain(p, 4)
	if _, err := x.Store("lora", Stored{BlockHashes: eh, Tokens: p, Salts: []uint64{7, 7}}); err != nil {
		t.Fatal(err)
	}
	if got := x.Match(HashTokens(p, 4, nil), nil); len(got) != 0 {
		t.Fatalf("salted blocks matched a plain prompt: %+v", got)
	}
}

// TestIndexLoRA: blocks an engine stored for a LoRA adapter's request, with
// each block's extra keys (lora_name, and the salt on the first) as vLLM
// reports them, split over two events, match the request's
// HashTokensKeyed keys, and no plain, other-adapter or other-salt prompt.
func TestIndexLoRA(t *testing.T) {
	for _, salt := range []string{"", "s1"} {
		x := NewIndex(IndexConfig{BlockSize: 4})
		p := seqTokens(16, 1)
		eh := engineChain(p, 4)
		salts := []uint64{BlockKey("sql-lora", salt), BlockKey("sql-lora", ""), BlockKey("sql-lora", ""), BlockKey("sql-lora", "")}
		if _, err := x.Store("e", Stored{BlockHashes: eh[:2], Tokens: p[:8], Salts: salts[:2]}); err != nil {
			t.Fatal(err)
		}
		if _, err := x.Store("e", Stored{BlockHashes: eh[2:], Parent: eh[1], HasParent: true, Tokens: p[8:], Salts: salts[2:]}); err != nil {
			t.Fatal(err)
		}
		if got := x.Match(HashTokensKeyed(p, "sql-lora", salt, 4, nil), nil); len(got) != 1 || got[0].Blocks != 4 {
			t.Fatalf("salt %q: the adapter's prompt matched %+v, want 4 blocks on e", salt, got)
		}
		for _, other := range [][2]string{{"", salt}, {"other", salt}, {"sql-lora", salt + "x"}} {
			if got := x.Match(HashTokensKeyed(p, other[0], other[1], 4, nil), nil); len(got) != 0 {
				t.Fatalf("salt %q: blocks matched adapter %q salt %q: %+v", salt, other[0], other[1], got)
			}
		}
	}
	if !slices.Equal(HashTokensKeyed(seqTokens(16, 1), "", "s", 4, nil), HashTokensSalted(seqTokens(16, 1), "s", 4, nil)) {
		t.Fatal("HashTokensKeyed without an adapter is not HashTokensSalted")
	}
}

// TestIndexManyEndpoints uses more than 64 endpoints (two groups).
func TestIndexManyEndpoints(t *testing.T) {
	x := NewIndex(IndexConfig{BlockSize: 4, Shards: 2})
	p := seqTokens(16, 1)
	for i := 0; i < 100; i++ {
		storeChain(t, x, fmt.Sprintf("e%03d", i), p, 4, 0, 1+i%4, kvroute.TierGPU)
	}
	got := x.Match(HashTokens(p, 4, nil), nil)
	if len(got) != 100 || got[0].Blocks != 4 || got[99].Blocks != 1 {
		t.Fatalf("got %d hits, first %+v last %+v", len(got), got[0], got[len(got)-1])
	}
	for i := 0; i < 100; i += 2 {
		x.Remove(fmt.Sprintf("e%03d", i))
	}
	storeChain(t, x, "new", p, 4, 0, 4, kvroute.TierGPU)
	got = x.Match(HashTokens(p, 4, nil), nil)
	if len(got) != 51 {
		t.Fatalf("after removals: %d hits, want 51", len(got))
	}
	for _, h := range got {
		var n int
		if h.Endpoint == "new" {
			continue
		}
		if _, err := fmt.Sscanf(h.Endpoint, "e%03d", &n); err != nil || n%2 == 0 {
			t.Fatalf("removed endpoint %s still matches", h.Endpoint)
		}
	}
}

func TestIndexCapacity(t *testing.T) {
	x := NewIndex(IndexConfig{BlockSize: 4, Capacity: 1000, Shards: 4})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		p := make([]uint32, 64)
		for j := range p {
			p[j] = rng.Uint32()
		}
		storeChain(t, x, fmt.Sprintf("e%d", i%3), p, 4, 0, 16, kvroute.TierGPU)
	}
	s := x.Stats()
	if s.Entries > 1000 || s.Evictions == 0 {
		t.Fatalf("stats %+v, want <= 1000 entries and evictions", s)
	}
	if s.Keys > s.Entries {
		t.Fatalf("keys %d > entries %d: evicted entries left in the tables", s.Keys, s.Entries)
	}
}

// naiveIndex is the reference: plain maps, same semantics.
type naiveIndex struct {
	bs  int
	eps map[string]*naiveEP
}

type naiveEP struct {
	blocks   map[uint64]uint64
	gpu, cpu map[uint64]bool
	copies   map[uint64]int // GPU copies of an engine hash beyond the first
}

func (n *naiveIndex) ep(name string) *naiveEP {
	e := n.eps[name]
	if e == nil {
		e = &naiveEP{blocks: map[uint64]uint64{}, gpu: map[uint64]bool{}, cpu: map[uint64]bool{}, copies: map[uint64]int{}}
		n.eps[name] = e
	}
	return e
}

func (n *naiveIndex) store(name string, s Stored) error {
	e := n.ep(name)
	var key uint64
	if s.HasParent {
		k, ok := e.blocks[s.Parent]
		if !ok {
			return ErrUnknownParent
		}
		key = k
	}
	for i, eh := range s.BlockHashes {
		key = ChainHash(key, s.Tokens[i*n.bs:(i+1)*n.bs])
		old, ok := e.blocks[eh]
		if ok && old != key {
			delete(e.gpu, old)
			delete(e.cpu, old)
		}
		switch {
		case !ok || old != key:
			delete(e.copies, eh)
		case s.Tier != kvroute.TierCPU && e.gpu[key]:
			e.copies[eh]++
		}
		e.blocks[eh] = key
		if s.Tier == kvroute.TierCPU {
			e.cpu[key] = true
		} else {
			e.gpu[key] = true
		}
	}
	return nil
}

func (n *naiveIndex) evict(name string, hs []uint64, tier kvroute.Tier) {
	e := n.eps[name]
	if e == nil {
		return
	}
	for _, eh := range hs {
		key, ok := e.blocks[eh]
		if !ok {
			delete(e.copies, eh)
			continue
		}
		if tier != kvroute.TierCPU && e.copies[eh] > 0 {
			e.copies[eh]--
			continue
		}
		this, other := e.gpu, e.cpu
		if tier == kvroute.TierCPU {
			this, other = other, this
		}
		delete(this, key)
		if !other[key] {
			delete(e.blocks, eh)
		}
	}
}

func (n *naiveIndex) match(hashes []uint64) []Hit {
	var out []Hit
	for name, e := range n.eps {
		blocks, gpuBlocks := 0, 0
		for _, h := range hashes {
			if !e.gpu[h] && !e.cpu[h] {
				break
			}
			if e.gpu[h] && gpuBlocks == blocks {
				gpuBlocks++
			}
			blocks++
		}
		if blocks > 0 {
			tier := kvroute.TierGPU
			if gpuBlocks < blocks {
				tier = kvroute.TierCPU
			}
			out = append(out, Hit{Endpoint: name, Blocks: blocks, Tier: tier, GPUBlocks: gpuBlocks})
		}
	}
	sortHits(out)
	return out
}

func (n *naiveIndex) entries() int {
	total := 0
	for _, e := range n.eps {
		total += len(e.blocks)
	}
	return total
}

// TestIndexDifferential drives Index and naiveIndex with the same random
// event streams and compares every Match.
func TestIndexDifferential(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { differential(t, seed, 3000) })
	}
}

func differential(t *testing.T, seed uint64, steps int) {
	const bs = 4
	rng := rand.New(rand.NewPCG(seed, seed*7))
	// A pool of prompts sharing prefixes: each is a random earlier prompt's
	// prefix plus random tokens over a small alphabet.
	var pool [][]uint32
	for i := 0; i < 30; i++ {
		var p []uint32
		if i > 0 && rng.IntN(2) == 0 {
			base := pool[rng.IntN(len(pool))]
			p = append(p, base[:bs*rng.IntN(len(base)/bs+1)]...)
		}
		for len(p) < bs*(4+rng.IntN(12)) {
			p = append(p, uint32(rng.IntN(3)))
		}
		pool = append(pool, p[:len(p)/bs*bs])
	}
	eps := []string{"a", "b", "c", "d", "e"}
	x := NewIndex(IndexConfig{BlockSize: bs, Shards: 2})
	ref := &naiveIndex{bs: bs, eps: map[string]*naiveEP{}}
	for step := 0; step < steps; step++ {
		ep := eps[rng.IntN(len(eps))]
		p := pool[rng.IntN(len(pool))]
		eh := engineChain(p, bs)
		tier := kvroute.TierGPU
		if rng.IntN(4) == 0 {
			tier = kvroute.TierCPU
		}
		switch op := rng.IntN(20); {
		case op < 9: // store a run of blocks, usually continuing a known parent
			from := rng.IntN(len(eh))
			to := from + 1 + rng.IntN(len(eh)-from)
			s := Stored{BlockHashes: slices.Clone(eh[from:to]), Tokens: p[from*bs : to*bs], Tier: tier}
			if from > 0 {
				s.Parent, s.HasParent = eh[from-1], true
			}
			if rng.IntN(50) == 0 && len(s.BlockHashes) > 0 {
				s.BlockHashes[0] = uint64(rng.IntN(4)) + 1 // engine reusing a hash
			}
			_, err1 := x.Store(ep, s)
			err2 := ref.store(ep, s)
			if !errors.Is(err1, err2) && (err1 != nil || err2 != nil) {
				t.Fatalf("step %d: Store errors differ: %v vs %v", step, err1, err2)
			}
		case op < 15: // remove some blocks
			var hs []uint64
			for _, h := range eh {
				if rng.IntN(3) == 0 {
					hs = append(hs, h)
				}
			}
			hs = append(hs, rng.Uint64())
			x.Evict(ep, hs, tier)
			ref.evict(ep, hs, tier)
		case op < 16:
			x.Clear(ep)
			if e := ref.eps[ep]; e != nil {
				ref.eps[ep] = nil
				delete(ref.eps, ep)
				ref.ep(ep)
			}
		case op < 17:
			x.Remove(ep)
			delete(ref.eps, ep)
		default:
		}
		q := HashTokens(pool[rng.IntN(len(pool))], bs, nil)
		got, want := x.Match(q, nil), ref.match(q)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: Match\n got %+v\nwant %+v", step, got, want)
		}
		if g, w := x.Stats().Entries, ref.entries(); g != w {
			t.Fatalf("step %d: entries %d, want %d", step, g, w)
		}
	}
}

func TestIndexConcurrent(t *testing.T) {
	x := NewIndex(IndexConfig{BlockSize: 4, Shards: 4, Capacity: 5000})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			ep := fmt.Sprintf("e%d", w)
			for i := 0; i < 300; i++ {
				p := make([]uint32, 32)
				for j := range p {
					p[j] = uint32(rng.IntN(4))
				}
				eh := engineChain(p, 4)
				_, _ = x.Store(ep, Stored{BlockHashes: eh, Tokens: p})
				if i%7 == 0 {
					x.Evict(ep, eh[4:], kvroute.TierGPU)
				}
				if i%100 == 99 {
					x.Remove(ep)
				}
			}
		}()
	}
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Hit
			for i := 0; i < 2000; i++ {
				dst = x.Match(HashTokens([]uint32{0, 1, 2, 3, 0, 0, 0, 0}, 4, nil), dst[:0])
				_ = x.Stats()
			}
		}()
	}
	wg.Wait()
}

// TestIndexMemory measures bytes per (block, endpoint) entry with
// runtime.MemStats. It builds a large index, so it runs only with
// KVROUTE_MEM=1 (KVROUTE_MEM_ENTRIES sets the size, default 4M).
func TestIndexMemory(t *testing.T) {
	if os.Getenv("KVROUTE_MEM") == "" {
		t.Skip("set KVROUTE_MEM=1 to measure memory per entry")
	}
	entries := 4 << 20
	if s := os.Getenv("KVROUTE_MEM_ENTRIES"); s != "" {
		fmt.Sscan(s, &entries)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := buildBig(entries, 64, 1)
	runtime.GC()
	runtime.ReadMemStats(&after)
	s := x.Stats()
	per := float64(after.HeapAlloc-before.HeapAlloc) / float64(s.Entries)
	t.Logf("%d entries over %d endpoints, %d keys, %d slots: %.1f bytes per (block, endpoint) entry (HeapAlloc %d MB)",
		s.Entries, s.Endpoints, s.Keys, s.Slots, per, (after.HeapAlloc-before.HeapAlloc)>>20)
	if per >= 64 {
		t.Errorf("%.1f bytes per entry, want < 64", per)
	}
	runtime.KeepAlive(x)
}

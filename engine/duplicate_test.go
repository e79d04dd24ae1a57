package engine

import (
	"fmt"
	"slices"
	"testing"
)

// copiesOf returns the blocks caching key, in the order a lookup meets
// them.
// copiesOf returns the ids (as BlockIDs reports them: vLLM's, block 0 being
// the null block) of the blocks caching key, in lookup order.
func copiesOf(e *Engine, key uint64) []int32 {
	var ids []int32
	e.pool.cached.copies(key, func(id int32) { ids = append(ids, id+1) })
	return ids
}

// eventCounts returns how many times each hash was stored and removed by
// events.
func eventCounts(events []KVEvent) (stored, removed map[uint64]int) {
	stored, removed = map[uint64]int{}, map[uint64]int{}
	for _, ev := range events {
		for _, h := range ev.BlockHashes {
			switch ev.Kind {
			case BlockStored:
				stored[h]++
			case BlockRemoved:
				removed[h]++
			}
		}
	}
	return stored, removed
}

// dupPrompts are the token ids of TestDuplicateLastBlock's requests on the
// tiny profile (64 blocks of 16 tokens, a 1024-token context): flush takes
// every block, p is exactly 4 blocks, evict1 takes 60 blocks and evict2
// one.
func dupPrompts() (flush, p, evict1, evict2 []uint32) {
	return tokens(1, 1023), tokens(500, 64), tokens(2000, 959), tokens(5000, 10)
}

// TestDuplicateLastBlock: a prompt whose blocks are all cached recomputes
// its last block (one token is always computed) and, as vLLM does, caches
// that copy too under the same hash, reporting a BlockStored for it. The
// block stays cached, and hittable, until its last copy is evicted: each
// copy's eviction reports a BlockRemoved.
//
// The free queue is made known first: a request that takes every block
// and frees them (tail first). Then p's first copy of its last block is
// the 60th block of the queue and the second copy the 61st, so a request
// of 60 blocks evicts the first and the next block allocated the second.
func TestDuplicateLastBlock(t *testing.T) {
	for _, probeAfter := range []int{0, 1, 2} { // evictions before the probe request
		t.Run(fmt.Sprint("evicted", probeAfter), func(t *testing.T) {
			e := mustEngine(t, "tiny", nil)
			d := newDriver(t, e)
			flush, p, evict1, evict2 := dupPrompts()
			if e.pool.size() != 64 || e.bs != 16 || e.maxLen != 1024 {
				t.Fatalf("tiny profile: %d blocks of %d tokens, max len %d; the test assumes 64, 16, 1024", e.pool.size(), e.bs, e.maxLen)
			}
			hashes := make([]uint64, 4)
			parent := e.hash.None()
			for i := range hashes {
				parent = e.hash.Block(parent, p[i*16:(i+1)*16])
				hashes[i] = parent.Key()
			}
			h3 := hashes[3]

			d.add(&Request{ID: "flush", Prompt: flush, MaxTokens: 1})
			d.run()
			d.add(&Request{ID: "a", Prompt: p, MaxTokens: 1, HoldKV: true})
			d.run()
			aBlocks := e.BlockIDs("a")
			e.Release("a")
			from := len(d.events)
			d.add(&Request{ID: "b", Prompt: p, MaxTokens: 1, HoldKV: true})
			d.run()
			bBlocks := e.BlockIDs("b")
			e.Release("b")

			if got := d.byID("b")[0].CachedTokens; got != 48 {
				t.Fatalf("b: cached tokens %d, want 48 (3 of 4 blocks: one token is computed)", got)
			}
			// b's copy of block 3: stored again, after a's (its block
			// evicted one of flush's).
			evs := slices.DeleteFunc(slices.Clone(d.events[from:]), func(ev KVEvent) bool {
				return ev.Kind == BlockRemoved && !slices.Contains(ev.BlockHashes, h3)
			})
			if len(evs) != 1 || evs[0].Kind != BlockStored || !slices.Equal(evs[0].BlockHashes, []uint64{h3}) ||
				evs[0].ParentHash == nil || *evs[0].ParentHash != hashes[2] || !slices.Equal(evs[0].TokenIDs, p[48:]) ||
				evs[0].BlockSize != 16 || evs[0].Medium != MediumGPU {
				t.Fatalf("b's events: %+v, want one BlockStored of block 3 (%d, parent %d, its 16 tokens)", evs, h3, hashes[2])
			}
			if got, want := copiesOf(e, h3), []int32{int32(aBlocks[3]), int32(bBlocks[3])}; !slices.Equal(got, want) {
				t.Fatalf("copies of block 3: %v, want a's then b's %v", got, want)
			}
			if !slices.Equal(aBlocks[:3], bBlocks[:3]) {
				t.Fatalf("b's blocks %v, want a's first three %v", bBlocks, aBlocks)
			}
			// flush cached 63 blocks (its 64th was partial), a evicted 3
			// of them and b one: every block caches a key.
			if st := e.Stats(); st.CachedBlocks != 64 {
				t.Errorf("cached blocks %d, want 64 (flush's 63 less 4 evicted, a's 4, b's copy)", st.CachedBlocks)
			}
			if d.mirror[h3] != 2 {
				t.Errorf("events report %d copies of block 3, want 2", d.mirror[h3])
			}

			// The probe asks for p and one more block: its hit shows the
			// copies of block 3 that are left.
			probe := &Request{ID: "probe", Prompt: concat(p, tokens(9000, 16)), MaxTokens: 1, HoldKV: true}
			wantHit := []int{64, 64, 48}
			for i, prompt := range [][]uint32{evict1, evict2} {
				if i == probeAfter {
					break
				}
				from := len(d.events)
				d.add(&Request{ID: fmt.Sprint("evict", i+1), Prompt: prompt, MaxTokens: 1})
				d.run()
				_, removed := eventCounts(d.events[from:])
				if removed[h3] != 1 || removed[hashes[2]] != 0 {
					t.Fatalf("evict%d: %d BlockRemoved of block 3 and %d of block 2, want 1 and 0", i+1, removed[h3], removed[hashes[2]])
				}
			}
			if got := d.mirror[h3]; got != 2-probeAfter {
				t.Errorf("events report %d copies of block 3, want %d", got, 2-probeAfter)
			}
			if got := len(copiesOf(e, h3)); got != 2-probeAfter {
				t.Errorf("%d copies of block 3 cached, want %d", got, 2-probeAfter)
			}
			if got := e.PrefixHit(probe); got != wantHit[probeAfter] {
				t.Errorf("PrefixHit = %d, want %d", got, wantHit[probeAfter])
			}
			d.add(probe)
			d.run()
			if got := d.byID("probe")[0].CachedTokens; got != wantHit[probeAfter] {
				t.Errorf("probe: cached tokens %d, want %d", got, wantHit[probeAfter])
			}
			// The hit is the copy cached first of those left.
			if probeAfter < 2 {
				want := []int32{int32(aBlocks[3]), int32(bBlocks[3])}[probeAfter]
				if got := e.BlockIDs("probe")[3]; int32(got) != want {
					t.Errorf("probe's block 3 is %d, want %d (a's copy, then b's once a's is evicted)", got, want)
				}
			}
			e.Release("probe")
		})
	}
}

// TestDuplicateOutputBlocks: two requests with the same prompt and seed,
// scheduled in the same step, generate the same tokens; each caches its
// own copy of every output block (the second hits the prompt blocks the
// first cached when they were allocated, in the same step, as vLLM
// does). Every output block is stored twice and, once the requests are
// done and their blocks evicted, removed twice; an engine without events
// keeps the same copies.
func TestDuplicateOutputBlocks(t *testing.T) {
	prompt := tokens(300, 40) // 2 full blocks and 8 tokens
	for _, noEvents := range []bool{false, true} {
		t.Run(fmt.Sprint("noEvents=", noEvents), func(t *testing.T) {
			e := mustEngine(t, "tiny", func(c *Config) { c.NoEvents = noEvents })
			d := newDriver(t, e)
			d.add(&Request{ID: "a", Prompt: prompt, MaxTokens: 60, Seed: 42})
			d.add(&Request{ID: "b", Prompt: prompt, MaxTokens: 60, Seed: 42})
			d.step()
			if a, b := d.byID("a"), d.byID("b"); len(a) != 1 || len(b) != 1 || a[0].CachedTokens != 0 || b[0].CachedTokens != 32 {
				t.Fatalf("first step: outputs a %+v, b %+v; want both, b with 32 cached tokens", a, b)
			}
			d.run()
			if !slices.EqualFunc(d.byID("a"), d.byID("b"), func(x, y Output) bool { return x.Token == y.Token }) {
				t.Fatal("a and b generated different tokens")
			}
			materializeAll(e)
			// 100 tokens, 99 computed: blocks 0 and 1 (prompt), 2 to 5
			// (with outputs).
			chain := concat(prompt, e.Sampler().AppendTokens(nil, &Request{ID: "a", Seed: 42}, 60))
			var keys []uint64
			parent := e.hash.None()
			for j := 0; (j+1)*16 <= 99; j++ {
				parent = e.hash.Block(parent, chain[j*16:(j+1)*16])
				keys = append(keys, parent.Key())
			}
			if len(keys) != 6 {
				t.Fatalf("%d keys, want 6", len(keys))
			}
			want := func(j int) int {
				if j >= 2 {
					return 2
				}
				return 1
			}
			for j, k := range keys {
				if got := len(copiesOf(e, k)); got != want(j) {
					t.Errorf("block %d has %d copies cached, want %d", j, got, want(j))
				}
				if !noEvents && d.mirror[k] != want(j) {
					t.Errorf("block %d: events report %d copies, want %d", j, d.mirror[k], want(j))
				}
			}
			if st := e.Stats(); st.CachedBlocks != 10 {
				t.Errorf("cached blocks %d, want 10 (2 prompt blocks, 4 output blocks twice)", st.CachedBlocks)
			}
			if noEvents {
				return
			}
			// Evict everything: a request as long as the cache.
			d.add(&Request{ID: "flush", Prompt: tokens(1, 1023), MaxTokens: 1})
			d.run()
			stored, removed := eventCounts(d.events)
			for j, k := range keys {
				if stored[k] != want(j) || removed[k] != want(j) {
					t.Errorf("block %d: stored %d times, removed %d times, want %d", j, stored[k], removed[k], want(j))
				}
			}
		})
	}
}

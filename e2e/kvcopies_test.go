package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// idsBody is a completion whose prompt is token ids: n ids from seed, all
// in the tiny model's vocabulary.
func idsBody(seed, n int) (string, []uint32) {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(1 + (seed+i*31)%997)
	}
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": ids, "max_tokens": 1, "ignore_eos": true})
	return string(b), ids
}

// TestKVCopiesKeepBlockIndexed: an emulated engine computes a second copy
// of a cached block (a fully cached prompt recomputes its last block, as
// vLLM does) and publishes a BlockStored for each copy over ZeroMQ; when
// one copy is evicted (BlockRemoved) the router's precise index still
// lists the block, as the engine still hits it, and only the eviction of
// the last copy drops it.
//
// The engine has 64 usable blocks (65 with vLLM's null block), and every
// request is sent alone with one
// output token, so the free queue's order, and which request evicts which
// block, follow from vLLM's rules: see each step.
func TestKVCopiesKeepBlockIndexed(t *testing.T) {
	a := startEngine(t, "a", engineOpts{encoding: "array"})
	a.cfg.Engine.NumGPUBlocks, a.cfg.Engine.MaxModelLen = 65, 64*blockSize
	a.restart() // with the small cache, before anyone subscribes
	r := startRouter(t, modelConfig("round_robin", true, a))
	idx := r.p.PreciseIndex(model)
	if idx == nil {
		t.Fatal("no precise index")
	}
	awaitEvents(t, r, a, false)

	send := func(what string, body string, wantCached int) {
		t.Helper()
		res := post(t, a.url(), "/v1/completions", body)
		if got := res.usage.CachedTokens(); got != wantCached {
			t.Fatalf("%s: cached_tokens %d, want %d", what, got, wantCached)
		}
	}
	// indexed waits until the router has applied the events of the
	// request whose ids these are (its blocks are all listed): the
	// evictions its allocation made, reported before, are applied too.
	indexed := func(what string, ids []uint32) {
		t.Helper()
		hashes := kvindex.HashTokens(ids, blockSize, nil)
		eventually(t, 5*time.Second, what+" indexed", func() (bool, string) {
			got := indexHolds(idx, hashes)["a"]
			return got == len(hashes), fmt.Sprintf("index holds %d of its %d blocks", got, len(hashes))
		})
	}

	// A request as long as the cache takes every block and frees them
	// tail first: the free queue is its blocks 63 (partial), 62, ..., 0.
	flush, flushIDs := idsBody(1, 64*blockSize-1)
	send("flush", flush, 0)
	indexed("flush", flushIDs)
	// p is exactly 4 blocks: it takes flush's blocks 63..60 and frees
	// them tail first.
	p, pIDs := idsBody(500, 4*blockSize)
	pHashes := kvindex.HashTokens(pIDs, blockSize, nil)
	send("p", p, 0)
	// p again hits 3 blocks (one token is always computed) and computes
	// block 3 again in flush's block 59: a second copy of p's block 3,
	// stored and reported again. The queue is flush's 58..0, then p's
	// first copy of block 3, the second, then p's blocks 2, 1, 0.
	send("p again", p, 3*blockSize)
	indexed("p", pIDs)

	// 60 blocks: flush's 58..0 and p's first copy of block 3 (reported
	// removed in the same step as this request's blocks stored).
	evict1, evict1IDs := idsBody(2000, 60*blockSize-1)
	send("evict1", evict1, 0)
	indexed("evict1", evict1IDs)
	if got := indexHolds(idx, pHashes)["a"]; got != 4 {
		t.Fatalf("after one of the two copies of p's block 3 was evicted, the index holds %d of p's blocks, want 4", got)
	}
	// The engine agrees: a request extending p hits all 4 blocks (the
	// second copy), and frees its blocks (the copy again, behind a new
	// partial block) at the queue's tail.
	probe, probeIDs := idsBody(500, 5*blockSize)
	if !equalPrefix(probeIDs, pIDs) {
		t.Fatal("the probe does not extend p")
	}
	send("probe", probe, 4*blockSize)

	// The queue is evict1's full blocks (the probe took its partial one
	// for its block 4), the probe's block 4, the copy, p's blocks 2, 1,
	// 0. 61 blocks: up to and including the last copy of p's block 3.
	evict2, evict2IDs := idsBody(7000, 61*blockSize-1)
	send("evict2", evict2, 0)
	indexed("evict2", evict2IDs)
	if got := indexHolds(idx, pHashes)["a"]; got != 3 {
		t.Fatalf("after both copies of p's block 3 were evicted, the index holds %d of p's blocks, want 3", got)
	}
	send("probe after the last copy's eviction", probe, 3*blockSize)
}

// equalPrefix reports whether long starts with short.
func equalPrefix(long, short []uint32) bool {
	if len(long) < len(short) {
		return false
	}
	for i, v := range short {
		if long[i] != v {
			return false
		}
	}
	return true
}

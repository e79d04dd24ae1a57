package kvindex

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestIndexMatchRacingRemove runs Match concurrently with Store, Evict,
// Clear and Remove of endpoints that come and go, reusing each other's
// bits (run it with -race). Endpoint "a" only ever holds prompt p and "b"
// only prompt q, so a hit of p naming "b" (or of q naming "a") attributes
// one endpoint's blocks to another. A Match that read a's blocks before
// a's Remove, and the bit's name after "b" took the bit over, did that:
// the router, which drops hits of endpoints it does not know, would have
// counted a's prefix for b, a live endpoint. A hit may still name an
// endpoint removed during the Match (the router drops it), never another.
func TestIndexMatchRacingRemove(t *testing.T) {
	const bs, blocks = 4, 8
	p, q := seqTokens(blocks*bs, 1), seqTokens(blocks*bs, 1000)
	ph, qh := HashTokens(p, bs, nil), HashTokens(q, bs, nil)
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	x := NewIndex(IndexConfig{BlockSize: bs, Shards: 2})
	pe, qe := engineChain(p, bs), engineChain(q, bs)
	store := func(ep string, eh []uint64, tokens []uint32, n int, tier kvroute.Tier) {
		if _, err := x.Store(ep, Stored{BlockHashes: eh[:n], Tokens: tokens[:n*bs], BlockSize: bs, Tier: tier}); err != nil {
			t.Errorf("Store(%s): %v", ep, err)
		}
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the writer: a and b take turns on bit 0
		defer wg.Done()
		defer done.Store(true)
		for i := range rounds {
			store("a", pe, p, blocks, kvroute.TierGPU)
			if i%3 == 0 {
				store("a", pe, p, blocks/2, kvroute.TierCPU)
			}
			x.Remove("a")
			store("b", qe, q, blocks, kvroute.TierGPU)
			switch i % 3 {
			case 0:
				x.Clear("b")
			case 1:
				x.Evict("b", qe[blocks/2:], kvroute.TierGPU)
			}
			x.Remove("b")
		}
	}()
	var wrong atomic.Int64
	var firstWrong atomic.Pointer[string]
	for _, c := range []struct {
		hashes []uint64
		owner  string
	}{{ph, "a"}, {qh, "b"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hits []Hit
			for !done.Load() {
				hits = x.Match(c.hashes, hits[:0])
				for _, h := range hits {
					if h.Endpoint != c.owner || h.Blocks > blocks || h.GPUBlocks > h.Blocks {
						msg := h.Endpoint
						firstWrong.CompareAndSwap(nil, &msg)
						wrong.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d hits named another endpoint than the prompt's owner (first: %q)", n, *firstWrong.Load())
	}
	if st := x.Stats(); st.Entries != 0 || st.Keys != 0 || st.Endpoints != 0 {
		t.Fatalf("stats after every endpoint left: %+v, want empty", st)
	}
}

// TestApproxMatchRacingRemove is TestIndexMatchRacingRemove for a
// concurrent (not Serialized) Approx, through Match and MatchUnordered:
// a Match that read a's blocks before Remove("a") and the bit's name
// after Record gave the bit to "b" credited b with a's prefix.
func TestApproxMatchRacingRemove(t *testing.T) {
	const bs, blocks = 4, 8
	ph, qh := HashTokens(seqTokens(blocks*bs, 1), bs, nil), HashTokens(seqTokens(blocks*bs, 1000), bs, nil)
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	now := time.Unix(1000, 0)
	a := NewApprox(ApproxConfig{TTL: time.Hour})
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the writer: a and b take turns on bit 0
		defer wg.Done()
		defer done.Store(true)
		for range rounds {
			a.Record(now, "a", ph)
			a.Remove("a")
			a.Record(now, "b", qh)
			a.Remove("b")
		}
	}()
	var wrong atomic.Int64
	for _, c := range []struct {
		hashes    []uint64
		owner     string
		unordered bool
	}{{ph, "a", false}, {qh, "b", true}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hits []Hit
			for !done.Load() {
				if c.unordered {
					hits = a.MatchUnordered(now, c.hashes, hits[:0])
				} else {
					hits = a.Match(now, c.hashes, hits[:0])
				}
				for _, h := range hits {
					if h.Endpoint != c.owner || h.Blocks > blocks {
						wrong.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d hits named another endpoint than the prompt's owner", n)
	}
	if n := a.Len(); n != 0 {
		t.Fatalf("%d entries after every endpoint left, want 0", n)
	}
}

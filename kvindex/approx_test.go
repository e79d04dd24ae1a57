package kvindex

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestApproxMatch(t *testing.T) {
	a := NewApprox(ApproxConfig{TTL: time.Minute})
	p1 := []uint64{1, 2, 3, 4}
	a.Record(t0, "e1", p1)
	a.Record(t0, "e2", []uint64{1, 2, 9})
	a.Record(t0, "e3", []uint64{7, 2, 3})
	got := a.Match(t0.Add(time.Second), []uint64{1, 2, 3, 5}, nil)
	want := []Hit{{"e1", 3, kvroute.TierGPU, 3}, {"e2", 2, kvroute.TierGPU, 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Match = %v, want %v", got, want)
	}
	// TTL: after a minute nothing matches.
	if got := a.Match(t0.Add(61*time.Second), p1, nil); len(got) != 0 {
		t.Fatalf("after TTL: got %v, want none", got)
	}
	// Re-recording refreshes.
	a.Record(t0.Add(60*time.Second), "e2", []uint64{1})
	if got := a.Match(t0.Add(61*time.Second), p1, nil); !reflect.DeepEqual(got, []Hit{{"e2", 1, kvroute.TierGPU, 1}}) {
		t.Fatalf("after refresh: got %v", got)
	}
	if got := a.Match(t0, nil, nil); got != nil {
		t.Fatalf("empty prompt: got %v", got)
	}
}

func TestApproxCapacity(t *testing.T) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 4})
	a.Record(t0, "e", []uint64{1, 2, 3})
	a.Record(t0, "e", []uint64{10, 11, 12})
	// Capacity 4: the second prompt's 3 blocks and the first prompt's head
	// survive; the first prompt's tail went first.
	if got := a.Match(t0, []uint64{1, 2, 3}, nil); !reflect.DeepEqual(got, []Hit{{"e", 1, kvroute.TierGPU, 1}}) {
		t.Fatalf("first prompt: got %v, want 1 block", got)
	}
	if got := a.Match(t0, []uint64{10, 11, 12}, nil); !reflect.DeepEqual(got, []Hit{{"e", 3, kvroute.TierGPU, 3}}) {
		t.Fatalf("second prompt: got %v, want 3 blocks", got)
	}
	a.SetCapacity("e", 2)
	if n := a.Len(); n != 2 {
		t.Fatalf("after SetCapacity(2): Len = %d", n)
	}
	a.Remove("e")
	if n := a.Len(); n != 0 {
		t.Fatalf("after Remove: Len = %d", n)
	}
	if got := a.Match(t0, []uint64{10}, nil); len(got) != 0 {
		t.Fatalf("after Remove: got %v", got)
	}
	a.Remove("unknown")
}

func TestApproxConcurrent(t *testing.T) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 100})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep := fmt.Sprintf("e%d", g)
			var dst []Hit
			for i := 0; i < 1000; i++ {
				h := []uint64{uint64(i % 7), uint64(i % 13), uint64(i)}
				a.Record(t0, ep, h)
				dst = a.Match(t0, h, dst[:0])
				if i%100 == 0 {
					a.SetCapacity(ep, 50+i%100)
				}
			}
		}()
	}
	wg.Wait()
	if n := a.Len(); n > 4*150 {
		t.Fatalf("Len = %d, want <= %d", n, 4*150)
	}
}

// naiveApprox is the reference: per endpoint a slice ordered most recent
// first, TTL checked at Match.
type naiveApprox struct {
	ttl      time.Duration
	defCap   int
	lists    map[string][]naiveEntry
	capacity map[string]int
}

type naiveEntry struct {
	h    uint64
	seen time.Time
}

func (n *naiveApprox) record(now time.Time, ep string, hs []uint64) {
	l := n.lists[ep]
	for i := len(hs) - 1; i >= 0; i-- {
		l = slices.DeleteFunc(l, func(e naiveEntry) bool { return e.h == hs[i] })
		l = append([]naiveEntry{{hs[i], now}}, l...)
	}
	c, ok := n.capacity[ep]
	if !ok {
		c = n.defCap
	}
	if len(l) > c {
		l = l[:c]
	}
	n.lists[ep] = l
}

func (n *naiveApprox) setCapacity(ep string, c int) {
	n.capacity[ep] = c
	if l := n.lists[ep]; len(l) > c {
		n.lists[ep] = l[:c]
	}
	if _, ok := n.lists[ep]; !ok {
		n.lists[ep] = nil
	}
}

func (n *naiveApprox) match(now time.Time, hs []uint64) []Hit {
	var out []Hit
	for ep, l := range n.lists {
		k := 0
		for _, h := range hs {
			if !slices.ContainsFunc(l, func(e naiveEntry) bool { return e.h == h && now.Sub(e.seen) <= n.ttl }) {
				break
			}
			k++
		}
		if k > 0 {
			out = append(out, Hit{Endpoint: ep, Blocks: k, Tier: kvroute.TierGPU, GPUBlocks: k})
		}
	}
	sortHits(out)
	return out
}

func TestApproxDifferential(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 20, TTL: time.Minute, Shards: 2})
		ref := &naiveApprox{ttl: time.Minute, defCap: 20, lists: map[string][]naiveEntry{}, capacity: map[string]int{}}
		now := t0
		eps := []string{"a", "b", "c"}
		prompt := func() []uint64 {
			base := uint64(rng.IntN(4)) * 100
			hs := make([]uint64, 1+rng.IntN(10))
			for i := range hs {
				hs[i] = base + uint64(i) + 1
				if rng.IntN(8) == 0 {
					hs[i] += 50 // a branch
				}
			}
			return hs
		}
		for step := 0; step < 2000; step++ {
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
			ep := eps[rng.IntN(len(eps))]
			switch op := rng.IntN(20); {
			case op < 12:
				hs := prompt()
				a.Record(now, ep, hs)
				ref.record(now, ep, hs)
			case op < 13:
				c := 5 + rng.IntN(30)
				a.SetCapacity(ep, c)
				ref.setCapacity(ep, c)
			case op < 14:
				a.Remove(ep)
				delete(ref.lists, ep)
				delete(ref.capacity, ep)
			}
			q := prompt()
			got, want := a.Match(now, q, nil), ref.match(now, q)
			if len(got) == 0 && len(want) == 0 {
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d: Match(%v)\n got %+v\nwant %+v", seed, step, q, got, want)
			}
		}
	}
}

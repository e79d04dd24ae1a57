package kvindex

import (
	"fmt"
	"reflect"
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

package sim

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

func TestAgendaOrder(t *testing.T) {
	// Differential test against sorting: events pop in (time, schedule order).
	rng := rand.New(rand.NewPCG(1, 2))
	var q agenda
	type key struct {
		at  time.Duration
		arg int32
	}
	var want []key
	for i := range 5000 {
		at := time.Duration(rng.IntN(200)) * time.Millisecond
		q.push(at, evStep, 0, int32(i))
		want = append(want, key{at, int32(i)})
		if i%7 == 0 { // interleave pops with pushes
			e := q.pop()
			sort.SliceStable(want, func(a, b int) bool { return want[a].at < want[b].at })
			if got := (key{e.at, e.arg}); got != want[0] {
				t.Fatalf("pop %d: got %+v, want %+v", i, got, want[0])
			}
			want = want[1:]
		}
	}
	sort.SliceStable(want, func(a, b int) bool { return want[a].at < want[b].at })
	for i, w := range want {
		at, ok := q.peek()
		if !ok || at != w.at {
			t.Fatalf("peek %d: got %v,%v, want %v", i, at, ok, w.at)
		}
		e := q.pop()
		if got := (key{e.at, e.arg}); got != w {
			t.Fatalf("pop %d: got %+v, want %+v", i, got, w)
		}
	}
	if q.Len() != 0 {
		t.Fatalf("len after draining: got %d, want 0", q.Len())
	}
	if _, ok := q.peek(); ok {
		t.Fatal("peek on empty agenda: got ok")
	}
}

func BenchmarkAgenda(b *testing.B) {
	b.ReportAllocs()
	var q agenda
	for i := range 1024 {
		q.push(time.Duration(i*7919%1024), evStep, 0, 0)
	}
	for i := 0; b.Loop(); i++ {
		e := q.pop()
		q.push(e.at+time.Duration(i%512), evStep, 0, 0)
	}
}

// TestFifoNeverEmpty: a fifo that always holds an item or two (scrapes
// in flight when the network latency is longer than the scrape interval,
// KV events when steps are shorter than their delay) reuses its array
// instead of growing with every push, and keeps its order.
func TestFifoNeverEmpty(t *testing.T) {
	var f fifo[int]
	next, want := 0, 0
	for range 3 {
		f.push(next)
		next++
	}
	for i := range 100000 {
		f.push(next)
		next++
		if i%3 == 0 {
			f.push(next)
			next++
		}
		for f.len() > 3 {
			if got := f.pop(); got != want {
				t.Fatalf("pop: got %d, want %d", got, want)
			}
			want++
		}
	}
	if c := cap(f.items); c > 64 {
		t.Errorf("after %d pushes with at most 5 queued: capacity %d, want at most 64", next, c)
	}
	for f.len() > 0 {
		if got := f.pop(); got != want {
			t.Fatalf("pop: got %d, want %d", got, want)
		}
		want++
	}
	if want != next {
		t.Errorf("popped %d items, want %d", want, next)
	}
}

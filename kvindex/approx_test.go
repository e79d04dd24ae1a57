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

func TestApproxRefresh(t *testing.T) {
	a := NewApprox(ApproxConfig{TTL: time.Minute})
	p := []uint64{1, 2, 3, 4}
	a.Record(t0, "e", p)
	a.Record(t0.Add(50*time.Second), "e", p[:2]) // a prefix of the last prompt: refreshes 1, 2
	if got, want := a.Match(t0.Add(61*time.Second), p, nil), []Hit{{"e", 2, kvroute.TierGPU, 2}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after refreshing a prefix: got %v, want %v", got, want)
	}
	a.Record(t0.Add(70*time.Second), "e", p)
	a.Record(t0.Add(100*time.Second), "e", p) // the same prompt again
	if got, want := a.Match(t0.Add(140*time.Second), p, nil), []Hit{{"e", 4, kvroute.TierGPU, 4}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after recording the same prompt again: got %v, want %v", got, want)
	}
	if n := a.Len(); n != 4 {
		t.Fatalf("Len = %d, want 4", n)
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

// TestApproxClear: Clear drops one endpoint's entries and keeps its
// capacity and Slot; the others' entries stay.
func TestApproxClear(t *testing.T) {
	for _, serialized := range []bool{false, true} {
		a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 8, Serialized: serialized})
		a.SetCapacity("e", 6)
		slot := a.Slot("e")
		a.Record(t0, "e", []uint64{1, 2, 3})
		a.Record(t0, "f", []uint64{1, 2})
		a.Clear("e")
		checkApprox(t, a, true)
		if got := a.Match(t0, []uint64{1, 2, 3}, nil); !reflect.DeepEqual(got, []Hit{{"f", 2, kvroute.TierGPU, 2}}) {
			t.Fatalf("serialized=%v: after Clear(e): got %v, want f's 2 blocks only", serialized, got)
		}
		if r := slot.Room(); r != 6 {
			t.Fatalf("serialized=%v: after Clear(e): room %d, want the capacity 6", serialized, r)
		}
		a.Record(t0, "e", []uint64{1, 2, 3, 4, 5, 6, 7})
		if got := a.Match(t0, []uint64{1, 2, 3, 4, 5, 6, 7}, nil); len(got) != 2 || got[0].Blocks != 6 {
			t.Fatalf("serialized=%v: recorded again: got %v, want e holding 6 (its capacity)", serialized, got)
		}
		a.Clear("unknown")
		checkApprox(t, a, true)
	}
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

// room returns the bounds of ep's Room at now: its capacity less the
// entries it holds, expired entries counting until they are dropped.
func (n *naiveApprox) room(now time.Time, ep string) (lo, hi int) {
	c, ok := n.capacity[ep]
	if !ok {
		c = n.defCap
	}
	live := 0
	for _, e := range n.lists[ep] {
		if now.Sub(e.seen) <= n.ttl {
			live++
		}
	}
	return c - len(n.lists[ep]), c - live
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

// TestApproxDifferential checks Approx against a naive reference (an LRU
// list per endpoint) through records, re-records of an endpoint's last
// prompt or its prefix, capacity cuts, removals and clock jumps past TTL,
// so that trees split, grow, extend their leaves and lose them, and the
// tables rebuild; after every operation the trees' invariants are checked
// (checkApprox). Records are chains, as Record requires. Variants: short
// prompts that branch, on small capacities; long prompts with shared
// prefixes, queried with duplicates inside a prompt (hashes that are not
// a chain, which Match must still handle); a Serialized index (plain
// stores, recycled arrays; small shards rebuild often); and chained
// queries, on which MatchUnordered's bisection must agree with the
// reference too.
func TestApproxDifferential(t *testing.T) {
	for _, v := range []struct {
		name   string
		cfg    ApproxConfig
		chains bool // no duplicates inside a query: check MatchUnordered
		short  bool // short branching prompts, capacity 20
	}{
		{"short", ApproxConfig{Shards: 2}, false, true},
		{"serialized/short", ApproxConfig{Shards: 2, Serialized: true}, true, true},
		{"duplicates", ApproxConfig{Shards: 4}, false, false},
		{"serialized/duplicates", ApproxConfig{Shards: 2, Serialized: true}, false, false},
		{"serialized/chains", ApproxConfig{Shards: 2, Serialized: true}, true, false},
		{"chains", ApproxConfig{Shards: 4}, true, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 6; seed++ {
				approxDifferential(t, seed, v.cfg, v.chains, v.short)
			}
		})
	}
}

// chainOf turns raw block contents into chained hashes: equal raw
// prefixes give equal hashes, and a hash determines the blocks before it.
func chainOf(raw []uint64) []uint64 {
	hs := make([]uint64, len(raw))
	h := uint64(0)
	for i, r := range raw {
		h = splitmix(h*31 + r)
		hs[i] = h
	}
	return hs
}

func approxDifferential(t *testing.T, seed uint64, cfg ApproxConfig, chains, short bool) {
	rng := rand.New(rand.NewPCG(seed, 29))
	capacity := 150
	if short {
		capacity = 20
	}
	cfg.DefaultCapacityBlocks, cfg.TTL = capacity, time.Minute
	a := NewApprox(cfg)
	ref := &naiveApprox{ttl: time.Minute, defCap: capacity, lists: map[string][]naiveEntry{}, capacity: map[string]int{}}
	now := t0
	eps := []string{"a", "b", "c", "d"}
	last := map[string][]uint64{}
	prompt := func() []uint64 {
		if short {
			base := uint64(rng.IntN(4)) * 100
			raw := make([]uint64, 1+rng.IntN(10))
			for i := range raw {
				raw[i] = base + uint64(i) + 1
				if rng.IntN(8) == 0 {
					raw[i] += 50 // a branch
				}
			}
			return chainOf(raw)
		}
		base := uint64(rng.IntN(6)) * 1000
		raw := make([]uint64, 1+rng.IntN(60))
		for i := range raw {
			raw[i] = base + uint64(i) + 1
		}
		if rng.IntN(3) == 0 { // a new tail
			for i := len(raw) / 2; i < len(raw); i++ {
				raw[i] = rng.Uint64()
			}
		}
		return chainOf(raw)
	}
	query := func() []uint64 {
		q := prompt()
		if !chains {
			for i := 1; i < len(q); i++ {
				if rng.IntN(30) == 0 {
					q[i] = q[rng.IntN(i)] // a duplicate
				}
			}
		}
		return q
	}
	for step := 0; step < 1500; step++ {
		d := time.Duration(rng.IntN(2000)) * time.Millisecond
		if rng.IntN(200) == 0 {
			d = 2 * time.Minute
		}
		now = now.Add(d)
		ep := eps[rng.IntN(len(eps))]
		switch op := rng.IntN(40); {
		case op < 24:
			hs := prompt()
			a.Record(now, ep, hs)
			ref.record(now, ep, hs)
			last[ep] = hs
		case op < 30: // the endpoint's last prompt or a prefix of it again
			if hs := last[ep]; len(hs) > 0 {
				hs = hs[:1+rng.IntN(len(hs))]
				a.Record(now, ep, hs)
				ref.record(now, ep, hs)
			}
		case op < 32:
			c := 1 + rng.IntN(200)
			a.SetCapacity(ep, c)
			ref.setCapacity(ep, c)
		case op < 33:
			a.Remove(ep)
			delete(ref.lists, ep)
			delete(ref.capacity, ep)
		}
		checkApprox(t, a, true)
		for ep := range ref.lists {
			if lo, hi := ref.room(now, ep); a.Slot(ep).Room() < lo || a.Slot(ep).Room() > hi {
				t.Fatalf("seed %d step %d: %s's Room = %d, want %d..%d", seed, step, ep, a.Slot(ep).Room(), lo, hi)
			}
		}
		q := query()
		want := ref.match(now, q)
		if got := a.Match(now, q, nil); (len(got) > 0 || len(want) > 0) && !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d step %d: Match(%v)\n got %+v\nwant %+v", seed, step, q, got, want)
		}
		if chains {
			un := a.MatchUnordered(now, q, nil)
			if sortHits(un); (len(un) > 0 || len(want) > 0) && !reflect.DeepEqual(un, want) {
				t.Fatalf("seed %d step %d: MatchUnordered(%v), sorted\n got %+v\nwant %+v", seed, step, q, un, want)
			}
			if sl := slotHits(a, a.MatchSlots(now, q, nil)); (len(sl) > 0 || len(want) > 0) && !reflect.DeepEqual(sl, want) {
				t.Fatalf("seed %d step %d: MatchSlots(%v), named and sorted\n got %+v\nwant %+v", seed, step, q, sl, want)
			}
		}
	}
	n := 0
	for _, l := range ref.lists {
		for _, e := range l {
			if now.Sub(e.seen) <= time.Minute {
				n++
			}
		}
	}
	if got := a.Len(); got < n {
		t.Errorf("seed %d: Len = %d, want at least the %d live entries", seed, got, n)
	}
}

// checkApprox checks the invariants of a's trees (see atree): every node
// in use has a non-empty run and is a leaf (in the heap, at the position
// it records) exactly when no node names it as parent; the heap is
// ordered by seq, and a parent's seq is at least its children's; n counts
// the blocks of the runs; each run's first key finds its node in start,
// and start names nothing else. With chains (every Record was a chain)
// it also checks that a block key is in at most one run of an endpoint
// and that the table holds the endpoint's bit for exactly its blocks.
func checkApprox(t testing.TB, a *Approx, chains bool) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	masks := map[*agroup]map[uint64]uint64{}
	for name, e := range a.eps {
		tr := &e.tree
		inUse := map[int32]bool{}
		for id := range tr.nodes {
			inUse[int32(id)] = true
		}
		for _, id := range tr.free {
			if tr.nodes[id].run != nil || tr.nodes[id].heap != -1 {
				t.Fatalf("%s: free node %d in use: %+v", name, id, tr.nodes[id])
			}
			delete(inUse, id)
		}
		kids := map[int32]int32{}
		n := 0
		for id := range inUse {
			nd := &tr.nodes[id]
			if len(nd.run) == 0 {
				t.Fatalf("%s: node %d has an empty run", name, id)
			}
			n += len(nd.run)
			if nd.parent >= 0 {
				if !inUse[nd.parent] {
					t.Fatalf("%s: node %d's parent %d is not in use", name, id, nd.parent)
				}
				kids[nd.parent]++
				if p := &tr.nodes[nd.parent]; p.seq < nd.seq {
					t.Fatalf("%s: node %d's seq %d is above its parent's %d", name, id, nd.seq, p.seq)
				}
			}
			if v := tr.start.find(nd.run[0]); chains && (v == nil || *v != uint64(id)) {
				t.Fatalf("%s: start does not find node %d by its first key", name, id)
			}
		}
		if n != tr.n {
			t.Fatalf("%s: n = %d, runs hold %d", name, tr.n, n)
		}
		for id := range inUse {
			nd := &tr.nodes[id]
			if nd.kids != kids[id] {
				t.Fatalf("%s: node %d counts %d children, has %d", name, id, nd.kids, kids[id])
			}
			if leaf := nd.kids == 0; leaf != (nd.heap >= 0) || leaf && tr.heap[nd.heap] != id {
				t.Fatalf("%s: node %d: %d children, heap position %d", name, id, nd.kids, nd.heap)
			}
		}
		for i, id := range tr.heap {
			if i > 0 && tr.nodes[tr.heap[(i-1)/2]].seq > tr.nodes[id].seq {
				t.Fatalf("%s: heap out of order at %d", name, i)
			}
		}
		if tr.start.n != len(inUse) && chains {
			t.Fatalf("%s: start has %d keys for %d nodes", name, tr.start.n, len(inUse))
		}
		if !chains {
			continue
		}
		m := masks[e.g]
		if m == nil {
			m = map[uint64]uint64{}
			masks[e.g] = m
		}
		for id := range inUse {
			for _, k := range tr.nodes[id].run {
				if m[k]&e.bit != 0 {
					t.Fatalf("%s: key %x is held twice", name, k)
				}
				m[k] |= e.bit
			}
		}
	}
	for g, m := range masks {
		for k, want := range m {
			if got := g.get(k) & want; got != want {
				t.Fatalf("table: key %x mask %x, want bits %x", k, got, want)
			}
		}
	}
}

// TestApproxNotChains records hashes that are not chains (keys repeated
// within a prompt and after other blocks) on small capacities: Record
// must keep its structure whole and its size within capacity.
func TestApproxNotChains(t *testing.T) {
	for _, serialized := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(3, 3))
		a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 30, TTL: time.Minute, Serialized: serialized})
		now := t0
		for step := range 3000 {
			now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
			hs := make([]uint64, 1+rng.IntN(12))
			for i := range hs {
				hs[i] = uint64(rng.IntN(40))
			}
			ep := []string{"a", "b"}[rng.IntN(2)]
			a.Record(now, ep, hs)
			if step%97 == 0 {
				a.SetCapacity(ep, 1+rng.IntN(40))
			}
			checkApprox(t, a, false)
			for _, name := range []string{"a", "b"} {
				if e := a.eps[name]; e != nil && e.tree.n > e.capacity {
					t.Fatalf("step %d: %s holds %d blocks, capacity %d", step, name, e.tree.n, e.capacity)
				}
			}
			a.Match(now, hs, nil)
			a.MatchUnordered(now, hs, nil)
		}
	}
}

// TestApproxSlotRoom: a Slot's Room follows Record's inserts and
// evictions, SetCapacity and expiry, and a new endpoint starts empty.
func TestApproxSlotRoom(t *testing.T) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 10, TTL: time.Minute, Serialized: true})
	if got := (Slot{}).Room(); got != -1 {
		t.Errorf("zero Slot: Room = %d, want -1", got)
	}
	s := a.Slot("e")
	check := func(when string, want int) {
		t.Helper()
		if got := s.Room(); got != want {
			t.Errorf("%s: Room = %d, want %d", when, got, want)
		}
	}
	check("new endpoint", 10)
	if !s.Oldest().IsZero() {
		t.Errorf("new endpoint: Oldest = %v, want zero", s.Oldest())
	}
	a.Record(t0, "e", []uint64{1, 2, 3, 4})
	check("4 blocks recorded", 6)
	if !s.Oldest().Equal(t0) {
		t.Errorf("Oldest = %v, want %v", s.Oldest(), t0)
	}
	a.Record(t0, "e", []uint64{1, 2})
	check("2 of them again", 6)
	a.Record(t0.Add(time.Second), "e", []uint64{11, 12, 13, 14, 15, 16, 17, 18})
	check("8 more: 2 evicted", 0)
	if !s.Oldest().Equal(t0) {
		t.Errorf("Oldest = %v, want %v (blocks 1 and 2 are left)", s.Oldest(), t0)
	}
	a.SetCapacity("e", 20)
	check("capacity 20", 10)
	a.SetCapacity("e", 5)
	check("capacity 5: 5 evicted", 0)
	if want := t0.Add(time.Second); !s.Oldest().Equal(want) {
		t.Errorf("Oldest = %v, want %v (blocks 1 and 2 evicted)", s.Oldest(), want)
	}
	a.Match(t0.Add(2*time.Minute), []uint64{11}, nil)
	check("all expired", 5)
	if !s.Oldest().IsZero() {
		t.Errorf("all expired: Oldest = %v, want zero", s.Oldest())
	}
	if got := a.Slot("other").Room(); got != 10 {
		t.Errorf("another endpoint: Room = %d, want 10", got)
	}
}

// TestAmapDifferential checks amap against a Go map through growth and
// shrinking.
func TestAmapDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	var m amap
	ref := map[uint64]uint64{}
	keys := []uint64{}
	for step := 0; step < 200000; step++ {
		grow := step%40000 < 25000
		if len(keys) == 0 || (grow && rng.IntN(3) > 0) || (!grow && rng.IntN(3) == 0) {
			k := rng.Uint64()%5000 + 1
			v := rng.Uint64()
			p, inserted := m.slot(k)
			if _, had := ref[k]; had == inserted {
				t.Fatalf("step %d: slot(%d) inserted = %v, want %v", step, k, inserted, !had)
			}
			*p = v
			if inserted {
				keys = append(keys, k)
			}
			ref[k] = v
			continue
		}
		keys = deleteRandomKey(rng, keys, &m, ref)
		if step%997 == 0 {
			if m.n != len(ref) {
				t.Fatalf("step %d: n = %d, want %d", step, m.n, len(ref))
			}
			for k, v := range ref {
				if p, inserted := m.slot(k); inserted || *p != v {
					t.Fatalf("step %d: key %d = %d (inserted %v), want %d", step, k, *p, inserted, v)
				}
			}
		}
	}
}

// TestATableConcurrentReaders runs readers against the single writer
// (under -race this also checks the plain stores): a key's mask is only
// ever 0 or its own pattern, so a reader that pairs a key with another
// key's mask is caught.
func TestATableConcurrentReaders(t *testing.T) {
	tab := newATable(4)
	pattern := func(k uint64) uint64 { return k*0x9e3779b97f4a7c15 | 1 }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad sync.Once
	var badMsg string
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := uint64(1); ; k = k%3000 + 1 {
				select {
				case <-stop:
					return
				default:
				}
				if m := tab.get(k); m != 0 && m != pattern(k) {
					bad.Do(func() { badMsg = fmt.Sprintf("get(%d) = %#x, want 0 or %#x", k, m, pattern(k)) })
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < 200000; i++ {
		k := rng.Uint64()%3000 + 1
		if rng.IntN(2) == 0 {
			tab.applyBatch([]uint64{k}, nil, pattern(k))
		} else {
			tab.applyBatch(nil, []uint64{k}, pattern(k))
		}
	}
	close(stop)
	wg.Wait()
	if badMsg != "" {
		t.Fatal(badMsg)
	}
}

// TestAmapFilter checks find, for present and absent keys, against a
// reference map while the map grows past amapFewMax and shrinks back, so
// the filter is used, dropped and rebuilt.
func TestAmapFilter(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	var m amap
	ref := map[uint64]uint64{}
	keys := []uint64{}
	check := func(step int, k uint64) {
		v, had := ref[k]
		p := m.find(k)
		switch {
		case had && (p == nil || *p != v):
			t.Fatalf("step %d: key %d: find %v, want value %d", step, k, p, v)
		case !had && p != nil:
			t.Fatalf("step %d: absent key %d: find %v", step, k, p)
		}
	}
	used := 0
	for step := 0; step < 100000; step++ {
		target := 10 + 90*((step/3000)%2) // below and above amapFewMax in turn
		if len(keys) == 0 || len(keys) < target && rng.IntN(2) == 0 {
			k := rng.Uint64()%400 + 1
			p, inserted := m.slot(k)
			*p = rng.Uint64()
			if inserted {
				keys = append(keys, k)
			}
			ref[k] = *p
		} else if rng.IntN(2) == 0 {
			keys = deleteRandomKey(rng, keys, &m, ref)
		}
		check(step, rng.Uint64()%400+1)
		if len(keys) > 0 {
			check(step, keys[rng.IntN(len(keys))])
		}
		if m.filtOK {
			used++
		}
	}
	if used < 10000 {
		t.Fatalf("the filter was valid in %d steps: the test did not exercise it", used)
	}
}

// deleteRandomKey deletes one of keys, chosen at random, from m and its
// reference ref, and returns keys without it.
func deleteRandomKey(rng *rand.Rand, keys []uint64, m *amap, ref map[uint64]uint64) []uint64 {
	j := rng.IntN(len(keys))
	k := keys[j]
	keys[j] = keys[len(keys)-1]
	m.del(k)
	delete(ref, k)
	return keys[:len(keys)-1]
}

// FuzzApprox drives an Approx and the naive reference through the
// operations the fuzzer's bytes spell (records of chained prompts drawn
// from a few branching stems, records of a prefix of the endpoint's last
// prompt, capacity changes, removals, clock jumps), checking the trees'
// invariants after each and Match, MatchUnordered and Room against the
// reference.
func FuzzApprox(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, false)
	f.Add([]byte{0x10, 0x31, 0x52, 0x13, 0x94, 0xf5, 0x26, 0x37, 0x08, 0x89}, true)
	f.Fuzz(func(t *testing.T, ops []byte, serialized bool) {
		const capacity = 12
		a := NewApprox(ApproxConfig{DefaultCapacityBlocks: capacity, TTL: time.Minute, Shards: 2, Serialized: serialized})
		ref := &naiveApprox{ttl: time.Minute, defCap: capacity, lists: map[string][]naiveEntry{}, capacity: map[string]int{}}
		eps := []string{"a", "b", "c"}
		last := map[string][]uint64{}
		now := t0
		// prompt spells a chained prompt from two bytes: its stem (which
		// of 4 shared beginnings), its length (1-8 blocks) and the block
		// after which it branches off the stem (none when past its end).
		prompt := func(x, y byte) []uint64 {
			raw := make([]uint64, 1+int(y&7))
			for i := range raw {
				raw[i] = uint64(x&3)*100 + uint64(i) + 1
				if i >= int(y>>3&7) {
					raw[i] += uint64(x>>2) * 1000 // the branch
				}
			}
			return chainOf(raw)
		}
		for i := 0; i+2 < len(ops); i += 3 {
			op, x, y := ops[i], ops[i+1], ops[i+2]
			ep := eps[int(op>>4)%len(eps)]
			switch op & 7 {
			case 0, 1, 2:
				hs := prompt(x, y)
				a.Record(now, ep, hs)
				ref.record(now, ep, hs)
				last[ep] = hs
			case 3:
				if hs := last[ep]; len(hs) > 0 {
					hs = hs[:1+int(x)%len(hs)]
					a.Record(now, ep, hs)
					ref.record(now, ep, hs)
				}
			case 4:
				c := 1 + int(x)%20
				a.SetCapacity(ep, c)
				ref.setCapacity(ep, c)
			case 5:
				a.Remove(ep)
				delete(ref.lists, ep)
				delete(ref.capacity, ep)
				delete(last, ep)
			case 6:
				now = now.Add(time.Duration(x) * time.Second) // up to past the TTL
			case 7:
				now = now.Add(time.Duration(x) * time.Millisecond)
			}
			checkApprox(t, a, true)
			q := prompt(y, x)
			want := ref.match(now, q)
			if got := a.Match(now, q, nil); (len(got) > 0 || len(want) > 0) && !reflect.DeepEqual(got, want) {
				t.Fatalf("op %d: Match(%v)\n got %+v\nwant %+v", i/3, q, got, want)
			}
			un := a.MatchUnordered(now, q, nil)
			if sortHits(un); (len(un) > 0 || len(want) > 0) && !reflect.DeepEqual(un, want) {
				t.Fatalf("op %d: MatchUnordered(%v), sorted\n got %+v\nwant %+v", i/3, q, un, want)
			}
			if sl := slotHits(a, a.MatchSlots(now, q, nil)); (len(sl) > 0 || len(want) > 0) && !reflect.DeepEqual(sl, want) {
				t.Fatalf("op %d: MatchSlots(%v), named and sorted\n got %+v\nwant %+v", i/3, q, sl, want)
			}
			for ep := range ref.lists {
				if lo, hi := ref.room(now, ep); a.Slot(ep).Room() < lo || a.Slot(ep).Room() > hi {
					t.Fatalf("op %d: %s's Room = %d, want %d..%d", i/3, ep, a.Slot(ep).Room(), lo, hi)
				}
			}
		}
	})
}

// slotHits converts MatchSlots' hits to Match's, named by the endpoints
// whose Slot has their number, and sorted as Match sorts them.
func slotHits(a *Approx, hits []SlotHit) []Hit {
	var out []Hit
	for _, h := range hits {
		name := ""
		for ep := range a.eps {
			if a.Slot(ep).Index() == int(h.Slot) {
				name = ep
			}
		}
		out = append(out, Hit{Endpoint: name, Blocks: int(h.Blocks), Tier: kvroute.TierGPU, GPUBlocks: int(h.Blocks)})
	}
	sortHits(out)
	return out
}

// TestApproxRecordHeldWithZeroKey: recording again a prompt the endpoint
// holds walks it whole, also when a hash is 0 (kept as 1, the tables'
// empty key being 0), which the walk's comparison of whole runs finds
// unequal and leaves to its comparison key by key: nothing is added.
func TestApproxRecordHeldWithZeroKey(t *testing.T) {
	hs := []uint64{11, 0, 13, 14, 15}
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 100, TTL: time.Minute, Serialized: true})
	for range 3 {
		a.Record(t0, "a", hs)
		if got := a.eps["a"].tree.n; got != len(hs) {
			t.Fatalf("after recording the same %d blocks again: %d held, want %d", len(hs), got, len(hs))
		}
		if got := a.Match(t0, hs, nil); len(got) != 1 || got[0].Blocks != len(hs) {
			t.Fatalf("Match = %+v, want a's %d blocks", got, len(hs))
		}
	}
}

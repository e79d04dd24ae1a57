package kvindex

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestApproxSerializedNoAllocs checks that a Serialized index at steady
// state, every Record evicting as many blocks as it adds (the table
// rebuilding shards as tombstones pile up), allocates nothing: rebuilt
// shards reuse the arrays they retired.
func TestApproxSerializedNoAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("fills an index to steady state")
	}
	const blocks, capacity, prompts = 256, 4096, 64
	ps := randomPrompts(rand.New(rand.NewPCG(7, 7)), prompts, blocks)
	for _, serialized := range []bool{false, true} {
		a := NewApprox(ApproxConfig{Serialized: serialized})
		a.SetCapacity("e", capacity)
		i := 0
		record := func() {
			a.Record(t0.Add(time.Duration(i)*time.Millisecond), "e", ps[i%prompts])
			i++
		}
		for range 4000 {
			record()
		}
		allocs := testing.AllocsPerRun(2000, record)
		t.Logf("serialized=%v: %.3f allocs per Record", serialized, allocs)
		if serialized && allocs != 0 {
			t.Errorf("serialized: got %.3f allocs per Record at steady state, want 0", allocs)
		}
	}
}

// TestApproxReRecordKeepsRecency checks the unindexed first entry: a block
// recorded once has no index entry, and recording it again must still make
// it most recent (its first entry then is stale and skipped), so that the
// blocks recorded in between are evicted before it.
func TestApproxReRecordKeepsRecency(t *testing.T) {
	for _, serialized := range []bool{false, true} {
		a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 6, TTL: time.Hour, Serialized: serialized})
		p1, p2, p3 := []uint64{11, 12, 13}, []uint64{21, 22, 23}, []uint64{31, 32, 33}
		a.Record(t0, "e", p1)
		a.Record(t0.Add(time.Second), "e", p2)
		a.Record(t0.Add(2*time.Second), "e", p1) // p1 most recent again
		a.Record(t0.Add(3*time.Second), "e", p3) // evicts p2, the least recent
		now := t0.Add(4 * time.Second)
		for _, c := range []struct {
			name   string
			prompt []uint64
			want   int
		}{{"p1", p1, 3}, {"p2", p2, 0}, {"p3", p3, 3}} {
			got := 0
			if h := a.Match(now, c.prompt, nil); len(h) > 0 {
				got = h[0].Blocks
			}
			if got != c.want {
				t.Errorf("serialized=%v: %s: got %d blocks held, want %d", serialized, c.name, got, c.want)
			}
		}
		if got := a.Len(); got != 6 {
			t.Errorf("serialized=%v: Len = %d, want 6", serialized, got)
		}
	}
}

// TestApproxTreeShape checks that a held prompt recorded again changes
// no structure: prompts sharing a prefix are one node for the prefix and
// one leaf each, and recording any of them again, or a prefix of one,
// adds no node and no block.
func TestApproxTreeShape(t *testing.T) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 10000, Serialized: true})
	ps := randomPrompts(rand.New(rand.NewPCG(9, 9)), 16, 100)
	for _, p := range ps {
		copy(p[:20], ps[0][:20])
	}
	nodes := func() (int, int) {
		tr := &a.eps["e"].tree
		return len(tr.nodes) - len(tr.free), tr.n
	}
	at := t0
	for _, p := range ps {
		at = at.Add(time.Millisecond)
		a.Record(at, "e", p)
	}
	if n, blocks := nodes(); n != 17 || blocks != 20+16*80 {
		t.Fatalf("16 prompts sharing 20 blocks: %d nodes, %d blocks; want 17 and %d", n, blocks, 20+16*80)
	}
	for i := range 3 * len(ps) {
		at = at.Add(time.Millisecond)
		a.Record(at, "e", ps[(i*7)%len(ps)])
	}
	if n, blocks := nodes(); n != 17 || blocks != 20+16*80 {
		t.Fatalf("after recording them again: %d nodes, %d blocks; want 17 and %d", n, blocks, 20+16*80)
	}
	a.Record(at, "e", ps[3][:50]) // splits prompt 3's leaf
	if n, _ := nodes(); n != 18 {
		t.Fatalf("after recording a prefix: %d nodes, want 18", n)
	}
	checkApprox(t, a, true)
}

package kvindex

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestApproxSerializedDifferential runs the long differential scenario's
// kind of traffic (shared prefixes, new tails, capacity cuts, expiry)
// against a Serialized index, whose table writes with plain stores and
// recycles rebuilt arrays: small shards make it rebuild often.
func TestApproxSerializedDifferential(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 31))
		a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 150, TTL: time.Minute, Shards: 2, Serialized: true})
		ref := &naiveApprox{ttl: time.Minute, defCap: 150, lists: map[string][]naiveEntry{}, capacity: map[string]int{}}
		now := t0
		eps := []string{"a", "b", "c", "d"}
		prompt := func() []uint64 {
			base := uint64(rng.IntN(6)) * 1000
			hs := make([]uint64, 1+rng.IntN(60))
			for i := range hs {
				hs[i] = base + uint64(i) + 1
			}
			if rng.IntN(2) == 0 { // a new tail
				for i := len(hs) / 2; i < len(hs); i++ {
					hs[i] = rng.Uint64()>>1 | 1<<62
				}
			}
			return hs
		}
		for step := 0; step < 2000; step++ {
			d := time.Duration(rng.IntN(2000)) * time.Millisecond
			if rng.IntN(300) == 0 {
				d = 2 * time.Minute
			}
			now = now.Add(d)
			ep := eps[rng.IntN(len(eps))]
			switch op := rng.IntN(40); {
			case op < 30:
				hs := prompt()
				a.Record(now, ep, hs)
				ref.record(now, ep, hs)
			case op < 32:
				c := 1 + rng.IntN(200)
				a.SetCapacity(ep, c)
				ref.setCapacity(ep, c)
			case op < 33:
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
			un := a.MatchUnordered(now, q, nil)
			if sortHits(un); !reflect.DeepEqual(un, want) {
				t.Fatalf("seed %d step %d: MatchUnordered(%v), sorted\n got %+v\nwant %+v", seed, step, q, un, want)
			}
		}
	}
}

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

// TestApproxChurnIndexesNothing checks that blocks recorded once are not
// indexed: under churn (every Record inserting and evicting new blocks)
// the endpoint's index stays empty, which is what makes such a Record
// cheap.
func TestApproxChurnIndexesNothing(t *testing.T) {
	a := NewApprox(ApproxConfig{DefaultCapacityBlocks: 1000, Serialized: true})
	ps := randomPrompts(rand.New(rand.NewPCG(9, 9)), 50, 100)
	for i, p := range ps {
		a.Record(t0.Add(time.Duration(i)*time.Millisecond), "e", p)
	}
	e := a.eps["e"]
	if e.idx.n != 0 || e.log.n != 1000 {
		t.Fatalf("after churn: %d indexed blocks, %d held; want 0 and 1000", e.idx.n, e.log.n)
	}
	a.Record(t0.Add(time.Second), "e", ps[len(ps)-1]) // the last prompt again: refreshed in place
	a.Record(t0.Add(2*time.Second), "e", ps[len(ps)-2])
	if e.idx.n != 100 {
		t.Fatalf("after recording a held prompt again: %d indexed blocks, want 100", e.idx.n)
	}
}

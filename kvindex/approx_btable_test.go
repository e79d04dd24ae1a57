package kvindex

import (
	"math/rand/v2"
	"testing"
)

// checkBTable checks t's invariants: n and over match a recount (over[b]
// is the number of keys stored past b whose home is at or before b),
// every key is found where it is stored, and the table's content equals
// want.
func checkBTable(t *testing.T, bt *btable, want map[uint64]uint64) {
	t.Helper()
	over := make([]uint32, len(bt.b))
	n, runs := 0, 0
	for bi := range bt.b {
		for j, k := range bt.b[bi].keys {
			if k == 0 {
				if m := bt.b[bi].masks[j]; m != 0 {
					t.Fatalf("bucket %d slot %d: empty with mask %#x", bi, j, m)
				}
				continue
			}
			n++
			if bt.b[bi].masks[j] == 0 {
				t.Fatalf("bucket %d slot %d: key %#x with mask 0", bi, j, k)
			}
			for x := bt.home(k); x != uint64(bi); x = (x + 1) & bt.mask {
				over[x]++
				runs++
			}
			if gb, gj := bt.find(k); gb != uint64(bi) || gj != j {
				t.Fatalf("find(%#x) = %d/%d, want %d/%d", k, gb, gj, bi, j)
			}
		}
	}
	if n != bt.n || n != len(want) {
		t.Fatalf("got %d keys (n %d), want %d", n, bt.n, len(want))
	}
	if runs != bt.runs {
		t.Fatalf("runs = %d, recount %d", bt.runs, runs)
	}
	for b := range over {
		if over[b] != bt.over[b] {
			t.Fatalf("over[%d] = %d, recount %d", b, bt.over[b], over[b])
		}
	}
	for k, m := range want {
		if got := bt.get(k); got != m {
			t.Fatalf("get(%#x) = %#x, want %#x", k, got, m)
		}
	}
}

// TestBTableDifferential checks btable against a map through random
// updates, with keys drawn from small pools so that the same keys come
// back, and (crowded) keys sharing a few home buckets so that buckets
// overflow, runs form and wrap around the array's end, and removals
// shorten them; the table grows and shrinks as the live count swings.
func TestBTableDifferential(t *testing.T) {
	for _, v := range []struct {
		name    string
		crowded bool
	}{{"random", false}, {"crowded", true}} {
		t.Run(v.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 4; seed++ {
				rng := rand.New(rand.NewPCG(seed, 99))
				bt := newBTable()
				want := map[uint64]uint64{}
				pool := make([]uint64, 3000)
				for i := range pool {
					if v.crowded {
						// mix is a bijection: pick mixed values with few
						// distinct top bits (a handful of home buckets,
						// the last one at the array's end) and invert.
						m := uint64(rng.IntN(4))<<62 | rng.Uint64()>>8 | 0xff<<54
						pool[i] = nonZero(m * 0xf1de83e19937733d) // inverse of mix's multiplier
					} else {
						pool[i] = rng.Uint64() | 1
					}
				}
				for step := range 40000 {
					// The live share swings: grow, then shrink.
					phase := step / 5000 % 2
					k := pool[rng.IntN(len(pool))]
					bit := uint64(1) << rng.IntN(3)
					var set, clr uint64
					if rng.IntN(3) > phase {
						set = bit
					} else {
						clr = bit | uint64(rng.IntN(2))<<2
					}
					old := bt.update(k, set, clr)
					if old != want[k] {
						t.Fatalf("seed %d step %d: update(%#x, %#x, %#x) = %#x, want %#x", seed, step, k, set, clr, old, want[k])
					}
					if nw := old&^clr | set; nw != 0 {
						want[k] = nw
					} else {
						delete(want, k)
					}
					if step%997 == 0 {
						checkBTable(t, bt, want)
					}
				}
				checkBTable(t, bt, want)
			}
		})
	}
}

func TestBTableMixInverse(t *testing.T) {
	// The crowded keys above rely on this inverse.
	for _, k := range []uint64{1, 2, 0xdeadbeef, 1<<63 | 5} {
		if got := mix(k * 0xf1de83e19937733d); got != k {
			t.Errorf("mix(k * inverse) = %#x, want %#x", got, k)
		}
	}
}

package engine

import (
	"math/rand/v2"
	"testing"
)

// TestBlockTableDifferential checks the open-addressing table against a Go
// map under random inserts and removals, with clustered and zero keys.
func TestBlockTableDifferential(t *testing.T) {
	for _, keyspace := range []uint64{8, 100, 1 << 62} {
		rng := rand.New(rand.NewPCG(keyspace, 3))
		const max = 300
		tab := newBlockTable(max)
		ref := map[uint64]int32{}
		for op := range 200000 {
			k := rng.Uint64N(keyspace)
			switch {
			case rng.IntN(3) > 0 && len(ref) < max:
				_, had := ref[k]
				added := tab.insert(k, int32(op))
				if added == had {
					t.Fatalf("op %d: insert(%d) added=%v, reference had=%v", op, k, added, had)
				}
				if added {
					ref[k] = int32(op)
				}
			default:
				tab.remove(k)
				delete(ref, k)
			}
			if op%97 == 0 {
				if tab.len() != len(ref) {
					t.Fatalf("op %d: len %d, want %d", op, tab.len(), len(ref))
				}
				for rk, rv := range ref {
					if v, ok := tab.get(rk); !ok || v != rv {
						t.Fatalf("op %d: get(%d) = %d,%v, want %d", op, rk, v, ok, rv)
					}
				}
				n := 0
				tab.each(func(k uint64, v int32) {
					n++
					if ref[k] != v {
						t.Fatalf("op %d: table has %d -> %d, reference %d", op, k, v, ref[k])
					}
				})
				if n != len(ref) {
					t.Fatalf("op %d: each visited %d, want %d", op, n, len(ref))
				}
			}
			if _, ok := tab.get(k); ok != (func() bool { _, ok := ref[k]; return ok })() {
				t.Fatalf("op %d: get(%d) presence %v disagrees with the reference", op, k, ok)
			}
		}
	}
}

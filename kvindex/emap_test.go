package kvindex

import (
	"math/rand/v2"
	"testing"
)

// TestEmap checks emap against a Go map on random operations over a small
// key space (long probe runs, wrap-around, backward shifts, key 0).
func TestEmap(t *testing.T) {
	for seed := uint64(0); seed < 10; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		var m emap
		ref := map[uint64]uint64{}
		for step := 0; step < 20000; step++ {
			k := uint64(rng.IntN(300))
			switch rng.IntN(7) {
			case 0, 1, 2:
				v := rng.Uint64()
				old, ok := m.put(k, v)
				rold, rok := ref[k]
				if ok != rok || old != rold {
					t.Fatalf("seed %d step %d: put(%d) = %d,%v want %d,%v", seed, step, k, old, ok, rold, rok)
				}
				ref[k] = v
			case 3, 4:
				v, ok := m.del(k)
				rv, rok := ref[k]
				if ok != rok || v != rv {
					t.Fatalf("seed %d step %d: del(%d) = %d,%v want %d,%v", seed, step, k, v, ok, rv, rok)
				}
				delete(ref, k)
			case 5:
				want := rng.IntN(5)
				n := m.evictFrom(rng.Uint64(), want, func(k, v uint64) {
					if rv, ok := ref[k]; !ok || rv != v {
						t.Fatalf("seed %d step %d: evicted %d=%d, held %d,%v", seed, step, k, v, rv, ok)
					}
				})
				if n > want {
					t.Fatalf("evicted %d, asked %d", n, want)
				}
				// Rebuild the reference from what is left.
				clear(ref)
				m.each(func(k, v uint64) { ref[k] = v })
			default:
				v, ok := m.get(k)
				rv, rok := ref[k]
				if ok != rok || v != rv {
					t.Fatalf("seed %d step %d: get(%d) = %d,%v want %d,%v", seed, step, k, v, ok, rv, rok)
				}
			}
			if m.Len() != len(ref) {
				t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.Len(), len(ref))
			}
		}
		// Every reference key is reachable.
		for k, v := range ref {
			if got, ok := m.get(k); !ok || got != v {
				t.Fatalf("seed %d: get(%d) = %d,%v want %d", seed, k, got, ok, v)
			}
		}
	}
}

package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBlockTableDifferential checks the open-addressing table against a Go
// map of each key's copies in the order they were cached, under random
// inserts (a quarter of them copies of a key already cached) and drops of
// any copy (which leave stale slots, and rebuild the table when they fill
// it), with clustered and zero keys, and keyspaces whose keys share tags
// (the low 32 bits of the spread key) with others only by chance (a tag
// match is checked against the block's key), and blocks that cache the
// key they held before (their stale slot, earlier in the probe run, must
// not pass for their new entry).
func TestBlockTableDifferential(t *testing.T) {
	for _, tc := range []struct {
		keyspace uint64
		copies   bool // insert copies of cached keys (a wide keyspace has none otherwise: rebuild's fast path)
	}{{8, true}, {100, true}, {1 << 62, true}, {1 << 62, false}, {collide, true}} {
		keyspace := tc.keyspace
		rng := rand.New(rand.NewPCG(keyspace, 3))
		const max = 300
		blocks := make([]kvBlock, max+1) // the last is the pool's spare, never hashed
		var free []int32                 // ids holding no entry
		for id := range int32(max) {
			free = append(free, id)
		}
		tab := newBlockTable(max, blocks)
		ref := map[uint64][]int32{} // key -> its copies, first cached first
		entries, rebuilds, dups := 0, 0, 0
		for op := range 200000 {
			var k uint64
			if keyspace == collide {
				// 64 keys with 4 tags: probe runs of tag matches whose
				// keys differ.
				k = unspread(rng.Uint64N(16)<<32 | rng.Uint64N(4)<<2)
			} else {
				k = rng.Uint64N(keyspace)
			}
			switch {
			case rng.IntN(3) > 0 && entries < max:
				id := free[rng.IntN(len(free))]
				switch {
				case rng.IntN(4) == 0 && !blocks[id].hashed && (tc.copies || len(ref[blocks[id].hash]) == 0):
					k = blocks[id].hash // the key it last held: its stale slot matches the tag
				case tc.copies && rng.IntN(4) == 0 && len(ref) > 0:
					for rk := range ref {
						k = rk // another copy
						break
					}
				}
				if len(ref[k]) > 0 {
					dups++
				}
				used := tab.used
				tab.insert(k, id)
				if tab.used < used {
					rebuilds++
				}
				ref[k] = append(ref[k], id)
				entries++
				free = slices.DeleteFunc(free, func(f int32) bool { return f == id })
				if b := blocks[id]; !b.hashed || b.hash != k {
					t.Fatalf("op %d: insert(%d, %d) left the block %+v, want it holding the key", op, k, id, b)
				}
			default:
				if len(ref) > 0 && rng.IntN(2) == 0 { // a key held (a wide keyspace's random key never is)
					for rk := range ref {
						k = rk
						break
					}
				}
				ids := ref[k]
				if len(ids) == 0 {
					break
				}
				c := rng.IntN(len(ids)) // any copy: eviction order is the free queue's
				id := ids[c]
				tab.drop(id)
				free = append(free, id)
				entries--
				if blocks[id].hashed {
					t.Fatalf("op %d: drop(%d) left block %d hashed", op, id, id)
				}
				if ids = slices.Delete(ids, c, c+1); len(ids) == 0 {
					delete(ref, k)
				} else {
					ref[k] = ids
				}
			}
			if tab.used > tab.maxUsed {
				t.Fatalf("op %d: %d slots used, more than %d", op, tab.used, tab.maxUsed)
			}
			if op%97 == 0 {
				if tab.len() != entries {
					t.Fatalf("op %d: len %d, want %d", op, tab.len(), entries)
				}
				for rk, rv := range ref {
					if v, ok := tab.get(rk); !ok || v != rv[0] {
						t.Fatalf("op %d: get(%d) = %d,%v, want %d (the first of %v)", op, rk, v, ok, rv[0], rv)
					}
					var got []int32
					tab.copies(rk, func(id int32) { got = append(got, id) })
					if !slices.Equal(got, rv) {
						t.Fatalf("op %d: copies of %d = %v, want %v", op, rk, got, rv)
					}
				}
				n := 0
				stale := tab.each(func(k uint64, v int32) {
					n++
					if !slices.Contains(ref[k], v) {
						t.Fatalf("op %d: table has %d -> %d, reference %v", op, k, v, ref[k])
					}
				})
				if n != entries {
					t.Fatalf("op %d: each visited %d, want %d", op, n, entries)
				}
				if n+stale != tab.used {
					t.Fatalf("op %d: %d live and %d stale slots, used says %d", op, n, stale, tab.used)
				}
			}
			if v, ok := tab.get(k); ok != (len(ref[k]) > 0) || ok && v != ref[k][0] {
				t.Fatalf("op %d: get(%d) = %d,%v, want the first of %v", op, k, v, ok, ref[k])
			}
		}
		if rebuilds == 0 || (dups > 0) != tc.copies || tab.dups != tc.copies {
			t.Errorf("keyspace %d: %d rebuilds and %d inserts of a second copy in 200,000 operations (table marked %v), want copies %v",
				keyspace, rebuilds, dups, tab.dups, tc.copies)
		}
	}
}

// collide is TestBlockTableDifferential's keyspace of keys with equal tags.
const collide = 1

// unspread inverts tag's spreading (before it keeps 32 bits): tag(unspread(m))
// == m & 0xffffffff.
func unspread(m uint64) uint64 {
	const c = 0xff51afd7ed558ccd
	inv := uint64(c) // Newton's iteration for c's inverse mod 2^64
	for range 6 {
		inv *= 2 - c*inv
	}
	m ^= m >> 33
	m *= inv
	return m ^ m>>33
}

func TestUnspread(t *testing.T) {
	for _, m := range []uint64{0, 1, 5<<32 | 7, 1<<63 | 12345} {
		if got := tag(unspread(m)); got != m&0xffffffff {
			t.Errorf("tag(unspread(%#x)): got %#x, want %#x", m, got, m&0xffffffff)
		}
	}
}

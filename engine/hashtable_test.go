package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBlockTableDifferential checks the open-addressing table against a Go
// map under random inserts and drops (which leave stale slots, and rebuild
// the table when they fill it), with clustered and zero keys, and
// keyspaces whose keys share tags (the low 32 bits of the spread key) with
// others only by chance (a tag match is checked against the block's key),
// and blocks that cache the key they held before.
func TestBlockTableDifferential(t *testing.T) {
	for _, keyspace := range []uint64{8, 100, 1 << 62, collide} {
		rng := rand.New(rand.NewPCG(keyspace, 3))
		const max = 300
		blocks := make([]kvBlock, max)
		var free []int32 // ids holding no entry
		for id := range int32(max) {
			free = append(free, id)
		}
		tab := newBlockTable(max, blocks)
		ref := map[uint64]int32{}
		rebuilds := 0
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
			case rng.IntN(3) > 0 && len(ref) < max:
				_, had := ref[k]
				id := free[rng.IntN(len(free))]
				if old := blocks[id].hash; rng.IntN(4) == 0 && !blocks[id].hashed {
					if _, taken := ref[old]; !taken {
						k, had = old, false // the key it last held: its stale slot matches the tag
					}
				}
				used := tab.used
				added := tab.insert(k, id)
				if added && tab.used < used {
					rebuilds++
				}
				if added == had {
					t.Fatalf("op %d: insert(%d) added=%v, reference had=%v", op, k, added, had)
				}
				if added {
					ref[k] = id
					free = slices.DeleteFunc(free, func(f int32) bool { return f == id })
					if b := blocks[id]; !b.hashed || b.hash != k {
						t.Fatalf("op %d: insert(%d, %d) left the block %+v, want it holding the key", op, k, id, b)
					}
				}
			default:
				if len(ref) > 0 && rng.IntN(2) == 0 { // a key held (a wide keyspace's random key never is)
					for rk := range ref {
						k = rk
						break
					}
				}
				if id, ok := ref[k]; ok {
					tab.drop(id)
					free = append(free, id)
					if blocks[id].hashed {
						t.Fatalf("op %d: drop(%d) left block %d hashed", op, id, id)
					}
				}
				delete(ref, k)
			}
			if tab.used > tab.maxUsed {
				t.Fatalf("op %d: %d slots used, more than %d", op, tab.used, tab.maxUsed)
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
				stale := tab.each(func(k uint64, v int32) {
					n++
					if ref[k] != v {
						t.Fatalf("op %d: table has %d -> %d, reference %d", op, k, v, ref[k])
					}
				})
				if n != len(ref) {
					t.Fatalf("op %d: each visited %d, want %d", op, n, len(ref))
				}
				if n+stale != tab.used {
					t.Fatalf("op %d: %d live and %d stale slots, used says %d", op, n, stale, tab.used)
				}
			}
			if _, ok := tab.get(k); ok != (func() bool { _, ok := ref[k]; return ok })() {
				t.Fatalf("op %d: get(%d) presence %v disagrees with the reference", op, k, ok)
			}
		}
		if rebuilds == 0 {
			t.Errorf("keyspace %d: no rebuild in 200,000 operations", keyspace)
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

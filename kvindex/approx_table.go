package kvindex

import (
	"math/bits"
	"sync/atomic"
)

// atable is Approx's block table: block key -> 64-bit mask of the
// endpoints of one group holding it. Like maskTable (table.go) it is
// sharded open addressing with linear probing whose slots are read and
// written with atomic operations, so Match reads it without a lock; unlike
// maskTable it has a single writer (the caller holds Approx.mu), so writes
// take no shard lock, and it takes its updates in batches (applyBatch) so
// that the cache misses of a whole prompt overlap instead of queueing one
// after the other.
//
// Reader consistency:
//
//   - a mask change is one atomic store, seen by a reader before or after;
//   - a new key goes into an empty slot mask first, key second, so a reader
//     that sees the key sees its mask;
//   - a key whose mask drops to 0 stays as a tombstone: it keeps probe runs
//     intact and is reused, by the same key or by a new key whose probe run
//     passes it. Reuse stores the new key first (the mask is 0) and the
//     mask second; a reader loads key, mask, key again and ignores the slot
//     when the key changed in between, so it never pairs a key with another
//     key's mask (short of the slot going K -> K2 -> K while the reader
//     sleeps between two loads, which at worst shows one stale mask to one
//     Match);
//   - rebuilds build a new array off to the side and publish it with one
//     atomic pointer store; readers holding the old array see a consistent,
//     merely older, state.
//
// Keys must not be 0 (the empty slot).
type atable struct {
	shards []ashard
	shift  uint // 64 - log2(len(shards))
}

type ashard struct {
	tab  atomic.Pointer[[]aslot]
	used int      // slots with a key (live + tombstones); writer only
	live int      // slots with a non-zero mask; writer only
	_    [40]byte // keep shards on separate cache lines
}

type aslot struct {
	key, mask atomic.Uint64
}

const (
	aminSlots   = 16
	amaxLoad    = 0.75 // used/len above which a shard is rebuilt
	atargetLoad = 0.5  // live/len right after a rebuild
)

func newATable(shards int) *atable {
	if shards <= 0 || shards&(shards-1) != 0 {
		shards = 64
	}
	t := &atable{shards: make([]ashard, shards), shift: uint(64 - bits.TrailingZeros(uint(shards)))}
	for i := range t.shards {
		s := make([]aslot, aminSlots)
		t.shards[i].tab.Store(&s)
	}
	return t
}

// locate returns key's shard and the array and first slot to probe.
func (t *atable) locate(key uint64) (*ashard, []aslot, int) {
	m := mix(key)
	sh := &t.shards[m>>t.shift] // m>>64 is 0 with a single shard
	arr := *sh.tab.Load()
	hi, _ := bits.Mul64(m<<(64-t.shift), uint64(len(arr)))
	return sh, arr, int(hi)
}

// home returns the first slot for key in an array of n slots of its shard.
func (t *atable) home(key uint64, n int) int {
	hi, _ := bits.Mul64(mix(key)<<(64-t.shift), uint64(n))
	return int(hi)
}

// get returns key's mask (0 when absent). It never blocks.
func (t *atable) get(key uint64) uint64 {
	_, arr, i := t.locate(key)
	n := len(arr)
	for {
		s := &arr[i]
		k := s.key.Load()
		if k == key {
			mask := s.mask.Load()
			if s.key.Load() == key {
				return mask
			}
			// The slot was reused for another key meanwhile: key is
			// absent there; look on.
		} else if k == 0 {
			return 0
		}
		if i++; i == n {
			i = 0
		}
	}
}

// touch loads the first slot of each key's probe run, so that the misses
// of a batch are in flight together; it returns a value the caller must
// keep so the loads are not dropped.
func (t *atable) touch(keys []uint64) uint64 {
	var sink uint64
	for _, k := range keys {
		_, arr, i := t.locate(k)
		sink += arr[i].key.Load()
	}
	return sink
}

// applyBatch ORs bit into the mask of every key of set, then clears it
// from every key of clear. Writer only.
func (t *atable) applyBatch(set, clear []uint64, bit uint64) uint64 {
	sink := t.touch(set) + t.touch(clear)
	for _, k := range set {
		t.update(k, bit, 0)
	}
	for _, k := range clear {
		t.update(k, 0, bit)
	}
	return sink
}

// update sets key's mask to (mask &^ clear) | set. Writer only.
func (t *atable) update(key, set, clear uint64) {
	sh, arr, i := t.locate(key)
	n := len(arr)
	reuse := -1
	for {
		s := &arr[i]
		k := s.key.Load()
		if k == key {
			old := s.mask.Load()
			if nw := (old &^ clear) | set; nw != old {
				s.mask.Store(nw)
				switch {
				case old == 0:
					sh.live++
				case nw == 0:
					sh.live--
					t.sweep(sh, arr, i)
				}
			}
			return
		}
		if k == 0 {
			break
		}
		if reuse < 0 && s.mask.Load() == 0 {
			reuse = i
		}
		if i++; i == n {
			i = 0
		}
	}
	if set == 0 {
		return
	}
	sh.live++
	if reuse >= 0 {
		s := &arr[reuse]
		s.key.Store(key) // mask is 0: a reader of the old key sees 0 or notices the change
		s.mask.Store(set)
		return
	}
	if float64(sh.used+1) > amaxLoad*float64(n) {
		arr = t.rebuild(sh)
		n = len(arr)
		i = t.home(key, n)
		for arr[i].key.Load() != 0 {
			if i++; i == n {
				i = 0
			}
		}
	}
	arr[i].mask.Store(set)
	arr[i].key.Store(key)
	sh.used++
}

// sweep empties the tombstone at i, and the tombstones before it, when the
// slot after it is empty: no probe run goes past an empty slot, so none
// needs them. A reader that loaded such a key before it left sees mask 0
// or notices the key change. Writer only.
func (t *atable) sweep(sh *ashard, arr []aslot, i int) {
	n := len(arr)
	next := i + 1
	if next == n {
		next = 0
	}
	if arr[next].key.Load() != 0 {
		return
	}
	for arr[i].key.Load() != 0 && arr[i].mask.Load() == 0 {
		arr[i].key.Store(0)
		sh.used--
		if i--; i < 0 {
			i = n - 1
		}
	}
}

// rebuild publishes and returns a new array for sh holding its live keys,
// sized for atargetLoad. Writer only.
var rebuildCount int

func (t *atable) rebuild(sh *ashard) []aslot {
	rebuildCount++
	old := *sh.tab.Load()
	n := max(int(float64(sh.live+1)/atargetLoad)+1, aminSlots)
	arr := make([]aslot, n)
	for j := range old {
		k := old[j].key.Load()
		mask := old[j].mask.Load()
		if k == 0 || mask == 0 {
			continue
		}
		i := t.home(k, n)
		for arr[i].key.Load() != 0 {
			if i++; i == n {
				i = 0
			}
		}
		arr[i].mask.Store(mask)
		arr[i].key.Store(k)
	}
	sh.used = sh.live
	sh.tab.Store(&arr)
	return arr
}

// slots returns the number of slots allocated (for memory accounting).
func (t *atable) slots() int {
	n := 0
	for s := range t.shards {
		n += len(*t.shards[s].tab.Load())
	}
	return n
}

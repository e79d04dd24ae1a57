package kvindex

import (
	"math/bits"
	"sync/atomic"
)

// atable is Approx's block table for concurrent use (a Serialized Approx
// uses btable): block key -> 64-bit mask of the endpoints of one group
// holding it. Like maskTable (table.go) it is
// sharded open addressing with linear probing that readers (get) use
// without a lock and without ever waiting; unlike maskTable it has a single
// writer (the caller holds Approx.mu), so writes take no shard lock and
// plain stores serve where no reader can look, and its writer loads a
// whole prompt's lines first (touch) or takes updates in batches
// (applyBatch), so that the cache misses of a prompt overlap instead of
// queueing one after the other. Atomic stores are most of what
// a write costs (each drains the store buffer): a mask change makes one, a
// new key one or two.
//
// What a reader sees while the writer works:
//
//   - a mask change is one atomic store, seen by a reader before or after;
//   - a key goes into a slot that never held one since its array was
//     published mask first, with a plain store no reader can race with
//     (a reader loads a mask only after it saw the slot's key), then key;
//   - a key whose mask drops to 0 stays as a tombstone, so probe runs stay
//     intact; the same key revives it, and a new key whose probe run passes
//     it takes it over key first (the mask is still 0), mask second. A
//     reader loads key, mask, key again and looks on when the key changed,
//     so it never pairs a key with another key's mask (short of the slot
//     going K -> K2 -> K while the reader sleeps between two loads, which
//     at worst shows one Match a stale mask for one block);
//   - rebuilds (growth, or too many tombstones) fill a new array with plain
//     stores and publish it with one atomic pointer store; readers holding
//     the old array see a consistent, merely older, state.
//
// Published slots are read and written with the sync/atomic functions by
// everyone but the writer's own loads. Keys must not be 0 (the empty slot).
type atable struct {
	shards []ashard
	shift  uint // 64 - log2(len(shards))
}

type ashard struct {
	tab  atomic.Pointer[[]aslot]
	used int // slots with a key (live + tombstones); writer only
	live int // slots with a non-zero mask; writer only
	// cur is *tab as the writer last stored it: the writer reads it here,
	// in the shard's own cache line, instead of through the published
	// pointer.
	cur []aslot
	_   [16]byte // keep shards on separate cache lines
}

type aslot struct {
	key, mask uint64
}

const (
	aminSlots   = 16
	amaxLoad    = 0.75 // used/len above which a shard is rebuilt
	atargetLoad = 0.35 // live/len right after a rebuild
)

func newATable(shards int) *atable {
	if shards <= 0 || shards&(shards-1) != 0 {
		shards = 64
	}
	t := &atable{shards: make([]ashard, shards), shift: uint(64 - bits.TrailingZeros(uint(shards)))}
	for i := range t.shards {
		s := make([]aslot, aminSlots)
		t.shards[i].tab.Store(&s)
		t.shards[i].cur = s
	}
	return t
}

// locate returns key's shard and the array and first slot to probe, for
// the writer.
func (t *atable) locate(key uint64) (*ashard, []aslot, int) {
	m := mix(key)
	sh := &t.shards[m>>t.shift] // m>>64 is 0 with a single shard
	arr := sh.cur
	hi, _ := bits.Mul64(m<<(64-t.shift), uint64(len(arr)))
	return sh, arr, int(hi)
}

// locateR is locate for readers: the published array.
func (t *atable) locateR(key uint64) ([]aslot, int) {
	m := mix(key)
	sh := &t.shards[m>>t.shift]
	arr := *sh.tab.Load()
	hi, _ := bits.Mul64(m<<(64-t.shift), uint64(len(arr)))
	return arr, int(hi)
}

// home returns the first slot for key in an array of n slots of its shard.
func (t *atable) home(key uint64, n int) int {
	hi, _ := bits.Mul64(mix(key)<<(64-t.shift), uint64(n))
	return int(hi)
}

// get returns key's mask (0 when absent). It never blocks.
func (t *atable) get(key uint64) uint64 {
	arr, i := t.locateR(key)
	n := len(arr)
	for {
		k := atomic.LoadUint64(&arr[i].key)
		if k == key {
			mask := atomic.LoadUint64(&arr[i].mask)
			if atomic.LoadUint64(&arr[i].key) == key {
				return mask
			}
			// The writer gave the slot to another key meanwhile: look on.
		} else if k == 0 {
			return 0
		}
		if i++; i == n {
			i = 0
		}
	}
}

// touch loads the first two cache lines of each key's probe run, so that
// the misses of a batch are in flight together; it returns a value the
// caller must keep so the loads are not dropped. Writer only.
func (t *atable) touch(keys []uint64) uint64 {
	var sink uint64
	for _, k := range keys {
		_, arr, i := t.locate(k)
		// A probe run often crosses into the next cache line (4 slots).
		sink += arr[i].key + arr[min(i+4, len(arr)-1)].key
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

// update sets key's mask to (mask &^ clear) | set and returns the mask
// before (0 when key was absent). Writer only: it reads slots with plain
// loads, as nothing else writes them.
func (t *atable) update(key, set, clear uint64) (old uint64) {
	sh, arr, i := t.locate(key)
	n := len(arr)
	reuse := -1
	for {
		s := &arr[i]
		if s.key == key {
			old = s.mask
			if nw := (old &^ clear) | set; nw != old {
				atomic.StoreUint64(&s.mask, nw)
				switch {
				case old == 0:
					sh.live++
				case nw == 0:
					sh.live--
				}
			}
			return old
		}
		if s.key == 0 {
			break
		}
		if reuse < 0 && s.mask == 0 {
			reuse = i
		}
		if i++; i == n {
			i = 0
		}
	}
	if set == 0 {
		return 0
	}
	sh.live++
	if reuse >= 0 {
		// Key first (the mask is 0), mask second: a reader that loaded
		// the old key sees mask 0 or, loading the key again, the change.
		s := &arr[reuse]
		atomic.StoreUint64(&s.key, key)
		atomic.StoreUint64(&s.mask, set)
		return 0
	}
	if float64(sh.used+1) > amaxLoad*float64(n) {
		arr = t.rebuild(sh)
		n = len(arr)
		i = t.home(key, n)
		for arr[i].key != 0 {
			if i++; i == n {
				i = 0
			}
		}
	}
	// The slot never held a key in this array (slots are emptied only by
	// a rebuild), so no reader loads its mask before it sees the key
	// stored below: the mask needs no atomic store.
	arr[i].mask = set
	atomic.StoreUint64(&arr[i].key, key)
	sh.used++
	return 0
}

// rebuild publishes and returns a new array for sh holding its live keys,
// sized for atargetLoad (so it grows when there are few tombstones and
// shrinks or stays when there are many). Writer only.
func (t *atable) rebuild(sh *ashard) []aslot {
	old := *sh.tab.Load()
	n := max(int(float64(sh.live+1)/atargetLoad)+1, aminSlots)
	arr := make([]aslot, n) // no reader sees arr before the Store below
	for _, s := range old {
		if s.key == 0 || s.mask == 0 {
			continue
		}
		i := t.home(s.key, n)
		for arr[i].key != 0 {
			if i++; i == n {
				i = 0
			}
		}
		arr[i] = s
	}
	sh.used = sh.live
	p := new([]aslot)
	*p = arr
	sh.tab.Store(p)
	sh.cur = arr
	return arr
}

package kvindex

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// maskTable maps block keys to 64-bit endpoint masks. It is sharded by key;
// each shard is an open-addressing table with linear probing whose slots are
// read and written with atomic operations, so that readers take no lock and
// never wait for a writer:
//
//   - a mask change is one atomic store, seen by a reader before or after;
//   - an insert stores the mask before the key, so a reader that sees the
//     key sees its mask;
//   - a key whose mask drops to 0 stays as a tombstone (it is reused if the
//     key comes back) and nothing ever moves inside a published array;
//   - growth and tombstone compaction build a new array off to the side and
//     publish it with one atomic pointer store; readers still holding the old
//     array see a consistent, merely older, state.
//
// Writers hold the shard's mutex. Keys must not be 0 (the empty slot).
type maskTable struct {
	shards []mshard
	shift  uint // 64 - log2(len(shards))
	live   atomic.Int64
}

type mshard struct {
	mu   sync.Mutex // serialises writers of this shard; guards used and live
	tab  atomic.Pointer[[]mslot]
	used int      // slots with a key (live + tombstones)
	live int      // slots with a non-zero mask
	_    [32]byte // keep shards on separate cache lines
}

type mslot struct {
	key, mask atomic.Uint64
}

const (
	minSlots   = 16
	maxLoad    = 0.8  // used/len above which a shard is rebuilt
	targetLoad = 0.55 // live/len right after a rebuild
)

func newMaskTable(shards int) *maskTable {
	if shards <= 0 || shards&(shards-1) != 0 {
		shards = 256
	}
	t := &maskTable{shards: make([]mshard, shards), shift: uint(64 - bits.TrailingZeros(uint(shards)))}
	for i := range t.shards {
		s := make([]mslot, minSlots)
		t.shards[i].tab.Store(&s)
	}
	return t
}

// mix scrambles a key so that shard and slot come from independent bits.
func mix(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 }

func (t *maskTable) shard(m uint64) *mshard {
	return &t.shards[m>>t.shift] // m>>64 is 0 with a single shard
}

// home returns the first slot to probe for mixed key m in an array of n.
func (t *maskTable) home(m uint64, n int) int {
	// The shard took the top bits; the slot comes from the ones below.
	hi, _ := bits.Mul64(m<<(64-t.shift), uint64(n))
	return int(hi)
}

// get returns key's mask (0 when absent). It never blocks.
func (t *maskTable) get(key uint64) uint64 {
	m := mix(key)
	arr := *t.shard(m).tab.Load()
	n := len(arr)
	for i := t.home(m, n); ; {
		k := arr[i].key.Load()
		if k == key {
			return arr[i].mask.Load()
		}
		if k == 0 {
			return 0
		}
		if i++; i == n {
			i = 0
		}
	}
}

// update sets key's mask to (mask &^ clear) | set and returns the old and
// new masks.
func (t *maskTable) update(key, set, clear uint64) (old, nw uint64) {
	m := mix(key)
	sh := t.shard(m)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	arr := *sh.tab.Load()
	n := len(arr)
	i := t.home(m, n)
	for {
		k := arr[i].key.Load()
		if k == key {
			old = arr[i].mask.Load()
			nw = (old &^ clear) | set
			if nw != old {
				arr[i].mask.Store(nw)
				t.account(sh, old, nw)
			}
			return old, nw
		}
		if k == 0 {
			break
		}
		if i++; i == n {
			i = 0
		}
	}
	if set == 0 {
		return 0, 0
	}
	if float64(sh.used+1) > maxLoad*float64(n) {
		t.rebuild(sh)
		arr = *sh.tab.Load()
		n = len(arr)
		i = t.home(m, n)
		for arr[i].key.Load() != 0 {
			if i++; i == n {
				i = 0
			}
		}
	}
	arr[i].mask.Store(set)
	arr[i].key.Store(key)
	sh.used++
	t.account(sh, 0, set)
	return 0, set
}

func (t *maskTable) account(sh *mshard, old, nw uint64) {
	switch {
	case old == 0 && nw != 0:
		sh.live++
		t.live.Add(1)
	case old != 0 && nw == 0:
		sh.live--
		t.live.Add(-1)
	}
}

// rebuild publishes a new array for sh holding its live keys, sized for
// targetLoad (so it grows when there are few tombstones and shrinks or
// stays when there are many). Called with sh.mu held.
func (t *maskTable) rebuild(sh *mshard) {
	old := *sh.tab.Load()
	n := int(float64(sh.live+1)/targetLoad) + 1
	n = max(n, minSlots)
	arr := make([]mslot, n)
	for j := range old {
		k := old[j].key.Load()
		if k == 0 {
			continue
		}
		mask := old[j].mask.Load()
		if mask == 0 {
			continue
		}
		mk := mix(k)
		i := t.home(mk, n)
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
}

// clearBits clears bitsToClear from every key (endpoint purge). Shards are
// visited one at a time.
func (t *maskTable) clearBits(bitsToClear uint64) {
	for s := range t.shards {
		sh := &t.shards[s]
		sh.mu.Lock()
		arr := *sh.tab.Load()
		for j := range arr {
			if arr[j].key.Load() == 0 {
				continue
			}
			old := arr[j].mask.Load()
			if nw := old &^ bitsToClear; nw != old {
				arr[j].mask.Store(nw)
				t.account(sh, old, nw)
			}
		}
		sh.mu.Unlock()
	}
}

// slots returns the number of slots allocated (for memory accounting).
func (t *maskTable) slots() int {
	n := 0
	for s := range t.shards {
		n += len(*t.shards[s].tab.Load())
	}
	return n
}

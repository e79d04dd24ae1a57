package kvindex

import "math/bits"

// btable is the block table of a Serialized Approx (atable is the one for
// concurrent use): block key -> 64-bit mask of the endpoints of one group
// holding it. Nothing reads it while it is written (the caller serialises
// every call), so it needs no atomics and no tombstones, and it is laid
// out for the router's churn, where each Record inserts and evicts a few
// hundred blocks at random places in a table of tens of thousands: every
// lookup should be one cache line and branches a predictor can guess.
//
// Slots are grouped in buckets of four, one 64-byte cache line each (keys,
// then masks). A key lives in its home bucket or, when that was full at
// its insertion, in the first later bucket (cyclically) with room. over[b]
// counts the keys that live past bucket b although their probe started at
// or before it (their insertion found b full): a lookup that does not find
// its key in bucket b stops there when over[b] is 0. Under the table's
// load most lookups read the home bucket, compare its four keys without
// branching, and read over[b] (a small array that stays in cache) only
// when the key is absent. A key whose mask drops to 0 leaves at once and
// the counts along its run go down, so nothing piles up under churn and
// the array is rehashed only to grow or shrink (or, should runs ever grow
// long, to shorten them).
//
// Keys must not be 0 (the empty slot). Not safe for concurrent use.
type btable struct {
	b     []bbucket
	over  []uint32
	mask  uint64 // len(b) - 1
	shift uint   // 64 - log2(len(b))
	n     int    // keys
	runs  int    // sum of over: the buckets passed by live keys' probes
	// runs0 is runs right after the last rehash: runs that long are the
	// keys' own (keys sharing a home bucket), and a rehash would not
	// shorten them.
	runs0 int
}

type bbucket struct {
	keys  [4]uint64
	masks [4]uint64
}

const (
	bminBuckets = 16
	bmaxLoad    = 0.5   // keys per slot above which the array doubles
	bminLoad    = 0.125 // keys per slot below which it halves
)

func newBTable() *btable {
	t := &btable{}
	t.alloc(bminBuckets)
	return t
}

func (t *btable) alloc(buckets int) {
	t.b = make([]bbucket, buckets)
	t.over = make([]uint32, buckets)
	t.mask = uint64(buckets - 1)
	t.shift = uint(64 - bits.TrailingZeros(uint(buckets)))
	t.n, t.runs, t.runs0 = 0, 0, 0
}

// home returns key's home bucket.
func (t *btable) home(key uint64) uint64 { return mix(key) >> t.shift }

// slotOf returns the slot of bucket bk holding key, or -1. The compiler
// turns the comparisons into conditional moves: one branch, on the result.
func slotOf(bk *bbucket, key uint64) int {
	j := -1
	if bk.keys[3] == key {
		j = 3
	}
	if bk.keys[2] == key {
		j = 2
	}
	if bk.keys[1] == key {
		j = 1
	}
	if bk.keys[0] == key {
		j = 0
	}
	return j
}

// find returns the bucket and slot holding key, slot -1 when key is absent.
func (t *btable) find(key uint64) (bi uint64, j int) {
	bi = t.home(key)
	for range len(t.b) {
		bk := &t.b[bi]
		if j = slotOf(bk, key); j >= 0 || t.over[bi] == 0 {
			return bi, j
		}
		bi = (bi + 1) & t.mask
	}
	return bi, -1
}

// touch loads the home bucket of each key, so that the misses of a batch
// overlap; it returns a value the caller must keep so the loads are not
// dropped.
func (t *btable) touch(keys []uint64) uint64 {
	var sink uint64
	for _, k := range keys {
		sink += t.b[t.home(k)].keys[0]
	}
	return sink
}

// get returns key's mask (0 when absent).
func (t *btable) get(key uint64) uint64 {
	bi, j := t.find(key)
	if j < 0 {
		return 0
	}
	return t.b[bi].masks[j]
}

// set ORs bit into key's mask and returns the mask before.
func (t *btable) set(key, bit uint64) uint64 { return t.update(key, bit, 0) }

// update sets key's mask to (mask &^ clear) | set and returns the mask
// before (0 when key was absent); a key whose mask becomes 0 is removed.
func (t *btable) update(key, set, clear uint64) (old uint64) {
	bi, j := t.find(key)
	if j >= 0 {
		bk := &t.b[bi]
		old = bk.masks[j]
		nw := old&^clear | set
		if nw != 0 {
			bk.masks[j] = nw
			return old
		}
		bk.keys[j], bk.masks[j] = 0, 0
		t.n--
		for x := t.home(key); x != bi; x = (x + 1) & t.mask {
			t.over[x]--
			t.runs--
		}
		if float64(t.n) < bminLoad*4*float64(len(t.b)) && len(t.b) > bminBuckets {
			t.rehash(len(t.b) / 2)
		}
		return old
	}
	if set == 0 {
		return 0
	}
	if float64(t.n+1) > bmaxLoad*4*float64(len(t.b)) {
		t.rehash(2 * len(t.b))
	} else if t.runs-t.runs0 > len(t.b) {
		t.rehash(len(t.b)) // runs grew long: lay the keys out afresh
	}
	t.insert(key, set)
	return 0
}

// insert puts key, absent, with mask m in the first bucket from its home
// with a free slot, counting the buckets it passes.
func (t *btable) insert(key, m uint64) {
	bi := t.home(key)
	for {
		bk := &t.b[bi]
		j := slotOf(bk, 0)
		if j >= 0 {
			bk.keys[j], bk.masks[j] = key, m
			t.n++
			return
		}
		t.over[bi]++
		t.runs++
		bi = (bi + 1) & t.mask
	}
}

// rehash moves every key into a new array of the given number of buckets.
func (t *btable) rehash(buckets int) {
	old := t.b
	t.alloc(max(buckets, bminBuckets))
	for i := range old {
		bk := &old[i]
		for j, k := range bk.keys {
			if k != 0 {
				t.insert(k, bk.masks[j])
			}
		}
	}
	t.runs0 = t.runs
}

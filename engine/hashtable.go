package engine

// blockTable maps block hashes to block ids: an open-addressing table with
// linear probing, 8 bytes a slot. It never holds more live entries than
// the cache has blocks, so it is sized once (live load factor <= 1/2) and
// never grows.
//
// A slot holds the low 32 bits of the spread key (the tag; its low bits are
// the entry's home slot) and the block id plus one (so a used slot is never
// 0, the empty mark). The full key lives in the block itself
// (blocks[id].hash, with hashed set), which a lookup that matches the tag
// checks: the table is half the size of one that stores keys, so a busy
// fleet's inserts (one a block filled, at a random slot) miss the cache and
// the TLB less, and a hit reads the block the caller touches next anyway.
//
// Evicting a block does not touch the table (drop): the block stops being
// hashed, and its slot, stale, fails that check until the table is rebuilt
// from the blocks, when live and stale slots fill maxUsed of it. In a busy
// engine every allocation evicts, and a removal's random slot missed the
// cache and the TLB (perf on the fleet soak with full caches: 15% of the
// engine loop); a rebuild is a pass over the blocks, every few thousand
// allocations.
type blockTable struct {
	slots   []uint64
	mask    uint64
	n       int // live entries
	used    int // live and stale slots
	maxUsed int
	blocks  []kvBlock // the pool's blocks: blocks[id].hash is the key of id's entry
}

// newBlockTable returns a table for at most maxEntries entries whose ids
// index blocks.
func newBlockTable(maxEntries int, blocks []kvBlock) *blockTable {
	size := 16
	for size < 2*maxEntries {
		size <<= 1
	}
	return &blockTable{slots: make([]uint64, size), mask: uint64(size - 1), maxUsed: size * 5 / 8, blocks: blocks}
}

// tag spreads the key's bits (caller-given keys with structure, sequential
// ids in tests and simulations, still spread over the table) and keeps 32.
func tag(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k & 0xffffffff
}

// find returns the slot of k's entry and its id, or the empty slot that
// ends k's probe run and -1. A stale slot (its block dropped, or caching
// another key) fails the block check like any other tag match.
func (t *blockTable) find(k uint64) (uint64, int32) {
	tg := tag(k)
	for i := tg & t.mask; ; i = (i + 1) & t.mask {
		sl := t.slots[i]
		if sl == 0 {
			return i, -1
		}
		if sl>>32 == tg {
			id := int32(uint32(sl) - 1)
			if b := &t.blocks[id]; b.hashed && b.hash == k {
				return i, id
			}
		}
	}
}

func (t *blockTable) get(k uint64) (int32, bool) {
	_, id := t.find(k)
	return id, id >= 0
}

// insert adds k -> id unless k is present, marking block id as holding k;
// it reports whether it added. Block id must hold no entry (it may have
// stale slots).
func (t *blockTable) insert(k uint64, id int32) bool {
	i, old := t.find(k)
	if old >= 0 {
		return false
	}
	t.slots[i] = tag(k)<<32 | uint64(uint32(id)+1)
	b := &t.blocks[id]
	b.hash, b.hashed = k, true
	t.n++
	if t.used++; t.used > t.maxUsed {
		t.rebuild()
	}
	return true
}

// drop deletes block id's entry (id holds one), leaving its slot stale.
func (t *blockTable) drop(id int32) {
	t.blocks[id].hashed = false
	t.n--
}

// rebuild empties the table and inserts the live entries again, dropping
// the stale slots.
func (t *blockTable) rebuild() {
	clear(t.slots)
	t.used = 0
	for id := range t.blocks {
		b := &t.blocks[id]
		if !b.hashed {
			continue
		}
		tg := tag(b.hash)
		i := tg & t.mask
		for t.slots[i] != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = tg<<32 | uint64(uint32(id)+1)
		t.used++
	}
}

func (t *blockTable) len() int { return t.n }

// clear removes every entry (the blocks' hashed marks are the caller's).
func (t *blockTable) clear() {
	clear(t.slots)
	t.n, t.used = 0, 0
}

// each calls fn for every live entry, at the slot find returns for it, and
// reports the number of stale slots (tests).
func (t *blockTable) each(fn func(k uint64, id int32)) (stale int) {
	for i, sl := range t.slots {
		if sl == 0 {
			continue
		}
		id := int32(uint32(sl) - 1)
		b := &t.blocks[id]
		if !b.hashed {
			stale++
			continue
		}
		if j, got := t.find(b.hash); j != uint64(i) || got != id {
			stale++ // an older slot of the same block and key, or another key's tag
			continue
		}
		fn(b.hash, id)
	}
	return stale
}

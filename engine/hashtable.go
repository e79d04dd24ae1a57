package engine

// blockTable maps block hashes to block ids: an open-addressing table with
// linear probing and backward-shift deletion, 8 bytes a slot. It never holds
// more entries than the cache has blocks, so it is sized once (load factor
// <= 1/2) and never grows.
//
// A slot holds the low 32 bits of the spread key (the tag; its low bits are
// the entry's home slot) and the block id plus one (so a used slot is never
// 0, the empty mark). The full key lives in the block itself
// (blocks[id].hash, with hashed set), which a lookup that matches the tag
// checks: the table is half the size of one that stores keys, so a busy
// fleet's inserts (one a block filled, at a random slot) miss the cache and
// the TLB less, and a hit reads the block the caller touches next anyway.
type blockTable struct {
	slots  []uint64
	mask   uint64
	n      int
	blocks []kvBlock // the pool's blocks: blocks[id].hash is the key of id's entry
}

// newBlockTable returns a table for at most maxEntries entries whose ids
// index blocks.
func newBlockTable(maxEntries int, blocks []kvBlock) *blockTable {
	size := 16
	for size < 2*maxEntries {
		size <<= 1
	}
	return &blockTable{slots: make([]uint64, size), mask: uint64(size - 1), blocks: blocks}
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
// ends k's probe run and -1.
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
// it reports whether it added. Block id must hold no entry.
func (t *blockTable) insert(k uint64, id int32) bool {
	i, old := t.find(k)
	if old >= 0 {
		return false
	}
	t.slots[i] = tag(k)<<32 | uint64(uint32(id)+1)
	b := &t.blocks[id]
	b.hash, b.hashed = k, true
	t.n++
	return true
}

// remove deletes k (and clears its block's hashed mark), shifting later
// entries of its probe run back so that no tombstones are needed.
func (t *blockTable) remove(k uint64) {
	i, id := t.find(k)
	if id < 0 {
		return
	}
	t.blocks[id].hashed = false
	t.n--
	for {
		t.slots[i] = 0
		j := i
		for {
			j = (j + 1) & t.mask
			sj := t.slots[j]
			if sj == 0 {
				return
			}
			// Move sj back to i unless its home slot lies cyclically in (i, j].
			h := sj >> 32 & t.mask
			if (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
				t.slots[i] = sj
				i = j
				break
			}
		}
	}
}

func (t *blockTable) len() int { return t.n }

// clear removes every entry (the blocks' hashed marks are the caller's).
func (t *blockTable) clear() {
	clear(t.slots)
	t.n = 0
}

// each calls fn for every entry (tests).
func (t *blockTable) each(fn func(k uint64, id int32)) {
	for _, sl := range t.slots {
		if sl != 0 {
			id := int32(uint32(sl) - 1)
			fn(t.blocks[id].hash, id)
		}
	}
}

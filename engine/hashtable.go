package engine

// blockTable maps block hashes to the blocks caching them: an
// open-addressing table with linear probing, 8 bytes a slot. Like vLLM's
// BlockHashToBlockMap it holds every block cached under a hash, not one:
// two requests that compute the same block (the last block of a prompt
// whose earlier blocks were hits, or equal outputs) each cache their copy.
// A lookup returns the copy cached first of those still cached, as vLLM's
// get_one_block returns the first of its dict's blocks. It never holds
// more live entries than the cache has blocks, so it is sized once (live
// load factor <= 1/2) and never grows.
//
// A slot holds the low 32 bits of the spread key (the tag; its low bits are
// the entry's home slot) and the block id plus one (so a used slot is never
// 0, the empty mark). The full key lives in the block itself
// (blocks[id].hash, with hashed set), which a lookup that matches the tag
// checks: the table is half the size of one that stores keys, so a busy
// fleet's inserts (one a block filled, at a random slot) miss the cache and
// the TLB less, and a hit reads the block the caller touches next anyway.
//
// An insert goes to the empty slot that ends its key's probe run, after
// every copy already there, so probe order is the order copies were
// cached in and a lookup stops at the first live one. On its way it
// retires any older slot naming the same block with the same tag (the
// block held that key, or one with its tag, before it was evicted): such a
// slot would pass the lookup's check for the block's new entry, out of
// order. So a block's live entry is the one slot with its id and its
// hash's tag.
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
	retired uint64    // a slot that names no block's entry: the pool's spare block, never hashed
	// dups is set when the table may hold a key more than once (an
	// insert met a copy, or the last rebuild kept some): rebuild then
	// keeps the copies' order.
	dups    bool
	spare   []uint64 // rebuild's second array of slots, when dups
	dupKeys []uint64 // rebuild's scratch: keys with several copies
	ids     []uint64 // reorder's scratch: a key's entries in probe order
}

// newBlockTable returns a table for at most maxEntries entries whose ids
// index blocks.
func newBlockTable(maxEntries int, blocks []kvBlock) *blockTable {
	size := 16
	for size < 2*maxEntries {
		size <<= 1
	}
	// The last block is the pool's spare, never hashed.
	return &blockTable{slots: make([]uint64, size), mask: uint64(size - 1), maxUsed: size * 5 / 8, blocks: blocks,
		retired: uint64(len(blocks))}
}

// tag spreads the key's bits (caller-given keys with structure, sequential
// ids in tests and simulations, still spread over the table) and keeps 32.
func tag(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k & 0xffffffff
}

// find returns the slot of k's first entry (the copy cached first of
// those still cached) and its id, or the empty slot that ends k's probe
// run and -1. A stale slot (its block dropped, or caching another key)
// fails the block check like any other tag match.
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

// insert adds k -> id after k's other entries, marking block id as
// holding k. Block id must hold no entry (it may have stale slots).
func (t *blockTable) insert(k uint64, id int32) {
	tg := tag(k)
	sl := tg<<32 | uint64(uint32(id)+1)
	slots, mask := t.slots, t.mask
	i := tg & mask
	for {
		x := slots[i]
		if x == 0 {
			break
		}
		if x>>32 == tg {
			if x == sl {
				slots[i] = tg<<32 | t.retired // an older slot of id with this tag
			} else if b := &t.blocks[int32(uint32(x)-1)]; !t.dups && b.hashed && b.hash == k {
				t.dups = true // a copy: the next rebuild keeps their order
			}
		}
		i = (i + 1) & mask
	}
	slots[i] = sl
	b := &t.blocks[id]
	b.hash, b.hashed = k, true
	t.n++
	if t.used++; t.used > t.maxUsed {
		t.rebuild()
	}
}

// drop deletes block id's entry (id holds one), leaving its slot stale.
func (t *blockTable) drop(id int32) {
	t.blocks[id].hashed = false
	t.n--
}

// live reports whether slot value sl is its block's entry.
func (t *blockTable) live(sl uint64) bool {
	b := &t.blocks[int32(uint32(sl)-1)]
	return b.hashed && tag(b.hash) == sl>>32
}

// rebuild empties the table and inserts the live entries again, dropping
// the stale slots: a pass over the blocks, inserting them in id order.
// When the table may hold copies of a key, it builds the new table in a
// second array, then puts each key with several copies back in the old
// table's probe order, and keeps the old array for the next such rebuild.
func (t *blockTable) rebuild() {
	if !t.dups {
		clear(t.slots)
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
		}
		t.used = t.n
		return
	}
	old, slots := t.slots, t.spare
	if len(slots) != len(old) {
		slots = make([]uint64, len(old))
	} else {
		clear(slots)
	}
	dups := t.dupKeys[:0]
	for id := range t.blocks {
		b := &t.blocks[id]
		if !b.hashed {
			continue
		}
		tg := tag(b.hash)
		i := tg & t.mask
		dup := false
		for ; slots[i] != 0; i = (i + 1) & t.mask {
			if sl := slots[i]; sl>>32 == tg && t.blocks[int32(uint32(sl)-1)].hash == b.hash {
				dup = true // every block in the new table is hashed
			}
		}
		slots[i] = tg<<32 | uint64(uint32(id)+1)
		if dup {
			dups = append(dups, b.hash)
		}
	}
	for _, k := range dups {
		t.reorder(old, slots, k)
	}
	t.dups = len(dups) > 0
	t.dupKeys = dups[:0]
	t.slots, t.spare = slots, old
	t.used = t.n
}

// reorder gives k's entries in slots (a rebuilt table) the order they had
// in old, the table it was rebuilt from.
func (t *blockTable) reorder(old, slots []uint64, k uint64) {
	tg := tag(k)
	ids := t.ids[:0]
	for i := tg & t.mask; old[i] != 0; i = (i + 1) & t.mask {
		if sl := old[i]; sl>>32 == tg && t.live(sl) && t.blocks[int32(uint32(sl)-1)].hash == k {
			ids = append(ids, sl)
		}
	}
	n := 0
	for i := tg & t.mask; slots[i] != 0; i = (i + 1) & t.mask {
		if sl := slots[i]; sl>>32 == tg && t.blocks[int32(uint32(sl)-1)].hash == k {
			slots[i] = ids[n]
			n++
		}
	}
	t.ids = ids[:0]
}

func (t *blockTable) len() int { return t.n }

// clear removes every entry (the blocks' hashed marks are the caller's).
func (t *blockTable) clear() {
	clear(t.slots)
	t.n, t.used = 0, 0
	t.dups = false
}

// each calls fn for every live entry, in slot order (a key's copies in
// the order a lookup meets them, unless its probe run wraps around the
// end of the table), and reports the number of stale slots (tests).
func (t *blockTable) each(fn func(k uint64, id int32)) (stale int) {
	for _, sl := range t.slots {
		if sl == 0 {
			continue
		}
		if !t.live(sl) {
			stale++ // dropped, retired, or an older slot of a block that caches another key
			continue
		}
		id := int32(uint32(sl) - 1)
		fn(t.blocks[id].hash, id)
	}
	return stale
}

// copies calls fn for each block caching k, in the order a lookup meets
// them: the order they were cached in (tests).
func (t *blockTable) copies(k uint64, fn func(id int32)) {
	tg := tag(k)
	for i := tg & t.mask; t.slots[i] != 0; i = (i + 1) & t.mask {
		sl := t.slots[i]
		if sl>>32 != tg {
			continue
		}
		if id := int32(uint32(sl) - 1); t.live(sl) && t.blocks[id].hash == k {
			fn(id)
		}
	}
}

package engine

// blockTable maps block hashes to block ids: an open-addressing table with
// linear probing and backward-shift deletion. It never holds more entries
// than the cache has blocks, so it is sized once (load factor <= 1/2) and
// never grows. Keys are block hashes, already uniformly distributed, so the
// low bits index the table directly. The key 0 marks an empty slot; a real
// key 0 is kept aside.
type blockTable struct {
	slots []tslot // key and value side by side: one cache line per probe
	mask  uint64
	n     int
	zero  int32 // block id cached under key 0, or -1
}

func newBlockTable(maxEntries int) *blockTable {
	size := 16
	for size < 2*maxEntries {
		size <<= 1
	}
	return &blockTable{slots: make([]tslot, size), mask: uint64(size - 1), zero: -1}
}

type tslot struct {
	key uint64
	val int32
}

// slot spreads the key's bits so that caller-given keys with structure
// (sequential ids in tests and simulations) still spread over the table.
func (t *blockTable) slot(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k & t.mask
}

func (t *blockTable) get(k uint64) (int32, bool) {
	if k == 0 {
		return t.zero, t.zero >= 0
	}
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.slots[i].key {
		case k:
			return t.slots[i].val, true
		case 0:
			return -1, false
		}
	}
}

// insert adds k -> v unless k is present; it reports whether it added.
func (t *blockTable) insert(k uint64, v int32) bool {
	if k == 0 {
		if t.zero >= 0 {
			return false
		}
		t.zero = v
		t.n++
		return true
	}
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.slots[i].key {
		case k:
			return false
		case 0:
			t.slots[i] = tslot{key: k, val: v}
			t.n++
			return true
		}
	}
}

// remove deletes k, shifting later entries of its probe run back so that no
// tombstones are needed.
func (t *blockTable) remove(k uint64) {
	if k == 0 {
		if t.zero >= 0 {
			t.zero = -1
			t.n--
		}
		return
	}
	i := t.slot(k)
	for {
		switch t.slots[i].key {
		case 0:
			return
		case k:
			goto found
		}
		i = (i + 1) & t.mask
	}
found:
	t.n--
	for {
		t.slots[i].key = 0
		j := i
		for {
			j = (j + 1) & t.mask
			kj := t.slots[j].key
			if kj == 0 {
				return
			}
			// Move kj back to i unless its home slot lies cyclically in (i, j].
			h := t.slot(kj)
			if (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
				t.slots[i] = t.slots[j]
				i = j
				break
			}
		}
	}
}

func (t *blockTable) len() int { return t.n }

func (t *blockTable) clear() {
	clear(t.slots)
	t.n = 0
	t.zero = -1
}

// each calls fn for every entry (tests).
func (t *blockTable) each(fn func(k uint64, v int32)) {
	if t.zero >= 0 {
		fn(0, t.zero)
	}
	for _, sl := range t.slots {
		if sl.key != 0 {
			fn(sl.key, sl.val)
		}
	}
}

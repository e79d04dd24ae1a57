package kvindex

import "math/bits"

// amap maps one endpoint's block keys to their positions in its alog (for
// the blocks recorded again while held: see Approx): open addressing with
// linear probing over a power-of-two array and backward-shift deletion (no
// tombstones), 16 bytes a slot. Unlike emap it has slot (find or insert in
// one probe). Keys must not be 0 (the empty slot). Not safe for concurrent use:
// Approx.mu guards it.
type amap struct {
	slots []eslot
	mask  uint64
	shift uint // 64 - log2(len(slots))
	n     int
}

const (
	amapMinSlots = 16
	amapMaxLoad  = 0.7 // n/len above which the array doubles
)

func (m *amap) home(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> m.shift }

// slot returns k's value slot, inserting k (value 0) when absent; inserted
// reports which. The pointer is valid until the next insertion or del (put
// of a present key keeps it valid).
func (m *amap) slot(k uint64) (v *uint64, inserted bool) {
	if len(m.slots) > 0 {
		for i := m.home(k); ; i = (i + 1) & m.mask {
			s := &m.slots[i]
			if s.k == k {
				return &s.v, false
			}
			if s.k == 0 {
				if float64(m.n+1) > amapMaxLoad*float64(len(m.slots)) {
					break
				}
				s.k, s.v = k, 0
				m.n++
				return &s.v, true
			}
		}
	}
	m.resize(max(2*len(m.slots), amapMinSlots))
	i := m.home(k)
	for m.slots[i].k != 0 {
		i = (i + 1) & m.mask
	}
	s := &m.slots[i]
	s.k, s.v = k, 0
	m.n++
	return &s.v, true
}

// find returns k's value slot, or nil when k is absent. The pointer is
// valid until the next insertion or del.
func (m *amap) find(k uint64) *uint64 {
	if m.n == 0 {
		return nil
	}
	for i := m.home(k); ; i = (i + 1) & m.mask {
		s := &m.slots[i]
		if s.k == k {
			return &s.v
		}
		if s.k == 0 {
			return nil
		}
	}
}

// findSlot returns the index in m.slots of k's slot, or -1 when k is
// absent. The index is valid until the next insertion or del.
func (m *amap) findSlot(k uint64) int {
	if m.n == 0 {
		return -1
	}
	for i := m.home(k); ; i = (i + 1) & m.mask {
		s := &m.slots[i]
		if s.k == k {
			return int(i)
		}
		if s.k == 0 {
			return -1
		}
	}
}

// del removes k, which must be present.
func (m *amap) del(k uint64) {
	i := m.home(k)
	for m.slots[i].k != k {
		if m.slots[i].k == 0 {
			return
		}
		i = (i + 1) & m.mask
	}
	m.n--
	// Backward shift: move later entries of the run into the hole unless
	// their home lies cyclically in (hole, j].
	j := i
	for {
		j = (j + 1) & m.mask
		kj := m.slots[j].k
		if kj == 0 {
			break
		}
		if (j-m.home(kj))&m.mask >= (j-i)&m.mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = eslot{}
	if m.n*8 < len(m.slots) && len(m.slots) > amapMinSlots {
		m.resize(len(m.slots) / 2)
	}
}

// touch loads the home slot of each key (see atable.touch).
func (m *amap) touch(keys []uint64) uint64 {
	if len(m.slots) == 0 {
		return 0
	}
	var sink uint64
	for _, k := range keys {
		i := m.home(nonZero(k))
		// A probe run often crosses into the next cache line (4 slots).
		sink += m.slots[i].k + m.slots[(i+4)&m.mask].k
	}
	return sink
}

func (m *amap) resize(size int) {
	old := m.slots
	m.slots = make([]eslot, size)
	m.mask = uint64(size - 1)
	m.shift = uint(64 - bits.TrailingZeros(uint(size)))
	for _, s := range old {
		if s.k == 0 {
			continue
		}
		i := m.home(s.k)
		for m.slots[i].k != 0 {
			i = (i + 1) & m.mask
		}
		m.slots[i] = s
	}
}

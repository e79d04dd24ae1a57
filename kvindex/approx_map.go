package kvindex

import "math/bits"

// amap maps block keys to values: an endpoint's atree finds its nodes by
// the first key of their runs with it. Open addressing with linear probing
// over a power-of-two array and backward-shift deletion (no tombstones), 16
// bytes a slot. Unlike emap it has slot (find or insert in one probe). Keys
// must not be 0 (the empty slot). Not safe for concurrent use: Approx.mu
// guards it.
type amap struct {
	slots []eslot
	mask  uint64
	shift uint // 64 - log2(len(slots))
	n     int

	// While the map is small (n <= amapFewMax) many lookups are of absent
	// keys (under churn, the first block of every new prompt), and filt
	// answers most of them without a probe: bit b is set when a key of bucket b (the top 8 bits of its
	// hash) may be present. Insertions set bits; deletions leave them
	// (filtDel counts them) until a rebuild. filtOK is false, and filt
	// all ones, while the map is too large for the filter to help: from an
	// insertion past
	// amapFewMax until a deletion brings n down to amapFewMax/2 (so that a
	// map hovering at the limit does not rebuild at every crossing).
	filt    [4]uint64
	filtOK  bool
	filtDel int
}

const (
	amapMinSlots = 16
	amapMaxLoad  = 0.7 // n/len above which the array doubles
	amapFewMax   = 64  // the largest n at which lookups consult filt
)

// bucket returns k's filter bit: the top 8 bits of the hash home takes
// its slot from (find computes it inline).
func bucket(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> 56 }

// dropFilter makes every lookup probe (filt all ones) until a rebuild.
func (m *amap) dropFilter() {
	m.filt = [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}
	m.filtOK = false
}

func (m *amap) rebuildFilter() {
	m.filt = [4]uint64{}
	for _, s := range m.slots {
		if s.k != 0 {
			b := bucket(s.k)
			m.filt[b>>6] |= 1 << (b & 63)
		}
	}
	m.filtOK, m.filtDel = true, 0
}

// added notes an insertion of k in the filter (n counts it already).
func (m *amap) added(k uint64) {
	switch {
	case m.n > amapFewMax:
		if m.filtOK {
			m.dropFilter()
		}
	case m.filtOK:
		b := bucket(k)
		m.filt[b>>6] |= 1 << (b & 63)
	case m.n == 1:
		m.rebuildFilter() // the first key: nothing to scan
	}
}

// removed notes a deletion in the filter (n counts it already).
func (m *amap) removed() {
	switch {
	case m.filtOK:
		if m.filtDel++; m.filtDel > amapFewMax/2 {
			m.rebuildFilter() // drop the deleted keys' bits
		}
	case m.n <= amapFewMax/2:
		m.rebuildFilter()
	}
}

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
				m.added(k)
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
	m.added(k)
	return &s.v, true
}

// find returns k's value slot, or nil when k is absent. The pointer is
// valid until the next insertion or del.
func (m *amap) find(k uint64) *uint64 {
	h := k * 0x9e3779b97f4a7c15 // home and bucket, written out to stay inlinable
	if m.filt[h>>62]&(1<<(h>>56&63)) == 0 {
		return nil // absent (also when the map is empty)
	}
	for i := h >> m.shift; ; i = (i + 1) & m.mask {
		s := &m.slots[i]
		if s.k == k {
			return &s.v
		}
		if s.k == 0 {
			return nil
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
	m.removed()
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

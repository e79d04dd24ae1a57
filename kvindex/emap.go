package kvindex

import "math/bits"

// emap maps an endpoint's engine block hashes to block keys: open addressing
// with linear probing and backward-shift deletion (no tombstones), 16 bytes
// a slot. It is not safe for concurrent use (the endpoint's mutex guards
// it). Engine hash 0 is a legal key, kept aside in zero/hasZero.
type emap struct {
	slots   []eslot
	n       int // entries in slots
	zero    uint64
	hasZero bool
}

type eslot struct{ k, v uint64 }

const emapMaxLoad = 0.8

func (m *emap) home(k uint64) int {
	hi, _ := bits.Mul64(k*0x9e3779b97f4a7c15, uint64(len(m.slots)))
	return int(hi)
}

// Len returns the number of entries.
func (m *emap) Len() int {
	if m.hasZero {
		return m.n + 1
	}
	return m.n
}

func (m *emap) get(k uint64) (uint64, bool) {
	if k == 0 {
		return m.zero, m.hasZero
	}
	if len(m.slots) == 0 {
		return 0, false
	}
	n := len(m.slots)
	for i := m.home(k); ; {
		s := &m.slots[i]
		if s.k == k {
			return s.v, true
		}
		if s.k == 0 {
			return 0, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// put sets k to v and returns the previous value, if any.
func (m *emap) put(k, v uint64) (old uint64, existed bool) {
	if k == 0 {
		old, existed = m.zero, m.hasZero
		m.zero, m.hasZero = v, true
		return old, existed
	}
	if float64(m.n+1) > emapMaxLoad*float64(len(m.slots)) {
		m.resize(max(16, int(float64(m.n+1)/0.55)+1))
	}
	n := len(m.slots)
	for i := m.home(k); ; {
		s := &m.slots[i]
		if s.k == k {
			old = s.v
			s.v = v
			return old, true
		}
		if s.k == 0 {
			s.k, s.v = k, v
			m.n++
			return 0, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// del removes k and returns its value.
func (m *emap) del(k uint64) (uint64, bool) {
	if k == 0 {
		v, ok := m.zero, m.hasZero
		m.zero, m.hasZero = 0, false
		return v, ok
	}
	if len(m.slots) == 0 {
		return 0, false
	}
	n := len(m.slots)
	i := m.home(k)
	for {
		s := &m.slots[i]
		if s.k == k {
			break
		}
		if s.k == 0 {
			return 0, false
		}
		if i++; i == n {
			i = 0
		}
	}
	v := m.slots[i].v
	m.deleteAt(i)
	if m.n > 64 && float64(m.n) < 0.2*float64(len(m.slots)) {
		m.resize(int(float64(m.n)/0.55) + 1)
	}
	return v, true
}

// deleteAt empties slot i and shifts later entries of the probe run back so
// that every entry stays reachable from its home slot.
func (m *emap) deleteAt(i int) {
	n := len(m.slots)
	m.n--
	j := i
	for {
		m.slots[i] = eslot{}
		for {
			if j++; j == n {
				j = 0
			}
			if m.slots[j].k == 0 {
				return
			}
			h := m.home(m.slots[j].k)
			// Move slots[j] into the hole at i unless its home lies
			// cyclically in (i, j].
			if i <= j {
				if i < h && h <= j {
					continue
				}
			} else if i < h || h <= j {
				continue
			}
			break
		}
		m.slots[i] = m.slots[j]
		i = j
	}
}

func (m *emap) resize(size int) {
	old := m.slots
	m.slots = make([]eslot, size)
	m.n = 0
	for _, s := range old {
		if s.k != 0 {
			m.put(s.k, s.v)
		}
	}
}

// evictFrom removes up to want entries starting at slot position start
// (any number, reduced modulo the size), calling fn for each removed
// entry, and returns how many it removed.
func (m *emap) evictFrom(start uint64, want int, fn func(k, v uint64)) int {
	removed := 0
	if want > 0 && m.hasZero {
		fn(0, m.zero)
		m.zero, m.hasZero = 0, false
		removed++
	}
	n := len(m.slots)
	if n == 0 {
		return removed
	}
	i := int(start % uint64(n))
	for scanned := 0; removed < want && m.n > 0 && scanned < 2*n; scanned++ {
		if m.slots[i].k != 0 {
			fn(m.slots[i].k, m.slots[i].v)
			m.deleteAt(i) // may shift another entry into i: look at i again
			removed++
			continue
		}
		if i++; i == n {
			i = 0
		}
	}
	return removed
}

// each calls fn for every entry.
func (m *emap) each(fn func(k, v uint64)) {
	if m.hasZero {
		fn(0, m.zero)
	}
	for _, s := range m.slots {
		if s.k != 0 {
			fn(s.k, s.v)
		}
	}
}

package kvindex

// alog is one endpoint's recency order: a ring of entries in the order they
// were last recorded, least recent at front. Each entry's position is a
// sequence number (it never changes unless compact moves the entry); for
// blocks recorded again while held, the endpoint's amap maps the block key
// to the position of its live entry. Recording such a block again leaves
// a tombstone (key 0) at its old position and appends it at back, so a hit
// writes two places and never the neighbours a linked list would; a block
// recorded again before it had an amap entry leaves its first entry in
// place, stale (see Approx.trim). Eviction pops the front, reading
// the ring in order.
//
// Not safe for concurrent use: Approx.mu guards it.
type alog struct {
	ring  []aentry // len is a power of two; position s lives at s&mask
	mask  uint64
	front uint64 // position of the least recent live entry (== back when empty)
	back  uint64 // next position to append at
	n     int    // live entries
	sink  uint64 // keeps makeRoom's prefetching loads alive
}

type aentry struct {
	key uint64 // 0: tombstone
	t   int64  // Unix nanoseconds of the last Record
}

const alogMinRing = 64

// push appends key at back and returns its position. It may move live
// entries (see makeRoom), updating their positions in idx.
func (l *alog) push(key uint64, t int64, idx *amap) uint64 {
	s := l.back
	if s-l.front == uint64(len(l.ring)) {
		l.makeRoom(idx)
	}
	e := &l.ring[s&l.mask]
	e.key, e.t = key, t
	l.back = s + 1
	return s
}

// refresh sets the time of the last len(hashes) entries to t and reports
// true when they are hashes[len-1], ..., hashes[0], all live: then
// recording hashes at t would leave the same order, and that is all it
// changes. It reads the back of the ring only, which the last Record left
// in cache.
func (l *alog) refresh(hashes []uint64, t int64) bool {
	n := uint64(len(hashes))
	if n > l.back-l.front {
		return false
	}
	for i, h := range hashes {
		if l.ring[(l.back-1-uint64(i))&l.mask].key != nonZero(h) {
			return false
		}
	}
	for i := range n {
		l.ring[(l.back-1-i)&l.mask].t = t
	}
	return true
}

// kill turns the entry at position s into a tombstone.
func (l *alog) kill(s uint64) { l.ring[s&l.mask].key = 0 }

// oldest returns the least recent live entry; l.n must be > 0 and front on
// a live entry (Approx.trim).
func (l *alog) oldest() aentry { return l.ring[l.front&l.mask] }

// pop removes the front entry and returns its key; the front must be on
// a live entry (Approx.trim).
func (l *alog) pop() uint64 {
	k := l.ring[l.front&l.mask].key
	l.ring[l.front&l.mask].key = 0
	l.front++
	l.n--
	return k
}

// makeRoom is called when the ring is full. When at least half of it is
// dead (tombstones, and stale entries: those of indexed blocks other than
// the one idx names) it compacts in place: live entries slide towards
// back, so the most recent ones, which are usually dense already, stay put
// and only the indexed entries that move get their position rewritten in
// idx. Otherwise the ring doubles; positions do not change. Either way
// each call is paid for by at least len/2 earlier pushes.
func (l *alog) makeRoom(idx *amap) {
	size := uint64(len(l.ring))
	if size >= alogMinRing && uint64(l.n)*2 <= size {
		// Entries go in chunks whose map slots are touched first, so
		// that their cache misses overlap. From back to front, a block's
		// live entry comes before its stale ones: once it has moved, the
		// index names its new position and the stale ones are dropped.
		var ents [64]aentry
		var keys, from [64]uint64
		w, r := l.back, l.back
		for r != l.front {
			c := 0
			for c < len(ents) && r != l.front {
				r--
				e := l.ring[r&l.mask]
				if e.key == 0 {
					continue
				}
				ents[c], keys[c], from[c] = e, e.key, r
				c++
			}
			l.sink += idx.touch(keys[:c])
			for j := range c {
				v := idx.find(keys[j])
				if v != nil && *v != from[j] {
					continue // stale
				}
				w--
				l.ring[w&l.mask] = ents[j]
				if v != nil {
					*v = w
				}
			}
		}
		l.front = w
		return
	}
	nsize := max(2*size, alogMinRing)
	ring := make([]aentry, nsize)
	nmask := nsize - 1
	for s := l.front; s != l.back; s++ {
		ring[s&nmask] = l.ring[s&l.mask]
	}
	l.ring, l.mask = ring, nmask
}

// shrink releases a ring much larger than the live entries need (after a
// capacity cut or an expiry), keeping positions.
func (l *alog) shrink() {
	used := l.back - l.front
	size := uint64(len(l.ring))
	if size <= alogMinRing || used*4 > size {
		return
	}
	nsize := uint64(alogMinRing)
	for nsize < 2*used {
		nsize *= 2
	}
	ring := make([]aentry, nsize)
	nmask := nsize - 1
	for s := l.front; s != l.back; s++ {
		ring[s&nmask] = l.ring[s&l.mask]
	}
	l.ring, l.mask = ring, nmask
}

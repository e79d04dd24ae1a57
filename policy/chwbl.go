package policy

import (
	"slices"

	"github.com/kvroute/kvroute"
)

// ring is a consistent-hash ring over the candidates of one Pick call, with
// vnodes virtual nodes per endpoint (Karger et al.; the bounded-load walk is
// Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
// Loads", SODA 2018). It is rebuilt only when the candidate list (IDs, in
// order, and weights when weighted) changes, so a router that keeps a
// stable order pays for it once. A weighted ring gives each candidate
// vnodes x weight / the largest weight points (at least one): its share
// of the ring is its share of the weights, and with equal weights it is
// the unweighted ring. The points of a candidate are its first replicas,
// so a weight change moves only the keys of the points added or removed.
type ring struct {
	points   []ringPoint // sorted by hash
	fp       uint64      // fingerprint of the candidate IDs (and weights) it was built from
	n        int         // number of candidates it was built from
	vnodes   int
	weighted bool // points per candidate scale with its weight
	hash     func(id string, replica int) uint64
	seen     []uint32 // per candidate: epoch of the last walk that visited it
	epoch    uint32
}

type ringPoint struct {
	hash uint64
	cand int32 // candidate index
}

// newRing returns a ring of vnodes points per candidate, or, weighted, per
// candidate of the largest weight (see ring).
func newRing(vnodes int, hash func(id string, replica int) uint64, weighted bool) *ring {
	return &ring{vnodes: vnodes, hash: hash, weighted: weighted}
}

// sync rebuilds the ring if cands differ from the last build.
func (r *ring) sync(cands []kvroute.Candidate) {
	fp := uint64(14695981039346656037)
	maxW := 1
	for i := range cands {
		x := fp ^ strHash(endpointID(&cands[i]))
		if r.weighted {
			w := weight(&cands[i])
			x += uint64(w)
			maxW = max(maxW, w)
		}
		fp = mix64(x)
	}
	if r.points != nil && fp == r.fp && len(cands) == r.n {
		return
	}
	r.fp, r.n = fp, len(cands)
	r.points = r.points[:0]
	for i := range cands {
		id := endpointID(&cands[i])
		vnodes := r.vnodes
		if r.weighted {
			// Rounded to the nearest; the largest weight gets vnodes.
			w := int64(weight(&cands[i]))
			vnodes = max(1, int((int64(r.vnodes)*w+int64(maxW)/2)/int64(maxW)))
		}
		for v := 0; v < vnodes; v++ {
			r.points = append(r.points, ringPoint{hash: r.hash(id, v), cand: int32(i)})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.cand - b.cand)
	})
}

// walk visits the ring's points clockwise from key's successor (wrapping
// once), calling visit with each point's candidate index until visit returns
// true; it returns that candidate, or -1 when visit never accepted one.
// Each candidate is offered once, at its first point on the walk, and the
// walk stops once every candidate has been offered.
func (r *ring) walk(key uint64, visit func(cand int) bool) int {
	n := len(r.points)
	if n == 0 {
		return -1
	}
	if len(r.seen) != r.n {
		r.seen = make([]uint32, r.n)
		r.epoch = 0
	}
	r.epoch++
	if r.epoch == 0 { // wrapped: reset the stamps
		clear(r.seen)
		r.epoch = 1
	}
	offered := 0
	start, _ := slices.BinarySearchFunc(r.points, key, func(p ringPoint, k uint64) int {
		switch {
		case p.hash < k:
			return -1
		case p.hash > k:
			return 1
		}
		return 0
	})
	if start >= n {
		start = 0
	}
	for k := 0; k < n; k++ {
		c := int(r.points[(start+k)%n].cand)
		if r.seen[c] == r.epoch {
			continue
		}
		r.seen[c] = r.epoch
		if visit(c) {
			return c
		}
		if offered++; offered == r.n {
			break
		}
	}
	return -1
}

// mix64 is the SplitMix64 finaliser: a cheap, well-spread 64-bit mix.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

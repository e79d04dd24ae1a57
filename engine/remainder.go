package engine

import "math/bits"

// remainder computes x mod d for a fixed divisor d < 2^32 with
// multiplications instead of a 64-bit division (which costs tens of cycles
// on some CPUs, once per generated token): Lemire, Kaser and Kurz, "Faster
// remainder by direct computation" (2019), with F = 128 >= 64 + 32 bits:
// m = ceil(2^128 / d), and x mod d = (((m * x) mod 2^128) * d) >> 128 for
// every 64-bit x.
type remainder struct {
	hi, lo uint64 // m
	d      uint64
}

func newRemainder(d uint32) remainder {
	if d < 2 {
		return remainder{d: uint64(d)} // x mod 1 = 0 (m = 0 gives 0); d = 0 is never used
	}
	qhi, r := bits.Div64(0, ^uint64(0), uint64(d)) // floor((2^128 - 1) / d) ...
	qlo, _ := bits.Div64(r, ^uint64(0), uint64(d))
	lo, c := bits.Add64(qlo, 1, 0) // ... + 1 = ceil(2^128 / d)
	return remainder{hi: qhi + c, lo: lo, d: uint64(d)}
}

// mod returns x mod d.
func (m *remainder) mod(x uint64) uint64 {
	h, l := bits.Mul64(m.lo, x) // (m * x) mod 2^128 = h:l
	h += m.hi * x
	p, _ := bits.Mul64(l, m.d) // (h:l * d) >> 128
	q, r := bits.Mul64(h, m.d)
	_, c := bits.Add64(r, p, 0)
	return q + c
}

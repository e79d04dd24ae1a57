// Package coldcache empties the CPU caches for benchmarks of code whose
// memory is cold when it runs, as an engine's after a sleep in a busy fleet.
package coldcache

// buf is larger than the CPU's last-level cache: reading it empties the
// caches. It is written once first: pages never written all read the
// kernel's one zero page, which would evict nothing.
var buf []uint64

// Evict reads a word of every cache line of a 64 MB buffer, evicting what
// the caches held. It is not safe for concurrent use.
func Evict() {
	if buf == nil {
		buf = make([]uint64, 64<<20/8)
		for i := range buf {
			buf[i] = uint64(i)
		}
	}
	var x uint64
	for i := 0; i < len(buf); i += 8 {
		x += buf[i]
	}
	buf[0] = x // a store the compiler cannot drop keeps the loads
}

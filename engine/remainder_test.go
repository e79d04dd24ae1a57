package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRemainder checks remainder.mod against the % operator for divisors
// of every size (the vocabularies of the shipped profiles among them) and
// numerators at the edges and at random.
func TestRemainder(t *testing.T) {
	divisors := []uint32{1, 2, 3, 7, 10, 1000, 1 << 16, 128256, 151936, 152064, 1<<31 - 1, 1 << 31, math.MaxUint32 - 1, math.MaxUint32}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, d := range divisors {
		m := newRemainder(d)
		d64 := uint64(d)
		xs := []uint64{0, 1, d64 - 1, d64, d64 + 1, 2*d64 - 1, math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64 / d64 * d64, math.MaxUint64/d64*d64 - 1, 1 << 63, 1<<63 - 1}
		for range 20000 {
			xs = append(xs, rng.Uint64(), rng.Uint64()>>rng.IntN(64))
		}
		for _, x := range xs {
			if got, want := m.mod(x), x%d64; got != want {
				t.Fatalf("%d mod %d: got %d, want %d", x, d, got, want)
			}
		}
	}
}

func BenchmarkRemainder(b *testing.B) {
	b.ReportAllocs()
	m := newRemainder(128256)
	d := uint64(vocabForBench)
	b.Run("mul", func(b *testing.B) {
		var s uint64
		for i := range b.N {
			s += m.mod(uint64(i) * 0x9e3779b97f4a7c15)
		}
		sink = s
	})
	b.Run("div", func(b *testing.B) {
		var s uint64
		for i := range b.N {
			s += uint64(i) * 0x9e3779b97f4a7c15 % d
		}
		sink = s
	})
}

var (
	sink          uint64
	vocabForBench uint32 = 128256 // a variable: the benchmark divides by a value unknown to the compiler
)

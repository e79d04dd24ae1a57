package workload

import (
	"math"
	"sort"
)

// AdapterMix is the lora generator's popularity law over LoRA adapters:
// adapter i (AdapterName(i)) of n is chosen with weight 1/(i+1)^skew, so
// skew 0 is uniform and 1 the usual Zipf law. kvroute plan's summary
// workloads draw their adapters with it too. It is immutable and safe for
// concurrent use.
type AdapterMix struct {
	cum []float64 // cum[i] is the summed weight of adapters 0..i
}

// NewAdapterMix returns the mix of n adapters (at least one) with exponent
// skew.
func NewAdapterMix(n int, skew float64) AdapterMix {
	cum := make([]float64, max(1, n))
	var sum float64
	for i := range cum {
		sum += 1 / math.Pow(float64(i+1), skew)
		cum[i] = sum
	}
	return AdapterMix{cum: cum}
}

// Len is the number of adapters.
func (m AdapterMix) Len() int { return len(m.cum) }

// Pick returns the adapter a uniform draw u in [0, 1) chooses.
func (m AdapterMix) Pick(u float64) int {
	n := len(m.cum)
	return min(sort.SearchFloat64s(m.cum, u*m.cum[n-1]), n-1)
}

// Share is adapter i's share of the requests: its weight over the sum.
func (m AdapterMix) Share(i int) float64 {
	prev := 0.0
	if i > 0 {
		prev = m.cum[i-1]
	}
	return (m.cum[i] - prev) / m.cum[len(m.cum)-1]
}

package workload

import (
	"math"
	"testing"
)

// TestAdapterMix works the lora generator's law by hand: 4 adapters at
// skew 1 weigh 1, 1/2, 1/3, 1/4 (sum 25/12), so their shares are 12/25,
// 6/25, 4/25 and 3/25, and a draw picks the adapter whose cumulative
// share it falls under.
func TestAdapterMix(t *testing.T) {
	m := NewAdapterMix(4, 1)
	for i, want := range []float64{12.0 / 25, 6.0 / 25, 4.0 / 25, 3.0 / 25} {
		if got := m.Share(i); math.Abs(got-want) > 1e-12 {
			t.Errorf("Share(%d) = %v, want %v", i, got, want)
		}
	}
	for _, tc := range []struct {
		u    float64
		want int
	}{{0, 0}, {0.47, 0}, {0.49, 1}, {0.71, 1}, {0.73, 2}, {0.87, 2}, {0.89, 3}, {0.999999, 3}} {
		if got := m.Pick(tc.u); got != tc.want {
			t.Errorf("Pick(%v) = %d, want %d", tc.u, got, tc.want)
		}
	}
	if u := NewAdapterMix(3, 0); u.Share(0) != u.Share(2) || u.Len() != 3 {
		t.Errorf("skew 0: shares %v, %v over %d adapters, want uniform over 3", u.Share(0), u.Share(2), u.Len())
	}
}

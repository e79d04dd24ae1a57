package sim

import "testing"

func TestOracle(t *testing.T) {
	o := newOracle()
	steps := []struct {
		hashes    []uint64
		promptLen int
		want      int
	}{
		{[]uint64{1, 2, 3}, 50, 0},      // cold
		{[]uint64{1, 2, 3}, 50, 48},     // all three blocks (48 <= 49)
		{[]uint64{1, 2, 3}, 48, 32},     // exact fit: the last token is recomputed, so only 2 blocks
		{[]uint64{1, 2, 9, 10}, 64, 32}, // diverges at block 2
		{[]uint64{1, 2, 9, 10}, 70, 64}, // now seen
		{[]uint64{7}, 10, 0},            // partial block only, nothing hashed beyond
		{nil, 5, 0},
	}
	var q, h int
	for i, s := range steps {
		if got := o.observe(s.hashes, 16, s.promptLen); got != s.want {
			t.Errorf("step %d: got %d hit tokens, want %d", i, got, s.want)
		}
		q += s.promptLen
		h += s.want
	}
	if got, want := o.rate(), float64(h)/float64(q); got != want {
		t.Errorf("rate: got %g, want %g", got, want)
	}
	if got := newOracle().rate(); got != 0 {
		t.Errorf("empty rate: got %g, want 0", got)
	}
}

package workload

import (
	"math"
	"slices"
	"testing"
)

// TestLoRAShares: the lora generator's adapters get shares proportional to
// 1/(i+1)^skew, base_share of the requests go to the base model, and every
// request of an adapter starts with that adapter's own system prompt.
func TestLoRAShares(t *testing.T) {
	const n = 8000
	for _, tc := range []struct {
		skew, base float64
	}{{1, 0}, {0, 0.25}, {2, 0.5}} {
		w := genOrFatal(t, "lora", Options{Seed: 9, Requests: n,
			Params: map[string]float64{"adapters": 4, "skew": tc.skew, "base_share": tc.base}})
		count := map[string]int{}
		sys := map[string]uint64{} // adapter -> its system prompt's key
		for _, r := range w.Requests {
			count[r.Adapter]++
			if k, ok := sys[r.Adapter]; ok && k != r.Segments[0].Key {
				t.Fatalf("skew %g: %s's requests start with system prompts %x and %x", tc.skew, r.Adapter, k, r.Segments[0].Key)
			}
			sys[r.Adapter] = r.Segments[0].Key
			if r.Segments[0].Len != 1500 || len(r.Segments) != 2 {
				t.Fatalf("skew %g: request %s: segments %+v, want the 1500-token system prompt and a user message", tc.skew, r.ID, r.Segments)
			}
		}
		var sum float64
		for i := range 4 {
			sum += 1 / math.Pow(float64(i+1), tc.skew)
		}
		want := map[string]float64{"": tc.base}
		for i := range 4 {
			want[AdapterName(i)] = (1 - tc.base) / math.Pow(float64(i+1), tc.skew) / sum
		}
		for a, share := range want {
			if got := float64(count[a]) / n; math.Abs(got-share) > 0.02 {
				t.Errorf("skew %g base %g: %q share %.3f, want %.3f", tc.skew, tc.base, a, got, share)
			}
		}
		if tc.base == 0 {
			delete(want, "")
		}
		if len(count) != len(want) {
			t.Errorf("skew %g base %g: requests per adapter %v, want the adapters of %v", tc.skew, tc.base, count, want)
		}
		keys := make([]uint64, 0, len(sys))
		for _, k := range sys {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if len(slices.Compact(keys)) != len(sys) {
			t.Errorf("skew %g: two adapters share a system prompt: %v", tc.skew, sys)
		}
	}
}

// TestLoRAArrivalsIndependentOfBaseShare: base_share changes which
// requests name an adapter, not when they arrive nor their lengths.
func TestLoRAArrivalsIndependentOfBaseShare(t *testing.T) {
	a := genOrFatal(t, "lora", Options{Seed: 3, Requests: 500})
	b := genOrFatal(t, "lora", Options{Seed: 3, Requests: 500, Params: map[string]float64{"base_share": 0.5}})
	for i := range a.Requests {
		ra, rb := a.Requests[i], b.Requests[i]
		if ra.Arrival != rb.Arrival || ra.PromptLen != rb.PromptLen || ra.OutputLen != rb.OutputLen {
			t.Fatalf("request %d: %v %d %d with base_share 0, %v %d %d with 0.5", i,
				ra.Arrival, ra.PromptLen, ra.OutputLen, rb.Arrival, rb.PromptLen, rb.OutputLen)
		}
	}
}

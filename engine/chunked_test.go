package engine

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// chunkedSteps is ChunkedPrefill step by step: one Profile.StepTime per
// chunk. mixed reports whether the chunks' prefill attention was priced on
// both sides of its max (FLOPs for some, cached-context read for others).
func chunkedSteps(p Profile, q, cached, budget, decodes, ctx int) (d time.Duration, steps int, mixed bool) {
	c := newCostModel(p)
	var flops, read bool
	for done := 0; done < q; steps++ {
		n := min(q-done, budget)
		at := cached + done
		pairs := float64(n) * (float64(at) + float64(n)/2)
		if f, r := c.attnFLOPsPerPair*pairs/(c.peak*c.mfuHi), c.kvSecPerToken*float64(at); f > r {
			flops = true
		} else if r > f {
			read = true
		}
		d += p.StepTime(Batch{PrefillTokens: n, PrefillAttnPairs: pairs, PrefillContext: at,
			DecodeTokens: decodes, DecodeContext: ctx, Seqs: decodes + 1, Sampled: decodes + 1})
		done += n
	}
	return d, steps, flops && read
}

// logInt returns an int in [lo, hi], log-uniform.
func logInt(r *rand.Rand, lo, hi int) int {
	v := math.Exp(math.Log(float64(lo)) + r.Float64()*(math.Log(float64(hi))-math.Log(float64(lo))))
	return min(hi, max(lo, int(v)))
}

// TestChunkedPrefillMatchesSteps checks ChunkedPrefill against the sum of
// its steps' StepTime over random prompts, cached prefixes, decode batches
// and step budgets on every shipped profile: within its stated bound of
// half a nanosecond per full chunk plus 2 ns, including runs whose prefill
// attention crosses from the FLOPs side to the cached-context read.
func TestChunkedPrefillMatchesSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	mixed := 0
	for _, name := range ProfileNames() {
		p, err := LookupProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		s := NewStepCost(p)
		for i := range 400 {
			budget := p.MaxNumBatchedTokens
			if i%2 == 1 {
				budget = logInt(r, 1, 32768)
			}
			q := logInt(r, 1, min(3_000_000, budget*2000))
			cached := 0
			if r.IntN(3) > 0 {
				cached = logInt(r, 1, 500_000)
			}
			decodes := r.IntN(1025)
			ctx := 0
			if decodes > 0 {
				ctx = decodes * logInt(r, 1, 32768)
			}
			want, steps, mix := chunkedSteps(p, q, cached, budget, decodes, ctx)
			if mix {
				mixed++
			}
			got := s.ChunkedPrefill(q, cached, budget, decodes, ctx)
			if diff, bound := (got - want).Abs(), time.Duration(steps/2+2); diff > bound {
				t.Errorf("%s: ChunkedPrefill(q %d, cached %d, budget %d, decodes %d, ctx %d) = %v, steps sum to %v (%d steps): off by %v > %v",
					name, q, cached, budget, decodes, ctx, got, want, steps, diff, bound)
			}
		}
	}
	if mixed < 20 {
		t.Errorf("only %d cases crossed from FLOPs-bound to read-bound prefill attention; the test does not cover the switch", mixed)
	}
	t.Logf("%d cases crossed regimes", mixed)
}

// TestChunkedPrefillEdges checks the cases the closed form treats apart:
// nothing to prefill, one partial chunk (exactly its StepTime), whole
// chunks only, and a budget below 1.
func TestChunkedPrefillEdges(t *testing.T) {
	p, _ := LookupProfile("llama-3.1-8b-h100")
	s := NewStepCost(p)
	if got := s.ChunkedPrefill(0, 100, 8192, 4, 4000); got != 0 {
		t.Errorf("q 0: %v, want 0", got)
	}
	if got := s.ChunkedPrefill(-5, 0, 8192, 0, 0); got != 0 {
		t.Errorf("q -5: %v, want 0", got)
	}
	if got, want := s.ChunkedPrefill(1000, 2048, 8192, 0, 0), p.PrefillTime(1000, 2048); got != want {
		t.Errorf("one partial chunk: %v, want PrefillTime %v", got, want)
	}
	for _, q := range []int{8192, 3 * 8192, 3*8192 + 1} {
		want, steps, _ := chunkedSteps(p, q, 0, 8192, 0, 0)
		if got := s.ChunkedPrefill(q, 0, 8192, 0, 0); (got - want).Abs() > time.Duration(steps/2+2) {
			t.Errorf("q %d: %v, steps sum to %v", q, got, want)
		}
	}
	want, _, _ := chunkedSteps(p, 10, 0, 1, 0, 0)
	if got := s.ChunkedPrefill(10, 0, 0, 0, 0); (got - want).Abs() > 7 {
		t.Errorf("budget 0: %v, want about %v (budget 1)", got, want)
	}
}

// TestStepCostStepTime checks the precomputed model prices a step as
// Profile.StepTime does.
func TestStepCostStepTime(t *testing.T) {
	for _, name := range ProfileNames() {
		p, _ := LookupProfile(name)
		s := NewStepCost(p)
		for _, b := range []Batch{{}, {DecodeTokens: 7, DecodeContext: 7000, Seqs: 7, Sampled: 7},
			{PrefillTokens: 4096, PrefillAttnPairs: 4096 * (1000 + 2048), PrefillContext: 1000, DecodeTokens: 3, DecodeContext: 900, Seqs: 4, Sampled: 4}} {
			if got, want := s.StepTime(b), p.StepTime(b); got != want {
				t.Errorf("%s: StepCost.StepTime(%+v) = %v, Profile.StepTime %v", name, b, got, want)
			}
		}
	}
}

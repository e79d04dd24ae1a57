package disagg

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
)

// prefillSteps is costModel.prefill step by step: one Profile.StepTime per
// budget-sized chunk, each step carrying the running decodes.
func prefillSteps(m costModel, q, cached int, l kvroute.Load) (time.Duration, int) {
	running, ctx := max(l.Running, 0), max(l.DecodeTokens, 0)
	var d time.Duration
	steps := 0
	for done := 0; done < q; steps++ {
		chunk := min(q-done, m.budget())
		p := cached + done
		d += m.prof.StepTime(engine.Batch{
			PrefillTokens: chunk, PrefillAttnPairs: float64(chunk) * (float64(p) + float64(chunk)/2), PrefillContext: p,
			DecodeTokens: running, DecodeContext: ctx, Seqs: running + 1, Sampled: running + 1,
		})
		done += chunk
	}
	return d, steps
}

// TestEstimateMatchesSteps checks the placement's queue and prefill
// estimates against pricing every budget-sized step, over random loads
// (up to millions of tokens queued), prompts, prefix hits and step budgets
// on every shipped profile: within half a nanosecond a step plus 2 ns.
func TestEstimateMatchesSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, name := range engine.ProfileNames() {
		p := mustProfile(t, name)
		for i := range 300 {
			if i%3 == 2 {
				p.MaxNumBatchedTokens = 1 << r.IntN(15)
			}
			// At most 2,000 steps a queue, so the reference stays quick.
			deep := min(3_000_000, 2000*p.MaxNumBatchedTokens)
			m := newCostModel(p, ShapeOf(p), 1+r.IntN(min(8192, deep/400+1)))
			running := r.IntN(300)
			l := kvroute.Load{Running: running, DecodeTokens: running * r.IntN(32768), Waiting: r.IntN(400),
				InFlightTokens: r.IntN(deep)}
			if r.IntN(4) == 0 {
				l.Running, l.DecodeTokens = -1, -5 // bad scrapes count as none
			}
			tokens := max(l.InFlightTokens, l.Waiting*m.meanQueued)
			want, steps := prefillSteps(m, tokens, 0, l)
			if got := m.queue(l); (got - want).Abs() > time.Duration(steps/2+2) {
				t.Errorf("%s budget %d: queue(%+v) = %v, steps sum to %v (%d steps)", name, m.budget(), l, got, want, steps)
			}
			prompt := 1 + r.IntN(min(131072, 2000*p.MaxNumBatchedTokens))
			cached := r.IntN(prompt + 1)
			want, steps = prefillSteps(m, prompt-cached, cached, l)
			if got := m.prefill(prompt-cached, cached, l); (got - want).Abs() > time.Duration(steps/2+2) {
				t.Errorf("%s budget %d: prefill(%d, cached %d, %+v) = %v, steps sum to %v (%d steps)",
					name, m.budget(), prompt-cached, cached, l, got, want, steps)
			}
		}
	}
}

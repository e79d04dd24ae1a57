package disagg

import (
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
)

// costModel turns a candidate's load and a request into time estimates with
// the engine model's own step-time function (engine.Profile.StepTime), the
// same one the simulator's engines run on. It is pure.
type costModel struct {
	prof engine.Profile
	// step is prof's step-time model with its constants derived once.
	step  engine.StepCost
	shape KVShape
	// meanQueued is the prompt size assumed for engine-queued requests the
	// router did not dispatch itself.
	meanQueued int
}

// newCostModel returns the cost model of engines of profile p whose KV is
// shaped shape, assuming meanQueued-token prompts for engine-queued requests.
func newCostModel(p engine.Profile, shape KVShape, meanQueued int) costModel {
	return costModel{prof: p, step: engine.NewStepCost(p), shape: shape, meanQueued: meanQueued}
}

// budget is the engine's per-step token budget.
func (m costModel) budget() int { return max(m.prof.MaxNumBatchedTokens, 1) }

// queue estimates the wait before a new request's prefill starts: the
// prefill work queued ahead of it (the router's own undispatched prompt
// tokens, or the engine's waiting queue at a mean prompt size when that is
// larger), computed in budget-sized steps alongside the running batch.
func (m costModel) queue(l kvroute.Load) time.Duration {
	tokens := l.InFlightTokens
	if w := l.Waiting * m.meanQueued; w > tokens {
		tokens = w
	}
	return m.prefill(tokens, 0, l)
}

// prefill estimates computing q uncached tokens on top of cached ones,
// in budget-sized chunks, each step also carrying the running decodes: the
// sum of the steps' StepTime, in closed form (engine.StepCost.
// ChunkedPrefill, within half a nanosecond a step of it), so a queue of
// millions of tokens costs no more to price than one chunk.
func (m costModel) prefill(q, cached int, l kvroute.Load) time.Duration {
	running := max(l.Running, 0)
	return m.step.ChunkedPrefill(q, cached, m.budget(), running, max(l.DecodeTokens, 0))
}

// decodeStep estimates one decode step on the candidate once a request
// with ctx tokens of context joins its running batch.
func (m costModel) decodeStep(l kvroute.Load, ctx int) time.Duration {
	running := max(l.Running, 0) + 1
	total := max(l.DecodeTokens, 0) + ctx
	return m.step.StepTime(engine.Batch{DecodeTokens: running, DecodeContext: total, Seqs: running, Sampled: running})
}

// slotWait estimates how long a request for LoRA adapter x waits on an
// engine of adapter signals l (kvroute.LoRALoad) for one of its max_lora
// slots, when the engine's running requests leave after out/2 more steps
// of step each: nothing when x is "" (the base model), when the engine
// runs or queues x already, when its batch's adapters leave a slot free,
// or when it reports no adapters (not a LoRA engine, not reported yet, or
// stale); else half an output, the mean rest of the running request whose
// adapter must leave first. vLLM's scheduler skips a waiting request whose
// adapter would take the step past --max-loras: a whole request's prefill,
// a prefill leg, and a decode leg's KV pull start only once a slot frees.
func slotWait(l *kvroute.LoRALoad, x string, out int, step time.Duration) time.Duration {
	if x == "" || l == nil || l.Max <= 0 || l.Active(x) {
		return 0
	}
	distinct := 0
	for i, a := range l.Running { // sorted
		if i == 0 || a != l.Running[i-1] {
			distinct++
		}
	}
	if distinct < l.Max {
		return 0
	}
	return time.Duration(float64(max(out, 0)) / 2 * float64(step))
}

// capacityTokens returns the candidate's KV capacity in tokens.
func (m costModel) capacityTokens(c *kvroute.Candidate) int {
	switch {
	case c.Load.KVCapacityTokens > 0:
		return c.Load.KVCapacityTokens
	case c.Endpoint.KVCapacityTokens > 0:
		return c.Endpoint.KVCapacityTokens
	}
	return m.prof.KVCapacityTokens()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// KVAwareParams returns parameters for the kv-aware policy (package
// policy) derived from an engine profile, so the prefill stage's picker
// estimates with the same cost model: per-token prefill time, step
// overhead, per-sequence and per-context decode costs and the step budget.
func KVAwareParams(p engine.Profile) map[string]any {
	budget := max(p.MaxNumBatchedTokens, 2)
	base := p.StepTime(engine.Batch{DecodeTokens: 1, Seqs: 1, Sampled: 1})
	full := p.PrefillTime(budget, 0)
	perTok := float64(full-p.PrefillTime(1, 0)) / float64(budget-1) / float64(time.Microsecond)
	seq := p.StepTime(engine.Batch{DecodeTokens: 65, Seqs: 65, Sampled: 65}) - p.StepTime(engine.Batch{DecodeTokens: 1, Seqs: 1, Sampled: 1})
	ctx := p.StepTime(engine.Batch{DecodeTokens: 1, DecodeContext: 1_000_001, Seqs: 1, Sampled: 1}) - p.StepTime(engine.Batch{DecodeTokens: 1, DecodeContext: 1, Seqs: 1, Sampled: 1})
	out := map[string]any{
		"prefill_us_per_token":   max(perTok, 0.001),
		"step_overhead_us":       float64(base) / float64(time.Microsecond),
		"decode_us_per_token":    max(float64(seq)/64/float64(time.Microsecond), 0),
		"decode_us_per_ctx_ktok": max(float64(ctx)/1000/float64(time.Microsecond), 0),
		"max_batched_tokens":     budget,
	}
	return out
}

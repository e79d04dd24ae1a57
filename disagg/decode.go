package disagg

import (
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute"
)

// DecodeParams configures decode placement. Zero values take the
// documented defaults.
type DecodeParams struct {
	// TPOTWeight weighs the decode step time the request would see on a
	// candidate (its running batch and their context, plus this request)
	// against the milliseconds of transfer and queueing: the step is paid
	// once per output token, so a slower batch costs more than its first
	// step. Default 4.
	TPOTWeight float64 `json:"tpot_weight" yaml:"tpot_weight"`
	// KVSoftCap is the KV usage (0..1, counting the request's own prompt
	// and output) above which a candidate is penalised; default 0.8.
	KVSoftCap float64 `json:"kv_soft_cap" yaml:"kv_soft_cap"`
	// KVPenaltyMs is the penalty at full KV usage, growing linearly from
	// KVSoftCap; default 200 ms. A candidate the request would not fit in
	// is not eligible.
	KVPenaltyMs float64 `json:"kv_penalty_ms" yaml:"kv_penalty_ms"`
	// OutputTokens is the output length assumed for KV headroom when the
	// request gives no max_tokens; default 256.
	OutputTokens int `json:"output_tokens" yaml:"output_tokens"`
	// TieMs: candidates within TieMs of the best score are tied and taken
	// in turn (never always the first). Default 0.5.
	TieMs float64 `json:"tie_ms" yaml:"tie_ms"`
}

// setDefault sets *v to def when it is the zero value.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (p *DecodeParams) applyDefaults() {
	setDefault(&p.TPOTWeight, 4)
	setDefault(&p.KVSoftCap, 0.8)
	setDefault(&p.KVPenaltyMs, 200)
	setDefault(&p.OutputTokens, 256)
	setDefault(&p.TieMs, 0.5)
}

// Validate reports the first out-of-range field.
func (p DecodeParams) Validate() error {
	switch {
	case p.TPOTWeight < 0 || math.IsNaN(p.TPOTWeight):
		return fmt.Errorf("disagg: decode.tpot_weight must be >= 0, got %v", p.TPOTWeight)
	case p.KVSoftCap < 0 || p.KVSoftCap >= 1:
		return fmt.Errorf("disagg: decode.kv_soft_cap must be in [0, 1), got %v", p.KVSoftCap)
	case p.KVPenaltyMs < 0:
		return fmt.Errorf("disagg: decode.kv_penalty_ms must be >= 0, got %v", p.KVPenaltyMs)
	case p.OutputTokens < 0:
		return fmt.Errorf("disagg: decode.output_tokens must be >= 0, got %d", p.OutputTokens)
	case p.TieMs < 0:
		return fmt.Errorf("disagg: decode.tie_ms must be >= 0, got %v", p.TieMs)
	}
	return nil
}

// DecodePicker places the decode stage. It scores each decode-capable
// candidate, lower is better:
//
//	score = transfer_ms (from the chosen prefill node, with fabric queueing,
//	        of the prompt KV the candidate does not hold: PulledTokens of its
//	        CachedTokens)
//	      + TPOTWeight x step_ms (one decode step with this request in the batch)
//	      + waiting x step_ms (requests queued for KV space ahead of it)
//	      + kv_penalty_ms (KV usage after admission above KVSoftCap)
//	      + adapter_ms (a LoRA adapter's request on an engine whose max_lora
//	        slots other adapters' running requests hold: OutputTokens/2 x
//	        step_ms; see slotWait)
//
// A candidate that holds the conversation's earlier turns pulls only the
// new part of the prompt, as vLLM's NixlConnector does, so it wins when
// the fabric is slow (not under Config.Protocol sglang, whose decode
// engines receive the whole prompt's KV); the prefix is not otherwise scored (the decode
// engine computes one token). Candidates the request does not fit in
// (prompt + output tokens over the free KV) are not eligible unless none
// fits. It implements kvroute.Picker
// (as a plain decode picker with no prefill node: no transfer term); the
// Planner calls PickFrom with the chosen prefill endpoint. Not safe for
// concurrent use (a tie-break position), like every Picker.
type DecodePicker struct {
	p      DecodeParams
	cost   costModel
	fabric *Fabric
	whole  bool // every transfer moves the whole prompt (Config.Protocol sglang)
	turn   uint64
	scores []kvroute.Score
}

var _ kvroute.Picker = (*DecodePicker)(nil)

// decodeChoice is DecodePicker's answer with its estimates.
type decodeChoice struct {
	d        kvroute.Decision
	transfer Estimate
	step     time.Duration
}

// Pick implements kvroute.Picker: decode placement with no prefill node.
func (dp *DecodePicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	return dp.PickFrom(now, now, req, cands, nil).d
}

// PickFrom places the decode stage of req given the prefill endpoint
// (nil = none: aggregated) whose KV becomes ready at time ready.
func (dp *DecodePicker) PickFrom(now, ready time.Time, req *kvroute.Request, cands []kvroute.Candidate, prefill *kvroute.Endpoint) decodeChoice {
	const name = "pd-decode"
	need := req.PromptTokens + req.MaxTokens
	if req.MaxTokens <= 0 {
		need = req.PromptTokens + dp.p.OutputTokens
	}
	dp.scores = dp.scores[:0]
	type opt struct {
		i     int
		score float64
		fits  bool
		xfer  Estimate
		step  time.Duration
	}
	var opts []opt
	anyFits := false
	for i := range cands {
		c := &cands[i]
		s := kvroute.Score{Endpoint: c.Endpoint.ID}
		if !c.Healthy || !c.Endpoint.Role.CanDecode() {
			s.Why = "unhealthy"
			if c.Healthy {
				s.Why = "role " + c.Endpoint.Role.String()
			}
			dp.scores = append(dp.scores, s)
			continue
		}
		var xfer Estimate
		pulled := req.PromptTokens
		if !dp.whole {
			pulled = PulledTokens(pulled, c.CachedTokens, dp.cost.prof.BlockSize)
		}
		if prefill != nil && dp.fabric != nil {
			xfer = dp.fabric.Estimate(now, ready, prefill, c.Endpoint, dp.cost.shape.Bytes(pulled))
		}
		step := dp.cost.decodeStep(c.Load, req.PromptTokens)
		capTok := dp.cost.capacityTokens(c)
		after := c.Load.KVUsage
		if capTok > 0 {
			after += float64(need) / float64(capTok)
		}
		fits := after <= 1
		anyFits = anyFits || fits
		pen := 0.0
		if after > dp.p.KVSoftCap {
			pen = dp.p.KVPenaltyMs * math.Min(after-dp.p.KVSoftCap, 1-dp.p.KVSoftCap) / (1 - dp.p.KVSoftCap)
		}
		waiting := float64(max(c.Load.Waiting, 0)) * ms(step)
		slot := ms(slotWait(c.Load.LoRA, req.Adapter, dp.p.OutputTokens, step))
		score := ms(xfer.Total()) + dp.p.TPOTWeight*ms(step) + waiting + pen + slot
		s.Value, s.Eligible = score, true
		s.Parts = []kvroute.Part{{Name: "transfer_ms", Value: ms(xfer.Total())}, {Name: "transfer_mb", Value: float64(xfer.Bytes) / 1e6},
			{Name: "step_ms", Value: ms(step)},
			{Name: "waiting_ms", Value: waiting}, {Name: "kv_after", Value: after}, {Name: "kv_penalty_ms", Value: pen}}
		if req.Adapter != "" {
			s.Parts = append(s.Parts, kvroute.Part{Name: "adapter_ms", Value: slot})
		}
		if !fits {
			s.Why = "kv full"
		}
		dp.scores = append(dp.scores, s)
		opts = append(opts, opt{i: i, score: score, fits: fits, xfer: xfer, step: step})
	}
	if len(opts) == 0 {
		if req.Adapter != "" {
			return decodeChoice{d: kvroute.None(name, fmt.Sprintf("no healthy decode-capable endpoint serving adapter %q", req.Adapter))}
		}
		return decodeChoice{d: kvroute.None(name, "no healthy decode-capable endpoint")}
	}
	best := math.Inf(1)
	for _, o := range opts {
		if (o.fits || !anyFits) && o.score < best {
			best = o.score
		}
	}
	var tied []opt
	for _, o := range opts {
		if (o.fits || !anyFits) && o.score <= best+dp.p.TieMs {
			tied = append(tied, o)
		}
	}
	o := tied[dp.turn%uint64(len(tied))]
	dp.turn++
	reason := fmt.Sprintf("decode: score %.1f ms (transfer %.1f, step %.2f)", o.score, ms(o.xfer.Total()), ms(o.step))
	if o.xfer.Bytes > 0 {
		reason = fmt.Sprintf("decode: score %.1f ms (transfer %.1f of %.1f MB, step %.2f)", o.score, ms(o.xfer.Total()), float64(o.xfer.Bytes)/1e6, ms(o.step))
	}
	if !anyFits {
		reason += "; no candidate has KV room, least bad"
	}
	d := kvroute.Chose(name, cands, o.i, reason)
	d.Scores = append([]kvroute.Score(nil), dp.scores...)
	return decodeChoice{d: d, transfer: o.xfer, step: o.step}
}

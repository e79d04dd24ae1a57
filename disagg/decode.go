package disagg

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
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
	// AdapterLoadMs prices a LoRA adapter's decode leg on an engine that
	// does not hold the adapter and would have no max_lora slot left
	// once it took one (see adapterWait): that slot may be the one
	// another adapter needs next, so an engine that holds the adapter
	// already wins unless its batch is that much slower. Default 10 ms.
	AdapterLoadMs float64 `json:"adapter_load_ms" yaml:"adapter_load_ms"`
	// AdapterHold is how long an engine is taken to hold an adapter the
	// picker placed a request of there (a decode leg, or a request run
	// whole), beside the adapters its signals show running or waiting:
	// a decode leg reaches its engine only once its prefill is done, and
	// until then its engine's signals do not show its adapter, so a burst
	// of one adapter's legs took every engine whose signals showed a slot
	// free, and at --max-loras 1 left the other adapters waiting for a
	// slot everywhere. Default 1s (in the simulator's lora workload on
	// 1:7 and 2:6 fleets, 1s did better than 2s, 3s and 10s at
	// --max-loras 1).
	AdapterHold time.Duration `json:"adapter_hold" yaml:"adapter_hold"`
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
	setDefault(&p.AdapterLoadMs, 10)
	setDefault(&p.AdapterHold, time.Second)
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
	case p.AdapterLoadMs < 0 || math.IsNaN(p.AdapterLoadMs):
		return fmt.Errorf("disagg: decode.adapter_load_ms must be >= 0, got %v", p.AdapterLoadMs)
	case p.AdapterHold < 0:
		return fmt.Errorf("disagg: decode.adapter_hold must be >= 0, got %v", p.AdapterHold)
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
//	      + adapter_ms (a LoRA adapter's request on an engine that does not
//	        hold it: AdapterLoadMs with a max_lora slot free, else the wait
//	        for one; see adapterWait)
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
	// placed are the adapters of the requests placed on each endpoint
	// (Placed).
	placed policy.AdapterUses
	held   [][]string           // per candidate, the adapters it holds (adapterWait), reused
	demand policy.AdapterDemand // the adapters' decode legs placed (Placed)
	homes  map[string]int       // per adapter, the candidates holding it, reused
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
	slots := dp.adapterState(now, req.Adapter, cands)
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
		slot := ms(dp.adapterWait(now, i, c, req.Adapter, slots, step))
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

// Placed records that a request for adapter x ("" the base model: nothing
// to record) was placed on endpoint id at now, its decode leg or the
// whole request: the engine holds x for AdapterHold (adapterState).
func (dp *DecodePicker) Placed(now time.Time, id, x string) {
	if x == "" || dp.p.AdapterHold <= 0 {
		return
	}
	dp.demand.Seen(now, x)
	dp.placed.Note(now, id, x)
}

// ForgetEndpoint drops what the picker placed on endpoint id (removed
// from the pool, or another engine under its ID).
func (dp *DecodePicker) ForgetEndpoint(id string) { dp.placed.Forget(id) }

// adapterState fills dp.held, the adapters each decode-capable candidate
// holds, and dp.homes, how many candidates hold each, for a request of
// adapter x, and returns the max_lora slots of an engine that reports
// none (the largest another reports: a pool's engines are alike; 0 when
// none does). An engine holds the adapters its signals show running or
// waiting and the last of those the picker placed there within
// AdapterHold, as many as its slots (Placed): vLLM batches at most
// max_lora adapters, and a request of another waits until one of them
// has no request left in the batch.
func (dp *DecodePicker) adapterState(now time.Time, x string, cands []kvroute.Candidate) (poolMax int) {
	if x == "" {
		return 0
	}
	for i := range cands {
		if l := cands[i].Load.LoRA; l != nil && l.Max > poolMax {
			poolMax = l.Max
		}
	}
	if poolMax == 0 {
		return 0
	}
	for len(dp.held) < len(cands) {
		dp.held = append(dp.held, nil)
	}
	if dp.homes == nil {
		dp.homes = make(map[string]int)
	}
	clear(dp.homes)
	for i := range cands {
		c := &cands[i]
		h := dp.held[i][:0]
		if c.Healthy && c.Endpoint.Role.CanDecode() {
			add := func(a string) {
				if !slices.Contains(h, a) {
					h = append(h, a)
				}
			}
			slots := poolMax
			if l := c.Load.LoRA; l != nil {
				for _, a := range l.Running {
					add(a)
				}
				for _, a := range l.Waiting {
					add(a)
				}
				if l.Max > 0 {
					slots = l.Max
				}
			}
			for a := range dp.placed.Held(now, c.Endpoint.ID, slots, dp.p.AdapterHold) {
				add(a)
			}
			for _, a := range h {
				dp.homes[a]++
			}
		}
		dp.held[i] = h
	}
	return poolMax
}

// adapterWait prices a decode leg of adapter x on candidate i (c), whose
// decode step is step, given adapterState (poolMax: its slots when c
// reports none; 0, no slots known anywhere: nothing): with H the
// adapters c holds and S its max_lora slots,
//
//   - x in H and H within S: nothing, x runs there;
//   - x not in H, with a slot to spare after x takes one: nothing;
//   - x not in H, taking the last free slot: AdapterLoadMs;
//   - x in H, H over S (others wait for a slot): nothing, unless x is held
//     elsewhere too; then half a decode (OutputTokens/2 steps), so that
//     x's next legs go to its other engine and this one drains for the
//     adapters waiting there;
//   - else x waits for a slot: AdapterLoadMs and half a decode, the mean
//     rest of the running request whose adapter must leave first, or,
//     behind adapters held nowhere else, whose legs keep coming and keep
//     x out, the time until they have none left in the batch
//     (policy.SlotBusyPeriod of their legs' rate, Placed, and a decode),
//     when that is longer.
//
// So each adapter keeps to the engines that hold it, a new one takes a
// free engine, a hot one spreads where its engines' batches are slower
// than a slot is dear, and one with no engine of its own (more adapters
// than slots) waits behind the least used. (A flat 4 decodes behind such
// adapters, as kv-aware priced a whole request's wait before it priced
// their demand, did worse on 1:7 and 2:6 fleets at --max-loras 1 than
// half a decode; their demand did better than either at 20 req/s.)
func (dp *DecodePicker) adapterWait(now time.Time, i int, c *kvroute.Candidate, x string, poolMax int, step time.Duration) time.Duration {
	if x == "" || poolMax == 0 {
		return 0
	}
	slots := poolMax
	l := c.Load.LoRA
	if l != nil && l.Max > 0 {
		slots = l.Max
	}
	held := dp.held[i]
	hasX := slices.Contains(held, x)
	load := time.Duration(dp.p.AdapterLoadMs * float64(time.Millisecond))
	half := time.Duration(float64(max(dp.p.OutputTokens, 0)) / 2 * float64(step))
	switch {
	case hasX && len(held) <= slots:
		return 0
	case !hasX && len(held)+1 < slots:
		return 0 // slots to spare after this one
	case !hasX && len(held) < slots:
		return load // the last free slot
	case hasX:
		if dp.homes[x] >= 2 {
			return half
		}
		return 0
	}
	wait := half
	lambda, pinned := 0.0, false
	for _, a := range held {
		if l.Runs(a) && dp.homes[a] < 2 {
			pinned = true
			lambda += dp.demand.Rate(now, a)
		}
	}
	if pinned && lambda > 0 {
		wait = max(wait, policy.SlotBusyPeriod(lambda, 2*half))
	}
	return load + wait
}

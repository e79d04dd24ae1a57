package planner

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
)

// Bound is one closed-form lower bound on the fleet, with its reasoning.
type Bound struct {
	Name string `json:"name"`
	// Engines is the bound itself (fractional); Need its ceiling.
	Engines float64 `json:"engines"`
	Need    int     `json:"need"`
	// Explain is the arithmetic in one or two sentences.
	Explain string `json:"explain"`
}

// Bounds are the closed-form bounds computed before any simulation.
type Bounds struct {
	Costs Costs `json:"costs"`
	// Compute: engine-seconds of prefill and decode per second at the
	// ideal batch, with the oracle hit rate (fewer engines cannot keep up).
	Compute Bound `json:"compute"`
	// Memory: KV working set (Little's law) over one engine's capacity.
	Memory Bound `json:"memory"`
	// Bandwidth: decode nodes needed to absorb the P/D handoffs at the
	// target link utilisation (disaggregated fleets only), each handoff
	// moving only the prompt blocks its decode node lacks: at least every
	// distinct block of the handed-off prompts once (in conditional mode
	// only of the requests the router hands off whatever the load, and only
	// blocks no request run on a decode node has), and each handed-off
	// prompt's partial last block.
	Bandwidth Bound `json:"bandwidth"`
	// Slots: with LoRA adapters, engines from their --max-loras slots
	// (Input.MaxLoRAs): the adapters that must be resident at once, by the
	// stretches the requests surely run to meet the TTFT target, over the
	// slots per engine (see slotsBound); DecodeSlots is the decode pool's
	// of a disaggregated fleet. Nil when no request names an adapter;
	// without a TTFT target it is no bound (Need 0, Explain says why).
	Slots       *Bound `json:"slots,omitempty"`
	DecodeSlots *Bound `json:"decode_slots,omitempty"`
	// Aggregated is max(compute, memory, slots): where the search starts.
	Aggregated int `json:"aggregated"`
	// TTFTFloor and TPOTFloor are the latencies an idle engine gives at the
	// SLO's quantile (every shared prefix cached): an SLO below them cannot
	// be met by any fleet.
	TTFTFloor time.Duration `json:"ttft_floor_ns"`
	TPOTFloor time.Duration `json:"tpot_floor_ns"`
	// ttftFloors are the per-request floors.
	ttftFloors []time.Duration
}

// netRTT is the router<->engine latency a TTFT pays (two one-way trips of
// the simulator's default 1 ms).
const netRTT = 2 * time.Millisecond

func computeBounds(in *Input, d *Demand) (Bounds, error) {
	p := in.Profile
	capTok := in.kvCapacity()
	b := Bounds{Costs: costs(p, capTok, d, in.SLO)}
	c := b.Costs

	// Context fit.
	limit := min(capTok, p.MaxModelLen)
	if d.MaxContext > limit {
		n := 0
		for i := range d.reqs {
			if d.reqs[i].PromptLen+d.reqs[i].OutputLen > limit {
				n++
			}
		}
		what := "the KV capacity"
		if p.MaxModelLen < capTok {
			what = "the max model length"
		}
		return b, fmt.Errorf("%w: %d request(s) need up to %d tokens of context (prompt + output), more than %s of one engine (%d tokens on %s); raise TP or the KV capacity",
			ErrInfeasible, n, d.MaxContext, what, limit, p.Name)
	}

	// Latency floors.
	b.ttftFloors = make([]time.Duration, len(d.reqs))
	prefill := chunkedPrefiller(p)
	for i := range d.reqs {
		r := &d.reqs[i]
		b.ttftFloors[i] = prefill(r.PromptLen-d.cached[i], d.cached[i]) + netRTT
	}
	if in.SLO.TTFT.Set() {
		q := in.SLO.TTFT.Quantile
		b.TTFTFloor = quantileDur(b.ttftFloors, q)
		if b.TTFTFloor > in.SLO.TTFT.Limit {
			med := p.PrefillTime(d.PromptP50, 0)
			return b, fmt.Errorf("%w: TTFT p%s of %s is below the prefill time of the p%s request on an idle %s engine (%s, even with every shared prefix cached; the median prompt of %d tokens takes %s uncached)",
				ErrInfeasible, qName(q), fmtDur(in.SLO.TTFT.Limit), qName(q), p.Name, fmtDur(b.TTFTFloor), d.PromptP50, fmtDur(med))
		}
	}
	if in.SLO.TPOT.Set() {
		q := in.SLO.TPOT.Quantile
		ctx := quantileContext(d, q)
		b.TPOTFloor = p.DecodeTime(1, ctx)
		if b.TPOTFloor > in.SLO.TPOT.Limit {
			return b, fmt.Errorf("%w: TPOT p%s of %s is below one decode step of a single sequence on %s (%s at the p%s context of %d tokens: reading the weights and its KV takes that long)",
				ErrInfeasible, qName(q), fmtDur(in.SLO.TPOT.Limit), p.Name, fmtDur(b.TPOTFloor), qName(q), ctx)
		}
	}

	// Compute.
	uncached := d.PromptMean * (1 - d.OracleHitRate)
	pfLoad := d.Rate * uncached / c.PrefillTokensPerSec
	dcLoad := d.Rate * d.OutputMean / c.DecodeTokensPerSec
	b.Compute.Name = "compute"
	b.Compute.Engines = pfLoad + dcLoad
	b.Compute.Need = max(1, int(math.Ceil(b.Compute.Engines-1e-9)))
	b.Compute.Explain = fmt.Sprintf("prefill %.2f req/s x %.0f uncached tokens (%.0f-token prompts, %.1f%% oracle hit rate) / %.0f tok/s per engine (%d-token chunks at %s/token) = %.2f engines; "+
		"decode %.2f req/s x %.0f output tokens / %.0f tok/s per engine (batch %d at %s/step, the largest meeting TPOT and KV) = %.2f engines; total %.2f",
		d.Rate, uncached, d.PromptMean, 100*d.OracleHitRate, c.PrefillTokensPerSec, c.Chunk, fmtDurFine(c.PrefillPerToken), pfLoad,
		d.Rate, d.OutputMean, c.DecodeTokensPerSec, c.DecodeBatch, fmtDur(c.DecodeStep), dcLoad, b.Compute.Engines)

	// Memory: requests in flight by Little's law, each holding its
	// uncached prompt and half its output; shared prefixes once.
	e2e := time.Duration(float64(b.meanTTFTFloor())) + time.Duration(d.OutputMean*float64(c.DecodeStep))
	inflight := d.Rate * e2e.Seconds()
	perReq := uncached + d.OutputMean/2
	shared := d.PromptMean * d.OracleHitRate
	ws := inflight*perReq + shared
	b.Memory.Name = "memory"
	b.Memory.Engines = ws / float64(capTok)
	b.Memory.Need = max(1, int(math.Ceil(b.Memory.Engines-1e-9)))
	b.Memory.Explain = fmt.Sprintf("%.1f requests in flight (%.2f req/s x %s mean end-to-end at the ideal batch) x %.0f KV tokens each (uncached prompt + half the output) + %.0f shared-prefix tokens = %.0f tokens / %d tokens per engine = %.2f engines",
		inflight, d.Rate, fmtDur(e2e), perReq, shared, ws, capTok, b.Memory.Engines)

	// Bandwidth for P/D handoffs: a decode engine pulls only the prompt
	// blocks its own prefix cache lacks (disagg.PulledTokens), and in
	// conditional mode only the requests the router hands off move any,
	// so the bytes are the fewest the handoffs can move (pulledFloor) of
	// the requests the router hands off whatever the load (mustHandOff),
	// never more: the bound must err low.
	handed, n := mustHandOff(in, d)
	pulled := float64(d.pulledFloor(p.BlockSize, handed)) / float64(len(d.reqs))
	bytesPerSec := d.Rate * pulled * float64(c.KVBytesPerToken)
	linkBps := in.Fabric.BytesPerSecond() * in.MaxUtilisation
	b.Bandwidth.Name = "bandwidth"
	b.Bandwidth.Engines = bytesPerSec / linkBps
	b.Bandwidth.Need = max(1, int(math.Ceil(b.Bandwidth.Engines-1e-9)))
	who := "P/D (always mode) hands off every request, moving the KV of each prompt's blocks a decode node does not hold"
	if handed != nil {
		who = fmt.Sprintf("P/D in conditional mode surely hands off %d of the %d requests (the router's rule, disagg.Planner.WhatIf, hands them off even with the prefill node saturated; the others may run whole on a decode node and leave their blocks there), moving the KV of their prompts' blocks no decode node can hold",
			n, len(d.reqs))
	}
	b.Bandwidth.Explain = fmt.Sprintf("%s: at least %.0f tokens per request of the %.0f-token mean prompt (every such block crosses the fabric once): %.2f req/s x %.0f tokens x %s/token = %s/s; at %.0f%% of a %g Gbps %s link (%s/s) per decode node that is %.2f decode nodes",
		who, pulled, d.PromptMean, d.Rate, pulled, fmtBytes(float64(c.KVBytesPerToken)), fmtBytes(bytesPerSec), 100*in.MaxUtilisation, in.Fabric.Gbps, in.Fabric.Name, fmtBytes(linkBps), b.Bandwidth.Engines)

	b.Aggregated = max(b.Compute.Need, b.Memory.Need)
	b.Slots, b.DecodeSlots = slotsBound(in, d, b.ttftFloors, false), slotsBound(in, d, b.ttftFloors, true)
	if b.Slots != nil {
		b.Aggregated = max(b.Aggregated, b.Slots.Need)
	}
	return b, nil
}

// saturatedPrefill is the prefill work queued on a saturated prefill node, in
// prompts of the request being placed: its queue then costs far more than
// any prefill on the decode node, so the router's conditional rule hands a
// request off only when nothing else is allowed.
const saturatedPrefill = 16

// mustHandOff returns which requests of d the router's P/D placement
// (disagg.Planner.WhatIf: its mode and conditional rule on its cost model)
// hands off whatever the fleet's load, and how many: nil (all) in always
// mode; in conditional mode those it hands off with the prefill node
// saturated and holding none of the prompt, and the decode node idle and
// holding the most of it any node can (Demand.mostCached): a loaded decode
// node, an emptier decode cache or a prefill node with room only hand off
// more. With the router's default thresholds these are the requests whose
// uncached prompt on that decode node is over max_local_tokens.
func mustHandOff(in *Input, d *Demand) ([]bool, int) {
	if in.PDMode != disagg.ModeConditional {
		return nil, len(d.reqs)
	}
	pd, err := disagg.NewPlanner(disagg.Config{Profile: in.Profile, Links: uniformLinks(in), Mode: in.PDMode})
	if err != nil {
		// Input validation leaves nothing for NewPlanner to refuse;
		// should it, no request is taken to hand off (a floor still).
		return make([]bool, len(d.reqs)), 0
	}
	handed := make([]bool, len(d.reqs))
	n := 0
	for i := range d.reqs {
		r := &d.reqs[i]
		// No adapter slot wait on the idle decode node: a wait there
		// makes running whole dearer and the handoff no dearer (its decode
		// leg waits only what is left of it), so the handoffs the rule
		// makes without one are the fewest.
		handed[i] = pd.HandsOff(disagg.Scenario{PromptTokens: r.PromptLen, CachedDecode: d.mostCached(i, in.Profile.BlockSize),
			PrefillLoad: kvroute.Load{InFlightTokens: saturatedPrefill * r.PromptLen}, Link: in.Fabric})
		if handed[i] {
			n++
		}
	}
	return handed, n
}

func (b *Bounds) meanTTFTFloor() time.Duration {
	if len(b.ttftFloors) == 0 {
		return 0
	}
	var s time.Duration
	for _, t := range b.ttftFloors {
		s += t
	}
	return s / time.Duration(len(b.ttftFloors))
}

// quantileContext is the q-quantile over requests of prompt + output.
func quantileContext(d *Demand, q float64) int {
	v := make([]int, len(d.reqs))
	for i := range d.reqs {
		v[i] = d.reqs[i].PromptLen + d.reqs[i].OutputLen
	}
	return quantileInt(v, q)
}

// hotPrefixes fills d.HotPrefixes: the n most requested shared prefixes,
// their load and the copies the load needs. A prompt is a path of segments
// (a trace's 512-token blocks); a hot prefix is a branch point of the prompt
// tree: a leading run of segments more requests share than share any longer
// run through it (so a system prompt and a long shared document both count,
// but not every block of a shared history). Requests given as token ids or
// text have no segments and no hot prefixes are reported for them.
func hotPrefixes(in *Input, d *Demand, c Costs, n int) {
	d.HotPrefixes = nil
	if !segmentsOnly(d.reqs) || d.Span <= 0 {
		return
	}
	type node struct {
		count, maxChild, tokens int
		first                   int     // the first request through it: ranks ties
		work                    float64 // engine-seconds of the requests through it
	}
	nodes := map[uint64]*node{}
	for i := range d.reqs {
		r := &d.reqs[i]
		work := float64(r.PromptLen-d.cached[i])*c.PrefillPerToken.Seconds() + float64(r.OutputLen)/c.DecodeTokensPerSec
		chain := uint64(0x686f74) ^ adapterRoot(r.Adapter) // an adapter's prefixes are its own
		tokens := 0
		var parent *node
		for _, sg := range r.Segments {
			chain = mix(chain ^ mix(sg.Key) ^ uint64(sg.Len)<<1)
			tokens += sg.Len
			nd := nodes[chain]
			if nd == nil {
				nd = &node{tokens: tokens, first: i}
				nodes[chain] = nd
			}
			nd.count++
			nd.work += work
			if parent != nil {
				parent.maxChild = max(parent.maxChild, nd.count)
			}
			parent = nd
		}
	}
	var hot []*node
	for _, nd := range nodes {
		if nd.count >= 2 && nd.count > nd.maxChild {
			hot = append(hot, nd)
		}
	}
	sort.Slice(hot, func(a, b int) bool {
		if hot[a].count != hot[b].count {
			return hot[a].count > hot[b].count
		}
		if hot[a].tokens != hot[b].tokens {
			return hot[a].tokens > hot[b].tokens
		}
		return hot[a].first < hot[b].first
	})
	for k, nd := range hot {
		if k >= n {
			break
		}
		load := nd.work / d.Span.Seconds()
		d.HotPrefixes = append(d.HotPrefixes, HotPrefix{
			Rank: k + 1, Requests: nd.count, Share: float64(nd.count) / float64(len(d.reqs)),
			Tokens: nd.tokens, Load: load, Copies: max(1, int(math.Ceil(load/in.MaxUtilisation-1e-9))),
		})
	}
}

func fmtBytes(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2f GB", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1f MB", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1f KB", v/1e3)
	default:
		return fmt.Sprintf("%.0f B", v)
	}
}

func fmtDurFine(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.1fus", float64(d)/1e3)
	}
	return fmtDur(d)
}

package disagg

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// Mode says when a request is disaggregated.
type Mode string

// Modes.
const (
	// ModeConditional disaggregates only when it pays (see Conditional).
	ModeConditional Mode = "conditional"
	// ModeAlways disaggregates every request that has a prefill node and a
	// distinct decode node.
	ModeAlways Mode = "always"
	// ModeNever runs every request aggregated on its decode node (the
	// baseline).
	ModeNever Mode = "never"
)

// Conditional configures conditional disaggregation. A request runs
// aggregated on its decode node when
//
//  1. its uncached prompt on the decode node is at most ShortTokens, or
//  2. Dynamo's isl_bounding rule holds: uncached < LocalISL and
//     uncached/prompt < LocalRatio (most of a moderate prompt is cached
//     on the decode node already), or
//  3. the estimated TTFT aggregated (decode node's queue + its prefill of
//     the uncached part) is below the estimated TTFT disaggregated
//     (prefill node's queue + its prefill + the KV transfer with fabric
//     queueing + one decode step) by at least Margin, the aggregated side
//     charged StallWeight x running x its prefill for stalling the decode
//     node's running batch, and the uncached
//     part is at most MaxLocalTokens (a decode node absorbs no prefill so
//     long that it stalls its running batch).
//
// For a LoRA adapter's request both estimates carry its waits for a
// max_lora slot where other adapters' running requests hold them all
// (Plan.AdapterWait): run whole, it waits the decode node's before its
// prefill; disaggregated, the prefill node's before the prefill, and the
// decode leg, which reaches the decode node once the prefill is done, what
// is left of the decode node's before its KV pull. So a decode node whose
// slots are taken sends the prompt to be prefilled elsewhere meanwhile,
// and a prefill node whose slots are taken leaves it to a decode node that
// runs the adapter.
//
// Zero values take the documented defaults; a negative value disables its
// rule.
type Conditional struct {
	// ShortTokens: default 256 (below a few hundred tokens the transfer's
	// setup and the extra hop cost more than the prefill).
	ShortTokens int `json:"short_tokens" yaml:"short_tokens"`
	// LocalISL and LocalRatio: Dynamo's defaults 2048 and 0.7.
	LocalISL   int     `json:"local_isl" yaml:"local_isl"`
	LocalRatio float64 `json:"local_ratio" yaml:"local_ratio"`
	// MaxLocalTokens: default 16384 (about half a second of 8B/H100
	// prefill: a longer one is never run on a decode node).
	MaxLocalTokens int `json:"max_local_tokens" yaml:"max_local_tokens"`
	// Margin is the fraction by which the aggregated estimate must beat the
	// disaggregated one; default 0.1.
	Margin float64 `json:"margin" yaml:"margin"`
	// StallWeight charges the aggregated side for the decode node's running
	// batch: a prefill there delays every running sequence's next token by
	// its duration, and StallWeight x running x prefill time is added to
	// the aggregated estimate before comparing. Default 0.05.
	StallWeight float64 `json:"stall_weight" yaml:"stall_weight"`
}

func (c *Conditional) applyDefaults() {
	setDefault(&c.ShortTokens, 256)
	setDefault(&c.LocalISL, 2048)
	setDefault(&c.LocalRatio, 0.7)
	setDefault(&c.MaxLocalTokens, 16384)
	setDefault(&c.Margin, 0.1)
	setDefault(&c.StallWeight, 0.05)
}

// Config configures a Planner. Zero values take the documented defaults;
// Profile is required.
type Config struct {
	// Profile is the engine model of the pool's engines (a P/D pool serves
	// one model): prefill, decode-step and queue estimates use its
	// step-time function. Required.
	Profile engine.Profile
	// Shape is the KV shape for transfer sizes; default ShapeOf(Profile).
	// Set it from ShapeFromHFConfig to size transfers from a config.json;
	// a Shape without TP takes Profile.TP (the decode engines' ranks each
	// read their share: KVShape).
	Shape KVShape
	// Links is the fabric; default DefaultLinks().
	Links Links
	// Fabric, when set, is shared (e.g. by several models' planners on one
	// cluster); default a new Fabric over Links.
	Fabric *Fabric
	// Mode is conditional (default), always or never.
	Mode Mode
	// Protocol is the engines' handoff protocol, which decides the KV a
	// transfer moves: ProtocolNixl (default), the prompt past the decode
	// node's own prefix-cache hit (PulledTokens: vLLM's NixlConnector
	// pulls only the blocks the decode engine lacks); ProtocolSGLang, the
	// whole prompt (SGLang's decode engines receive every prompt token's
	// KV: their radix cache is off in P/D unless
	// --disaggregation-decode-enable-radix-cache).
	Protocol string
	// Conditional holds the thresholds of ModeConditional.
	Conditional Conditional
	// Decode configures decode placement.
	Decode DecodeParams
	// Prefill is the prefill stage's picker; default the kv-aware policy
	// with parameters derived from Profile (KVAwareParams) and Seed. It
	// sees every candidate, with the ones that cannot prefill marked
	// unhealthy.
	Prefill kvroute.Picker
	// Seed seeds the default prefill picker.
	Seed uint64
	// MeanQueuedTokens is the prompt size assumed for engine-queued
	// requests the router did not send itself; default 1024.
	MeanQueuedTokens int
	// PlanTTL bounds how long an untaken plan is kept; default 1m.
	PlanTTL time.Duration
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	if err := c.Profile.Validate(); err != nil {
		return fmt.Errorf("disagg: config: profile: %w", err)
	}
	if err := c.Shape.Validate(); err != nil {
		return err
	}
	if err := c.Links.Validate(); err != nil {
		return err
	}
	switch c.Mode {
	case ModeConditional, ModeAlways, ModeNever:
	default:
		return fmt.Errorf("disagg: config: mode must be conditional, always or never, got %q", c.Mode)
	}
	switch c.Protocol {
	case ProtocolNixl, ProtocolSGLang:
	default:
		return fmt.Errorf("disagg: config: protocol must be %s or %s, got %q", ProtocolNixl, ProtocolSGLang, c.Protocol)
	}
	if c.Conditional.LocalRatio > 1 || math.IsNaN(c.Conditional.LocalRatio) {
		return fmt.Errorf("disagg: config: conditional.local_ratio must be <= 1, got %v", c.Conditional.LocalRatio)
	}
	if c.Conditional.Margin >= 1 {
		return fmt.Errorf("disagg: config: conditional.margin must be < 1, got %v", c.Conditional.Margin)
	}
	return c.Decode.Validate()
}

func (c *Config) applyDefaults() {
	if c.Shape == (KVShape{}) {
		c.Shape = ShapeOf(c.Profile)
	}
	if c.Shape.TP == 0 {
		c.Shape.TP = c.Profile.TP
	}
	if c.Fabric != nil {
		c.Links = c.Fabric.Links()
	}
	if len(c.Links.Rules) == 0 && c.Links.Default.Gbps == 0 {
		c.Links = DefaultLinks()
	}
	if c.Mode == "" {
		c.Mode = ModeConditional
	}
	if c.Protocol == "" {
		c.Protocol = ProtocolNixl
	}
	c.Conditional.applyDefaults()
	c.Decode.applyDefaults()
	if c.MeanQueuedTokens <= 0 {
		c.MeanQueuedTokens = 1024
	}
	if c.PlanTTL <= 0 {
		c.PlanTTL = time.Minute
	}
}

// Plan is the placement of one request.
type Plan struct {
	// Disaggregated reports a prefill leg on Prefill and a decode leg on
	// Decode; otherwise the request runs whole on Decode (Prefill == Decode).
	Disaggregated bool
	// Prefill and Decode are the chosen endpoints.
	Prefill, Decode *kvroute.Endpoint
	// Reason explains the choice in one line; Rule names the rule that
	// decided (short, cached, cheaper, max_local, cost, always, never,
	// no_prefill, same_node) for metrics.
	Reason string
	Rule   string
	// The estimates behind the choice. PrefillQueue and PrefillTime are on
	// the prefill node; Transfer is the KV handoff to Decode (with fabric
	// queueing) of the prompt tokens Decode does not hold (PulledTokens);
	// DecodeStep the first decode step. AggregatedTTFT and
	// DisaggregatedTTFT are the two sides of the comparison (0 when a side
	// was not possible): queue + AdapterWait + prefill on the decode
	// node, and PrefillQueue + PrefillAdapterWait + PrefillTime +
	// DecodeAdapterWait + Transfer + DecodeStep.
	PrefillQueue, PrefillTime time.Duration
	Transfer                  Estimate
	DecodeStep                time.Duration
	AggregatedTTFT            time.Duration
	DisaggregatedTTFT         time.Duration
	// Stall is the charge for stalling the decode node's running batch
	// with a local prefill (Conditional.StallWeight).
	Stall time.Duration
	// The waits of a LoRA adapter's request (kvroute.Request.Adapter) for
	// a max_lora slot where other adapters' running requests hold every
	// one (vLLM's scheduler skips it until one leaves: half an output of
	// the engine's decode steps, the decode stage's adapter_ms; see
	// DecodePicker), 0 for the base model's. AdapterWait is the decode
	// node's: the request run whole there waits it before its prefill (in
	// AggregatedTTFT). PrefillAdapterWait is the prefill leg's on the
	// prefill node, before its prefill (nothing on a prefill-only node,
	// whose running requests are prefill legs that end within
	// PrefillQueue); DecodeAdapterWait is what is left of AdapterWait when
	// the decode leg reaches the decode node, the prefill done, before its
	// KV pull (both in DisaggregatedTTFT, and kept, as it is, in a plan
	// run whole).
	AdapterWait, PrefillAdapterWait, DecodeAdapterWait time.Duration
	// UncachedPrefill and UncachedDecode are the uncached prompt tokens on
	// the two nodes.
	UncachedPrefill, UncachedDecode int
	// Ticket is the fabric reservation of the transfer (0 when
	// aggregated); release it with Planner.Finish.
	Ticket Ticket
	// Decision is what the router logs: the first leg's endpoint, with one
	// Score carrying the plan's parts followed by the decode picker's
	// per-candidate scores.
	Decision kvroute.Decision
}

// Parts returns the plan's estimates as named parts (milliseconds), as
// they appear in the decision log; a LoRA adapter's slot waits, when not
// zero, as adapter_ms (AdapterWait), prefill_adapter_ms and
// decode_adapter_ms.
func (p *Plan) Parts() []kvroute.Part {
	parts := []kvroute.Part{
		{Name: "queue_ms", Value: ms(p.PrefillQueue)},
		{Name: "prefill_ms", Value: ms(p.PrefillTime)},
		{Name: "transfer_ms", Value: ms(p.Transfer.Total())},
		{Name: "transfer_queue_ms", Value: ms(p.Transfer.Queue)},
		{Name: "decode_step_ms", Value: ms(p.DecodeStep)},
		{Name: "aggregated_ttft_ms", Value: ms(p.AggregatedTTFT)},
		{Name: "disaggregated_ttft_ms", Value: ms(p.DisaggregatedTTFT)},
		{Name: "stall_ms", Value: ms(p.Stall)},
		{Name: "transfer_mb", Value: float64(p.Transfer.Bytes) / 1e6},
		{Name: "uncached_prefill", Value: float64(p.UncachedPrefill)},
		{Name: "uncached_decode", Value: float64(p.UncachedDecode)},
	}
	for _, w := range []struct {
		name string
		d    time.Duration
	}{{"adapter_ms", p.AdapterWait}, {"prefill_adapter_ms", p.PrefillAdapterWait}, {"decode_adapter_ms", p.DecodeAdapterWait}} {
		if w.d != 0 {
			parts = append(parts, kvroute.Part{Name: w.name, Value: ms(w.d)})
		}
	}
	return parts
}

// PolicyName is the policy a P/D pool's decisions name (the Planner's);
// the configured policy places the prefill stage inside the plan.
const PolicyName = "pd"

// Planner places requests on a P/D pool: prefill cache- and load-aware,
// decode by KV headroom, batch and transfer cost, and decides per request
// whether to disaggregate at all. It is a kvroute.Picker for router.Router,
// so the proxy and the simulator run the same placement: Pick plans the
// whole request and returns its first leg (the prefill node, or the decode
// node when aggregated); the caller takes the plan with Take and routes the
// decode leg with the same router after Pin.
//
// Planner does no I/O and never reads the clock. Pick, like every Picker,
// is serialised by the router; Take, Pin, Finish and Unpin may be called
// concurrently from request goroutines.
type Planner struct {
	cfg     Config
	cost    costModel
	prefill kvroute.Picker
	decode  *DecodePicker
	fabric  *Fabric
	pscr    []kvroute.Candidate // scratch, under the router's serialisation

	mu    sync.Mutex // protects plans and pins
	plans map[*kvroute.Request]*planEntry
	pins  map[*kvroute.Request]pin
}

// pin is a Pick instruction for one request: a fixed endpoint (by id, and
// when ep is set the same engine in the same role as ep), or (id "") a
// decode-stage placement with the transfer from the endpoint from.
type pin struct {
	id   string
	ep   *kvroute.Endpoint
	from *kvroute.Endpoint
}

type planEntry struct {
	plan Plan
	at   time.Time
}

var (
	_ kvroute.Picker   = (*Planner)(nil)
	_ kvroute.Learner  = (*Planner)(nil)
	_ kvroute.Releaser = (*Planner)(nil)

	_ router.FirstTokenObserver = (*Planner)(nil)
	_ router.EndpointForgetter  = (*Planner)(nil)
)

// NewPlanner validates cfg (after defaults) and returns a Planner.
func NewPlanner(cfg Config) (*Planner, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pk := cfg.Prefill
	if pk == nil {
		var err error
		pk, err = policy.New(policy.NameKVAware, KVAwareParams(cfg.Profile), cfg.Seed)
		if err != nil {
			return nil, fmt.Errorf("disagg: prefill picker: %w", err)
		}
	}
	fab := cfg.Fabric
	if fab == nil {
		fab = NewFabric(cfg.Links)
	}
	cost := newCostModel(cfg.Profile, cfg.Shape, cfg.MeanQueuedTokens)
	return &Planner{
		cfg: cfg, cost: cost, prefill: pk, fabric: fab,
		decode: &DecodePicker{p: cfg.Decode, cost: cost, fabric: fab, whole: cfg.Protocol == ProtocolSGLang},
		plans:  make(map[*kvroute.Request]*planEntry),
		pins:   make(map[*kvroute.Request]pin),
	}, nil
}

// NewDecodePicker returns a decode picker with the planner's parameters
// and fabric, for callers that place the decode stage alone.
func (p *Planner) NewDecodePicker() *DecodePicker {
	return &DecodePicker{p: p.cfg.Decode, cost: p.cost, fabric: p.fabric, whole: p.cfg.Protocol == ProtocolSGLang}
}

// Fabric returns the planner's fabric.
func (p *Planner) Fabric() *Fabric { return p.fabric }

// Config returns the effective configuration (defaults applied).
func (p *Planner) Config() Config { return p.cfg }

// Pin makes the next Pick for req choose endpoint id (the decode leg of
// req's plan, or a retry's replacement) without planning. Route the decode
// leg with exclude listing every other endpoint, or rely on Pin alone.
// Where the pool's endpoints may change between the plan and the leg, use
// PinEndpoint.
func (p *Planner) Pin(req *kvroute.Request, id string) {
	p.mu.Lock()
	p.pins[req] = pin{id: id}
	p.mu.Unlock()
}

// PinEndpoint is Pin of endpoint e as planned: the next Pick for req
// chooses the candidate of e's ID only if it is still the same engine in
// the same role (URL, data-parallel place and role), else none. An
// endpoint that an endpoint change (router.Router.SetEndpoints) removed
// since, or whose ID it gave to another engine or role, is not available:
// a decode leg is never sent to an engine that cannot decode, or to one
// other than the plan's.
func (p *Planner) PinEndpoint(req *kvroute.Request, e *kvroute.Endpoint) {
	p.mu.Lock()
	p.pins[req] = pin{id: e.ID, ep: e}
	p.mu.Unlock()
}

// PinDecode makes the next Pick for req place only the decode stage, with
// the decode picker and the transfer from endpoint from (a retry of a
// failed decode leg whose KV lease can be reused).
func (p *Planner) PinDecode(req *kvroute.Request, from *kvroute.Endpoint) {
	p.mu.Lock()
	p.pins[req] = pin{from: from}
	p.mu.Unlock()
}

// Unpin drops req's pin if no Pick consumed it: a Route that failed before
// the picker ran (no eligible endpoint) leaves it. Callers that Pin defer
// it, so that a pin (and the request it holds) never outlives its request.
func (p *Planner) Unpin(req *kvroute.Request) {
	p.mu.Lock()
	delete(p.pins, req)
	p.mu.Unlock()
}

// Take returns and forgets the plan the last Pick made for req.
func (p *Planner) Take(req *kvroute.Request) (Plan, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.plans[req]
	if !ok {
		return Plan{}, false
	}
	delete(p.plans, req)
	return e.plan, true
}

// Finish releases a plan's fabric reservation (the transfer is over or
// will not happen). It is idempotent.
func (p *Planner) Finish(t Ticket) { p.fabric.Release(t) }

// ErrNoPlan is returned by Place when the picker made no plan.
var ErrNoPlan = errors.New("disagg: no plan")

// Pick implements kvroute.Picker: it plans req over cands and returns its
// first leg, or the pinned endpoint after Pin.
func (p *Planner) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.mu.Lock()
	pn, pinned := p.pins[req]
	if pinned {
		delete(p.pins, req)
	}
	p.mu.Unlock()
	if pinned && pn.id == "" {
		d := p.decode.PickFrom(now, now, req, cands, pn.from).d
		d.Reason = "decode leg retry: " + d.Reason
		if d.Index >= 0 {
			p.decode.Placed(now, cands[d.Index].Endpoint.ID, req.Adapter)
		}
		return d
	}
	if pinned {
		for i := range cands {
			if c := cands[i].Endpoint; c.ID == pn.id && (pn.ep == nil || c.SameEngine(pn.ep)) && cands[i].Healthy {
				return kvroute.Chose(PolicyName, cands, i, "decode leg of the P/D plan")
			}
		}
		return kvroute.None(PolicyName, fmt.Sprintf("pinned endpoint %q is not available", pn.id))
	}
	plan := p.Plan(now, req, cands)
	if plan.Decision.Index >= 0 {
		// The decode node (or the node running it whole) holds the
		// request's adapter from now on, before its signals show it.
		p.decode.Placed(now, plan.Decode.ID, req.Adapter)
		p.mu.Lock()
		p.purge(now)
		p.plans[req] = &planEntry{plan: plan, at: now}
		p.mu.Unlock()
	}
	return plan.Decision
}

// purge drops plans nobody took within PlanTTL (under p.mu).
func (p *Planner) purge(now time.Time) {
	if len(p.plans) < 64 {
		return
	}
	for r, e := range p.plans {
		if now.Sub(e.at) > p.cfg.PlanTTL {
			delete(p.plans, r)
			p.fabric.Release(e.plan.Ticket)
		}
	}
}

// Observe implements kvroute.Learner by passing the outcomes of prefill
// legs and of requests placed whole on one node on to the prefill picker:
// a decode leg's (Outcome.Decode) TTFT measures the KV pull, not a prefill.
func (p *Planner) Observe(now time.Time, o kvroute.Outcome) {
	if o.Decode {
		return
	}
	if l, ok := p.prefill.(kvroute.Learner); ok {
		l.Observe(now, o)
	}
}

// Release implements kvroute.Releaser: the prefill picker hears the end of
// every flight (its per-request state is keyed by request and released
// once, at the first leg's end).
func (p *Planner) Release(now time.Time, req *kvroute.Request, endpoint string) {
	if rel, ok := p.prefill.(kvroute.Releaser); ok {
		rel.Release(now, req, endpoint)
	}
}

// ForgetEndpoint implements router.EndpointForgetter: the pool's endpoint
// change (router.Router.SetEndpoints) removed endpoint id, or put another
// engine or role under it. The prefill picker forgets it (if it keeps
// state per endpoint: kv-aware's learned rates, a radix tree of what each
// worker holds), and the fabric drops the reservations of transfers into
// or out of its GPU links, so that an engine added later under the ID
// queues behind none of its predecessor's. Transfers between nodes are
// booked on the nodes' ports, which other endpoints share: they stay until
// released or over. Requests in progress keep their plans and pins; a pin
// to the endpoint finds it unavailable (Pin).
func (p *Planner) ForgetEndpoint(id string) {
	if f, ok := p.prefill.(router.EndpointForgetter); ok {
		f.ForgetEndpoint(id)
	}
	p.decode.ForgetEndpoint(id)
	p.fabric.forgetEndpoint(id)
}

// FirstToken implements router.FirstTokenObserver: the prefill picker
// hears when a flight produced its first token (for a disaggregated
// request, when its prefill leg ends), so that an estimate of the prefill
// still queued per endpoint, like kv-aware's, stays exact under P/D.
func (p *Planner) FirstToken(now time.Time, req *kvroute.Request, endpoint string) {
	if o, ok := p.prefill.(router.FirstTokenObserver); ok {
		o.FirstToken(now, req, endpoint)
	}
}

// Plan places req over cands: the prefill stage on a prefill-capable
// candidate (cache- and load-aware picker), the decode stage on a
// decode-capable one (DecodePicker, with the transfer from that prefill
// node), then decides aggregated or disaggregated and, when
// disaggregated, reserves the transfer on the fabric. Decision.Index is
// the first leg's candidate (-1 when nothing can serve the request).
func (p *Planner) Plan(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) Plan {
	// Prefill stage over prefill-capable candidates.
	p.pscr = append(p.pscr[:0], cands...)
	nPrefill := 0
	for i := range p.pscr {
		if !p.pscr[i].Endpoint.Role.CanPrefill() {
			p.pscr[i].Healthy = false
		}
		if p.pscr[i].Healthy {
			nPrefill++
		}
	}
	var pd kvroute.Decision
	pi := -1
	if nPrefill > 0 && p.cfg.Mode != ModeNever {
		pd = p.prefill.Pick(now, req, p.pscr)
		if pd.Index >= 0 && pd.Index < len(cands) && p.pscr[pd.Index].Healthy {
			pi = pd.Index
		} else if pd.Shed {
			d := pd
			d.Policy = PolicyName
			return Plan{Decision: d, Reason: d.Reason}
		}
	}
	var pc *kvroute.Candidate
	var pqueue, pwait, ptime time.Duration
	ready := now
	if pi >= 0 {
		pc = &cands[pi]
		pqueue = p.cost.queue(pc.Load)
		pwait = p.prefillSlotWait(pc, req.Adapter, req.PromptTokens)
		ptime = p.cost.prefill(req.PromptTokens-pc.CachedTokens, pc.CachedTokens, pc.Load)
		ready = now.Add(pqueue + pwait + ptime)
	}
	var pEP *kvroute.Endpoint
	if pc != nil {
		pEP = pc.Endpoint
	}
	dc := p.decode.PickFrom(now, ready, req, cands, pEP)
	if p.cfg.Mode == ModeAlways && pi >= 0 && dc.d.Index == pi {
		// A "both" endpoint won both stages: always means another decode
		// node when there is one.
		healthy := cands[pi].Healthy
		cands[pi].Healthy = false
		if alt := p.decode.PickFrom(now, ready, req, cands, pEP); alt.d.Index >= 0 {
			dc = alt
		}
		cands[pi].Healthy = healthy
	}
	if dc.d.Index < 0 {
		p.unpick(now, req, cands, pi)
		d := dc.d
		d.Policy = PolicyName
		return Plan{Decision: d, Reason: d.Reason}
	}
	dcand := &cands[dc.d.Index]
	plan := Plan{Decode: dcand.Endpoint, Prefill: dcand.Endpoint, DecodeStep: dc.step}
	dwait := slotWait(dcand.Load.LoRA, req.Adapter, p.cfg.Decode.OutputTokens, dc.step)
	aq, ap := p.aggregatedSide(&plan, req.PromptTokens, dcand.CachedTokens, dcand.Load, dwait)
	disagg, rule, reason := false, "", ""
	if pc != nil && pc.Endpoint.ID != dcand.Endpoint.ID {
		plan.UncachedPrefill = max(req.PromptTokens-pc.CachedTokens, 0)
		plan.PrefillQueue, plan.PrefillAdapterWait, plan.PrefillTime, plan.Transfer = pqueue, pwait, ptime, dc.transfer
		disaggregatedSide(&plan)
		disagg, rule, reason = p.decide(req.PromptTokens, &plan)
	} else {
		plan.PrefillQueue, plan.PrefillTime = aq, ap
		switch {
		case p.cfg.Mode == ModeNever:
			rule, reason = "never", "aggregated: mode never"
		case pc == nil && req.Adapter != "":
			rule, reason = "no_prefill", fmt.Sprintf("aggregated: no prefill-capable endpoint serving adapter %q available", req.Adapter)
		case pc == nil:
			rule, reason = "no_prefill", "aggregated: no prefill-capable endpoint available"
		default:
			rule, reason = "same_node", "aggregated: the best prefill node is the decode node"
		}
		reason += adapterNote(&plan)
	}
	first := dc.d.Index
	if disagg {
		plan.Disaggregated, plan.Prefill = true, pc.Endpoint
		first = pi
		plan.Ticket, plan.Transfer = p.fabric.Reserve(now, ready, pc.Endpoint, dcand.Endpoint, plan.Transfer.Bytes)
	} else {
		plan.PrefillQueue, plan.PrefillTime, plan.Transfer = aq, ap, Estimate{}
		if pi != first {
			// The prefill runs on the decode node: the prefill picker's
			// node gets nothing.
			p.unpick(now, req, cands, pi)
		}
	}
	plan.Reason, plan.Rule = reason, rule
	d := kvroute.Chose(PolicyName, cands, first, reason)
	head := kvroute.Score{Endpoint: plan.Prefill.ID + ">" + plan.Decode.ID, Value: ms(plan.AggregatedTTFT), Eligible: true, Parts: plan.Parts()}
	if disagg {
		head.Value = ms(plan.DisaggregatedTTFT)
	}
	d.Scores = append([]kvroute.Score{head}, dc.d.Scores...)
	plan.Decision = d
	return plan
}

// unpick tells the prefill picker that its choice for req, candidate pi
// (none when < 0), is not dispatched: a picker that counts the load it
// placed per request (kv-aware's pending prefill) would otherwise charge
// that node until the request ends.
func (p *Planner) unpick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate, pi int) {
	if pi < 0 {
		return
	}
	if rel, ok := p.prefill.(kvroute.Releaser); ok {
		rel.Release(now, req, cands[pi].Endpoint.ID)
	}
}

// prefillSlotWait is the wait of a prefill leg for LoRA adapter x and
// prompt tokens on prefill candidate c for a max_lora slot
// (Plan.PrefillAdapterWait): slotWait with c's decode step on an engine
// that decodes (a "both" one, whose running requests leave with their
// output); nothing on a prefill-only engine, whose running requests are
// prefill legs that leave with their first token, their prompts within
// the queue estimate already (costModel.queue).
func (p *Planner) prefillSlotWait(c *kvroute.Candidate, x string, prompt int) time.Duration {
	if x == "" || !c.Endpoint.Role.CanDecode() {
		return 0
	}
	return slotWait(c.Load.LoRA, x, p.cfg.Decode.OutputTokens, p.cost.decodeStep(c.Load, prompt))
}

// aggregatedSide fills pl's aggregated estimate for a request of prompt
// tokens run whole on a decode node that holds cached of them under load
// l, where it waits wait for a LoRA adapter's slot: UncachedDecode,
// AdapterWait, AggregatedTTFT (queue + slot wait + prefill there) and
// Stall. It returns the queue and the prefill.
func (p *Planner) aggregatedSide(pl *Plan, prompt, cached int, l kvroute.Load, wait time.Duration) (queue, prefill time.Duration) {
	pl.UncachedDecode = max(prompt-cached, 0)
	queue = p.cost.queue(l)
	prefill = p.cost.prefill(pl.UncachedDecode, cached, l)
	pl.AdapterWait = wait
	pl.AggregatedTTFT = queue + wait + prefill
	if w := p.cfg.Conditional.StallWeight; w > 0 {
		pl.Stall = time.Duration(w * float64(max(l.Running, 0)) * float64(prefill))
	}
	return queue, prefill
}

// disaggregatedSide fills pl's disaggregated estimate from its prefill
// leg's PrefillQueue, PrefillAdapterWait and PrefillTime, the decode
// node's AdapterWait, the Transfer and the DecodeStep: the decode leg
// reaches the decode node when the prefill is done, waits for what is
// left of the slot wait there (DecodeAdapterWait), pulls the KV and runs
// its first step.
func disaggregatedSide(pl *Plan) {
	ready := pl.PrefillQueue + pl.PrefillAdapterWait + pl.PrefillTime
	pl.DecodeAdapterWait = max(pl.AdapterWait-ready, 0)
	pl.DisaggregatedTTFT = ready + pl.DecodeAdapterWait + pl.Transfer.Total() + pl.DecodeStep
}

// Scenario is one request on a prefill node and a decode node, as WhatIf
// prices it. A request for a LoRA adapter (Adapter) waits for a max_lora
// slot as Plan prices it from the loads' LoRA signals (kvroute.Load.LoRA):
// on the decode node (Plan.AdapterWait before a prefill run whole there,
// and what is left of it when the decode leg arrives, DecodeAdapterWait),
// and none on the prefill node, taken to be prefill-only (its running
// prefill legs leave with their first token, within its queue), as the
// capacity planner's (package planner) prefill pools are. The planner's
// replay gives each decode node's load the adapters of the requests it
// runs then.
type Scenario struct {
	// PromptTokens is the request's prompt.
	PromptTokens int
	// Adapter is the LoRA adapter the request is for ("" = the base
	// model, which waits for no slot).
	Adapter string
	// CachedPrefill and CachedDecode are the prompt tokens each node holds
	// in its prefix cache.
	CachedPrefill, CachedDecode int
	// PrefillLoad and DecodeLoad are the nodes' loads (as a Candidate's).
	PrefillLoad, DecodeLoad kvroute.Load
	// Link is the fabric link between the nodes; the transfer is priced on
	// it idle (setup + wire, no queueing).
	Link Link
}

// WhatIf returns the plan Plan would make for s's request, with the same
// cost model, mode and conditional rule (Conditional), without placing
// anything: it books no transfer, consults no picker and keeps no state,
// so it is safe for concurrent use. Prefill and Decode are nil, Ticket
// and Decision zero. Capacity planners (package planner) use it to tell
// which requests the router would hand off, and so the fabric they load.
func (p *Planner) WhatIf(s Scenario) Plan { return p.whatIf(s, true) }

// HandsOff reports whether the router would hand s's request off:
// WhatIf(s).Disaggregated, without writing the plan's reason (text the
// capacity planner's replay, asking for each request of each candidate
// fleet, would throw away). It allocates nothing and is safe for
// concurrent use.
func (p *Planner) HandsOff(s Scenario) bool { return p.whatIf(s, false).Disaggregated }

// whatIf is WhatIf, with the plan's Reason left empty unless reasons.
func (p *Planner) whatIf(s Scenario, reasons bool) Plan {
	var pl Plan
	pl.DecodeStep = p.cost.decodeStep(s.DecodeLoad, s.PromptTokens)
	wait := slotWait(s.DecodeLoad.LoRA, s.Adapter, p.cfg.Decode.OutputTokens, pl.DecodeStep)
	aq, ap := p.aggregatedSide(&pl, s.PromptTokens, s.CachedDecode, s.DecodeLoad, wait)
	if p.cfg.Mode == ModeNever {
		pl.PrefillQueue, pl.PrefillTime = aq, ap
		pl.Rule, pl.Reason = "never", "aggregated: mode never"
		return pl
	}
	cp := min(max(s.CachedPrefill, 0), s.PromptTokens)
	pl.UncachedPrefill = s.PromptTokens - cp
	pl.PrefillQueue = p.cost.queue(s.PrefillLoad)
	pl.PrefillTime = p.cost.prefill(pl.UncachedPrefill, cp, s.PrefillLoad)
	pulled := s.PromptTokens
	if p.cfg.Protocol != ProtocolSGLang {
		pulled = PulledTokens(s.PromptTokens, s.CachedDecode, p.cost.prof.BlockSize)
	}
	if b := p.cost.shape.Bytes(pulled); b > 0 {
		pl.Transfer = Estimate{Link: s.Link, Bytes: b, Setup: s.Link.Setup, Wire: s.Link.wire(float64(b))}
	}
	disaggregatedSide(&pl)
	dis, rule := p.rule(s.PromptTokens, &pl)
	pl.Rule = rule
	if reasons {
		pl.Reason = p.reason(rule, s.PromptTokens, &pl)
	}
	pl.Disaggregated = dis
	if !dis {
		pl.PrefillQueue, pl.PrefillTime, pl.Transfer = aq, ap, Estimate{}
	}
	return pl
}

// decide applies the mode and the conditional rule to a plan with both
// sides estimated, for a request of prompt tokens: whether to hand it off,
// the rule that said so and why.
func (p *Planner) decide(prompt int, pl *Plan) (bool, string, string) {
	dis, rule := p.rule(prompt, pl)
	return dis, rule, p.reason(rule, prompt, pl)
}

// rule is decide without the reason.
func (p *Planner) rule(prompt int, pl *Plan) (bool, string) {
	c := p.cfg.Conditional
	agg, dis := ms(pl.AggregatedTTFT), ms(pl.DisaggregatedTTFT)
	u := pl.UncachedDecode
	switch p.cfg.Mode {
	case ModeAlways:
		return true, "always"
	case ModeNever:
		return false, "never"
	}
	if c.ShortTokens >= 0 && u <= c.ShortTokens {
		return false, "short"
	}
	if c.LocalISL >= 0 && c.LocalRatio >= 0 && prompt > 0 && u < c.LocalISL &&
		float64(u)/float64(prompt) < c.LocalRatio {
		return false, "cached"
	}
	aggCost := agg + ms(pl.Stall)
	if c.MaxLocalTokens >= 0 && u <= c.MaxLocalTokens && aggCost < dis*(1-c.Margin) {
		return false, "cheaper"
	}
	if aggCost < dis*(1-c.Margin) {
		return true, "max_local"
	}
	return true, "cost"
}

// reason is the text of decide's rule for a plan of a request of prompt
// tokens, with the plan's adapterNote.
func (p *Planner) reason(rule string, prompt int, pl *Plan) string {
	return p.ruleText(rule, prompt, pl) + adapterNote(pl)
}

// adapterNote is the part of a plan's reason that gives a LoRA adapter's
// slot waits: "" when there are none.
func adapterNote(pl *Plan) string {
	switch {
	case pl.AdapterWait == 0 && pl.PrefillAdapterWait == 0:
		return ""
	case pl.DisaggregatedTTFT == 0:
		return fmt.Sprintf("; adapter slot wait %.1f ms on the decode node", ms(pl.AdapterWait))
	}
	return fmt.Sprintf("; adapter slot wait %.1f ms on the decode node aggregated, %.1f ms on the prefill node + %.1f ms left for the decode leg disaggregated",
		ms(pl.AdapterWait), ms(pl.PrefillAdapterWait), ms(pl.DecodeAdapterWait))
}

// ruleText is reason without the adapterNote.
func (p *Planner) ruleText(rule string, prompt int, pl *Plan) string {
	c := p.cfg.Conditional
	agg, dis := ms(pl.AggregatedTTFT), ms(pl.DisaggregatedTTFT)
	u := pl.UncachedDecode
	switch rule {
	case "always":
		return fmt.Sprintf("disaggregated: mode always (est. TTFT %.1f ms vs %.1f ms aggregated)", dis, agg)
	case "never":
		return "aggregated: mode never"
	case "short":
		return fmt.Sprintf("aggregated: short uncached prompt (%d <= %d tokens)", u, c.ShortTokens)
	case "cached":
		return fmt.Sprintf("aggregated: mostly cached on the decode node (%d uncached < %d, %.2f < %.2f of %d)",
			u, c.LocalISL, float64(u)/float64(prompt), c.LocalRatio, prompt)
	case "cheaper":
		return fmt.Sprintf("aggregated: cheaper on the decode node (est. TTFT %.1f ms + %.1f ms stall vs %.1f ms with %.1f ms transfer)",
			agg, ms(pl.Stall), dis, ms(pl.Transfer.Total()))
	case "max_local":
		return fmt.Sprintf("disaggregated: %d uncached tokens > max_local_tokens %d (est. TTFT %.1f ms vs %.1f ms + %.1f ms stall aggregated)",
			u, c.MaxLocalTokens, dis, agg, ms(pl.Stall))
	}
	if pl.PrefillAdapterWait != 0 || pl.DecodeAdapterWait != 0 {
		return fmt.Sprintf("disaggregated: est. TTFT %.1f ms (queue %.1f + slot wait %.1f + prefill %.1f + decode slot wait %.1f + transfer %.1f + step %.1f) vs %.1f ms + %.1f ms stall aggregated, %d uncached",
			dis, ms(pl.PrefillQueue), ms(pl.PrefillAdapterWait), ms(pl.PrefillTime), ms(pl.DecodeAdapterWait), ms(pl.Transfer.Total()), ms(pl.DecodeStep), agg, ms(pl.Stall), u)
	}
	return fmt.Sprintf("disaggregated: est. TTFT %.1f ms (queue %.1f + prefill %.1f + transfer %.1f + step %.1f) vs %.1f ms + %.1f ms stall aggregated, %d uncached",
		dis, ms(pl.PrefillQueue), ms(pl.PrefillTime), ms(pl.Transfer.Total()), ms(pl.DecodeStep), agg, ms(pl.Stall), u)
}

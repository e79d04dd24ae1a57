package sim

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workload"
)

// PDConfig configures prefill/decode disaggregation. It applies when the
// fleet has prefill or decode engines (Group.Role); the router's picker is
// then a disagg.Planner (the same placement kvroute serve runs), with the
// configured policy placing the prefill stage. Every engine of such a
// fleet runs the same model (a Config error otherwise), on any hardware.
//
// A disaggregated request runs as the live NixlConnector handoff does: the
// prefill leg (max_tokens 1, KV held) on the prefill engine; its reply
// reaches the router, which routes the decode leg; the decode leg reaches
// the decode engine, which pulls the KV over the fabric (setup + queueing
// behind the transfers in flight on the same ports + wire time, modelled by
// a disagg.Fabric of the transfers that actually happen) of the prompt
// tokens past its own prefix-cache hit (disagg.PulledTokens: a decode
// engine holding the conversation's earlier turns pulls the new turn's
// KV, as vLLM's NixlConnector does); the prefill
// engine then releases the blocks and the decode engine generates with no
// prefill (engine.Request.SkipPrefill). The record's TTFT splits into
// queue and prefill (on the prefill engine), transfer (the router hop and
// the KV pull) and first decode step (decode engine wait and step).
type PDConfig struct {
	// Mode is conditional (default), always or never.
	Mode disagg.Mode
	// Links is the fabric between engines (simulated engines have no
	// labels, so only Default applies unless Labels are set); default one
	// 400 Gb/s RDMA link with 1 ms setup between every pair.
	Links disagg.Links
	// Conditional and Decode are the planner's parameters (zero values:
	// disagg's defaults).
	Conditional disagg.Conditional
	Decode      disagg.DecodeParams
}

// DefaultPDLink is the simulator's default fabric link.
var DefaultPDLink = disagg.Link{Name: "rdma", Gbps: disagg.RDMAGbps, Setup: time.Millisecond}

// pd phases of a disaggregated request.
const (
	pdPrefill  uint8 = iota + 1 // the prefill leg is on its engine
	pdTransfer                  // the router routes the decode leg; the KV moves
	pdDecode                    // the decode leg is on its engine
)

// pdState is a disaggregated request's extra state.
type pdState struct {
	plan       disagg.Plan
	pEng, dEng int32
	pflight    *router.Flight
	dreq       kvroute.Request // the decode leg's routing view
	tokens     []uint32        // the prompt in token mode, for the decode leg
	phase      uint8
	routed     bool // the decode leg was routed (st.eng is then dEng)

	pQueue, pPrefill time.Duration // on the prefill engine
	prefillEnd       time.Duration // the prefill leg finished (KV ready)
	decodeAt         time.Duration // the decode leg reached its engine, KV in place
	cached           int           // prompt tokens the prefill engine had cached
	ticket           disagg.Ticket
}

// pdOn reports whether the fleet has prefill or decode engines.
func (c *Config) pdOn() bool {
	for _, g := range c.Fleet {
		if r, _ := kvroute.ParseRole(g.Role); r != kvroute.RoleBoth {
			return true
		}
	}
	return false
}

// newPlanner builds router replica k's P/D planner.
func (s *simulation) newPlanner(k int, prof engine.Profile) (*disagg.Planner, error) {
	pc := s.cfg.PD
	prefill := s.cfg.Picker // nil: the Planner's own kv-aware
	if prefill == nil && !(s.cfg.Policy == policy.NameKVAware && len(s.cfg.PolicyParams) == 0) {
		p, err := policy.New(s.cfg.Policy, s.cfg.PolicyParams, s.cfg.Seed+uint64(k))
		if err != nil {
			return nil, err
		}
		prefill = p
	}
	return disagg.NewPlanner(disagg.Config{Profile: prof, Links: s.cfg.pdLinks(), Mode: pc.Mode,
		Conditional: pc.Conditional, Decode: pc.Decode, Prefill: prefill, Seed: s.cfg.Seed + uint64(k)})
}

// pdLinks returns the configured fabric or the default.
func (c *Config) pdLinks() disagg.Links {
	if len(c.PD.Links.Rules) == 0 && c.PD.Links.Default.Gbps == 0 {
		return disagg.UniformLinks(DefaultPDLink)
	}
	return c.PD.Links
}

// pdArrive starts a disaggregated plan for request i routed by f. It
// reports false when the plan is aggregated (the normal path runs it).
func (s *simulation) pdArrive(i int32, f *router.Flight) bool {
	st := &s.st[i]
	plan, ok := s.planners[st.rt].Take(&st.rreq)
	if !ok || !plan.Disaggregated {
		return false
	}
	pd := &pdState{plan: plan, pEng: s.byEP[plan.Prefill.ID], dEng: s.byEP[plan.Decode.ID], pflight: f, phase: pdPrefill}
	pd.dreq = st.rreq
	st.pd = pd
	st.flight = f
	st.eng = pd.pEng
	s.engines[pd.pEng].routed++
	s.schedule(s.now+s.cfg.NetLatency, evDeliver, pd.pEng, i)
	return true
}

// pdPrepare adapts request i's engine request to its leg before engine.Add.
func (s *simulation) pdPrepare(i int32) {
	st := &s.st[i]
	pd := st.pd
	switch pd.phase {
	case pdPrefill:
		st.ereq.MaxTokens, st.ereq.HoldKV = 1, true
		pd.tokens = st.tokens
	case pdDecode:
		st.ereq.SkipPrefill = true
	}
}

// pdOutput handles the prefill leg's outputs; it reports false for the
// decode leg's (the normal path).
func (s *simulation) pdOutput(ei int32, i int32, o *engine.Output) bool {
	st := &s.st[i]
	pd := st.pd
	if pd.phase != pdPrefill || ei != pd.pEng {
		return false
	}
	if o.First {
		pd.cached = o.CachedTokens
	}
	if !o.Finished {
		return true
	}
	st.onEngine = false
	pd.pQueue, pd.pPrefill, pd.prefillEnd = o.QueueTime, o.PrefillTime, s.now
	if o.FinishReason == engine.FinishAbort {
		st.status, st.errMsg = http.StatusInternalServerError, "prefill leg aborted by the engine"
		s.schedule(s.now+s.cfg.NetLatency, evDone, ei, i)
		return true
	}
	pd.phase = pdTransfer
	s.schedule(s.now+s.cfg.NetLatency, evPDPrefilled, ei, i)
	return true
}

// pdPrefilled: the prefill reply reached the router; it ends the prefill
// flight, routes the decode leg and starts the KV pull.
func (s *simulation) pdPrefilled(i int32) {
	st := &s.st[i]
	pd := st.pd
	rt := s.rts[st.rt]
	now := wall(s.now)
	rt.FirstToken(now, pd.pflight)
	rt.Done(now, pd.pflight, kvroute.Outcome{PromptTokens: st.rreq.PromptTokens, CachedTokens: -1, TTFT: s.now - st.arrival})
	s.drained(st.rt)
	// The plan's fabric reservation stays until the request ends (finish),
	// as kvroute serve's handoff keeps it until its legs return: plans made
	// while the KV moves queue behind it.
	pl := s.planners[st.rt]
	pl.Pin(&pd.dreq, pd.plan.Decode.ID)
	df, err := rt.Route(now, &pd.dreq, nil)
	if err != nil { // the planned decode node is gone: any decode node
		pl.PinDecode(&pd.dreq, pd.plan.Prefill)
		df, err = rt.Route(now, &pd.dreq, nil)
	}
	if err != nil {
		s.engines[pd.pEng].eng.Release(st.ereq.ID)
		s.wake(pd.pEng)
		st.status, st.errMsg = kvroute.StatusOf(err), err.Error()
		st.flight = nil
		s.finish(i)
		return
	}
	pd.dEng = s.byEP[df.Endpoint.ID]
	st.flight, st.eng, pd.routed = df, pd.dEng, true
	s.engines[pd.dEng].routed++
	// The decode leg reaches its engine, which pulls the KV.
	start := s.now + s.cfg.NetLatency
	// The decode engine's ranks each read their share (disagg.KVShape).
	bytes := disagg.ShapeOf(s.engines[pd.dEng].profile).Bytes(s.pulledTokens(pd.dEng, i))
	tk, est := s.fabric.Reserve(wall(start), wall(start), pd.plan.Prefill, df.Endpoint, bytes)
	if t := est.Total(); t < 0 || start+t < start || start+t > workload.MaxSpan {
		// The link's time for the bytes overflowed time.Duration.
		s.fail(fmt.Errorf("sim: a KV transfer of %d bytes over link %s (%g Gbps) takes longer than the simulator's clock can hold",
			bytes, est.Link.Name, est.Link.Gbps))
		return
	}
	pd.ticket = tk
	s.transfers = append(s.transfers, Transfer{ID: s.reqs[i].ID, Prefill: s.engines[pd.pEng].id, Decode: df.Endpoint.ID,
		Bytes: bytes, Ready: start, Wire: start + est.Setup + est.Queue, End: start + est.Total(), Setup: est.Setup})
	s.schedule(start+est.Total(), evPDTransferred, pd.dEng, i)
}

// pulledTokens returns the prompt tokens of request i whose KV decode
// engine ei pulls: those past its own prefix-cache hit
// (disagg.PulledTokens), as vLLM's NixlConnector pulls only the blocks the
// decode engine's cache lacks. The planner priced the same from the
// router's view of that cache.
func (s *simulation) pulledTokens(ei, i int32) int {
	e := s.engines[ei]
	r := &s.reqs[i]
	st := &s.st[i]
	probe := engine.Request{PromptLen: r.PromptLen, LoRA: r.Adapter}
	switch {
	case s.tokenMode:
		probe.Prompt = st.pd.tokens
	case e.profile.BlockSize == s.blockSize:
		probe.BlockHashes = st.ehashes
	default:
		probe.BlockHashes = r.BlockHashes(e.profile.BlockSize, nil)
	}
	return disagg.PulledTokens(r.PromptLen, e.eng.PrefixHit(&probe), e.profile.BlockSize)
}

// pdTransferred: the KV is on the decode engine: the prefill engine
// releases its blocks and the decode leg joins the decode engine.
func (s *simulation) pdTransferred(i int32) {
	st := &s.st[i]
	pd := st.pd
	s.fabric.Release(pd.ticket)
	s.engines[pd.pEng].eng.Release(st.ereq.ID)
	s.wake(pd.pEng)
	pd.phase, pd.decodeAt = pdDecode, s.now
	st.tokens = pd.tokens
	pd.tokens = nil
	s.deliver(pd.dEng, i)
}

// wake starts an idle engine that has work again.
func (s *simulation) wake(ei int32) {
	e := s.engines[ei]
	if !e.busy && e.eng.HasWork() {
		e.busy = true
		s.schedule(s.now, evStep, ei, -1)
	}
}

// pdRecord fills a disaggregated request's engines and, when it
// completed, its TTFT split. Its prefill leg's engine is PrefillEngine and
// Engine its decode engine, or "" when it failed before the router routed
// its decode leg (a prefill engine there counted in the row's per-engine
// requests and imbalance, which are the decode engines').
func (s *simulation) pdRecord(i int32, rec *Record) {
	st := &s.st[i]
	pd := st.pd
	if pd == nil {
		return
	}
	rec.PrefillEngine = s.engines[pd.pEng].id
	if !pd.routed {
		rec.Engine = ""
	}
	if !rec.OK() {
		return
	}
	rec.CachedTokens = pd.cached // the decode engine's "hit" is the transferred KV
	rec.Queue = pd.pQueue
	rec.Prefill = pd.pPrefill
	rec.Transfer = pd.decodeAt - pd.prefillEnd
	rec.FirstDecode = st.firstAt - pd.decodeAt
}

// pdValidate checks the P/D configuration.
func (c *Config) pdValidate() error {
	if !c.pdOn() {
		return nil
	}
	switch c.PD.Mode {
	case "", disagg.ModeConditional, disagg.ModeAlways, disagg.ModeNever:
	default:
		return fmt.Errorf("sim: config: pd.mode must be conditional, always or never, got %q", c.PD.Mode)
	}
	if err := c.Fleet.oneModel(); err != nil {
		return err
	}
	links := c.pdLinks()
	if err := links.Validate(); err != nil {
		return err
	}
	for _, l := range append([]disagg.Link{links.Default}, linkRules(links)...) {
		if gbps := l.BytesPerSecond() * 8 / 1e9; gbps < MinLinkGbps {
			return fmt.Errorf("sim: config: pd link %s: %g Gbps effective is below the %g Gbps a simulated KV handoff may use (a long prompt's KV would take hours)",
				l.Name, gbps, MinLinkGbps)
		}
	}
	return nil
}

// oneModel reports a P/D fleet whose engines do not all run one model: a
// decode engine generates from the KV cache a prefill engine computed,
// which only the same model (its weights and KV layout) can use. Groups
// may differ in hardware, tensor parallelism, overrides and speed. The
// check is on the KV layout (disagg.KVShape.Layout: layers, KV heads, head
// dim, KV dtype, whatever the TP), what a handoff moves: a model's name differs between a
// built-in profile and the same model read from its config.json. A group
// whose profile does not resolve is left to newSimulation.
func (f Fleet) oneModel() error {
	var first engine.Profile
	firstGroup := -1
	for gi := range f {
		p, err := f[gi].profile()
		if err != nil {
			continue
		}
		if firstGroup < 0 {
			first, firstGroup = p, gi
			continue
		}
		if a, b := disagg.ShapeOf(p).Layout(), disagg.ShapeOf(first).Layout(); a != b {
			return fmt.Errorf("sim: config: a P/D fleet runs one model, but group %d (%s) runs %s (KV %+v) and group %d (%s) %s (KV %+v): a decode engine cannot use another model's KV",
				gi, f[gi].name(), p.Model.Name, a, firstGroup, f[firstGroup].name(), first.Model.Name, b)
		}
	}
	return nil
}

// MinLinkGbps is the slowest P/D fabric link the simulator accepts: below
// it a long prompt's KV takes hours to move, the handoffs queue for years of
// virtual time and the run never ends in practice.
const MinLinkGbps = 0.01

func linkRules(l disagg.Links) []disagg.Link {
	out := make([]disagg.Link, len(l.Rules))
	for i, r := range l.Rules {
		out[i] = r.Link
	}
	return out
}

package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/workload"
)

// Fleet is one planned fleet: aggregated (every engine prefills and decodes)
// or disaggregated (a prefill pool hands KV to a decode pool).
type Fleet struct {
	// Mode is "aggregated" or "disaggregated".
	Mode string `json:"mode"`
	// Method is "simulated" (searched and confirmed with the fleet
	// simulator: the router's own policy and P/D placement code) or
	// "analytical" (queueing on the engine cost model).
	Method string `json:"method"`
	// Meets reports whether the fleet meets the SLO.
	Meets bool `json:"meets"`
	// Engines is the total; Prefill and Decode the pools (0 when aggregated).
	Engines int `json:"engines"`
	Prefill int `json:"prefill,omitempty"`
	Decode  int `json:"decode,omitempty"`
	// GPUs is Engines x TP; CostPerHour GPUs x the GPU-hour cost.
	GPUs        int     `json:"gpus"`
	CostPerHour float64 `json:"cost_per_hour,omitempty"`
	// KVCapacityTokens is one engine's KV capacity; HitRate the expected
	// prefix-cache hit rate (tokens).
	KVCapacityTokens int     `json:"kv_capacity_tokens"`
	HitRate          float64 `json:"hit_rate"`
	TTFT             Latency `json:"ttft"`
	TPOT             Latency `json:"tpot"`
	ThroughputRPS    float64 `json:"throughput_rps"`
	OutputTPS        float64 `json:"output_tps"`
	// Utilisation is the mean engine busy fraction: an engine's busy
	// time (stepping) over the wall time from the first arrival to the
	// last request's end, as sim.EngineResult.Utilisation counts it;
	// PrefillUtil and DecodeUtil are the pools' (disaggregated). The
	// analytical model reads it off its replay (a prefill engine busy with
	// the prefills handed to it, a decode engine with its own prefills and
	// its requests from first to last token; TestPDUtilisationMatchesSimulation),
	// and plans on load, not on it (Input.MaxUtilisation).
	Utilisation float64 `json:"utilisation"`
	PrefillUtil float64 `json:"prefill_util,omitempty"`
	DecodeUtil  float64 `json:"decode_util,omitempty"`
	// DecodeBatch is the mean number of sequences decoding per
	// decode-capable engine.
	DecodeBatch float64 `json:"decode_batch"`
	// SplitFraction is, for a disaggregated fleet, the fraction of
	// requests the router split between the pools (in conditional mode
	// the rest ran whole on a decode node): simulated, of the completed
	// requests; analytical, the expected share (disagg.Planner.WhatIf).
	SplitFraction float64 `json:"split_fraction,omitempty"`
	// Fabric is the KV handoff bandwidth (disaggregated only).
	Fabric *FabricNeed `json:"fabric,omitempty"`
	// Spread is the range of the confirming runs over the seeds (simulated
	// fleets); the figures above are their mean.
	Spread *Spread `json:"spread,omitempty"`
	// Burst is the same fleet at the burst factor; NodeLost with one engine
	// fewer (disaggregated: one fewer in the pool that hurts most).
	Burst    *Headroom `json:"burst,omitempty"`
	NodeLost *Headroom `json:"node_lost,omitempty"`
	Notes    []string  `json:"notes,omitempty"`
}

// Ratio renders the prefill:decode ratio ("-" when aggregated).
func (f *Fleet) Ratio() string {
	if f.Prefill == 0 && f.Decode == 0 {
		return "-"
	}
	return fmt.Sprintf("%d:%d", f.Prefill, f.Decode)
}

// Spread is the range of a fleet's confirming runs over seeds: [min, max].
type Spread struct {
	Seeds    []uint64 `json:"seeds"`
	Requests int      `json:"requests"`
	// TTFT and TPOT are at the SLO quantiles (p99 without a target).
	TTFT          [2]time.Duration `json:"ttft_ns"`
	TTFTP90       [2]time.Duration `json:"ttft_p90_ns"`
	TTFTP99       [2]time.Duration `json:"ttft_p99_ns"`
	TPOT          [2]time.Duration `json:"tpot_ns"`
	ThroughputRPS [2]float64       `json:"throughput_rps"`
}

// Headroom is a planned fleet under a stress: a burst or a lost node.
type Headroom struct {
	// Factor is the rate multiplier (1 for a lost node).
	Factor float64 `json:"factor"`
	// Engines is the fleet size under the stress.
	Engines     int     `json:"engines"`
	Method      string  `json:"method"`
	Utilisation float64 `json:"utilisation"`
	TTFT        Latency `json:"ttft"`
	TPOT        Latency `json:"tpot"`
	Meets       bool    `json:"meets"`
	Note        string  `json:"note,omitempty"`
}

// Candidate is one simulation run of a fleet: a search candidate on the
// search window, or a confirming run.
type Candidate struct {
	// Engines is the fleet size; Prefill and Decode the pools of a
	// disaggregated fleet (0 when aggregated).
	Engines int `json:"engines"`
	Prefill int `json:"prefill,omitempty"`
	Decode  int `json:"decode,omitempty"`
	// Seed, Scale and Requests say what ran: the seed, the rate scale and
	// the requests measured.
	Seed     uint64  `json:"seed"`
	Scale    float64 `json:"rate_scale"`
	Requests int     `json:"requests"`
	TTFT     Latency `json:"ttft"`
	TPOT     Latency `json:"tpot"`
	// Attainment is the fraction of requests meeting every SLO limit;
	// TTFTAttainment and TPOTAttainment the fractions within each limit
	// (the SLO is met when each is at least its target's quantile).
	Attainment     float64 `json:"attainment"`
	TTFTAttainment float64 `json:"ttft_attainment"`
	TPOTAttainment float64 `json:"tpot_attainment"`
	ThroughputRPS  float64 `json:"throughput_rps"`
	OutputTPS      float64 `json:"output_tps"`
	HitRate        float64 `json:"hit_rate"`
	Utilisation    float64 `json:"utilisation"`
	PrefillUtil    float64 `json:"prefill_util,omitempty"`
	DecodeUtil     float64 `json:"decode_util,omitempty"`
	// Disaggregated is the fraction of completed requests the router
	// split between a prefill and a decode engine.
	Disaggregated float64     `json:"disaggregated,omitempty"`
	Fabric        *FabricNeed `json:"fabric,omitempty"`
	Preemptions   int         `json:"preemptions"`
	// Failed counts requests that did not complete (rejected or refused).
	Failed int  `json:"failed"`
	Meets  bool `json:"meets"`

	decodeBatch float64 // mean sequences decoding per decode-capable engine
	cached      []int   // per simulated request: prefix-cached prompt tokens
	// Seconds to first token of the requests over the TTFT limit, spent on
	// the prefill side (queue and prefill on a prefill engine) and on the
	// decode side (handoff and first step, or a whole run on a decode node).
	tailPrefill, tailDecode float64
}

// Result is a capacity plan.
type Result struct {
	// Name labels the scenario ("baseline", "rate-x2", ...).
	Name     string  `json:"name"`
	Profile  string  `json:"profile"`
	Model    string  `json:"model"`
	GPU      string  `json:"gpu"`
	TP       int     `json:"tp"`
	Workload string  `json:"workload"`
	Demand   *Demand `json:"demand"`
	// MaxLoRAs is the engines' --max-loras (Input.MaxLoRAs), given when
	// the workload names LoRA adapters (Demand.Adapters).
	MaxLoRAs  int     `json:"max_loras,omitempty"`
	SLO       SLO     `json:"slo"`
	Burst     float64 `json:"burst"`
	GPUCost   float64 `json:"gpu_hour_cost,omitempty"`
	Policy    string  `json:"policy"`
	PDMode    string  `json:"pd_mode"`
	Seed      uint64  `json:"seed"`
	Bounds    Bounds  `json:"bounds"`
	Simulated string  `json:"simulated"`
	// Candidates and PDCandidates are the search's aggregated and
	// disaggregated fleets on the search window, by size.
	Candidates   []Candidate `json:"candidates,omitempty"`
	PDCandidates []Candidate `json:"pd_candidates,omitempty"`
	// Confirmations are the confirming runs (the chosen fleets with every
	// seed, the fleets one engine smaller, the bursts).
	Confirmations []Candidate `json:"confirmations,omitempty"`
	// Aggregated and Disaggregated are the cheapest simulated fleets of
	// each kind; AggregatedModel and DisaggregatedModel the analytical
	// estimates (queueing on the cost model) next to them.
	Aggregated         Fleet `json:"aggregated"`
	AggregatedModel    Fleet `json:"aggregated_model"`
	Disaggregated      Fleet `json:"disaggregated"`
	DisaggregatedModel Fleet `json:"disaggregated_model"`
	// Cheapest is "aggregated", "disaggregated" or "" when neither meets.
	Cheapest string   `json:"cheapest"`
	Notes    []string `json:"notes,omitempty"`
	// Error says why no fleet meets the SLO (Plan also returns it).
	Error string `json:"error,omitempty"`
	// Verify is a simulation of the whole workload on the planned fleets
	// with a seed the plan did not use (Verify), when run.
	Verify *Verification `json:"verify,omitempty"`
}

// Plan computes the closed-form bounds for in, searches aggregated and
// disaggregated fleets with the simulator (starting at the bound and at the
// analytical P:D estimate) and confirms the chosen ones on the confirming
// workload with several seeds. Bad input wraps ErrBadInput; an SLO that no
// fleet can meet wraps ErrInfeasible with the reason.
func Plan(ctx context.Context, in Input) (*Result, error) {
	res, err := plan(ctx, in)
	if err != nil && res != nil {
		res.Error = err.Error()
	}
	return res, err
}

func plan(ctx context.Context, in Input) (*Result, error) {
	in.defaults()
	if err := in.Validate(); err != nil {
		return nil, err
	}
	p := in.Profile
	d := analyse(in.Workload, p.BlockSize)
	if math.IsInf(d.Rate, 0) {
		return nil, fmt.Errorf("%w: workload: every request arrives at the same instant; no rate to plan for", ErrBadInput)
	}
	res := &Result{Name: "baseline", Profile: p.Name, Model: p.Model.Name, GPU: p.Hardware.Name, TP: p.TP,
		Workload: in.Workload.Name, Demand: d, SLO: in.SLO, Burst: in.Burst, GPUCost: in.GPUHourCost,
		Policy: in.Policy, PDMode: string(in.PDMode), Seed: in.Seed}
	if d.Adapters > 0 {
		res.MaxLoRAs = in.MaxLoRAs
	}
	b, err := computeBounds(&in, d)
	res.Bounds = b
	if err != nil {
		return res, err
	}
	hotPrefixes(&in, d, b.Costs, 5)
	s := newSearch(&in)
	res.Simulated = s.describe()

	// Aggregated: search the window from the analytical fleet at the
	// oracle hit rate (optimistic, so usually at or below the answer, and
	// never below the bound): fleets far below it are overloaded and
	// their runs are the slowest.
	start := b.Aggregated
	if f := newModel(&in, d, b.Costs, d.OracleHitRate, nil, nil).analyticAggregated(b.Aggregated); f.Meets {
		start = max(start, f.Engines)
	}
	aggN, aggNote, err := s.searchAggregated(ctx, start, 1, false)
	if err != nil {
		return res, err
	}
	// The analytical model takes each request's prefix hit from the
	// simulated aggregated fleet (the chosen one, else the largest tried).
	hit, simReqs, simCached := d.OracleHitRate, []workload.Request(nil), []int(nil)
	if ws := s.window(false); len(ws) > 0 {
		wc := ws[len(ws)-1]
		if aggN > 0 {
			wc, _ = s.run(runKey{l: layout{A: aggN}, seed: s.seeds[0], scale: 1})
		}
		hit, simReqs, simCached = wc.HitRate, s.reqs, wc.cached
	}
	m := newModel(&in, d, b.Costs, hit, simReqs, simCached)
	res.AggregatedModel = m.analyticAggregated(b.Aggregated)
	if aggN > 0 {
		wc, _ := s.run(runKey{l: layout{A: aggN}, seed: s.seeds[0], scale: 1})
		res.Notes = append(res.Notes, queueNote(m, aggN, wc))
	}
	decodeFloor := b.Bandwidth.Need
	if b.DecodeSlots != nil {
		decodeFloor = max(decodeFloor, b.DecodeSlots.Need)
	}
	res.DisaggregatedModel = m.analyticDisaggregated(decodeFloor)

	// The aggregated fleet's confirmation beside the disaggregated search:
	// each searches again on the confirming workload from the window's
	// answer, then runs the other seeds, the burst and one node lost.
	var aggConf, pdConf *confirmed
	var pdNote string
	g, gctx := errgroup.WithContext(ctx)
	if aggN > 0 {
		g.Go(func() error {
			n, note, err := s.searchAggregated(gctx, aggN, b.Aggregated, true)
			if err != nil || n == 0 {
				aggNote = note
				return err
			}
			aggConf, err = s.confirmFleet(gctx, layout{A: n})
			return err
		})
	}
	g.Go(func() error {
		start := layout{P: res.DisaggregatedModel.Prefill, D: res.DisaggregatedModel.Decode}
		if start.P < 1 || start.D < 1 {
			start = layout{P: max(1, b.Aggregated/2), D: max(1, b.Bandwidth.Need, b.Aggregated/2)}
		}
		start.D = max(start.D, decodeFloor)
		// A disaggregated fleet far larger than the aggregated one is no
		// answer: the search stops at twice the aggregated fleet.
		maxPD := in.MaxEngines
		if aggN > 0 {
			maxPD = max(2*aggN, aggN+4)
		}
		if n := start.size(); n > maxPD {
			start = layout{P: max(1, start.P*maxPD/n), D: max(1, start.D*maxPD/n)}
		}
		l, note, err := s.searchDisaggregated(gctx, start, maxPD, false)
		if err == nil && l.size() > 0 {
			l, note, err = s.searchDisaggregated(gctx, l, maxPD, true)
		}
		if err != nil || l.size() == 0 {
			pdNote = note
			return err
		}
		pdConf, err = s.confirmFleet(gctx, l)
		return err
	})
	err = g.Wait()
	res.Candidates, res.PDCandidates, res.Confirmations = s.window(false), s.window(true), s.confirmations()
	if err != nil {
		return res, err
	}
	res.Aggregated = Fleet{Mode: "aggregated", Method: "simulated", KVCapacityTokens: in.kvCapacity()}
	if aggConf != nil {
		res.Aggregated = fleetOf(&in, aggConf)
	} else {
		res.Aggregated.Notes = append(res.Aggregated.Notes, aggNote)
	}
	res.Disaggregated = Fleet{Mode: "disaggregated", Method: "simulated", KVCapacityTokens: in.kvCapacity()}
	if pdConf != nil {
		res.Disaggregated = fleetOf(&in, pdConf)
		if fb := res.Disaggregated.Fabric; fb != nil && fb.LinkUtilP99 > 1 {
			res.Disaggregated.Notes = append(res.Disaggregated.Notes, fmt.Sprintf(
				"the p99 one-second KV ingress of a decode node (%s/s) exceeds its %g Gbps link: handoffs queue in bursts (p99 wait %s, in the simulated TTFT); a faster fabric or more decode nodes removes it",
				fmtBytes(fb.PerDecodeP99), fb.Gbps, fmtDur(fb.QueueP99)))
		}
	} else {
		res.Disaggregated.Notes = append(res.Disaggregated.Notes, pdNote)
	}
	for _, f := range []*Fleet{&res.Aggregated, &res.AggregatedModel, &res.Disaggregated, &res.DisaggregatedModel} {
		f.GPUs = f.Engines * p.TP
		f.CostPerHour = float64(f.GPUs) * in.GPUHourCost
	}
	modelNote(res)
	for _, f := range []*Fleet{&res.Aggregated, &res.Disaggregated} {
		if n := edgeNote(f, in.SLO); n != "" {
			f.Notes = append(f.Notes, n)
		}
	}
	switch a, dd := res.Aggregated, res.Disaggregated; {
	case a.Meets && (!dd.Meets || a.GPUs <= dd.GPUs):
		res.Cheapest = "aggregated"
	case dd.Meets:
		res.Cheapest = "disaggregated"
	default:
		return res, fmt.Errorf("%w: no fleet meets %s (aggregated: %s; disaggregated: %s)",
			ErrInfeasible, in.SLO, firstNote(a.Notes), firstNote(dd.Notes))
	}
	return res, nil
}

// queueNote checks the analytical aggregated model against the simulated
// aggregated fleet of n engines (on the window): its TTFT at the SLO's
// quantile (the wait in the replay of the workload's arrivals on the
// engines, model.replay, plus the prefill) and its TPOT. (An M/G/c queue,
// Erlang C with the Allen-Cunneen correction, predicted 851ms at 6 engines
// of llama-3.1-8b-h100 on the conversation trace where the simulator has
// 1.00s, and a Poisson count of the prefills met a TPOT p99 of 29ms at 3
// engines where it has 213ms.)
func queueNote(m *model, n int, wc Candidate) string {
	var mf Fleet
	m.aggregatedAt(&mf, n)
	off := func(mod, sim time.Duration) string {
		if mod == infDur {
			return "it does not meet the load"
		}
		return fmt.Sprintf("%+.0f%%", 100*(float64(mod)-float64(sim))/float64(sim))
	}
	simT, modT := atOr99(wc.TTFT, m.in.SLO.TTFT), atOr99(mf.TTFT, m.in.SLO.TTFT)
	simP, modP := atOr99(wc.TPOT, m.in.SLO.TPOT), atOr99(mf.TPOT, m.in.SLO.TPOT)
	return fmt.Sprintf("analytical aggregated model (the workload's arrivals replayed on the engines) checked against the simulated search window: at %d aggregated engines it predicts TTFT %s and TPOT %s, the simulator %s (%s) and %s (%s)",
		n, fmtLat(modT), fmtLat(modP), fmtLat(simT), off(modT, simT), fmtLat(simP), off(modP, simP))
}

// modelNote says how far the analytical fleets are from the simulated ones.
func modelNote(res *Result) {
	for _, x := range []struct{ sim, mod *Fleet }{{&res.Aggregated, &res.AggregatedModel}, {&res.Disaggregated, &res.DisaggregatedModel}} {
		a, am := x.sim, x.mod
		if !a.Meets || !am.Meets || (am.Engines == a.Engines && am.Ratio() == a.Ratio()) {
			continue
		}
		how := "optimistic"
		if am.Engines > a.Engines {
			how = "pessimistic"
		}
		what := fmt.Sprint(a.Engines, " engines")
		mw := fmt.Sprint(am.Engines, " engines")
		if a.Mode == "disaggregated" {
			what, mw = a.Ratio()+" prefill:decode", am.Ratio()
		}
		res.Notes = append(res.Notes, fmt.Sprintf("the analytical %s model is %s on this workload: it sizes %s where the simulation needs %s (the plan is the simulated fleet)",
			a.Mode, how, mw, what))
	}
}

// fleetOf turns a confirmed fleet into the plan's Fleet: the mean over the
// seeds, their spread, the burst and the worst node lost.
func fleetOf(in *Input, c *confirmed) Fleet {
	mode := "aggregated"
	if c.l.pd() {
		mode = "disaggregated"
	}
	mc := c.mean
	f := Fleet{Mode: mode, Method: "simulated", Meets: c.passes, Engines: c.l.size(), Prefill: c.l.P, Decode: c.l.D,
		KVCapacityTokens: in.kvCapacity(), HitRate: mc.HitRate, TTFT: mc.TTFT, TPOT: mc.TPOT,
		ThroughputRPS: mc.ThroughputRPS, OutputTPS: mc.OutputTPS, Utilisation: mc.Utilisation,
		PrefillUtil: mc.PrefillUtil, DecodeUtil: mc.DecodeUtil, DecodeBatch: mc.decodeBatch,
		Fabric: mc.Fabric, Spread: spread(in, c.seeds)}
	if c.l.pd() {
		f.SplitFraction = mc.Disaggregated
	}
	if c.note != "" {
		f.Notes = append(f.Notes, c.note)
	}
	if bu := c.burst; bu.Engines > 0 {
		f.Burst = &Headroom{Factor: in.Burst, Engines: f.Engines, Method: fmt.Sprintf("simulated (seed %d)", bu.Seed),
			Utilisation: bu.Utilisation, TTFT: bu.TTFT, TPOT: bu.TPOT, Meets: bu.Meets}
	}
	if len(c.lost) == 0 {
		note := "a one-engine fleet has nothing left when its engine is lost"
		if c.l.pd() {
			note = "each pool has one engine: losing it stops the pool"
		}
		f.NodeLost = &Headroom{Factor: 1, Note: note}
		return f
	}
	worst := -1
	for i, nl := range c.lost {
		if worst < 0 || (!nl.Meets && c.lost[worst].Meets) ||
			(nl.Meets == c.lost[worst].Meets && atOr99(nl.TTFT, in.SLO.TTFT) > atOr99(c.lost[worst].TTFT, in.SLO.TTFT)) {
			worst = i
		}
	}
	nl := c.lost[worst]
	f.NodeLost = &Headroom{Factor: 1, Engines: nl.Engines, Method: fmt.Sprintf("simulated (seed %d)", nl.Seed),
		Utilisation: nl.Utilisation, TTFT: nl.TTFT, TPOT: nl.TPOT, Meets: nl.Meets}
	if c.l.pd() {
		f.NodeLost.Note = "one decode engine lost"
		if nl.Prefill < c.l.P {
			f.NodeLost.Note = "one prefill engine lost"
		}
	}
	return f
}

// edgeNote warns when a simulated fleet meets a target by less than 2%:
// another seed or day may miss it.
func edgeNote(f *Fleet, slo SLO) string {
	if !f.Meets || f.Method != "simulated" {
		return ""
	}
	for _, x := range []struct {
		name string
		got  time.Duration
		t    Target
	}{{"TTFT", f.TTFT.AtSLO, slo.TTFT}, {"TPOT", f.TPOT.AtSLO, slo.TPOT}} {
		if x.t.Set() && float64(x.got) > 0.98*float64(x.t.Limit) {
			return fmt.Sprintf("%s p%s is %s against the %s limit, within 2%%: another seed or day may miss it; plan one more engine for a margin",
				x.name, qName(x.t.Quantile), fmtLat(x.got), fmtDur(x.t.Limit))
		}
	}
	return ""
}

func firstNote(n []string) string {
	if len(n) == 0 {
		return "no reason recorded"
	}
	return n[0]
}

// Verification compares a plan's predictions with simulations of the whole
// workload on the planned fleets, with a seed the plan did not use.
type Verification struct {
	Requests int    `json:"requests"`
	Seed     uint64 `json:"seed"`
	// Aggregated and Disaggregated check the plan's fleets of each kind
	// (nil when the plan has none that meets the SLO).
	Aggregated    *Check `json:"aggregated,omitempty"`
	Disaggregated *Check `json:"disaggregated,omitempty"`
}

// Check is one planned fleet's prediction against its verifying run.
type Check struct {
	// Fleet is the engine count or the prefill:decode ratio.
	Fleet         string      `json:"fleet"`
	Engines       int         `json:"engines"`
	TTFT          Latency     `json:"ttft"`
	TPOT          Latency     `json:"tpot"`
	ThroughputRPS float64     `json:"throughput_rps"`
	HitRate       float64     `json:"hit_rate"`
	Fabric        *FabricNeed `json:"fabric,omitempty"`
	Meets         bool        `json:"meets"`
	// Predicted are the plan's figures for the fleet.
	PredictedTTFT          Latency `json:"predicted_ttft"`
	PredictedThroughputRPS float64 `json:"predicted_throughput_rps"`
	// Errors are (simulated - predicted) / predicted: TTFT at the SLO
	// quantile (p99 without a TTFT target), at p90 and p99, and the
	// throughput in requests per second.
	TTFTError       float64 `json:"ttft_error"`
	TTFTP90Error    float64 `json:"ttft_p90_error"`
	TTFTP99Error    float64 `json:"ttft_p99_error"`
	ThroughputError float64 `json:"throughput_error"`
}

// Verify simulates the whole of in.Workload on the plan's aggregated and
// disaggregated fleets (those that meet the SLO) with seed
// in.Seed+in.Seeds, the first seed the plan's confirmation did not use, and
// compares each with the plan's prediction.
func Verify(ctx context.Context, in Input, res *Result) (*Verification, error) {
	in.defaults()
	if res == nil || (!res.Aggregated.Meets && !res.Disaggregated.Meets) {
		return nil, errors.New("planner: verify: the plan has no fleet that meets the SLO")
	}
	in.ConfirmRequests = -1
	s := newSearch(&in)
	seed := in.Seed + uint64(in.Seeds)
	v := &Verification{Requests: len(s.confirm), Seed: seed}
	var keys []runKey
	var fleets []*Fleet
	for _, f := range []*Fleet{&res.Aggregated, &res.Disaggregated} {
		if !f.Meets || f.Method != "simulated" {
			continue
		}
		l := layout{A: f.Engines}
		if f.Mode == "disaggregated" {
			l = layout{P: f.Prefill, D: f.Decode}
		}
		keys = append(keys, runKey{l: l, confirm: true, seed: seed, scale: 1})
		fleets = append(fleets, f)
	}
	got, err := s.runAll(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i, c := range got {
		f := fleets[i]
		ch := &Check{Fleet: keys[i].l.String(), Engines: c.Engines, TTFT: c.TTFT, TPOT: c.TPOT, ThroughputRPS: c.ThroughputRPS,
			HitRate: c.HitRate, Fabric: c.Fabric, Meets: c.Meets, PredictedTTFT: f.TTFT, PredictedThroughputRPS: f.ThroughputRPS}
		rel := func(got, want float64) float64 {
			if want == 0 || want == float64(infDur) || got == float64(infDur) {
				return math.Inf(1)
			}
			return (got - want) / want
		}
		ch.TTFTError = rel(float64(atOr99(c.TTFT, in.SLO.TTFT)), float64(atOr99(f.TTFT, in.SLO.TTFT)))
		ch.TTFTP90Error = rel(float64(c.TTFT.P90), float64(f.TTFT.P90))
		ch.TTFTP99Error = rel(float64(c.TTFT.P99), float64(f.TTFT.P99))
		ch.ThroughputError = rel(c.ThroughputRPS, f.ThroughputRPS)
		if f.Mode == "aggregated" {
			v.Aggregated = ch
		} else {
			v.Disaggregated = ch
		}
	}
	res.Verify = v
	return v, nil
}

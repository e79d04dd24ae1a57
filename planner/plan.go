package planner

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/workload"
)

// Fleet is one planned fleet: aggregated (every engine prefills and decodes)
// or disaggregated (a prefill pool hands KV to a decode pool).
type Fleet struct {
	// Mode is "aggregated" or "disaggregated".
	Mode string `json:"mode"`
	// Method is "simulated" (confirmed by the fleet simulator, the router's
	// own policy code) or "analytical" (queueing on the engine cost model).
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
	// Utilisation is the mean engine busy fraction (disaggregated: the
	// pools' utilisation weighted by size; PrefillUtil the prefill pool's
	// offered load per engine, DecodeUtil the mean decode batch over the
	// largest batch meeting TPOT).
	Utilisation float64 `json:"utilisation"`
	PrefillUtil float64 `json:"prefill_util,omitempty"`
	DecodeUtil  float64 `json:"decode_util,omitempty"`
	// DecodeBatch is the mean number of sequences decoding per decode-capable
	// engine.
	DecodeBatch float64 `json:"decode_batch"`
	// Fabric is the KV handoff bandwidth (disaggregated only).
	Fabric *FabricNeed `json:"fabric,omitempty"`
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

// Candidate is one simulated aggregated fleet of the search.
type Candidate struct {
	Engines int     `json:"engines"`
	TTFT    Latency `json:"ttft"`
	TPOT    Latency `json:"tpot"`
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
	Preemptions    int     `json:"preemptions"`
	// Failed counts requests that did not complete (rejected or refused).
	Failed int  `json:"failed"`
	Meets  bool `json:"meets"`

	decodeBatch float64 // mean sequences decoding per engine
	cached      []int   // per simulated request: prefix-cached prompt tokens
}

// Result is a capacity plan.
type Result struct {
	// Name labels the scenario ("baseline", "rate-x2", ...).
	Name      string  `json:"name"`
	Profile   string  `json:"profile"`
	Model     string  `json:"model"`
	GPU       string  `json:"gpu"`
	TP        int     `json:"tp"`
	Workload  string  `json:"workload"`
	Demand    *Demand `json:"demand"`
	SLO       SLO     `json:"slo"`
	Burst     float64 `json:"burst"`
	GPUCost   float64 `json:"gpu_hour_cost,omitempty"`
	Policy    string  `json:"policy"`
	Seed      uint64  `json:"seed"`
	Bounds    Bounds  `json:"bounds"`
	Simulated string  `json:"simulated"`
	// Candidates are the simulated aggregated fleets, by size.
	Candidates []Candidate `json:"candidates,omitempty"`
	// prefillCands are the simulated prefill pools of the disaggregated
	// fleet, by size.
	prefillCands []prefillCandidate
	// Aggregated and Disaggregated are the cheapest fleets of each kind;
	// AggregatedModel is the analytical estimate next to the simulated one.
	Aggregated      Fleet `json:"aggregated"`
	AggregatedModel Fleet `json:"aggregated_model"`
	Disaggregated   Fleet `json:"disaggregated"`
	// Cheapest is "aggregated", "disaggregated" or "" when neither meets.
	Cheapest string   `json:"cheapest"`
	Notes    []string `json:"notes,omitempty"`
	// Error says why no fleet meets the SLO (Plan also returns it).
	Error string `json:"error,omitempty"`
	// Verify is a simulation of the whole workload on the planned
	// aggregated fleet (Verify), when run.
	Verify *Verification `json:"verify,omitempty"`
}

// Plan computes the closed-form bounds for in, searches aggregated fleets with
// the simulator from the bound up (when in.Simulable), and estimates the
// disaggregated fleet analytically. Bad input wraps ErrBadInput; an SLO that
// no fleet can meet wraps ErrInfeasible with the reason.
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
		Policy: in.Policy, Seed: in.Seed}
	b, err := computeBounds(&in, d)
	res.Bounds = b
	if err != nil {
		return res, err
	}
	hotPrefixes(&in, d, b.Costs, 5)

	// Aggregated: simulate from the bound up.
	hit := d.OracleHitRate
	var simReqs []workload.Request
	var simCached []int
	var srch *search
	if in.Simulable {
		s := newSearch(&in, d)
		srch = s
		res.Simulated = s.describe()
		agg, err := s.run(ctx, b.Aggregated)
		res.Candidates = s.sorted()
		if err != nil {
			return res, err
		}
		res.Aggregated = agg
		hit = agg.HitRate
		if !agg.Meets && len(res.Candidates) > 0 {
			// No fleet passed: take the hit rates of the largest one tried.
			last := res.Candidates[len(res.Candidates)-1]
			hit, simReqs, simCached = last.HitRate, s.reqs, last.cached
		}
		if agg.Meets {
			simReqs, simCached = s.reqs, s.runs[agg.Engines].cached
			// The simulated window has its own rate: scale the fraction of
			// its offered load the fleet sustained to the whole workload.
			if kept := agg.ThroughputRPS / s.offeredRate(); kept > 0 {
				res.Aggregated.ThroughputRPS = d.Rate * min(kept, 1.0)
				res.Aggregated.OutputTPS = res.Aggregated.ThroughputRPS * d.OutputMean
			}
		}
	} else {
		res.Simulated = "nothing: the simulator runs built-in profiles only (" + p.Name + " is not one); every figure is analytical"
		res.Notes = append(res.Notes, "hit rates assume the oracle bound (an infinite shared cache), so they are optimistic")
	}
	m := newModel(&in, d, b.Costs, hit, simReqs, simCached)
	res.AggregatedModel = m.analyticAggregated(b.Aggregated)
	if !in.Simulable {
		res.Aggregated = res.AggregatedModel
		res.Aggregated.Burst, res.Aggregated.NodeLost = m.aggHeadroom(res.Aggregated.Engines)
	}
	if in.Simulable && res.Aggregated.Meets {
		var mf Fleet
		m.aggregatedAt(&mf, res.Aggregated.Engines)
		simT, modT := atOr99(res.Aggregated.TTFT, in.SLO.TTFT), atOr99(mf.TTFT, in.SLO.TTFT)
		if err := math.Abs(float64(modT)-float64(simT)) / float64(simT); modT != infDur && err <= 0.1 {
			res.Notes = append(res.Notes, fmt.Sprintf("queue model checked against the simulation: at %d aggregated engines it predicts TTFT %s, the simulator %s (within 10%%, used uncalibrated)",
				res.Aggregated.Engines, fmtLat(modT), fmtLat(simT)))
		} else {
			k := m.calibrate(res.Aggregated.Engines, simT)
			clamp := ""
			if k <= 0.2501 || k >= 3.999 {
				clamp = " (clamped: the model's error is not only queue variability, so treat the disaggregated TTFT with care)"
			}
			res.Notes = append(res.Notes, fmt.Sprintf("queue model calibrated on the simulation (as Dynamo's planner corrects with observed/expected TTFT): at %d aggregated engines the uncalibrated model predicts TTFT %s, the simulator %s; the queue's variability term is scaled x%.3g for the disaggregated estimate%s",
				res.Aggregated.Engines, fmtLat(modT), fmtLat(simT), k, clamp))
		}
	}
	res.Disaggregated = m.analyticDisaggregated(b.Bandwidth.Need)
	var prefillSim prefillEval
	if srch != nil && res.Disaggregated.Decode > 0 {
		// The prefill pool through the simulator (the decode pool stays
		// analytical: the simulator has no P/D mode).
		analytical := res.Disaggregated.Ratio()
		pcs, pe, err := srch.simulatePrefillPool(ctx, m, &res.Disaggregated)
		if err != nil {
			return res, err
		}
		prefillSim = pe
		res.prefillCands = pcs
		if res.Disaggregated.Method != "analytical" {
			res.Notes = append(res.Notes, fmt.Sprintf("disaggregated: the analytical model alone sized %s; simulating the prefill pool gives %s",
				analytical, res.Disaggregated.Ratio()))
		} else {
			res.Disaggregated.Meets = false
			res.Disaggregated.Notes = append(res.Disaggregated.Notes, fmt.Sprintf("no simulated prefill pool of up to %d engines meets TTFT", in.MaxEngines))
		}
	}
	if res.Disaggregated.Meets {
		var err error
		res.Disaggregated.Burst, res.Disaggregated.NodeLost, err = m.disaggHeadroom(res.Disaggregated.Prefill, res.Disaggregated.Decode, prefillSim)
		if err != nil {
			return res, err
		}
	}
	if fb := res.Disaggregated.Fabric; fb != nil && fb.LinkUtilP99 > 1 {
		res.Disaggregated.Notes = append(res.Disaggregated.Notes, fmt.Sprintf(
			"the p99 one-second KV ingress of a decode node (%s/s) exceeds its %g Gbps link: handoffs queue in bursts beyond the idle-link times shown; a faster fabric or more decode nodes removes it",
			fmtBytes(fb.PerDecodeP99), fb.Gbps))
	}
	if res.Disaggregated.Method == "analytical" {
		hitSource := "each request's prefix hit taken from the simulated aggregated fleet"
		if simReqs == nil {
			hitSource = "prefix hits at the oracle bound (optimistic)"
		}
		res.Disaggregated.Notes = append(res.Disaggregated.Notes,
			"analytical, not simulated: the simulator has no P/D mode; M/G/c queueing on the same engine cost model, "+hitSource)
	} else {
		res.Disaggregated.Notes = append(res.Disaggregated.Notes,
			"prefill pool simulated (the window's requests as prefill-only requests through the router's policy on the prefill engines; TTFT adds each request's KV handoff on an idle link, the first decode step and the extra hop); decode pool, fabric, burst and node-lost figures analytical (the simulator has no P/D mode)")
	}
	for _, f := range []*Fleet{&res.Aggregated, &res.AggregatedModel, &res.Disaggregated} {
		f.GPUs = f.Engines * p.TP
		f.CostPerHour = float64(f.GPUs) * in.GPUHourCost
	}
	if am, a := res.AggregatedModel, res.Aggregated; a.Method == "simulated" && a.Meets && am.Meets && am.Engines != a.Engines {
		how := "optimistic"
		if am.Engines > a.Engines {
			how = "pessimistic"
		}
		part := "the disaggregated column is the same model family"
		if res.Disaggregated.Method != "analytical" {
			part = "the disaggregated decode pool is sized by the same model family"
		}
		res.Notes = append(res.Notes, fmt.Sprintf("the analytical aggregated model is %s on this workload: it sizes %d engines where the simulation needs %d; %s, so read it with that error in mind",
			how, am.Engines, a.Engines, part))
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

func firstNote(n []string) string {
	if len(n) == 0 {
		return "no reason recorded"
	}
	return n[0]
}

// aggHeadroom evaluates the analytical aggregated fleet of n engines under
// the burst factor and with one engine lost.
func (m *model) aggHeadroom(n int) (burst, lost *Headroom) {
	eval := func(rate float64, engines int) *Headroom {
		mm := *m
		mm.rate = rate
		var f Fleet
		ok := mm.aggregatedAt(&f, engines)
		return &Headroom{Factor: rate / m.d.Rate, Engines: engines, Method: "analytical", Utilisation: f.Utilisation,
			TTFT: f.TTFT, TPOT: f.TPOT, Meets: ok || (f.Utilisation < 1 && meets(f.TTFT, m.in.SLO.TTFT) && meets(f.TPOT, m.in.SLO.TPOT))}
	}
	burst = eval(m.rate*m.in.Burst, n)
	if n > 1 {
		lost = eval(m.rate, n-1)
	} else {
		lost = &Headroom{Factor: 1, Note: "a one-engine fleet has nothing left when its engine is lost"}
	}
	return burst, lost
}

// disaggHeadroom evaluates the disaggregated fleet under the burst factor
// and with one engine lost from the pool where it hurts most. With pe the
// prefill pool's TTFT comes from the simulator (decode stays analytical).
func (m *model) disaggHeadroom(pn, dn int, pe prefillEval) (burst, lost *Headroom, err error) {
	eval := func(rate float64, pn, dn int) (*Headroom, error) {
		mm := *m
		mm.rate = rate
		var f Fleet
		mm.disaggAt(&f, pn, dn)
		prefillOK := f.PrefillUtil < 1 && meets(f.TTFT, m.in.SLO.TTFT)
		method := "analytical"
		if pe != nil {
			c, err := pe(pn, rate/m.d.Rate)
			if err != nil {
				return nil, err
			}
			f.TTFT, prefillOK, method = c.ttft, c.meets, "prefill simulated, decode analytical"
			f.Utilisation = (min(1, c.util)*float64(pn) + min(1, f.DecodeUtil)*float64(dn)) / float64(pn+dn)
		}
		ok := prefillOK && f.DecodeBatch <= float64(m.in.Profile.MaxNumSeqs) && meets(f.TPOT, m.in.SLO.TPOT)
		return &Headroom{Factor: rate / m.d.Rate, Engines: pn + dn, Method: method, Utilisation: f.Utilisation,
			TTFT: f.TTFT, TPOT: f.TPOT, Meets: ok}, nil
	}
	if burst, err = eval(m.rate*m.in.Burst, pn, dn); err != nil {
		return nil, nil, err
	}
	var cands []*Headroom
	if pn > 1 {
		h, err := eval(m.rate, pn-1, dn)
		if err != nil {
			return nil, nil, err
		}
		h.Note = "one prefill engine lost"
		cands = append(cands, h)
	}
	if dn > 1 {
		h, err := eval(m.rate, pn, dn-1)
		if err != nil {
			return nil, nil, err
		}
		h.Note = "one decode engine lost"
		cands = append(cands, h)
	}
	if len(cands) == 0 {
		return burst, &Headroom{Factor: 1, Note: "each pool has one engine: losing it stops the pool"}, nil
	}
	lost = cands[0]
	for _, h := range cands[1:] {
		if (!h.Meets && lost.Meets) || (h.Meets == lost.Meets && h.TTFT.AtSLO > lost.TTFT.AtSLO) {
			lost = h
		}
	}
	return burst, lost, nil
}

// Verification compares a plan's aggregated prediction with a simulation of
// the whole workload on the planned fleet (a different seed).
type Verification struct {
	Requests      int     `json:"requests"`
	Engines       int     `json:"engines"`
	Seed          uint64  `json:"seed"`
	TTFT          Latency `json:"ttft"`
	TPOT          Latency `json:"tpot"`
	ThroughputRPS float64 `json:"throughput_rps"`
	HitRate       float64 `json:"hit_rate"`
	Meets         bool    `json:"meets"`
	// TTFTError and ThroughputError are (simulated - predicted) / predicted
	// at the SLO quantile (TTFT) and in requests per second.
	TTFTError       float64 `json:"ttft_error"`
	ThroughputError float64 `json:"throughput_error"`
}

// Verify simulates the whole of in.Workload (no window) on the plan's
// aggregated fleet with seed in.Seed+1 and compares it with the plan's
// prediction.
func Verify(ctx context.Context, in Input, res *Result) (*Verification, error) {
	in.defaults()
	if !in.Simulable {
		return nil, errors.New("planner: verify: the simulator cannot run profile " + in.Profile.Name)
	}
	if res == nil || !res.Aggregated.Meets || res.Aggregated.Engines < 1 {
		return nil, errors.New("planner: verify: the plan has no aggregated fleet")
	}
	s := newSearch(&in, res.Demand)
	s.reqs = in.Workload.Requests
	s.seed = in.Seed + 1
	s.warm = 0
	c, err := s.simulate(ctx, res.Aggregated.Engines, 1)
	if err != nil {
		return nil, err
	}
	v := &Verification{Requests: len(s.reqs), Engines: c.Engines, Seed: s.seed, TTFT: c.TTFT, TPOT: c.TPOT,
		ThroughputRPS: c.ThroughputRPS, HitRate: c.HitRate, Meets: c.Meets}
	pred := res.Aggregated
	if q := pred.TTFT.AtSLO; q > 0 {
		v.TTFTError = (float64(v.TTFT.AtSLO) - float64(q)) / float64(q)
	} else if pred.TTFT.P99 > 0 {
		v.TTFTError = (float64(v.TTFT.P99) - float64(pred.TTFT.P99)) / float64(pred.TTFT.P99)
	}
	if pred.ThroughputRPS > 0 {
		v.ThroughputError = (v.ThroughputRPS - pred.ThroughputRPS) / pred.ThroughputRPS
	}
	res.Verify = v
	return v, nil
}

// simWorkload returns the requests to simulate per candidate: all of them,
// or the first limit requests (a time window from the start, arrival
// offsets kept).
func simWorkload(w *workload.Workload, limit int) []workload.Request {
	if limit < 0 || len(w.Requests) <= limit {
		return w.Requests
	}
	return w.Requests[:limit]
}

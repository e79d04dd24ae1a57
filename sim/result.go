package sim

import (
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/report"
)

// Record is one request's simulated outcome.
type Record struct {
	ID string `json:"id"`
	// Engine is the engine the router chose ("" when rejected by the
	// router, or, for a disaggregated request, when it failed before its
	// decode leg was routed).
	Engine string `json:"engine,omitempty"`
	// Adapter is the LoRA adapter the request named ("" = the base model).
	Adapter string `json:"adapter,omitempty"`
	// Arrival is the request's arrival on the workload's clock, scaled
	// (Config.RateScale divides it).
	Arrival time.Duration `json:"arrival_ns"`
	// Status is 200 for a completed request, 429 when shed, 503 when no
	// endpoint was available, 400 when the engine refused the request.
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`

	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	OutputTokens int `json:"output_tokens"`
	// Preemptions counts the times the engine preempted the request.
	Preemptions int `json:"preemptions,omitempty"`

	// TTFT, as the router sees it, is Held + Network + Queue + Prefill +
	// FirstDecode.
	TTFT time.Duration `json:"ttft_ns"`
	// Held is the time the router held the request in its line before
	// routing it (the queue escape hatch, Config.QueueWait); 0 for most.
	Held time.Duration `json:"held_ns,omitempty"`
	// Network is the router<->engine latency paid before the first token
	// (two one-way trips).
	Network time.Duration `json:"network_ns"`
	// Queue is the time from reaching the engine to the start of its first
	// scheduled step (waiting for a batch slot or KV blocks).
	Queue time.Duration `json:"queue_ns"`
	// Prefill is the time from the start of the first scheduled step to the
	// start of the step that produced the first token (chunked prefill).
	Prefill time.Duration `json:"prefill_ns"`
	// FirstDecode is the duration of the step that produced the first token.
	// For a disaggregated request it is the decode engine's wait and step
	// after the KV arrived.
	FirstDecode time.Duration `json:"first_decode_ns"`
	// Transfer is, for a disaggregated request (P/D), the time from the
	// prefill leg's end to the KV's arrival on the decode engine: the
	// router's hop and the KV pull over the fabric. 0 otherwise.
	Transfer time.Duration `json:"transfer_ns,omitempty"`
	// PrefillEngine is the engine that ran a disaggregated request's
	// prefill leg, whether or not the request completed ("" otherwise);
	// Engine is then its decode engine.
	PrefillEngine string `json:"prefill_engine,omitempty"`
	// TPOT is the mean time per output token after the first.
	TPOT time.Duration `json:"tpot_ns"`
	// E2E is arrival to last token at the router.
	E2E time.Duration `json:"e2e_ns"`
	// TTFTBound is the least TTFT any router could give the request under
	// the model: its prompt, less what a perfect, infinite, fleet-shared
	// cache would hold, prefilled on an idle engine (TTFTBounds), plus the
	// network round trip. 0 when no engine can hold the request.
	TTFTBound time.Duration `json:"ttft_bound_ns,omitempty"`
}

// OK reports whether the request completed.
func (r *Record) OK() bool { return r.Status == http.StatusOK }

// EngineResult is one engine's totals over a run.
type EngineResult struct {
	ID      string `json:"id"`
	Profile string `json:"profile"`
	// Role is both, prefill or decode.
	Role string `json:"role"`
	// Requests is the number of requests routed to the engine.
	Requests int `json:"requests"`
	// Steps is the number of scheduler iterations; Busy their total
	// duration and Utilisation Busy over the run's makespan.
	Steps       int           `json:"steps"`
	Busy        time.Duration `json:"busy_ns"`
	Utilisation float64       `json:"utilisation"`
	Preemptions int           `json:"preemptions"`
	// PrefixHitRate is the engine's own prefix-cache hit rate (tokens).
	PrefixHitRate float64 `json:"prefix_hit_rate"`
}

// Result is a simulation run's outcome.
type Result struct {
	Policy    string  `json:"policy"`
	Fleet     string  `json:"fleet"`
	RateScale float64 `json:"rate_scale"`
	Seed      uint64  `json:"seed"`
	// Records are in workload order.
	Records []Record `json:"records"`
	// Engines are in fleet order.
	Engines []EngineResult `json:"engines"`
	// Makespan is the virtual time from the start of the simulation's
	// clock to the last event: from the workload's time 0, or, when its
	// first request comes more than a minute later, from a minute or so
	// before it (see the package doc). Engine utilisation is over it.
	Makespan time.Duration `json:"makespan_ns"`
	// OracleHitRate is the hit-rate bound: infinite cache, perfect affinity.
	OracleHitRate float64 `json:"oracle_hit_rate"`
	// CompletedOracleHitRate is the same bound over the completed requests
	// only, the ones the report's hit rate counts (OracleHitRate when every
	// request completed); Row reports it next to the hit rate.
	CompletedOracleHitRate float64 `json:"completed_oracle_hit_rate"`
	// TTFTBound is the distribution of the records' TTFT bounds
	// (Record.TTFTBound) over the completed requests, the ones the report's
	// TTFT percentiles count: a floor under those percentiles that no
	// router can beat under the model (no queueing, and the hits of a
	// perfect, infinite, fleet-shared cache). Nearest-rank percentiles, as
	// the report's TTFT; when every request completes it depends on the
	// workload, the fleet and the network latency, not on the policy.
	TTFTBound report.Dist `json:"ttft_bound"`
	// Events is the number of events scheduled (an idle fleet's scrapes up
	// to the next arrival are one per engine and replica; see the package
	// documentation).
	Events int `json:"events"`
	// Timeline is the per-engine utilisation over time: busy fraction, KV
	// usage and queue (waiting + running) per bucket.
	TimelineStep time.Duration `json:"timeline_step_ns"`
	Busy         [][]float64   `json:"busy"`     // [engine][bucket], 0..1
	KVUsage      [][]float64   `json:"kv_usage"` // [engine][bucket], 0..1, mean of scrapes
	Queue        [][]float64   `json:"queue"`    // [engine][bucket], mean of scrapes
	// Transfers are the KV handoffs of a P/D fleet, in the order the
	// router planned them (see FabricLoad).
	Transfers []Transfer `json:"transfers,omitempty"`

	slo SLO
}

// Samples converts the records to the report package's samples.
func (r *Result) Samples() []report.Sample {
	out := make([]report.Sample, len(r.Records))
	for i := range r.Records {
		rec := &r.Records[i]
		s := report.Sample{
			ID:           rec.ID,
			Engine:       rec.Engine,
			Arrival:      rec.Arrival,
			TTFT:         rec.TTFT,
			E2E:          rec.E2E,
			PromptTokens: rec.PromptTokens,
			CachedTokens: rec.CachedTokens,
			OutputTokens: rec.OutputTokens,
			Preemptions:  rec.Preemptions,
		}
		switch rec.Status {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			s.Rejected = true
		default:
			s.Err = "http_" + strconv.Itoa(rec.Status)
		}
		out[i] = s
	}
	return out
}

// Row summarises the run as one report row named by the policy, at load
// (the x-axis of a sweep; usually the rate scale). Its imbalance and
// per-engine counts are over the engines a record names (Record.Engine),
// idle ones included: in a P/D fleet the decode engines, since a prefill
// engine's leg is in Record.PrefillEngine (counted as idle, the prefill
// engines doubled a balanced fleet's imbalance).
func (r *Result) Row(load float64) report.Row {
	names := make([]string, 0, len(r.Engines))
	pre := 0
	for _, e := range r.Engines {
		if e.Role != kvroute.RolePrefill.String() {
			names = append(names, e.ID)
		}
		pre += e.Preemptions
	}
	// Per-request preemption counts are in the samples when the engine
	// reports them; otherwise count the engines' totals.
	perReq := 0
	for i := range r.Records {
		perReq += r.Records[i].Preemptions
	}
	extra := 0
	if perReq == 0 {
		extra = pre
	}
	return report.Summarize(r.Samples(), report.SummaryOptions{
		Name:          r.Policy,
		Load:          load,
		SLO:           report.SLO{TTFT: r.slo.TTFT, TPOT: r.slo.TPOT},
		OracleHitRate: r.CompletedOracleHitRate,
		Engines:       names,
		Preemptions:   extra,
	})
}

// Utilisation returns the timeline as report series: one set for the busy
// fraction and one for KV usage, labelled with run.
func (r *Result) Utilisation(run string) []report.Utilisation {
	mk := func(metric string, v [][]float64) report.Utilisation {
		u := report.Utilisation{Run: run, Metric: metric}
		for i, e := range r.Engines {
			s := report.Series{Name: e.ID}
			for b, y := range v[i] {
				s.X = append(s.X, (time.Duration(b) * r.TimelineStep).Seconds())
				s.Y = append(s.Y, y)
			}
			u.Engines = append(u.Engines, s)
		}
		return u
	}
	return []report.Utilisation{mk("busy", r.Busy), mk("kv_usage", r.KVUsage)}
}

// Breakdown is the mean TTFT split over completed requests.
type Breakdown struct {
	Held, Network, Queue, Prefill, Transfer, FirstDecode time.Duration
}

// TTFTBreakdown returns the mean of each TTFT component over completed
// requests.
func (r *Result) TTFTBreakdown() Breakdown {
	var b Breakdown
	var n time.Duration
	for i := range r.Records {
		rec := &r.Records[i]
		if !rec.OK() {
			continue
		}
		b.Held += rec.Held
		b.Network += rec.Network
		b.Queue += rec.Queue
		b.Prefill += rec.Prefill
		b.FirstDecode += rec.FirstDecode
		b.Transfer += rec.Transfer
		n++
	}
	if n > 0 {
		b.Held /= n
		b.Network /= n
		b.Queue /= n
		b.Prefill /= n
		b.FirstDecode /= n
		b.Transfer /= n
	}
	return b
}

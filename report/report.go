package report

import (
	"fmt"
	"sort"
	"time"
)

// SLO is a service-level objective for goodput. A zero (or negative) limit is
// no limit.
type SLO struct {
	// TTFT is the time-to-first-token limit.
	TTFT time.Duration `json:"ttft_ns"`
	// TPOT is the limit on the request's mean time per output token after
	// the first.
	TPOT time.Duration `json:"tpot_ns"`
}

// String renders the SLO as "ttft<=2s tpot<=100ms" ("none" when unset).
func (s SLO) String() string {
	switch {
	case s.TTFT > 0 && s.TPOT > 0:
		return fmt.Sprintf("ttft<=%v tpot<=%v", s.TTFT, s.TPOT)
	case s.TTFT > 0:
		return fmt.Sprintf("ttft<=%v", s.TTFT)
	case s.TPOT > 0:
		return fmt.Sprintf("tpot<=%v", s.TPOT)
	}
	return "none"
}

// Dist summarises a latency distribution. Percentiles are exact
// (nearest-rank over all samples).
type Dist struct {
	N    int           `json:"n"`
	Mean time.Duration `json:"mean_ns"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
}

// Row is one line of a report: one policy of a simulation, one load point
// of a sweep, or one bench run.
type Row struct {
	// Name is the policy (sim) or run (bench) name.
	Name string `json:"name"`
	// Load is the x-axis value of a sweep (rate scale or offered req/s);
	// 0 when the report is not a sweep.
	Load float64 `json:"load"`

	// Requests counts every request issued but the Interrupted ones;
	// Completed those that finished without error; Rejected those refused
	// by the router or engine (429 or shed), which are not counted in
	// Errors.
	Requests  int            `json:"requests"`
	Completed int            `json:"completed"`
	Rejected  int            `json:"rejected"`
	Errors    map[string]int `json:"errors,omitempty"` // by kind, e.g. connect, http_500, timeout
	// Interrupted counts the requests cut short by the run's interruption
	// (bench: in flight at Ctrl-C), set by the driver: they had no
	// outcome, so they count in none of the above (nor in any figure
	// below).
	Interrupted int `json:"interrupted,omitempty"`
	// Preemptions counts engine preemptions (sim: summed over engines).
	Preemptions int `json:"preemptions"`

	TTFT Dist `json:"ttft"`
	// TPOT is the distribution of per-request mean time per output token,
	// (E2E - TTFT) / (output tokens - 1), over requests with >= 2 tokens.
	TPOT Dist `json:"tpot"`
	// ITL is the distribution of individual inter-token gaps (bench; empty
	// when samples carry none).
	ITL Dist `json:"itl"`
	E2E Dist `json:"e2e"`

	// Duration is the measured span: first arrival to last completion.
	Duration time.Duration `json:"duration_ns"`
	// Throughput in completed requests and output tokens per second.
	ThroughputRPS float64 `json:"throughput_rps"`
	OutputTPS     float64 `json:"output_tps"`
	// Goodput is completed requests per second that met the SLO, and
	// GoodputFrac their share of all requests.
	Goodput     float64 `json:"goodput_rps"`
	GoodputFrac float64 `json:"goodput_frac"`

	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// HitRate is cached over prompt tokens of completed requests that
	// reported cached tokens; -1 when none did.
	HitRate float64 `json:"hit_rate"`
	// OracleHitRate is the infinite-cache bound on HitRate, over the same
	// requests (the completed ones); -1 unknown.
	OracleHitRate float64 `json:"oracle_hit_rate"`
	// Imbalance is the busiest engine's share of requests over the mean
	// share (1 = perfectly even); -1 when engines are unknown.
	Imbalance float64 `json:"imbalance"`
	// Engines holds per-engine counts, by name.
	Engines []EngineStat `json:"engines,omitempty"`

	// TTFTQuantiles are TTFT quantiles in seconds at q = 0, 0.01, ..., 1
	// (101 values) over completed requests, for CDF charts.
	TTFTQuantiles []float64 `json:"ttft_quantiles_s,omitempty"`
}

// ErrorCount returns the total number of errored requests.
func (r *Row) ErrorCount() int {
	n := 0
	for _, v := range r.Errors {
		n += v
	}
	return n
}

// EngineStat is one engine's share of a run.
type EngineStat struct {
	Name         string `json:"name"`
	Requests     int    `json:"requests"`
	PromptTokens int64  `json:"prompt_tokens"`
	CachedTokens int64  `json:"cached_tokens"`
}

// Series is a named line of (X, Y) points.
type Series struct {
	Name string    `json:"name"`
	X    []float64 `json:"x"`
	Y    []float64 `json:"y"`
}

// Utilisation is the per-engine utilisation over time of one run: X in
// seconds since the start, Y a utilisation (0..1, e.g. KV usage or busy
// fraction) or an occupancy count, as Metric says.
type Utilisation struct {
	Run     string   `json:"run"`
	Metric  string   `json:"metric"`
	Engines []Series `json:"engines"`
}

// Report is the one report format of kvroute sim and kvroute bench.
type Report struct {
	// Title heads the HTML report and the table.
	Title string `json:"title"`
	// Source is "sim" or "bench".
	Source string `json:"source"`
	// Workload names the trace file or generator.
	Workload string `json:"workload"`
	// Params records the run's settings (flags), rendered sorted by key.
	Params map[string]string `json:"params,omitempty"`
	SLO    SLO               `json:"slo"`
	// Rows are in display order; a sweep has several rows per Name with
	// different Load values.
	Rows []Row `json:"rows"`
	// Utilisation holds per-engine time series (optional).
	Utilisation []Utilisation `json:"utilisation,omitempty"`
}

// IsSweep reports whether some name has rows at more than one load.
func (r *Report) IsSweep() bool {
	loads := map[string]map[float64]bool{}
	for _, row := range r.Rows {
		if loads[row.Name] == nil {
			loads[row.Name] = map[float64]bool{}
		}
		loads[row.Name][row.Load] = true
		if len(loads[row.Name]) > 1 {
			return true
		}
	}
	return false
}

// names returns the distinct row names in first-appearance order.
func (r *Report) names() []string {
	seen := map[string]bool{}
	var out []string
	for _, row := range r.Rows {
		if !seen[row.Name] {
			seen[row.Name] = true
			out = append(out, row.Name)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Merge returns a report holding the rows and utilisation of reps in order,
// for side-by-side comparison of separate runs (e.g. one bench run per
// routing policy). Title, source, workload and SLO come from the first
// report; a setting that differs between reports is kept as "a | b".
func Merge(reps ...*Report) *Report {
	out := &Report{}
	for i, r := range reps {
		if r == nil {
			continue
		}
		if i == 0 || out.Title == "" {
			out.Title, out.Source, out.Workload, out.SLO = r.Title, r.Source, r.Workload, r.SLO
		}
		for k, v := range r.Params {
			if out.Params == nil {
				out.Params = map[string]string{}
			}
			switch old, ok := out.Params[k]; {
			case !ok:
				out.Params[k] = v
			case old != v:
				out.Params[k] = old + " | " + v
			}
		}
		out.Rows = append(out.Rows, r.Rows...)
		out.Utilisation = append(out.Utilisation, r.Utilisation...)
	}
	return out
}

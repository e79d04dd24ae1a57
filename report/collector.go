package report

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Sample is one request's outcome, as measured by bench or simulated by sim.
type Sample struct {
	ID string
	// Engine is the endpoint that served the request ("" = unknown).
	Engine string
	// Arrival is when the request was issued, as an offset from the run's
	// start.
	Arrival time.Duration
	// TTFT is the time to the first output token (0 when none arrived
	// before a failure; bench: E2E for a completed stream that carried no
	// content); E2E the time to the last byte or the error.
	TTFT, E2E time.Duration
	// ITL are the gaps between successive output tokens (optional).
	ITL []time.Duration
	// PromptTokens and OutputTokens as reported (or known); CachedTokens is
	// the engine's cached prompt tokens, -1 when not reported.
	PromptTokens, CachedTokens, OutputTokens int
	// Preemptions this request suffered (sim).
	Preemptions int
	// Err is the error kind ("" = success), e.g. connect, http_500, timeout,
	// midstream, canceled. Errored requests count in Row.Errors.
	Err string
	// Rejected marks a request refused for load (429 / shed).
	Rejected bool
}

// OK reports whether the request completed.
func (s *Sample) OK() bool { return s.Err == "" && !s.Rejected }

// TPOT returns the mean time per output token after the first, or 0 when
// fewer than two tokens were produced.
func (s *Sample) TPOT() time.Duration {
	if s.OutputTokens < 2 || s.E2E <= s.TTFT {
		return 0
	}
	return (s.E2E - s.TTFT) / time.Duration(s.OutputTokens-1)
}

// Collector gathers samples and computes a Row. It is safe for concurrent
// use.
type Collector struct {
	mu      sync.Mutex // guards samples
	samples []Sample
}

// NewCollector returns an empty collector.
func NewCollector() *Collector { return &Collector{} }

// Add records one sample.
func (c *Collector) Add(s Sample) {
	c.mu.Lock()
	c.samples = append(c.samples, s)
	c.mu.Unlock()
}

// Len returns the number of samples so far.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.samples)
}

// Samples returns a copy of the samples so far.
func (c *Collector) Samples() []Sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.samples)
}

// SummaryOptions configures Collector.Summary.
type SummaryOptions struct {
	// Name and Load label the row.
	Name string
	Load float64
	// SLO defines goodput; zero (or negative) limits are no limit, as
	// SLO.String renders them.
	SLO SLO
	// Duration overrides the measured span (first arrival to last
	// completion) used for rates; 0 = measured.
	Duration time.Duration
	// OracleHitRate is copied to the row; set it to -1 when unknown (the
	// zero value means a bound of 0).
	OracleHitRate float64
	// Engines lists every engine of the fleet so that idle ones count in the
	// imbalance; nil = the engines seen in samples.
	Engines []string
	// Preemptions is added to the samples' own preemption counts (for
	// callers that count them per engine).
	Preemptions int
}

// Summary computes the row for the samples so far.
func (c *Collector) Summary(o SummaryOptions) Row {
	return Summarize(c.Samples(), o)
}

// Summarize computes a row from samples (see Collector.Summary).
func Summarize(samples []Sample, o SummaryOptions) Row {
	row := Row{Name: o.Name, Load: o.Load, Requests: len(samples), OracleHitRate: o.OracleHitRate,
		Preemptions: o.Preemptions, HitRate: -1, Imbalance: -1}
	var ttft, tpot, e2e, itl []time.Duration
	var first, last time.Duration = math.MaxInt64, 0
	var good int
	var hitPrompt int64
	engines := map[string]*EngineStat{}
	for _, name := range o.Engines {
		engines[name] = &EngineStat{Name: name}
	}
	for i := range samples {
		s := &samples[i]
		first = min(first, s.Arrival)
		last = max(last, s.Arrival+s.E2E)
		row.Preemptions += s.Preemptions
		if s.Engine != "" {
			es := engines[s.Engine]
			if es == nil {
				es = &EngineStat{Name: s.Engine}
				engines[s.Engine] = es
			}
			es.Requests++
			es.PromptTokens += int64(s.PromptTokens)
			es.CachedTokens += int64(max(s.CachedTokens, 0))
		}
		switch {
		case s.Rejected:
			row.Rejected++
			continue
		case s.Err != "":
			if row.Errors == nil {
				row.Errors = map[string]int{}
			}
			row.Errors[s.Err]++
			continue
		}
		row.Completed++
		row.PromptTokens += int64(s.PromptTokens)
		row.OutputTokens += int64(s.OutputTokens)
		if s.CachedTokens >= 0 {
			row.CachedTokens += int64(s.CachedTokens)
			hitPrompt += int64(s.PromptTokens)
		}
		ttft = append(ttft, s.TTFT)
		e2e = append(e2e, s.E2E)
		tp := s.TPOT()
		if s.OutputTokens >= 2 {
			tpot = append(tpot, tp)
		}
		itl = append(itl, s.ITL...)
		if (o.SLO.TTFT <= 0 || s.TTFT <= o.SLO.TTFT) && (o.SLO.TPOT <= 0 || tp <= o.SLO.TPOT) {
			good++
		}
	}
	if hitPrompt > 0 {
		row.HitRate = float64(row.CachedTokens) / float64(hitPrompt)
	}
	row.TTFT = dist(ttft)
	row.TPOT = dist(tpot)
	row.E2E = dist(e2e)
	row.ITL = dist(itl)
	if len(ttft) > 0 {
		row.TTFTQuantiles = make([]float64, 101)
		for q := range row.TTFTQuantiles {
			row.TTFTQuantiles[q] = quantile(ttft, float64(q)/100).Seconds() // ttft is sorted by dist
		}
	}
	row.Duration = o.Duration
	if row.Duration <= 0 && len(samples) > 0 {
		row.Duration = last - first
	}
	if secs := row.Duration.Seconds(); secs > 0 {
		row.ThroughputRPS = float64(row.Completed) / secs
		row.OutputTPS = float64(row.OutputTokens) / secs
		row.Goodput = float64(good) / secs
	}
	if row.Requests > 0 {
		row.GoodputFrac = float64(good) / float64(row.Requests)
	}
	if len(engines) > 0 {
		names := sortedKeys(engines)
		maxReq, total := 0, 0
		for _, n := range names {
			es := engines[n]
			row.Engines = append(row.Engines, *es)
			maxReq = max(maxReq, es.Requests)
			total += es.Requests
		}
		if total > 0 {
			row.Imbalance = float64(maxReq) / (float64(total) / float64(len(names)))
		}
	}
	return row
}

// dist sorts d in place and summarises it.
func dist(d []time.Duration) Dist {
	if len(d) == 0 {
		return Dist{}
	}
	slices.Sort(d)
	var sum float64
	for _, v := range d {
		sum += float64(v)
	}
	return Dist{
		N:    len(d),
		Mean: time.Duration(sum / float64(len(d))),
		P50:  quantile(d, 0.50),
		P90:  quantile(d, 0.90),
		P99:  quantile(d, 0.99),
		Max:  d[len(d)-1],
	}
}

// quantile returns the nearest-rank q-quantile of sorted d: the smallest
// value with at least q of the samples at or below it (q=0 gives the min).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q*float64(len(sorted)) - 1e-9))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}

// Percentile returns the exact nearest-rank q-quantile (0..1) of d without
// modifying it.
func Percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return quantile(s, q)
}

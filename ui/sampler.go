package ui

import (
	"maps"
	"math"
	"slices"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Metric names the dashboard reads from the router's Gatherer.
const (
	metricRequests = "kvroute_requests_total"
	metricTTFB     = "kvroute_upstream_ttfb_seconds"
	// metricPDStage's stage="ttfb" is the TTFB of a P/D model's requests
	// (arrival to the client's first byte): the P/D handoff does not
	// observe metricTTFB.
	metricPDStage = "kvroute_pd_stage_seconds"
)

// window is the number of chart points the TTFT quantiles and the hit rate
// of one point are computed over (a sliding window, so that a quiet second
// does not blank the chart).
const window = 5

// hist is a cumulative histogram: counts[i] observations <= bounds[i]
// (the last bound may be +Inf).
type hist struct {
	bounds []float64
	counts []float64
}

func (h hist) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// add adds o to h over the union of their bounds. At a bound one side
// lacks, that side's count is its count at its next lower bound (a
// cumulative histogram's lower estimate), so the sum stays cumulative:
// histograms of different metrics (kvroute_upstream_ttfb_seconds and
// kvroute_pd_stage_seconds) have different bounds.
func (h hist) add(o hist) hist {
	if len(h.bounds) == 0 {
		return hist{bounds: slices.Clone(o.bounds), counts: slices.Clone(o.counts)}
	}
	if len(o.bounds) == 0 {
		return h
	}
	bounds := slices.Concat(h.bounds, o.bounds)
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	out := hist{bounds: bounds, counts: make([]float64, len(bounds))}
	for i, b := range bounds {
		out.counts[i] = h.at(b) + o.at(b)
	}
	return out
}

// at is h's cumulative count at bound b: the count of the highest bound
// <= b, 0 below the first.
func (h hist) at(b float64) float64 {
	i, ok := slices.BinarySearch(h.bounds, b)
	if ok {
		return h.counts[i]
	}
	if i == 0 {
		return 0
	}
	return h.counts[i-1]
}

// sub returns h - prev; when any bucket went down (the counters were reset,
// e.g. a new router) the whole of h is the delta, as Prometheus' rate()
// treats a reset.
func (h hist) sub(prev hist) hist {
	out := hist{bounds: slices.Clone(h.bounds), counts: slices.Clone(h.counts)}
	if len(prev.bounds) != len(h.bounds) {
		return out
	}
	for i := range out.counts {
		d := h.counts[i] - prev.counts[i]
		if d < 0 || prev.bounds[i] != h.bounds[i] {
			return hist{bounds: slices.Clone(h.bounds), counts: slices.Clone(h.counts)}
		}
		out.counts[i] = d
	}
	return out
}

// quantile estimates the q-quantile like histogram_quantile: linear
// interpolation within the bucket holding the rank; a rank in the +Inf
// bucket reports the highest finite bound. It returns NaN for an empty
// histogram.
func (h hist) quantile(q float64) float64 {
	total := h.total()
	if total <= 0 || math.IsNaN(q) {
		return math.NaN()
	}
	q = min(max(q, 0), 1)
	rank := q * total
	lo, below := 0.0, 0.0
	for i, b := range h.bounds {
		c := h.counts[i]
		if c >= rank && c > below {
			if math.IsInf(b, 1) {
				return lo
			}
			return lo + (b-lo)*(rank-below)/(c-below)
		}
		if !math.IsInf(b, 1) {
			lo = b
		}
		below = c
	}
	return lo
}

// gathered is what the dashboard reads from the router's metrics, per
// series (keyed by its labels, seriesKey): the answered requests and the
// TTFB histograms. Deltas are taken per series, as Prometheus' rate() does:
// the proxy deletes a removed endpoint's series, and their sums going down
// is no counter reset.
type gathered struct {
	ok       bool
	requests map[string]float64 // kvroute_requests_total
	ttfb     map[string]hist    // kvroute_upstream_ttfb_seconds
	pdTTFB   map[string]hist    // kvroute_pd_stage_seconds{stage="ttfb"}
}

// seriesKey identifies a series of a family by its label pairs (sorted by
// name in a gathered family).
func seriesKey(m *dto.Metric) string {
	var b []byte
	for _, l := range m.GetLabel() {
		b = append(b, l.GetName()...)
		b = append(b, 0xff)
		b = append(b, l.GetValue()...)
		b = append(b, 0xfe)
	}
	return string(b)
}

// counterDelta is what the series of cur added since prev: a series new
// since prev, or that went down (reset: a new child after its deletion),
// counts whole; a series gone since prev (deleted) counts nothing.
func counterDelta(cur, prev map[string]float64) float64 {
	var d float64
	for k, v := range cur {
		if old, ok := prev[k]; ok && v >= old {
			v -= old
		}
		d += v
	}
	return d
}

// histDelta is the observations the series of cur added since prev, merged
// (hist.sub treats a series' reset as counterDelta does).
func histDelta(cur, prev map[string]hist) hist {
	var d hist
	for _, k := range slices.Sorted(maps.Keys(cur)) {
		d = d.add(cur[k].sub(prev[k]))
	}
	return d
}

// readFamilies extracts the dashboard's figures from gathered families,
// summing over every label combination. A P/D model's TTFB is its
// kvroute_pd_stage_seconds{stage="ttfb"} (from the request's start, the
// prefill leg included); its decode engines' kvroute_upstream_ttfb_seconds
// (from the decode leg's start) is left out, not counted twice.
func readFamilies(mfs []*dto.MetricFamily) gathered {
	g := gathered{requests: map[string]float64{}, ttfb: map[string]hist{}, pdTTFB: map[string]hist{}}
	pd := map[string]bool{} // models with P/D stage timings
	for _, mf := range mfs {
		if mf.GetName() == metricPDStage {
			for _, m := range mf.GetMetric() {
				pd[labelValue(m, "model")] = true
			}
		}
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricRequests:
			g.ok = true
			for _, m := range mf.GetMetric() {
				g.requests[seriesKey(m)] = m.GetCounter().GetValue()
			}
		case metricTTFB:
			g.ok = true
			for _, m := range mf.GetMetric() {
				if !pd[labelValue(m, "model")] {
					g.ttfb[seriesKey(m)] = histFromDTO(m.GetHistogram())
				}
			}
		case metricPDStage:
			for _, m := range mf.GetMetric() {
				if labelValue(m, "stage") == "ttfb" {
					g.pdTTFB[seriesKey(m)] = histFromDTO(m.GetHistogram())
				}
			}
		}
	}
	return g
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func histFromDTO(h *dto.Histogram) hist {
	if h == nil {
		return hist{}
	}
	var out hist
	for _, b := range h.GetBucket() {
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.counts = append(out.counts, float64(b.GetCumulativeCount()))
	}
	if n := len(out.bounds); n == 0 || !math.IsInf(out.bounds[n-1], 1) {
		out.bounds = append(out.bounds, math.Inf(1))
		out.counts = append(out.counts, float64(h.GetSampleCount()))
	}
	return out
}

// endpointSample is one endpoint's engine counters and load at a sample.
type endpointSample struct {
	model, id     string
	scraped       bool
	hits, queries float64
	load          float64
}

// point is one chart point: the figures over the interval since the
// previous point (throughput) or over the last window points (TTFT, hit
// rate).
type point struct {
	at           time.Time
	dt           float64           // seconds since the previous point
	requests     float64           // answered in the interval
	ttfb         hist              // TTFB observations in the interval
	hits, tokens float64           // engine prefix-cache hit and query tokens in the interval
	load         map[epRef]float64 // waiting + running per endpoint
}

// epRef names an endpoint of a model: endpoint IDs are unique per model
// only, and two models' pools may share an ID (or an engine).
type epRef struct{ model, id string }

// mark labels the start of a run on the charts.
type mark struct {
	at    time.Time
	label string
}

// Totals are the figures since the last Mark.
type Totals struct {
	// Label is the last Mark's label.
	Label string
	// Since is the last Mark's time.
	Since time.Time
	// Requests answered by the router (any status).
	Requests int
	// TTFTP50 and TTFTP99 are estimated from the router's upstream TTFB
	// histogram (0 before any request).
	TTFTP50, TTFTP99 time.Duration
	// HitRate is the engines' prefix-cache hit rate in tokens (-1 when the
	// engines reported no prompt tokens yet).
	HitRate float64
}

// sampler keeps the chart history. Not safe for concurrent use: the
// Dashboard's mutex guards it.
type sampler struct {
	history int
	last    time.Time
	prev    gathered
	prevEP  map[epRef]endpointSample
	points  []point
	marks   []mark
	eps     []epRef          // endpoints in the points, in first-seen order
	n       uint64           // points taken
	seenAt  map[epRef]uint64 // each of eps' last point (n then)

	// totals since the last mark
	label        string
	since        time.Time
	requests     float64
	ttfb         hist
	hits, tokens float64
}

func (s *sampler) init(history int) {
	s.history = history
	s.prevEP = map[epRef]endpointSample{}
	s.seenAt = map[epRef]uint64{}
}

func (s *sampler) mark(now time.Time, label string) {
	s.marks = append(s.marks, mark{at: now, label: label})
	if len(s.marks) > 50 {
		s.marks = s.marks[1:]
	}
	s.label, s.since = label, now
	s.requests, s.ttfb, s.hits, s.tokens = 0, hist{}, 0, 0
}

// add takes a point at now from the gathered metrics and the endpoints'
// counters. Counter resets (a new router, a restarted engine) count from
// zero.
func (s *sampler) add(now time.Time, g gathered, eps []endpointSample) {
	p := point{at: now, load: make(map[epRef]float64, len(eps))}
	if !s.last.IsZero() {
		p.dt = now.Sub(s.last).Seconds()
	}
	if g.ok {
		// Per series: a removed endpoint's deleted series is no reset of
		// the others. The first point only sets the baselines: the
		// router's counters hold its whole life before it.
		if !s.last.IsZero() {
			p.requests = counterDelta(g.requests, s.prev.requests)
			p.ttfb = histDelta(g.ttfb, s.prev.ttfb).add(histDelta(g.pdTTFB, s.prev.pdTTFB))
		}
		s.prev = g
	}
	s.n++
	for _, e := range eps {
		ref := epRef{e.model, e.id}
		if _, ok := s.seenAt[ref]; !ok {
			s.eps = append(s.eps, ref)
		}
		s.seenAt[ref] = s.n
		p.load[ref] = e.load
		if !e.scraped {
			continue
		}
		if old, ok := s.prevEP[ref]; ok {
			dh, dq := e.hits-old.hits, e.queries-old.queries
			if dh < 0 || dq < 0 { // engine restarted
				dh, dq = e.hits, e.queries
			}
			p.hits += dh
			p.tokens += dq
		}
		s.prevEP[ref] = e
	}
	for k := range s.prevEP {
		if s.seenAt[k] != s.n { // not in this sample
			delete(s.prevEP, k)
		}
	}
	if !s.last.IsZero() { // the first point only sets the baselines
		s.requests += p.requests
		s.ttfb = s.ttfb.add(p.ttfb)
		s.hits += p.hits
		s.tokens += p.tokens
	}
	s.last = now
	s.points = append(s.points, p)
	if len(s.points) > s.history {
		s.points = slices.Delete(s.points, 0, len(s.points)-s.history)
		// Endpoints gone from every point kept (they left their pool)
		// leave the chart: with discovery churn they would pile up.
		oldest := s.n - uint64(len(s.points)) + 1
		s.eps = slices.DeleteFunc(s.eps, func(ref epRef) bool {
			if s.seenAt[ref] < oldest {
				delete(s.seenAt, ref)
				return true
			}
			return false
		})
	}
}

func (s *sampler) totals() Totals {
	t := Totals{Label: s.label, Since: s.since, Requests: int(s.requests), HitRate: -1}
	if q := s.ttfb.quantile(0.5); !math.IsNaN(q) {
		t.TTFTP50 = time.Duration(q * float64(time.Second))
		t.TTFTP99 = time.Duration(s.ttfb.quantile(0.99) * float64(time.Second))
	}
	if s.tokens > 0 {
		t.HitRate = s.hits / s.tokens
	}
	return t
}

// series is the chart data sent to the page: parallel arrays, null where a
// point has no data.
type series struct {
	T       []int64    `json:"t"` // unix ms
	TTFTP50 []*float64 `json:"ttft_p50_ms"`
	TTFTP99 []*float64 `json:"ttft_p99_ms"`
	RPS     []*float64 `json:"rps"`
	Hit     []*float64 `json:"hit_rate"`
	// Load is waiting + running by model, then endpoint ID; Order lists
	// each model's endpoint IDs, sorted. (Endpoint IDs are unique per model
	// only.)
	Load  map[string]map[string][]*float64 `json:"load"`
	Order map[string][]string              `json:"endpoints"`
	Marks []markJSON                       `json:"marks"`
}

type markJSON struct {
	T     int64  `json:"t"`
	Label string `json:"label"`
}

func num(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func (s *sampler) series() series {
	out := series{Load: map[string]map[string][]*float64{}, Order: map[string][]string{}, Marks: []markJSON{}}
	for _, ref := range s.eps {
		out.Order[ref.model] = append(out.Order[ref.model], ref.id)
		if out.Load[ref.model] == nil {
			out.Load[ref.model] = map[string][]*float64{}
		}
	}
	for _, ids := range out.Order {
		sort.Strings(ids)
	}
	n := len(s.points)
	for i, p := range s.points {
		out.T = append(out.T, p.at.UnixMilli())
		var h hist
		var hits, tokens float64
		for j := max(0, i-window+1); j <= i; j++ {
			h = h.add(s.points[j].ttfb)
			hits += s.points[j].hits
			tokens += s.points[j].tokens
		}
		out.TTFTP50 = append(out.TTFTP50, num(h.quantile(0.5)*1000))
		out.TTFTP99 = append(out.TTFTP99, num(h.quantile(0.99)*1000))
		rps := math.NaN()
		if p.dt > 0 {
			rps = p.requests / p.dt
		}
		out.RPS = append(out.RPS, num(rps))
		hr := math.NaN()
		if tokens > 0 {
			hr = hits / tokens
		}
		out.Hit = append(out.Hit, num(hr))
		for _, ref := range s.eps {
			v, ok := p.load[ref]
			byID := out.Load[ref.model]
			if _, exists := byID[ref.id]; !exists {
				byID[ref.id] = make([]*float64, i, n)
			}
			if ok {
				byID[ref.id] = append(byID[ref.id], num(v))
			} else {
				byID[ref.id] = append(byID[ref.id], nil)
			}
		}
	}
	for _, m := range s.marks {
		out.Marks = append(out.Marks, markJSON{T: m.at.UnixMilli(), Label: m.label})
	}
	return out
}

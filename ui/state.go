package ui

import (
	"time"

	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/router"
)

// state is the body of GET <prefix>/api/state.
type state struct {
	Now      int64       `json:"now"` // unix ms
	Title    string      `json:"title"`
	Admin    adminJSON   `json:"admin"`
	Policies []string    `json:"policies"`
	Models   []modelJSON `json:"models"`
	Series   series      `json:"series"`
	Totals   totalsJSON  `json:"totals"`
	Run      *runJSON    `json:"run,omitempty"`
}

type adminJSON struct {
	Enabled bool   `json:"enabled"`
	Path    string `json:"path"`
}

type modelJSON struct {
	Name      string                  `json:"name"`
	Policy    string                  `json:"policy"`
	Endpoints []endpointJSON          `json:"endpoints"`
	Decisions []router.DecisionRecord `json:"decisions"`
}

// endpointJSON is one row of the fleet table.
type endpointJSON struct {
	ID             string   `json:"id"`
	URL            string   `json:"url"`
	Role           string   `json:"role"`
	Healthy        bool     `json:"healthy"`
	ActiveOK       bool     `json:"active_ok"`
	Ejected        bool     `json:"ejected"`
	Ejections      int      `json:"ejections"`
	Waiting        int      `json:"waiting"`
	Running        int      `json:"running"`
	KVUsage        float64  `json:"kv_usage"`
	HitRate        *float64 `json:"hit_rate"` // null = unknown
	SignalAgeMS    *float64 `json:"signal_age_ms"`
	Stale          bool     `json:"stale"`
	InFlight       int      `json:"in_flight"`
	InFlightTokens int      `json:"in_flight_tokens"`
	Scrapes        uint64   `json:"scrapes"`
	ScrapeErrors   uint64   `json:"scrape_errors"`
	LastError      string   `json:"last_error,omitempty"`
	Precise        bool     `json:"precise"`
}

type totalsJSON struct {
	Label    string   `json:"label"`
	Requests int      `json:"requests"`
	TTFTP50  *float64 `json:"ttft_p50_ms"`
	TTFTP99  *float64 `json:"ttft_p99_ms"`
	HitRate  *float64 `json:"hit_rate"`
}

type runJSON struct {
	Title       string    `json:"title"`
	Workload    string    `json:"workload"`
	Phase       int       `json:"phase"`
	Phases      int       `json:"phases"`
	Policy      string    `json:"policy"`
	RemainingMS int64     `json:"remaining_ms"`
	Done        bool      `json:"done"`
	Rows        []rowJSON `json:"rows"`
}

// rowJSON is one policy's result in the comparison.
type rowJSON struct {
	Name      string  `json:"name"`
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Errors    int     `json:"errors"`
	TTFTP50   float64 `json:"ttft_p50_ms"`
	TTFTP99   float64 `json:"ttft_p99_ms"`
	E2EP50    float64 `json:"e2e_p50_ms"`
	RPS       float64 `json:"throughput_rps"`
	OutputTPS float64 `json:"output_tps"`
	HitRate   float64 `json:"hit_rate"`
	Oracle    float64 `json:"oracle_hit_rate"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func rowFrom(r report.Row) rowJSON {
	return rowJSON{
		Name: r.Name, Requests: r.Requests, Completed: r.Completed, Errors: r.ErrorCount(),
		TTFTP50: ms(r.TTFT.P50), TTFTP99: ms(r.TTFT.P99), E2EP50: ms(r.E2E.P50),
		RPS: r.ThroughputRPS, OutputTPS: r.OutputTPS, HitRate: r.HitRate, Oracle: r.OracleHitRate,
	}
}

// buildState assembles the page's state; the caller holds d.mu.
func (d *Dashboard) buildState(now time.Time) state {
	st := state{
		Now:      now.UnixMilli(),
		Title:    "kvroute",
		Admin:    adminJSON{Enabled: d.opts.AdminEnabled, Path: d.opts.AdminPath},
		Policies: d.opts.Policies,
		Models:   []modelJSON{},
		Series:   d.s.series(),
	}
	for _, name := range d.opts.Source.Models() {
		rt := d.opts.Source.Router(name)
		if rt == nil {
			continue
		}
		m := modelJSON{Name: name, Policy: rt.Policy(), Decisions: rt.Decisions(d.opts.Decisions)}
		if m.Decisions == nil {
			m.Decisions = []router.DecisionRecord{}
		}
		for _, es := range rt.Status(now) {
			m.Endpoints = append(m.Endpoints, endpointFrom(now, es))
		}
		st.Models = append(st.Models, m)
	}
	t := d.s.totals()
	st.Totals = totalsJSON{Label: t.Label, Requests: t.Requests}
	if t.Requests > 0 && t.TTFTP50 > 0 {
		st.Totals.TTFTP50, st.Totals.TTFTP99 = num(ms(t.TTFTP50)), num(ms(t.TTFTP99))
	}
	if t.HitRate >= 0 {
		st.Totals.HitRate = num(t.HitRate)
	}
	if d.opts.Run != nil {
		rs := d.opts.Run()
		if rs.Title != "" {
			st.Title = rs.Title
		}
		rj := &runJSON{Title: rs.Title, Workload: rs.Workload, Phase: rs.Phase, Phases: rs.Phases, Policy: rs.Policy,
			RemainingMS: rs.Remaining.Milliseconds(), Done: rs.Done, Rows: []rowJSON{}}
		for _, r := range rs.Rows {
			rj.Rows = append(rj.Rows, rowFrom(r))
		}
		st.Run = rj
	}
	return st
}

func endpointFrom(now time.Time, es router.EndpointStatus) endpointJSON {
	l := es.Load
	e := endpointJSON{
		ID: es.ID, URL: es.URL, Role: es.Role, Healthy: es.Healthy, ActiveOK: es.ActiveOK,
		Ejected: es.EjectedUntil.After(now), Ejections: es.Ejections,
		Waiting: l.Waiting, Running: l.Running, KVUsage: l.KVUsage, Stale: l.Stale,
		InFlight: l.InFlight, InFlightTokens: l.InFlightTokens,
		Scrapes: es.Signals.Scrapes, ScrapeErrors: es.Signals.Errors, LastError: es.Signals.LastError,
		Precise: es.Precise,
	}
	if l.PrefixHitRate >= 0 {
		e.HitRate = num(l.PrefixHitRate)
	}
	if !l.ObservedAt.IsZero() {
		e.SignalAgeMS = num(ms(l.Age(now)))
	}
	return e
}

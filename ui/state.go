package ui

import (
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
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
	Name string `json:"name"`
	// Policy names what places the model's requests, as its decisions
	// (/debug/decisions) name it: "pd" for a P/D pool.
	Policy string `json:"policy"`
	// PD marks a disaggregated (prefill/decode) pool; PrefillPolicy is then
	// the configured policy, which places the prefill stage inside the P/D
	// plan. The admin API does not switch a P/D pool's policy.
	PD            bool                    `json:"pd"`
	PrefillPolicy string                  `json:"prefill_policy,omitempty"`
	Endpoints     []endpointJSON          `json:"endpoints"`
	Decisions     []router.DecisionRecord `json:"decisions"`
}

// endpointJSON is one row of the fleet table.
type endpointJSON struct {
	ID             string   `json:"id"`
	URL            string   `json:"url"`
	Role           string   `json:"role"`
	Healthy        bool     `json:"healthy"`
	ActiveOK       bool     `json:"active_ok"`
	Ejected        bool     `json:"ejected"`
	Absent         bool     `json:"absent"` // a data-parallel rank its server does not have
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
	Label string `json:"label"`
	// Source says where the figures come from: "router" (requests the
	// router answered, TTFT estimated from its TTFB histogram buckets, the
	// engines' prefix-cache counters) or "client" (a demo phase's row so
	// far: the load generator's own measurements, as the comparison shows
	// them).
	Source   string   `json:"source"`
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
	Name      string   `json:"name"`
	Requests  int      `json:"requests"`
	Completed int      `json:"completed"`
	Errors    int      `json:"errors"`
	TTFTP50   *float64 `json:"ttft_p50_ms"` // null = no request completed
	TTFTP99   *float64 `json:"ttft_p99_ms"`
	E2EP50    *float64 `json:"e2e_p50_ms"`
	RPS       float64  `json:"throughput_rps"`
	OutputTPS float64  `json:"output_tps"`
	HitRate   *float64 `json:"hit_rate"`        // null = unknown (the engines reported no cached tokens)
	Oracle    *float64 `json:"oracle_hit_rate"` // null = unknown
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rowFrom is a report row for the comparison. A latency with no completed
// request behind it is null ("–"), not 0: a policy whose requests all
// failed showed TTFT "0.0 ms" and was marked the best.
func rowFrom(r report.Row) rowJSON {
	row := rowJSON{
		Name: r.Name, Requests: r.Requests, Completed: r.Completed, Errors: r.ErrorCount(),
		RPS: r.ThroughputRPS, OutputTPS: r.OutputTPS, HitRate: fraction(r.HitRate), Oracle: fraction(r.OracleHitRate),
	}
	if r.TTFT.N > 0 {
		row.TTFTP50, row.TTFTP99 = num(ms(r.TTFT.P50)), num(ms(r.TTFT.P99))
	}
	if r.E2E.N > 0 {
		row.E2EP50 = num(ms(r.E2E.P50))
	}
	return row
}

// fraction is a rate for the page: nil (null, shown as "–") when negative,
// report.Row's "unknown".
func fraction(v float64) *float64 {
	if v < 0 {
		return nil
	}
	return num(v)
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
		// Empty lists, not null (a pool without endpoints, discovered and
		// none ready): the page reads them as arrays.
		m := modelJSON{Name: name, Policy: rt.Policy(), Decisions: rt.Decisions(d.opts.Decisions), Endpoints: []endpointJSON{}}
		if m.Decisions == nil {
			m.Decisions = []router.DecisionRecord{}
		}
		for _, es := range rt.Status(now) {
			m.Endpoints = append(m.Endpoints, endpointFrom(now, es))
			// A pool with a prefill or decode endpoint is disaggregated
			// (config.Model.Disaggregated): the P/D planner places its
			// requests and names itself in their decisions.
			if r, err := kvroute.ParseRole(es.Role); err == nil && r != kvroute.RoleBoth {
				m.PD = true
			}
		}
		if m.PD {
			m.Policy, m.PrefillPolicy = disagg.PolicyName, rt.Policy()
		}
		st.Models = append(st.Models, m)
	}
	t := d.s.totals()
	st.Totals = totalsJSON{Label: t.Label, Source: "router", Requests: t.Requests}
	if t.Requests > 0 && t.TTFTP50 > 0 {
		st.Totals.TTFTP50, st.Totals.TTFTP99 = num(ms(t.TTFTP50)), num(ms(t.TTFTP99))
	}
	if t.HitRate >= 0 {
		st.Totals.HitRate = num(t.HitRate)
	}
	if d.opts.Run != nil {
		rs := d.opts.Run()
		if rs.Current != nil {
			st.Totals = totalsFromRow(t.Label, rs.Current())
		}
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

// totalsFromRow gives the summary tiles a report row's figures.
func totalsFromRow(label string, r report.Row) totalsJSON {
	t := totalsJSON{Label: label, Source: "client", Requests: r.Requests}
	if r.TTFT.N > 0 {
		t.TTFTP50, t.TTFTP99 = num(ms(r.TTFT.P50)), num(ms(r.TTFT.P99))
	}
	t.HitRate = fraction(r.HitRate)
	return t
}

func endpointFrom(now time.Time, es router.EndpointStatus) endpointJSON {
	l := es.Load
	e := endpointJSON{
		ID: es.ID, URL: es.URL, Role: es.Role, Healthy: es.Healthy, ActiveOK: es.ActiveOK,
		Ejected: es.EjectedUntil.After(now), Absent: es.Absent, Ejections: es.Ejections,
		Waiting: l.Waiting, Running: l.Running, KVUsage: l.KVUsage, Stale: l.Stale,
		InFlight: l.InFlight, InFlightTokens: l.InFlightTokens,
		Scrapes: es.Signals.Scrapes, ScrapeErrors: es.Signals.Errors, LastError: es.Signals.LastError,
		Precise: es.Precise,
	}
	if l.PrefixHitRate >= 0 {
		e.HitRate = num(l.PrefixHitRate)
	}
	if !l.ObservedAt.IsZero() {
		// A scrape sent after now (they run while the state is built)
		// is fresh, not negative in age.
		e.SignalAgeMS = num(ms(max(0, l.Age(now))))
	}
	return e
}

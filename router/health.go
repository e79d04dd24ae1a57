package router

import (
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/signals"
)

// healthyAt reports whether e may be picked at now. Callers hold Router.mu.
func (e *endpoint) healthyAt(now time.Time) bool {
	c := newNowCmp(now)
	return e.healthy(&c)
}

// healthy is healthyAt at c.now.
func (e *endpoint) healthy(c *nowCmp) bool {
	return e.activeOK && !e.absent && !c.before(e.ejectedUntil)
}

// SetAbsent records whether the endpoint, a data-parallel rank, is absent
// from its server: the server's metrics have no series of its rank
// (data_parallel_size larger than the server's, or ranks scaled down), and
// the server refuses requests pinned to it. An absent endpoint is never
// picked, whatever its health checks and ejections say (the server's one
// health probe passes for its absent ranks too), until SetAbsent(false).
// Endpoints start present, and one removed and added again by SetEndpoints
// starts present again; one that stays keeps its state. It reports whether
// the state changed.
func (r *Router) SetAbsent(now time.Time, endpointID string, absent bool) (changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.byID[endpointID]
	if e == nil || e.absent == absent {
		return false
	}
	e.absent = absent
	if !absent {
		r.wake() // a request held for room may fit on it
	}
	return true
}

// ReportResult records the passive health outcome of one attempt on an
// endpoint: ok=false for a connect error or a 5xx. After FailThreshold
// consecutive failures the endpoint is ejected for BaseEjection, doubling
// with each further ejection up to MaxEjection; a success resets both the
// failure count and the back-off. It reports whether this call ejected.
func (r *Router) ReportResult(now time.Time, endpointID string, ok bool) (ejected bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.byID[endpointID]
	if e == nil {
		return false
	}
	if ok {
		e.consecFails, e.ejections = 0, 0
		return false
	}
	e.consecFails++
	if e.consecFails < r.cfg.Health.FailThreshold || now.Before(e.ejectedUntil) {
		return false
	}
	// Base << shift, unless that is over the cap: checked before the
	// shift, which wraps (a base of hours shifted 20 times may wrap to a
	// positive length shorter than the last ejection's).
	d, shift := r.cfg.Health.MaxEjection, min(e.ejections, 20)
	if r.cfg.Health.BaseEjection <= d>>shift {
		d = r.cfg.Health.BaseEjection << shift
	}
	e.ejectedUntil = now.Add(d)
	e.ejections++
	e.totalEjects++
	e.consecFails = 0
	return true
}

// SetActiveHealth records an active health check's verdict (the checker
// applies its own pass/fail thresholds). An endpoint failing active checks is
// never picked; one that passes again signals Drained.
func (r *Router) SetActiveHealth(now time.Time, endpointID string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.byID[endpointID]; e != nil && e.activeOK != ok {
		e.activeOK = ok
		if ok {
			r.wake() // a request held for room may fit on it
		}
	}
}

// Why an endpoint is out of rotation (EndpointStatus.Out).
const (
	// OutAbsent: a data-parallel rank its server does not have (SetAbsent).
	OutAbsent = "absent_rank"
	// OutActive: failing active health checks (SetActiveHealth).
	OutActive = "health_check"
	// OutEjected: passively ejected after failures (ReportResult).
	OutEjected = "ejected"
)

// EndpointStatus is one endpoint's state for metrics, the admin API and the
// dashboard.
type EndpointStatus struct {
	ID     string            `json:"id"`
	URL    string            `json:"url"`
	Role   string            `json:"role"`
	Labels map[string]string `json:"labels,omitempty"`
	// Adapters are the LoRA adapters the endpoint serves when it serves
	// only some of its model's (kvroute.Endpoint.Adapters); none: every one.
	Adapters []string `json:"adapters,omitempty"`
	// Healthy reports that the endpoint may be picked; when not, Out says
	// why.
	Healthy  bool `json:"healthy"`
	ActiveOK bool `json:"active_ok"`
	// Absent reports a data-parallel rank missing from its server's
	// metrics (SetAbsent).
	Absent bool `json:"absent,omitempty"`
	// Out is why the endpoint is out of rotation, "" when it is not: OutAbsent,
	// OutActive or OutEjected, the first that applies.
	Out string `json:"out,omitempty"`
	// EjectedUntil is set while the endpoint is passively ejected.
	EjectedUntil time.Time `json:"ejected_until,omitzero"`
	Ejections    int       `json:"ejections"`
	// Load is the routing view of the endpoint's load at the status time.
	Load kvroute.Load `json:"load"`
	// SignalAge is how old the engine signals are (0 = never scraped).
	SignalAge time.Duration `json:"signal_age_ns"`
	// Signals is the scrape state: last values, errors.
	Signals signals.ViewStatus `json:"signals"`
	// Precise reports that the endpoint's KV events feed the precise index.
	Precise bool `json:"precise"`
}

// Status returns every endpoint's state at now, in configuration order.
func (r *Router) Status(now time.Time) []EndpointStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]EndpointStatus, len(r.eps))
	for i, e := range r.eps {
		l := e.view.Load(now)
		if l.KVCapacityTokens == 0 { // as Route sees it (currentLoad)
			l.KVCapacityTokens = e.ep.KVCapacityTokens
		}
		s := EndpointStatus{
			ID: e.ep.ID, URL: e.ep.URL, Role: e.ep.Role.String(), Labels: e.ep.Labels, Adapters: e.ep.Adapters,
			Healthy: e.healthyAt(now), ActiveOK: e.activeOK, Ejections: e.totalEjects,
			Load: l, SignalAge: l.Age(now), Signals: e.view.Snapshot(), Precise: e.precise,
		}
		if e.ejectedUntil.After(now) {
			s.EjectedUntil = e.ejectedUntil
		}
		switch {
		case e.absent:
			s.Absent, s.Out = true, OutAbsent
		case !e.activeOK:
			s.Out = OutActive
		case !s.EjectedUntil.IsZero():
			s.Out = OutEjected
		}
		out[i] = s
	}
	return out
}

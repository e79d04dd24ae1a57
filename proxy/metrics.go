package proxy

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's own Prometheus metrics. Per-endpoint children
// used on every request are resolved once in newMetrics.
type metrics struct {
	requests     *prometheus.CounterVec   // model, endpoint, code
	inflight     *prometheus.GaugeVec     // model, endpoint
	ttfb         *prometheus.HistogramVec // model, endpoint
	duration     *prometheus.HistogramVec // model
	decision     *prometheus.HistogramVec // model
	retries      *prometheus.CounterVec   // model, endpoint, reason
	queued       *prometheus.CounterVec   // model
	ejections    *prometheus.CounterVec   // model, endpoint, kind (passive|active|absent)
	streamErrors *prometheus.CounterVec   // model, endpoint
	healthy      *healthCollector
	pools        map[string]*poolMetrics // read-only after New (models are not added live)

	// The config reloads (reload.go), as Prometheus reports its own.
	reloads         *prometheus.CounterVec // result: success|failure
	reloadOK        prometheus.Gauge
	reloadSuccessAt prometheus.Gauge
}

// poolMetrics are a model's children; an endpoint's are in its
// endpointProxy.
type poolMetrics struct {
	duration prometheus.Observer
	decision prometheus.Observer

	// series makes a write of a series by endpoint label atomic with the
	// deletion of a removed endpoint's series: a writer holds it (read)
	// from pool.label's check that the endpoint is in the pool to the
	// write, and forgetEndpoint holds it (write) while it deletes. A
	// reload publishes the set without the endpoint before it deletes, so
	// a writer either wrote before the deletion or finds the endpoint
	// gone: none brings a deleted series back. Writes through the
	// endpointProxy's children (inflight, ttfb, the usage counters) need
	// no lock: a deleted series' child is detached from its vector, so an
	// Inc before the removal and its Dec after it reach that child alone
	// (an ID added again gets a new child, starting at 0).
	series sync.RWMutex
}

func newMetrics(p *Proxy) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_requests_total",
			Help: "Inference requests answered, by model, last endpoint tried and HTTP status (499: client went away).",
		}, []string{"model", "endpoint", "code"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_inflight_requests",
			Help: "Requests the router holds open to each endpoint.",
		}, []string{"model", "endpoint"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_upstream_ttfb_seconds",
			Help:    "Time from dispatch to the first response body byte from the endpoint (the first token of a stream).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"model", "endpoint"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_request_duration_seconds",
			Help:    "End-to-end time of routed requests, from arrival to the last byte.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"model"}),
		decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_decision_duration_seconds",
			Help:    "Time the routing core took to pick an endpoint.",
			Buckets: []float64{1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, .01},
		}, []string{"model"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_retries_total",
			Help: "Attempts retried on another endpoint, by the endpoint that failed and why (connect_error, upstream_reset, status_5xx, endpoint_removed).",
		}, []string{"model", "endpoint", "reason"}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_queued_requests_total",
			Help: "Requests held in the router's queue: shed because every endpoint was over its load cap (policy overload: queue), or arrived while others were held.",
		}, []string{"model"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_ejections_total",
			Help: "Endpoints taken out of rotation: passive (consecutive failures), active (health checks) or absent (a data-parallel rank missing from its server's metrics).",
		}, []string{"model", "endpoint", "kind"}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_upstream_stream_errors_total",
			Help: "Responses that broke after their first byte (streams are ended with an error event).",
		}, []string{"model", "endpoint"}),
		healthy: &healthCollector{p: p, desc: prometheus.NewDesc("kvroute_endpoint_healthy",
			"1 when the endpoint may be picked (passes health checks, is not ejected, and is not a data-parallel rank absent from its server), else 0.",
			[]string{"model", "endpoint"}, nil),
			absent: prometheus.NewDesc("kvroute_endpoint_absent",
				"1 while the endpoint, a data-parallel rank, is out of rotation because its server's metrics have no series with its engine label (data_parallel_size larger than the server's), else 0.",
				[]string{"model", "endpoint"}, nil)},
		pools: make(map[string]*poolMetrics),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_config_reloads_total",
			Help: "Config reloads (SIGHUP), by result: success or failure (the file did not load or validate; nothing changed).",
		}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_config_last_reload_successful",
			Help: "1 when the last config reload succeeded (or none was tried), else 0.",
		}),
		reloadSuccessAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_config_last_reload_success_timestamp_seconds",
			Help: "When the config was last loaded successfully (at start, or by a reload), in Unix seconds.",
		}),
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	m.reloadOK.Set(1)
	m.reloadSuccessAt.Set(float64(p.now().UnixNano()) / 1e9)
	return m
}

// addPool resolves a model's children.
func (m *metrics) addPool(name string) {
	m.pools[name] = &poolMetrics{duration: m.duration.WithLabelValues(name), decision: m.decision.WithLabelValues(name)}
}

// forgetEndpoint deletes every series of an endpoint removed from a
// model's pool, so that /metrics shows no ghosts. (Requests still in
// progress on it are counted without it: see pool.label.) Called once
// the endpoint is out of the pool's set; it waits for the writers that
// found it still there (poolMetrics.series).
func (p *Proxy) forgetEndpoint(model, id string) {
	m := p.metrics
	if pm := m.pools[model]; pm != nil { // nil while New builds the pools: nothing writes yet
		pm.series.Lock()
		defer pm.series.Unlock()
	}
	labels := prometheus.Labels{"model": model, "endpoint": id}
	m.inflight.Delete(labels)
	m.ttfb.Delete(labels)
	m.streamErrors.Delete(labels)
	m.requests.DeletePartialMatch(labels)
	m.retries.DeletePartialMatch(labels)
	m.ejections.DeletePartialMatch(labels)
	p.fb.cached.Delete(labels)
	p.fb.prompt.Delete(labels)
	p.notFound.forget(model, id)
}

func (m *metrics) register(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.inflight, m.ttfb, m.duration, m.decision, m.retries, m.queued,
		m.ejections, m.streamErrors, m.healthy, m.reloads, m.reloadOK, m.reloadSuccessAt} {
		errs = append(errs, reg.Register(c))
	}
	return errors.Join(errs...)
}

// healthCollector reports every endpoint's health from the routers at
// scrape time, so the gauge is never stale.
type healthCollector struct {
	p            *Proxy
	desc, absent *prometheus.Desc
}

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc; ch <- c.absent }

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.p.now()
	for _, name := range c.p.names {
		for _, st := range c.p.pools[name].router.Status(now) {
			v := 0.0
			if st.Healthy {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name, st.ID)
			ch <- prometheus.MustNewConstMetric(c.absent, prometheus.GaugeValue, b2f(st.Absent), name, st.ID)
		}
	}
}

// levelFor is the log level of a finished request: warn for 5xx.
func levelFor(code int) slog.Level {
	if code >= 500 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

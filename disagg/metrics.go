package disagg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the handoff's Prometheus metrics. Build them once with
// NewMetrics and share them between models' Handoffs (every series has a
// model label). A nil *Metrics records nothing. Safe for concurrent use.
type Metrics struct {
	decisions     *prometheus.CounterVec
	stage         *prometheus.HistogramVec
	transferBytes *prometheus.CounterVec
	transferEst   *prometheus.HistogramVec
	failures      *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	rejected      *prometheus.CounterVec
}

// NewMetrics builds the metrics and registers them on reg (nil: not
// registered, still kept). An already registered identical collector is
// reused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_pd_decisions_total",
			Help: "P/D placement decisions by mode (aggregated, disaggregated) and the rule that decided."}, []string{"model", "mode", "rule"}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvroute_pd_stage_seconds",
			Help:    "Latency of each P/D stage as the router sees it: prefill (prefill leg reply), decode_first_byte (decode leg dispatch to first byte), ttfb (arrival to first byte to the client).",
			Buckets: buckets}, []string{"model", "stage"}),
		transferBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_pd_transfer_bytes_total",
			Help: "KV bytes handed from prefill to decode engines (each handoff whose decode leg was answered, at its planned size), per fabric link class."}, []string{"model", "link"}),
		transferEst: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvroute_pd_transfer_estimated_seconds",
			Help:    "Estimated KV transfer time (setup + fabric queueing + wire) per planned handoff, per link class.",
			Buckets: buckets}, []string{"model", "link"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_pd_leg_failures_total",
			Help: "Failed P/D legs by leg (prefill, decode, aggregated) and reason (status, transport, missing_kv_params, cancelled)."},
			[]string{"model", "leg", "reason"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_pd_fallbacks_total",
			Help: "Recoveries after a failed leg: replan (another pair), aggregated (prefill on the decode node), decode_retry (another decode node with the same KV lease)."},
			[]string{"model", "kind"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_pd_rejected_total",
			Help: "Client requests rejected for carrying a reserved P/D field or an endpoint-naming header."}, []string{"model", "code"}),
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.decisions, m.stage, m.transferBytes, m.transferEst, m.failures, m.fallbacks, m.rejected}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			cs[i] = are.ExistingCollector
		}
	}
	m.decisions = cs[0].(*prometheus.CounterVec)
	m.stage = cs[1].(*prometheus.HistogramVec)
	m.transferBytes = cs[2].(*prometheus.CounterVec)
	m.transferEst = cs[3].(*prometheus.HistogramVec)
	m.failures = cs[4].(*prometheus.CounterVec)
	m.fallbacks = cs[5].(*prometheus.CounterVec)
	m.rejected = cs[6].(*prometheus.CounterVec)
	return m, nil
}

func (m *Metrics) decision(model string, p *Plan) {
	if m == nil {
		return
	}
	mode := "aggregated"
	if p.Disaggregated {
		mode = "disaggregated"
		m.transferEst.WithLabelValues(model, p.Transfer.Link.Name).Observe(p.Transfer.Total().Seconds())
	}
	m.decisions.WithLabelValues(model, mode, p.Rule).Inc()
}

// handed counts a handoff's KV bytes once its decode leg was answered.
func (m *Metrics) handed(model, link string, bytes int64) {
	if m != nil {
		m.transferBytes.WithLabelValues(model, link).Add(float64(bytes))
	}
}

func (m *Metrics) observeStage(model, stage string, seconds float64) {
	if m != nil {
		m.stage.WithLabelValues(model, stage).Observe(seconds)
	}
}

func (m *Metrics) failure(model, leg, reason string) {
	if m != nil {
		m.failures.WithLabelValues(model, leg, reason).Inc()
	}
}

func (m *Metrics) fallback(model, kind string) {
	if m != nil {
		m.fallbacks.WithLabelValues(model, kind).Inc()
	}
}

func (m *Metrics) reject(model, code string) {
	if m != nil {
		m.rejected.WithLabelValues(model, code).Inc()
	}
}

package signals

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// EndpointMetrics exports endpoints' signal state (EndpointStatus) as
// Prometheus metrics, kvroute_endpoint_*, under one set of names and HELP
// texts whoever collects them: the Manager's collector labels them
// "endpoint", the router's (package proxy) "model" and "endpoint". An
// EndpointMetrics is safe for concurrent use.
type EndpointMetrics struct {
	age, stale, scrapes, errors, duration *prometheus.Desc
	waiting, running, kv, hitRate, conn   *prometheus.Desc
	kvCounters                            []*prometheus.Desc // kvEventCounters' descs, in its order
}

// NewEndpointMetrics returns the metrics with the variable labels labels,
// whose values each Collect gives in the same order.
func NewEndpointMetrics(labels ...string) *EndpointMetrics {
	desc := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, labels, nil) }
	m := &EndpointMetrics{
		age: desc("kvroute_endpoint_signal_age_seconds", "Age of the endpoint's last successful metrics scrape."),
		stale: desc("kvroute_endpoint_signal_stale", "1 when the endpoint's signals are stale (too old, failing scrapes "+
			"or never scraped) and routing uses router-local counts."),
		scrapes:  desc("kvroute_endpoint_scrapes_total", "Successful metrics scrapes of the endpoint."),
		errors:   desc("kvroute_endpoint_scrape_errors_total", "Failed metrics scrapes of the endpoint."),
		duration: desc("kvroute_endpoint_scrape_duration_seconds", "Duration of the endpoint's last metrics scrape."),
		waiting:  desc("kvroute_endpoint_waiting", "Waiting requests in the endpoint's last scrape."),
		running:  desc("kvroute_endpoint_running", "Running requests in the endpoint's last scrape."),
		kv:       desc("kvroute_endpoint_kv_usage", "KV-cache usage (0..1) in the endpoint's last scrape."),
		hitRate:  desc("kvroute_endpoint_prefix_hit_rate", "The engine's recent prefix-cache hit rate (tokens); -1 unknown."),
		conn:     desc("kvroute_endpoint_kv_events_connected", "1 while the endpoint's KV-event subscriber is connected."),
	}
	for _, c := range kvEventCounters {
		m.kvCounters = append(m.kvCounters, desc(c.Name, c.Help))
	}
	return m
}

// Describe sends the metrics' descriptions.
func (m *EndpointMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.age, m.stale, m.scrapes, m.errors, m.duration, m.waiting, m.running, m.kv,
		m.hitRate, m.conn} {
		ch <- d
	}
	for _, d := range m.kvCounters {
		ch <- d
	}
}

// Collect sends st's metrics at time now, labelled labelValues. The last
// scrape's values (and its age) are sent only once a scrape succeeded, the
// KV-cache usage only when the engine reports it, and the KV-event
// subscriber's metrics only when there is one (st.KVEvents).
func (m *EndpointMetrics) Collect(ch chan<- prometheus.Metric, now time.Time, st *EndpointStatus, labelValues ...string) {
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labelValues...)
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labelValues...)
	}
	if v := &st.View; !v.ObservedAt.IsZero() {
		gauge(m.age, now.Sub(v.ObservedAt).Seconds())
		gauge(m.waiting, v.Last.Waiting)
		gauge(m.running, v.Last.Running)
		if v.Last.Has(HasKVUsage) {
			gauge(m.kv, v.Last.KVUsage)
		}
	}
	gauge(m.stale, b2f(st.Load.Stale))
	counter(m.scrapes, st.View.Scrapes)
	counter(m.errors, st.View.Errors)
	gauge(m.duration, st.ScrapeDuration.Seconds())
	gauge(m.hitRate, st.Load.PrefixHitRate)
	if ev := st.KVEvents; ev != nil {
		for i, c := range kvEventCounters {
			counter(m.kvCounters[i], c.Value(ev))
		}
		gauge(m.conn, b2f(ev.Connected))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

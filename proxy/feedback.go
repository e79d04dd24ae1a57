package proxy

import (
	"net/http"

	"github.com/kvroute/kvroute/openai"
	"github.com/prometheus/client_golang/prometheus"
)

// This file feeds back what the engine reported about a request's prompt:
// its usage (prompt_tokens, prompt_tokens_details.cached_tokens), read from
// the last bytes of the response on their way to the client
// (openai.UsageTail, openai.ParseUsage, which the P/D handoff reads a
// request run whole on one node with). Nothing is buffered beyond the
// tail: the copy to the client is untouched.

// tailWriter is the client's ResponseWriter, keeping the response's tail
// and its head. Unwrap and FlushError keep http.ResponseController (which
// the reverse proxy flushes event streams with) working through it.
type tailWriter struct {
	http.ResponseWriter
	tail *openai.UsageTail
	head *openai.EventHead
}

func (w *tailWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.tail.Add(p[:n])
	w.head.Add(p[:n])
	return n, err
}

// FlushError flushes the client's connection.
func (w *tailWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the client's ResponseWriter.
func (w *tailWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// feedbackMetrics count the prompt tokens engines reported and how many of
// them they served from their prefix cache, per model and endpoint. Each
// endpoint's children are resolved once, in its endpointProxy.
type feedbackMetrics struct {
	cached *prometheus.CounterVec
	prompt *prometheus.CounterVec
}

func newFeedbackMetrics() *feedbackMetrics {
	return &feedbackMetrics{
		cached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prefix_cached_tokens_total",
			Help: "Prompt tokens the engines reported served from their prefix cache (usage.prompt_tokens_details.cached_tokens), for responses that reported it.",
		}, []string{"model", "endpoint"}),
		prompt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prompt_tokens_total",
			Help: "Prompt tokens the engines reported (usage.prompt_tokens) for responses whose cached tokens are known (reported, or 0 when an engine that reports them left them out, as vLLM does when none were cached): the denominator of the prefix hit rate.",
		}, []string{"model", "endpoint"}),
	}
}

// observeUsage counts one response's usage on its endpoint and returns
// its cached tokens as the endpoint reports them (openai.CachedTokens: an
// answer without them is 0 from an engine that has reported them, as vLLM
// leaves them out when none were cached; -1, not counted, before).
func (e *endpointProxy) observeUsage(prompt, cached int) int {
	if cached = e.reportsCached.Of(cached); cached < 0 {
		return -1
	}
	e.prompt.Add(float64(prompt))
	e.cached.Add(float64(cached))
	return cached
}

func (f *feedbackMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.cached, f.prompt}
}

package proxy

import (
	"bytes"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// This file feeds back what the engine reported about a request's prompt:
// its usage (prompt_tokens, prompt_tokens_details.cached_tokens), read from
// the last bytes of the response on their way to the client. A
// non-streaming response ends with its usage object; a stream asked with
// stream_options.include_usage ends with a usage chunk before [DONE].
// Nothing is buffered beyond the tail: the copy to the client is untouched.

// tailSize is how many of a response's last bytes are kept. vLLM's final
// usage chunk is about 300 bytes, the usage object of a non-streaming
// response under 200, and at most a short "data: [DONE]" follows.
const tailSize = 2048

// usageTail holds the last tailSize bytes written to the client.
type usageTail struct {
	n   int
	buf [tailSize]byte
}

func (t *usageTail) reset() { t.n = 0 }

func (t *usageTail) write(p []byte) {
	switch {
	case len(p) >= tailSize:
		t.n = copy(t.buf[:], p[len(p)-tailSize:])
	case t.n+len(p) <= tailSize:
		t.n += copy(t.buf[t.n:], p)
	default:
		keep := tailSize - len(p)
		copy(t.buf[:keep], t.buf[t.n-keep:t.n])
		copy(t.buf[keep:], p)
		t.n = tailSize
	}
}

func (t *usageTail) bytes() []byte { return t.buf[:t.n] }

// tailWriter is the client's ResponseWriter, keeping the response's tail.
// Unwrap and FlushError keep http.ResponseController (which the reverse
// proxy flushes event streams with) working through it.
type tailWriter struct {
	http.ResponseWriter
	tail *usageTail
}

func (w *tailWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.tail.write(p[:n])
	return n, err
}

// FlushError flushes the client's connection.
func (w *tailWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the client's ResponseWriter.
func (w *tailWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var (
	usageKey  = []byte(`"usage":`)
	promptKey = []byte(`"prompt_tokens":`)
	cachedKey = []byte(`"cached_tokens":`)
)

// parseUsage finds the last usage object in a response tail and returns
// its prompt_tokens and prompt_tokens_details.cached_tokens; cached is -1
// when the engine did not report it. ok is false when the tail holds no
// complete usage object (none sent, "usage":null, or cut off by the tail).
// Generated text cannot fake a usage key: JSON escapes its quotes.
func parseUsage(tail []byte) (prompt, cached int, ok bool) {
	i := bytes.LastIndex(tail, usageKey)
	if i < 0 {
		return 0, -1, false
	}
	obj := tail[i+len(usageKey):]
	obj = bytes.TrimLeft(obj, " \t\r\n")
	if len(obj) == 0 || obj[0] != '{' {
		return 0, -1, false
	}
	depth, end := 0, -1
	for j, c := range obj {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth == 0 {
			end = j
			break
		}
	}
	if end < 0 {
		return 0, -1, false
	}
	obj = obj[:end+1]
	prompt, ok = intAfter(obj, promptKey)
	if !ok {
		return 0, -1, false
	}
	if cached, ok = intAfter(obj, cachedKey); !ok {
		cached = -1
	}
	return prompt, cached, true
}

// intAfter parses the non-negative integer after the first key in b.
func intAfter(b, key []byte) (int, bool) {
	i := bytes.Index(b, key)
	if i < 0 {
		return 0, false
	}
	b = bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	n, digits := 0, 0
	for _, c := range b {
		if c < '0' || c > '9' || digits == 18 {
			break
		}
		n = n*10 + int(c-'0')
		digits++
	}
	return n, digits > 0
}

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
			Help: "Prompt tokens the engines reported (usage.prompt_tokens) for responses that reported cached tokens: the denominator of the prefix hit rate.",
		}, []string{"model", "endpoint"}),
	}
}

// observeUsage counts one response's usage on its endpoint.
func (e *endpointProxy) observeUsage(prompt, cached int) {
	if cached < 0 {
		return
	}
	e.prompt.Add(float64(prompt))
	e.cached.Add(float64(cached))
}

func (f *feedbackMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.cached, f.prompt}
}

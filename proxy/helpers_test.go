package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
)

// firstHealthy always picks the healthy candidate with the lowest index, so
// tests know where a request goes and where its retry goes.
var firstHealthy = kvroute.PickerFunc(func(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	for i, c := range cands {
		if c.Healthy {
			return kvroute.Chose("first", cands, i, "first healthy")
		}
	}
	return kvroute.None("first", "no healthy candidate")
})

// roundRobin is a tiny local round-robin picker (the router serialises Pick).
type roundRobin struct{ next int }

func (p *roundRobin) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	for k := range cands {
		i := (p.next + k) % len(cands)
		if cands[i].Healthy {
			p.next = i + 1
			return kvroute.Chose("rr", cands, i, "next in turn")
		}
	}
	return kvroute.None("rr", "no healthy candidate")
}

// learner picks the first healthy candidate and records the outcomes the
// router feeds back.
type learner struct {
	mu       sync.Mutex
	outcomes []kvroute.Outcome
}

func (l *learner) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	return firstHealthy(now, req, cands)
}

func (l *learner) Observe(_ time.Time, o kvroute.Outcome) {
	l.mu.Lock()
	l.outcomes = append(l.outcomes, o)
	l.mu.Unlock()
}

func (l *learner) got() []kvroute.Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]kvroute.Outcome(nil), l.outcomes...)
}

func testPickers(name string, _ map[string]any, _ uint64) (kvroute.Picker, error) {
	switch name {
	case "first":
		return firstHealthy, nil
	case "rr":
		return &roundRobin{}, nil
	case "learn":
		return &learner{}, nil
	case "shed":
		return kvroute.PickerFunc(func(time.Time, *kvroute.Request, []kvroute.Candidate) kvroute.Decision {
			d := kvroute.None("shed", "every endpoint over its cap")
			d.Shed = true
			return d
		}), nil
	}
	return nil, fmt.Errorf("unknown policy %q", name)
}

// fakeClock is a settable clock for the routing core.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// backend is an httptest engine that counts the requests it serves.
type backend struct {
	*httptest.Server
	name string
	hits atomic.Int32
	down atomic.Bool // GET /health answers 503
}

// newBackend starts an engine: h serves /v1/*; GET /health answers 200
// unless down is set.
func newBackend(t testing.TB, name string, h http.HandlerFunc) *backend {
	t.Helper()
	b := &backend{name: name}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			if b.down.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
			return
		}
		b.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(b.Close)
	return b
}

// okHandler answers like vLLM: a JSON completion naming the backend, or an
// event stream of n chunks.
func okHandler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct{ Stream bool }
		_ = json.Unmarshal(body, &req)
		w.Header().Set("X-Backend", name)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"from %s","finish_reason":"stop"}]}`, name)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"%s-%d\"}]}\n\n", name, i)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// flushEvents starts an event-stream response with events and flushes
// them to the client, as an engine sends its first chunk before it
// generates the rest.
func flushEvents(w http.ResponseWriter, events string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, events)
	w.(http.Flusher).Flush()
}

func statusHandler(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":"engine says %d","type":"InternalServerError","param":null,"code":%d}}`, status, status)
	}
}

// testConfig is a one-model config over urls with the given test policy,
// active health checks off.
func testConfig(policy string, urls ...string) config.Config {
	c := config.Config{Listen: "127.0.0.1:0", HealthCheck: config.HealthCheck{Disabled: true}}
	m := config.Model{Name: "m", Policy: config.Policy{Name: policy}}
	for _, u := range urls {
		m.Endpoints = append(m.Endpoints, config.Endpoint{URL: u})
	}
	c.Models = []config.Model{m}
	return c
}

// pdTestConfig is a one-model P/D config ("tiny": prefill p0, decode d0,
// protocol proto, mode always) with the given test policy ("" for the
// default), engine signals and active health checks off.
func pdTestConfig(policy, proto, prefillURL, decodeURL string) config.Config {
	return config.Config{
		Models: []config.Model{{
			Name: "tiny",
			Endpoints: []config.Endpoint{
				{ID: "p0", URL: prefillURL, Role: "prefill"},
				{ID: "d0", URL: decodeURL, Role: "decode"},
			},
			Policy:  config.Policy{Name: policy},
			PD:      config.PD{Protocol: proto, Mode: "always", Profile: "tiny"},
			Signals: config.Signals{Disabled: true},
		}},
		HealthCheck: config.HealthCheck{Disabled: true},
	}
}

type testProxy struct {
	*Proxy
	srv   *httptest.Server
	reg   *prometheus.Registry
	clock *fakeClock
}

func newTestProxy(t testing.TB, cfg config.Config) *testProxy {
	t.Helper()
	return newTestProxyWith(t, cfg, testPickers)
}

func newTestProxyWith(t testing.TB, cfg config.Config, pickers NewPickerFunc) *testProxy {
	t.Helper()
	return newTestProxyOpts(t, Options{Config: cfg, NewPicker: pickers})
}

// onePicker is the NewPickerFunc of a test whose models all route with p,
// whatever their policy's name and parameters.
func onePicker(p kvroute.Picker) NewPickerFunc {
	return func(string, map[string]any, uint64) (kvroute.Picker, error) { return p, nil }
}

// newQueueProxy serves a testProxy of policy name, routed by p, over one
// engine that answers 200, with retry.queue_wait queueWait: the set-up of
// the tests of the router's queue.
func newQueueProxy(t testing.TB, name string, p kvroute.Picker, queueWait time.Duration) *testProxy {
	t.Helper()
	engine := httptest.NewServer(statusHandler(http.StatusOK))
	t.Cleanup(engine.Close)
	cfg := testConfig(name, engine.URL)
	cfg.Retry.QueueWait = queueWait
	return newTestProxyWith(t, cfg, onePicker(p))
}

// newTestProxyOpts serves a Proxy of opts, given its own registry and a
// fake clock, on an httptest server until the test ends.
func newTestProxyOpts(t testing.TB, opts Options) *testProxy {
	t.Helper()
	reg := prometheus.NewRegistry()
	clock := newFakeClock()
	opts.Registerer, opts.Gatherer, opts.Now = reg, reg, clock.Now
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return &testProxy{Proxy: p, srv: srv, reg: reg, clock: clock}
}

func (tp *testProxy) post(t testing.TB, path, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(tp.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// postOK posts body to path n times, each answer read whole, and fails
// the test at the first that is not 200.
func (tp *testProxy) postOK(t testing.TB, n int, path, body string) {
	t.Helper()
	for range n {
		resp := tp.post(t, path, body)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
		}
	}
}

// counter reads a counter or gauge with the given labels (0 if absent).
func (tp *testProxy) metric(t testing.TB, c prometheus.Collector, labels ...string) float64 {
	t.Helper()
	var m prometheus.Metric
	switch v := c.(type) {
	case *prometheus.CounterVec:
		m = v.WithLabelValues(labels...)
	case *prometheus.GaugeVec:
		m = v.WithLabelValues(labels...)
	default:
		t.Fatalf("metric: unsupported collector %T", c)
	}
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}

func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return string(b)
}

// errorBody reads resp's body as an OpenAI error: the body, the error, and
// its param ("" when null).
func errorBody(t testing.TB, resp *http.Response) (string, openai.ErrorResponse, string) {
	t.Helper()
	out := readAll(t, resp)
	var e openai.ErrorResponse
	_ = json.Unmarshal([]byte(out), &e)
	param := ""
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return out, e, param
}

// events reads the data of every SSE event of a response.
func events(t testing.TB, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// waitFor polls cond until it holds; it fails the test after a generous
// deadline (a hang guard, not a timing assertion).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// recv receives from ch or fails after a generous hang guard.
func recv[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/router"
)

// model is the model name every test engine serves.
const model = "m"

// blockSize is the engines' KV block size (the tiny profile's).
const blockSize = 16

// logger returns the tests' logger: silent unless KVROUTE_E2E_LOG is set.
func logger() *slog.Logger {
	if os.Getenv("KVROUTE_E2E_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// engineOpts configure one emulated engine.
type engineOpts struct {
	// speed runs the engine model this many times faster than real time.
	speed float64
	// encoding publishes KV events in this encoding ("array" or "map");
	// "" publishes none.
	encoding string
	// connect makes the engine connect its PUB socket to the router, which
	// listens (vLLM with a host in its endpoint); otherwise the engine binds
	// an ipc:// socket and the router dials it.
	connect bool
	// lora configures the engine's LoRA adapters (default none).
	lora emulator.LoRAConfig
	// role is the engine's P/D role (default both); prefill and decode
	// engines hand off in vLLM's NixlConnector protocol.
	role kvroute.Role
	// flavor is the engine's metrics flavour, and the API that goes with
	// it (emulator.Config.MetricsFlavor; default vLLM's).
	flavor string
}

// engineProc is one emulated engine served on a fixed loopback address, so
// that it can be restarted in place.
type engineProc struct {
	t       testing.TB
	id      string
	cfg     emulator.Config
	addr    string // HTTP host:port
	kvAddr  string // the subscriber's address ("" = no events)
	replay  string // the engine's replay address
	connect bool

	failMetrics atomic.Bool // answer /metrics with 503

	legsMu sync.Mutex // guards legs
	legs   []leg      // the inference requests the engine received

	mu   sync.Mutex // guards the running instance below
	srv  *emulator.Server
	hs   *http.Server
	stop context.CancelFunc
	done chan struct{}
}

func startEngine(t testing.TB, id string, o engineOpts) *engineProc {
	t.Helper()
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if o.speed == 0 {
		o.speed = 50
	}
	e := &engineProc{t: t, id: id, connect: o.connect, cfg: emulator.Config{
		Model: model,
		Engine: engine.Config{Profile: prof, NumGPUBlocks: 2048, MaxModelLen: 16384, MaxNumBatchedTokens: 2048,
			MaxNumSeqs: 32},
		Speed:         o.speed,
		LoRA:          o.lora,
		Role:          o.role,
		MetricsFlavor: o.flavor,
		Logger:        logger().With("engine", id),
	}}
	if o.encoding != "" && !o.connect {
		dir, err := os.MkdirTemp("", "kve2e")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		e.kvAddr = "ipc://" + filepath.Join(dir, id+".sock")
	}
	// The KV-event ports are picked free, then bound by the engine: another
	// process (any outgoing connection's ephemeral port) can take one in
	// between, so a bind error picks new ones.
	for attempt := 1; ; attempt++ {
		if o.encoding != "" {
			if o.connect {
				e.kvAddr = fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
			}
			e.replay = fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
			e.cfg.KVEvents = emulator.KVEventsConfig{Endpoint: e.kvAddr, ReplayEndpoint: e.replay, Encoding: o.encoding}
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e.addr = ln.Addr().String()
		err = e.launch(ln)
		if err == nil {
			break
		}
		if be := (*emulator.BindError)(nil); !errors.As(err, &be) || attempt == 10 {
			t.Fatal(err)
		}
		t.Logf("engine %s: %v; picking other ports", id, err)
	}
	t.Cleanup(e.halt)
	return e
}

func (e *engineProc) url() string { return "http://" + e.addr }

// launch starts an instance serving HTTP on ln; emulator.New's error (ln
// closed) when it cannot.
func (e *engineProc) launch(ln net.Listener) error {
	srv, err := emulator.New(e.cfg)
	if err != nil {
		ln.Close()
		return err
	}
	host, port, _ := net.SplitHostPort(e.addr)
	var p int
	fmt.Sscan(port, &p)
	srv.SetAdvertise(host, p)
	h := srv.Handler()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && e.failMetrics.Load() {
			http.Error(w, "metrics switched off by the test", http.StatusServiceUnavailable)
			return
		}
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			e.record(r)
		}
		h.ServeHTTP(w, r)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = hs.Serve(ln) }()
	go func() {
		defer close(done)
		if err := srv.Run(ctx); err != nil {
			e.t.Errorf("engine %s: Run: %v", e.id, err)
		}
	}()
	e.mu.Lock()
	e.srv, e.hs, e.stop, e.done = srv, hs, cancel, done
	e.mu.Unlock()
	return nil
}

// leg is an inference request an engine received: the model it named and,
// for a P/D leg, which (kv_transfer_params' do_remote_decode: a prefill
// leg; do_remote_prefill: a decode leg).
type leg struct {
	model           string
	prefill, decode bool
}

// record notes r's leg (its body read and put back).
func (e *engineProc) record(r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var in struct {
		Model string `json:"model"`
		KV    *struct {
			DoRemoteDecode  bool `json:"do_remote_decode"`
			DoRemotePrefill bool `json:"do_remote_prefill"`
		} `json:"kv_transfer_params"`
	}
	_ = json.Unmarshal(body, &in)
	l := leg{model: in.Model}
	if in.KV != nil {
		l.prefill, l.decode = in.KV.DoRemoteDecode, in.KV.DoRemotePrefill
	}
	e.legsMu.Lock()
	e.legs = append(e.legs, l)
	e.legsMu.Unlock()
}

// takeLegs returns the legs the engine received since the last call.
func (e *engineProc) takeLegs() []leg {
	e.legsMu.Lock()
	defer e.legsMu.Unlock()
	l := e.legs
	e.legs = nil
	return l
}

// halt stops the engine: its loop, its KV-event sockets and its listener.
func (e *engineProc) halt() {
	e.mu.Lock()
	srv, hs, stop, done := e.srv, e.hs, e.stop, e.done
	e.srv = nil
	e.mu.Unlock()
	if srv == nil {
		return
	}
	stop()
	<-done
	hs.Close()
}

// restart stops the engine and starts a fresh one (empty cache, sequence
// numbers from 0) on the same addresses.
func (e *engineProc) restart() {
	e.halt()
	client.CloseIdleConnections() // the old instance's keep-alive connections are dead
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", e.addr)
		if err == nil {
			if err := e.launch(ln); err != nil {
				e.t.Fatalf("engine %s: restart: %v", e.id, err)
			}
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("engine %s: relisten on %s: %v", e.id, e.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// endpoint is the engine as a config endpoint; with events it subscribes
// to its KV events.
func (e *engineProc) endpoint(events bool) config.Endpoint {
	ep := config.Endpoint{ID: e.id, URL: e.url()}
	if e.cfg.Role != kvroute.RoleBoth {
		ep.Role = e.cfg.Role.String()
	}
	if events && e.kvAddr != "" {
		ep.KVEvents = config.KVEvents{Address: e.kvAddr, ReplayAddress: e.replay, Listen: e.connect}
	}
	return ep
}

// modelConfig is a model served by engines, scraped every 50 ms.
func modelConfig(policyName string, precise bool, engines ...*engineProc) config.Model {
	m := config.Model{Name: model, Policy: config.Policy{Name: policyName, Seed: 7},
		Signals: config.Signals{ScrapeInterval: 50 * time.Millisecond, StaleAfter: 500 * time.Millisecond}}
	if precise {
		m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer, BlockSize: blockSize}
	}
	for _, e := range engines {
		m.Endpoints = append(m.Endpoints, e.endpoint(precise))
	}
	return m
}

// routerProc is the proxy served on loopback.
type routerProc struct {
	p   *proxy.Proxy
	url string
	reg *prometheus.Registry
}

func startRouter(t testing.TB, models ...config.Model) *routerProc {
	t.Helper()
	cfg := config.Config{Models: models, Debug: config.Debug{Enabled: true},
		HealthCheck: config.HealthCheck{Interval: time.Second, Timeout: 500 * time.Millisecond},
		Timeouts:    config.Timeouts{Shutdown: 2 * time.Second}}
	return startRouterConfig(t, cfg)
}

// startRouterConfig serves a proxy of cfg, with its own registry, on
// loopback until the test ends.
func startRouterConfig(t testing.TB, cfg config.Config) *routerProc {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New, Logger: logger().With("side", "router"),
		Registerer: reg, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &routerProc{p: p, url: serveProxy(t, p), reg: reg}
}

// serveProxy serves p on a loopback port and returns its base URL. When
// the test ends it stops p and waits for Serve to return, failing the test
// on its error.
func serveProxy(t testing.TB, p *proxy.Proxy) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }() // Serve scrapes the engines' signals
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// status returns one endpoint's status in the model's router.
func (r *routerProc) status(t testing.TB, id string) router.EndpointStatus {
	t.Helper()
	for _, st := range r.p.Router(model).Status(time.Now()) {
		if st.ID == id {
			return st
		}
	}
	t.Fatalf("no endpoint %q", id)
	return router.EndpointStatus{}
}

// metric returns the value of the router's metric with these labels.
func (r *routerProc) metric(t testing.TB, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// series formats every series of the named counter families, labels and
// values, one per line: what a failure message shows of the router's
// counters (a P/D test's leg failures and fallbacks, say).
func (r *routerProc) series(t testing.TB, names ...string) string {
	t.Helper()
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			fmt.Fprintf(&b, "%s{", f.GetName())
			for i, lp := range m.GetLabel() {
				if i > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, "%s=%q", lp.GetName(), lp.GetValue())
			}
			fmt.Fprintf(&b, "} %v\n", m.GetCounter().GetValue())
		}
	}
	if b.Len() == 0 {
		return "(none)\n"
	}
	return b.String()
}

// eventually polls cond until it holds or the deadline passes, then fails
// with the last explanation cond gave.
func eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, within, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// result is what a test reads from one response.
type result struct {
	status   int
	endpoint string // x-kvroute-endpoint (debug on)
	usage    openai.Usage
	hasUsage bool
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

// post sends body to base+path and reads the response: the JSON body's
// usage, or for a stream the last usage chunk. It fails the test on any
// error or a non-200 non-streaming answer.
func post(t testing.TB, base, path, body string) result {
	t.Helper()
	res, err := tryPost(base, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// tryPost is post for other goroutines than the test's: it returns errors.
func tryPost(base, path, body string) (result, error) {
	resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		return result{}, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode, endpoint: resp.Header.Get(proxy.HeaderEndpoint)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimPrefix(sc.Text(), "data: ")
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var chunk struct{ Usage *openai.Usage }
			if json.Unmarshal([]byte(line), &chunk) == nil && chunk.Usage != nil {
				res.usage, res.hasUsage = *chunk.Usage, true
			}
		}
		return res, sc.Err()
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return res, fmt.Errorf("POST %s: read: %w", path, err)
	}
	if res.status != http.StatusOK {
		return res, fmt.Errorf("POST %s: status %d: %s", path, res.status, data)
	}
	var out struct{ Usage *openai.Usage }
	if err := json.Unmarshal(data, &out); err != nil {
		return res, fmt.Errorf("POST %s: %w: %s", path, err, data)
	}
	if out.Usage != nil {
		res.usage, res.hasUsage = *out.Usage, true
	}
	return res, nil
}

// chatBody is a chat request with a system prompt and a user message.
func chatBody(system, user string, maxTokens int, stream bool) string {
	req := map[string]any{
		"model": model,
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
		"max_tokens": maxTokens, "ignore_eos": true, "stream": stream,
	}
	if stream {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(req)
	return string(b)
}

func completionBody(prompt string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true})
	return string(b)
}

// text returns about words words of deterministic prose for seed.
func text(seed uint64, words int) string {
	vocab := []string{"cache", "block", "router", "engine", "prefix", "token", "stream", "batch", "queue", "decode",
		"prefill", "memory", "latency", "policy", "signal", "event", "index", "model", "request", "endpoint"}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var b bytes.Buffer
	for i := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.IntN(len(vocab))])
		if rng.IntN(9) == 0 {
			fmt.Fprintf(&b, "%d", rng.IntN(1000))
		}
	}
	return b.String()
}

// tokenize asks an engine for a request's prompt token ids (vLLM's
// /tokenize: chat rendered with its template and the generation prompt).
func tokenize(t testing.TB, e *engineProc, body string) []uint32 {
	t.Helper()
	resp, err := client.Post(e.url()+"/tokenize", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("tokenize: status %d, %v", resp.StatusCode, err)
	}
	return out.Tokens
}

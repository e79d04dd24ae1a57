package disagg

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

// emu starts an emulated engine (tiny profile, 100x real time).
func emu(t *testing.T, role kvroute.Role, proto string) *httptest.Server {
	t.Helper()
	_, hs := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: role, PDProtocol: proto,
		LoadFailure: emulator.LoadFailureFail}, nil)
	return hs
}

func hostPort(t testing.TB, u string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// leg is one request the handoff sent to an engine.
type leg struct {
	host string
	id   string
	body map[string]any
}

// recorder is a Doer that records every leg before sending it.
type recorder struct {
	mu   sync.Mutex
	legs []leg
	c    *http.Client
}

func (r *recorder) Do(req *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(bytes.NewReader(b))
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	r.mu.Lock()
	r.legs = append(r.legs, leg{host: req.URL.Host, id: req.Header.Get("X-Request-Id"), body: m})
	r.mu.Unlock()
	return r.c.Do(req)
}

func (r *recorder) to(u string) []leg {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []leg
	for _, l := range r.legs {
		if "http://"+l.host == u {
			out = append(out, l)
		}
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.legs)
}

type pdFixture struct {
	h    *Handoff
	r    *router.Router
	pl   *Planner
	rec  *recorder
	reg  *prometheus.Registry
	srv  *httptest.Server
	logs *syncbuf.Buffer
}

// newPD builds a router + planner + handoff over eps and serves it like
// the proxy does: parse, then Handoff.Serve.
func newPD(t *testing.T, proto string, mode Mode, eps ...kvroute.Endpoint) *pdFixture {
	t.Helper()
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: mode, Seed: 1,
		Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Endpoints: eps, Policy: "pd", Picker: pl})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{c: &http.Client{}}
	logs := &syncbuf.Buffer{}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: rec, Protocol: proto, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), EndpointHeader: testEndpointHeader})
	if err != nil {
		t.Fatal(err)
	}
	f := &pdFixture{h: h, r: r, pl: pl, rec: rec, reg: reg, logs: logs}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		kind := openai.KindCompletion
		if req.URL.Path == "/v1/chat/completions" {
			kind = openai.KindChat
		}
		ri, err := openai.ParseRequest(kind, body)
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		id := req.Header.Get("X-Request-Id") // the client's, as the proxy takes it
		if id == "" {
			id = "req-" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
		}
		kr := &kvroute.Request{ID: id, Model: ri.Model, Prompt: ri.Prompt,
			PromptTokens: ri.PromptTokens(), MaxTokens: ri.MaxTokens, Stream: ri.Stream, Arrival: time.Now()}
		if res := h.Serve(w, req, req.URL.Path, body, kr); res.Abort {
			panic(http.ErrAbortHandler) // as the proxy does
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// testEndpointHeader is the fixture's HandoffConfig.EndpointHeader.
const testEndpointHeader = "X-Test-Endpoint"

func (f *pdFixture) post(t *testing.T, body string, hdr ...string) (int, string) {
	t.Helper()
	code, body, _ := f.postH(t, body, hdr...)
	return code, body
}

// postH is post that also returns the endpoint header of the response.
func (f *pdFixture) postH(t *testing.T, body string, hdr ...string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get(testEndpointHeader)
}

func endpoint(id, u string, role kvroute.Role, labels ...string) kvroute.Endpoint {
	e := kvroute.Endpoint{ID: id, URL: u, Role: role, Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		e.Labels[labels[i]] = labels[i+1]
	}
	return e
}

const prompt = "Disaggregated serving splits the prompt computation from token generation across two engines, and the KV cache crosses the fabric."

func completion(stream bool, maxTokens int) string {
	opts := ""
	if stream {
		opts = `"stream_options":{"include_usage":true},`
	}
	return fmt.Sprintf(`{"model":"tiny","prompt":%q,"max_tokens":%d,"stream":%v,%s"min_tokens":1}`, prompt, maxTokens, stream, opts)
}

func counter(t *testing.T, c *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestPDNixlEndToEnd(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))

	// Non-streaming.
	code, body, answered := f.postH(t, completion(false, 5))
	if code != 200 {
		t.Fatalf("got %d %s", code, body)
	}
	if answered != "d" {
		t.Errorf("%s: got %q, want the decode endpoint d", testEndpointHeader, answered)
	}
	var c openai.Completion
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	if c.Usage.CompletionTokens != 5 || c.KVTransferParams != nil {
		t.Errorf("got %s, want 5 tokens and no kv_transfer_params", body)
	}
	pl, dl := f.rec.to(p.URL), f.rec.to(d.URL)
	if len(pl) != 1 || len(dl) != 1 {
		t.Fatalf("got %d prefill and %d decode legs, want 1 and 1", len(pl), len(dl))
	}
	pb := pl[0].body
	kv, _ := pb["kv_transfer_params"].(map[string]any)
	if pb["max_tokens"] != float64(1) || pb["stream"] != false || pb["stream_options"] != nil || pb["min_tokens"] != nil ||
		kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || kv["remote_host"] != nil {
		t.Errorf("prefill leg body: got %v", pb)
	}
	db := dl[0].body
	dkv, _ := db["kv_transfer_params"].(map[string]any)
	host, port := hostPort(t, p.URL)
	if db["max_tokens"] != float64(5) || db["min_tokens"] != float64(1) || dkv["do_remote_prefill"] != true ||
		dkv["remote_host"] != host || dkv["remote_port"] != float64(port) {
		t.Errorf("decode leg body: got %v, want the original with the prefill's params (remote %s:%d)", db, host, port)
	}
	if pl[0].id == "" || pl[0].id != dl[0].id {
		t.Errorf("X-Request-Id: got %q and %q, want one id on both legs", pl[0].id, dl[0].id)
	}

	// Streaming: the decode engine's SSE stream reaches the client.
	code, body = f.post(t, completion(true, 4))
	if code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Count(body, "data: ") < 3 {
		t.Errorf("stream: got %d %s", code, body)
	}
	if got := counter(t, f.h.cfg.Metrics.decisions, "tiny", "disaggregated", "always"); got != 2 {
		t.Errorf("decisions: got %v disaggregated, want 2", got)
	}
	if got := counter(t, f.h.cfg.Metrics.transferBytes, "tiny", "tcp"); got <= 0 {
		t.Errorf("transfer bytes: got %v, want > 0", got)
	}
	if strings.Contains(f.logs.String(), "level=WARN") {
		t.Errorf("logs: %s", f.logs.String())
	}
}

func TestPDSGLangEndToEnd(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDSGLang)
	d := emu(t, kvroute.RoleDecode, emulator.PDSGLang)
	_, port := hostPort(t, p.URL)
	f := newPD(t, ProtocolSGLang, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port)),
		endpoint("d", d.URL, kvroute.RoleDecode))
	for _, stream := range []bool{false, true} {
		code, body := f.post(t, completion(stream, 4))
		if code != 200 {
			t.Fatalf("stream=%v: got %d %s", stream, code, body)
		}
		if stream && !strings.Contains(body, "data: [DONE]") {
			t.Errorf("stream: got %s", body)
		}
		if !stream {
			var c openai.Completion
			_ = json.Unmarshal([]byte(body), &c)
			if c.Usage.CompletionTokens != 4 {
				t.Errorf("got %s, want 4 tokens", body)
			}
		}
	}
	pl, dl := f.rec.to(p.URL), f.rec.to(d.URL)
	if len(pl) != 2 || len(dl) != 2 {
		t.Fatalf("got %d prefill and %d decode legs, want 2 and 2", len(pl), len(dl))
	}
	host, _ := hostPort(t, p.URL)
	for i := range pl {
		a, b := pl[i].body, dl[i].body
		if a["bootstrap_host"] != host || a["bootstrap_port"] != float64(port) || a["bootstrap_room"] == nil {
			t.Errorf("prefill leg %d: got %v", i, a)
		}
		if a["bootstrap_room"] != b["bootstrap_room"] || a["bootstrap_host"] != b["bootstrap_host"] || a["max_tokens"] != b["max_tokens"] {
			t.Errorf("leg %d: prefill and decode bodies differ: %v vs %v", i, a, b)
		}
		if room, _ := a["bootstrap_room"].(float64); room < 0 || room >= 1<<63 {
			t.Errorf("room %v is not a 63-bit value", room)
		}
	}
	if pl[0].body["bootstrap_room"] == pl[1].body["bootstrap_room"] {
		t.Errorf("two requests got the same room %v", pl[0].body["bootstrap_room"])
	}
}

// TestPDConditionalEndToEnd: with the short-prompt rule on, a short prompt
// runs aggregated on the decode node (no prefill leg).
func TestPDConditionalEndToEnd(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := router.New(router.Config{Model: "tiny", Endpoints: []kvroute.Endpoint{endpoint("p", p.URL, kvroute.RolePrefill),
		endpoint("d", d.URL, kvroute.RoleDecode)}, Picker: pl})
	rec := &recorder{c: &http.Client{}}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: rec})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	hr := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(completion(false, 3)))
	res := h.Serve(w, hr, "/v1/completions", []byte(completion(false, 3)), &kvroute.Request{ID: "c1", Model: "tiny", PromptTokens: 30, MaxTokens: 3})
	if w.Code != 200 || res.Disaggregated || res.Decode != "d" {
		t.Fatalf("got %d %+v %s", w.Code, res, w.Body)
	}
	if n := len(rec.to(p.URL)); n != 0 {
		t.Errorf("got %d prefill legs, want 0 (aggregated)", n)
	}
	if ds := r.Decisions(1); len(ds) != 1 || !strings.Contains(ds[0].Decision.Reason, "short uncached prompt") {
		t.Errorf("decision log: got %+v", ds)
	}
}

// fake is an engine that answers every request with handler.
func fake(t *testing.T, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(handler)
	t.Cleanup(s.Close)
	return s
}

func status500(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, `{"error":{"message":"boom","type":"internal_error"}}`, http.StatusInternalServerError)
}

func TestPDFailures(t *testing.T) {
	t.Run("prefill 500 -> another prefill node", func(t *testing.T) {
		bad := fake(t, status500)
		p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("bad", bad.URL, kvroute.RolePrefill), endpoint("p", p.URL, kvroute.RolePrefill),
			endpoint("d", d.URL, kvroute.RoleDecode))
		// Distinct prompts miss every cache, so placement spreads over both
		// prefill nodes; every request succeeds, disaggregated.
		for i := 0; len(f.rec.to(bad.URL)) == 0; i++ {
			if i == 20 {
				t.Fatal("the failing prefill node was never placed")
			}
			body := fmt.Sprintf(`{"model":"tiny","prompt":"%d %s","max_tokens":2}`, i, prompt)
			if code, got := f.post(t, body); code != 200 {
				t.Fatalf("request %d: got %d %s", i, code, got)
			}
		}
		if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "status"); got != 1 {
			t.Errorf("prefill failures: got %v, want 1", got)
		}
		dl := f.rec.to(d.URL)
		if last := dl[len(dl)-1].body; last["kv_transfer_params"] == nil {
			t.Errorf("after the failed prefill: got decode leg %v, want a disaggregated one (via p)", last)
		}
	})
	t.Run("prefill 400 -> the client's answer, naming the endpoint", func(t *testing.T) {
		bad := fake(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}`)
		})
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("bad", bad.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		code, body, answered := f.postH(t, completion(false, 2))
		if code != 400 || !strings.Contains(body, "too long") || answered != "bad" {
			t.Errorf("got %d %s from %q, want the engine's 400 from bad", code, body, answered)
		}
	})
	t.Run("prefill 500, no other prefill node -> aggregated on the decode node", func(t *testing.T) {
		bad := fake(t, status500)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("bad", bad.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		code, body := f.post(t, completion(false, 2))
		if code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
		dl := f.rec.to(d.URL)
		if len(dl) != 1 || dl[0].body["kv_transfer_params"] != nil {
			t.Errorf("decode node: got legs %v, want one aggregated request without kv_transfer_params", dl)
		}
		if ds := f.r.Decisions(1); len(ds) != 1 || !strings.Contains(ds[0].Decision.Reason, "no prefill-capable") &&
			!strings.Contains(ds[0].Decision.Reason, "pinned") && !strings.Contains(ds[0].Decision.Reason, "P/D plan") {
			t.Errorf("last decision: %+v", ds)
		}
	})
	t.Run("missing kv_transfer_params is counted, logged, never a silent recompute", func(t *testing.T) {
		noParams := fake(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}],"kv_transfer_params":null}`)
		})
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("np", noParams.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		code, body := f.post(t, completion(false, 2))
		if code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
		if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "missing_kv_params"); got != 1 {
			t.Errorf("missing params: got %v, want 1", got)
		}
		if !strings.Contains(f.logs.String(), "without kv_transfer_params") {
			t.Errorf("logs: got %q, want the missing-params error", f.logs.String())
		}
		for _, l := range f.rec.to(d.URL) {
			if kv, _ := l.body["kv_transfer_params"].(map[string]any); kv != nil && kv["do_remote_prefill"] == true && kv["remote_host"] == nil {
				t.Errorf("decode leg sent with unusable params: %v", l.body)
			}
		}
		if got := counter(t, f.h.cfg.Metrics.fallbacks, "tiny", "aggregated"); got != 1 {
			t.Errorf("aggregated fallbacks: got %v, want 1 (explicit, counted)", got)
		}
	})
	t.Run("decode 500 before the first byte -> another decode node, prefill re-run", func(t *testing.T) {
		p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
		bad := fake(t, status500)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("bad", bad.URL, kvroute.RoleDecode),
			endpoint("d", d.URL, kvroute.RoleDecode))
		for i := range 2 { // a client that sends one id on every request
			if code, body := f.post(t, completion(false, 2), "X-Request-Id", "fixed"); code != 200 {
				t.Fatalf("request %d: got %d %s", i, code, body)
			}
		}
		// Each placement has its own X-Request-Id, the client's with a
		// suffix: a re-planned request (or the client's next one) never
		// reaches the prefill engine under the id of a prefill it holds.
		// Its decode leg carries the same id as its prefill.
		seen := map[string]bool{}
		for _, l := range f.rec.to(p.URL) {
			if seen[l.id] || !strings.HasPrefix(l.id, "fixed.") {
				t.Errorf("prefill leg X-Request-Id %q: want a new id per placement, starting with the client's", l.id)
			}
			seen[l.id] = true
		}
		for _, l := range append(f.rec.to(bad.URL), f.rec.to(d.URL)...) {
			kv, _ := l.body["kv_transfer_params"].(map[string]any)
			if rid, _ := kv["remote_request_id"].(string); l.id != rid || !seen[l.id] {
				t.Errorf("decode leg X-Request-Id %q with remote_request_id %q: want its prefill's id", l.id, rid)
			}
		}
		nbad, np := len(f.rec.to(bad.URL)), len(f.rec.to(p.URL))
		if nbad == 0 {
			t.Fatalf("the failing decode node was never placed")
		}
		if np != 2+nbad {
			t.Errorf("prefill legs: got %d, want %d (one re-run per failed decode leg)", np, 2+nbad)
		}
		if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "decode", "status"); got != float64(nbad) {
			t.Errorf("decode failures: got %v, want %d", got, nbad)
		}
	})
	t.Run("decode connect error -> another decode node with the same lease", func(t *testing.T) {
		p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
		dead := httptest.NewServer(http.NotFoundHandler())
		deadURL := dead.URL
		dead.Close()
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("dead", deadURL, kvroute.RoleDecode),
			endpoint("d", d.URL, kvroute.RoleDecode))
		// Until the decode placement tries the dead node (the first or
		// second request in practice; which one depends on tie-breaking
		// and load estimates): each request is still one prefill leg.
		sent := 0
		for sent < 8 && counter(t, f.h.cfg.Metrics.fallbacks, "tiny", "decode_retry") < 1 {
			if code, body := f.post(t, completion(false, 2)); code != 200 {
				t.Fatalf("request %d: got %d %s", sent, code, body)
			}
			sent++
		}
		if got := counter(t, f.h.cfg.Metrics.fallbacks, "tiny", "decode_retry"); got < 1 {
			t.Fatalf("decode retries after %d requests: got %v, want >= 1", sent, got)
		}
		if np := len(f.rec.to(p.URL)); np != sent {
			t.Errorf("prefill legs: got %d for %d requests (the lease was not reused)", np, sent)
		}
		prefills := map[string]bool{}
		for _, l := range f.rec.to(p.URL) {
			prefills[l.id] = true
		}
		for _, l := range append(f.rec.to(deadURL), f.rec.to(d.URL)...) {
			if !prefills[l.id] {
				t.Errorf("decode leg X-Request-Id %q: want its prefill's (the retry is the same placement)", l.id)
			}
		}
	})
	t.Run("sglang prefill 500 cancels the decode leg", func(t *testing.T) {
		decodeIn := make(chan struct{}, 4)
		bad := fake(t, func(w http.ResponseWriter, r *http.Request) {
			<-decodeIn // fail once the decode leg waits for its bootstrap
			status500(w, r)
		})
		decodeGone := make(chan struct{}, 4)
		d := fake(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			decodeIn <- struct{}{}
			<-r.Context().Done() // waits for a bootstrap that never comes
			decodeGone <- struct{}{}
		})
		f := newPD(t, ProtocolSGLang, ModeAlways, endpoint("bad", bad.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		f.h.cfg.Attempts = 1
		code, _ := f.post(t, completion(false, 2))
		if code != 500 && code != 502 {
			t.Errorf("got %d, want the prefill's 500 or 502", code)
		}
		select {
		case <-decodeGone:
		case <-time.After(10 * time.Second):
			t.Fatal("the decode leg was not cancelled")
		}
	})
}

// TestPDClientDisconnect: a client that goes away cancels the legs in
// flight: the prefill leg (NIXL), and both legs (SGLang).
func TestPDClientDisconnect(t *testing.T) {
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		t.Run(proto, func(t *testing.T) {
			started := make(chan string, 4)
			cancelled := make(chan string, 4)
			block := func(name string) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.ReadAll(r.Body) // the server notices a closed connection only after the body
					started <- name
					<-r.Context().Done()
					cancelled <- name
				}
			}
			p, d := fake(t, block("prefill")), fake(t, block("decode"))
			f := newPD(t, proto, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/completions", strings.NewReader(completion(true, 2)))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			want := 1
			if proto == ProtocolSGLang {
				want = 2
			}
			for range want {
				select {
				case <-started:
				case <-time.After(10 * time.Second):
					t.Fatal("legs not started")
				}
			}
			cancel()
			<-errc
			got := map[string]bool{}
			for range want {
				select {
				case n := <-cancelled:
					got[n] = true
				case <-time.After(10 * time.Second):
					t.Fatalf("got cancelled legs %v, want %d", got, want)
				}
			}
			if !got["prefill"] || (proto == ProtocolSGLang && !got["decode"]) {
				t.Errorf("got cancelled legs %v", got)
			}
		})
	}
}

// TestPDInjectionRejected: a client cannot name the endpoint a leg uses.
func TestPDInjectionRejected(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	for _, tc := range []struct {
		name string
		body string
		hdr  []string
	}{
		{"kv_transfer_params", `{"model":"tiny","prompt":"hi","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254","remote_port":80}}`, nil},
		{"case-folded field", `{"model":"tiny","prompt":"hi","KV_Transfer_Params":{"remote_host":"evil"}}`, nil},
		{"bootstrap_host", `{"model":"tiny","prompt":"hi","bootstrap_host":"evil.example","bootstrap_port":80,"bootstrap_room":1}`, nil},
		{"header", `{"model":"tiny","prompt":"hi"}`, []string{"X-Prefiller-Host-Port", "evil.example:80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.rec.count()
			code, body := f.post(t, tc.body, tc.hdr...)
			if code != 400 || !strings.Contains(body, "reserved") {
				t.Errorf("got %d %s, want 400 reserved", code, body)
			}
			if n := f.rec.count(); n != before {
				t.Errorf("got %d legs sent, want none", n-before)
			}
		})
	}
	if got := counter(t, f.h.cfg.Metrics.rejected, "tiny", "reserved_field"); got != 3 {
		t.Errorf("rejected fields: got %v, want 3", got)
	}
}

func TestWireForms(t *testing.T) {
	b, err := NixlPrefillBody([]byte(`{"model":"m","messages":[{"role":"user","content":"<a&b>"}],"max_completion_tokens":9,"stream":true,"stream_options":{"include_usage":true},"min_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"max_completion_tokens":1,"max_tokens":1,"messages":[{"role":"user","content":"<a&b>"}],"model":"m","stream":false}`
	if string(b) != want {
		t.Errorf("nixl prefill:\ngot  %s\nwant %s", b, want)
	}
	b, _ = SGLangBody([]byte(`{"model":"m","prompt":"x"}`), "10.0.0.1", 8998, 1<<63+5)
	if want := `{"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":5,"model":"m","prompt":"x"}`; string(b) != want {
		t.Errorf("sglang:\ngot  %s\nwant %s", b, want)
	}
	// Batches get one room per item, as SGLang's router sends them.
	for _, tc := range []struct{ body, want string }{
		{`{"prompt":["a","b"]}`, `{"bootstrap_host":["h","h"],"bootstrap_port":[8998,8998],"bootstrap_room":[7,8],"prompt":["a","b"]}`},
		{`{"prompt":[[1,2],[3]]}`, `{"bootstrap_host":["h","h"],"bootstrap_port":[8998,8998],"bootstrap_room":[7,8],"prompt":[[1,2],[3]]}`},
		{`{"prompt":[1,2,3]}`, `{"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":7,"prompt":[1,2,3]}`},
		{`{"messages":[],"n":3}`, `{"bootstrap_host":["h","h","h"],"bootstrap_port":[8998,8998,8998],"bootstrap_room":[7,8,9],"messages":[],"n":3}`},
		{`{"text":["x"],"n":1}`, `{"bootstrap_host":["h"],"bootstrap_port":[8998],"bootstrap_room":[7],"n":1,"text":["x"]}`},
	} {
		b, err := SGLangBody([]byte(tc.body), "h", 8998, 7)
		if err != nil || string(b) != tc.want {
			t.Errorf("sglang %s:\ngot  %s (%v)\nwant %s", tc.body, b, err, tc.want)
		}
	}
	if _, err := SGLangBody([]byte(`{"messages":[],"n":70000}`), "h", 8998, 7); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("sglang n=70000: got %v, want the batch limit", err)
	}
	for _, reply := range []string{`{}`, `{"kv_transfer_params":null}`, `{"kv_transfer_params":{}}`, `{"kv_transfer_params":[1]}`} {
		if _, err := KVTransferParams([]byte(reply)); err != ErrMissingKVParams {
			t.Errorf("%s: got %v, want ErrMissingKVParams", reply, err)
		}
	}
	if _, err := KVTransferParams([]byte(`not json`)); err == nil {
		t.Error("bad reply: got no error")
	}
	if kv, err := KVTransferParams([]byte(`{"kv_transfer_params":{"remote_host":"h"}}`)); err != nil || string(kv) != `{"remote_host":"h"}` {
		t.Errorf("got %s %v", kv, err)
	}
	for _, body := range []string{`[]`, `null`, `{"a":1} x`, ``} {
		if err := CheckClientRequest([]byte(body), http.Header{}); err == nil {
			t.Errorf("%q: got no error", body)
		}
	}
	var _ = bufio.NewReader
}

// TestPDServerStop: a request the server cancels with a *kvroute.Error
// cause (the proxy's drain deadline) is answered with that error, as a
// JSON error before the answer began and as an error event and [DONE] in
// a stream; a plain cancellation (the client went away) is not answered.
func TestPDServerStop(t *testing.T) {
	stopErr := &kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable, Message: "shutting down"}
	// serve runs the request and cancels it with cause once arrived is
	// closed (nil: once the client was written to).
	serve := func(t *testing.T, f *pdFixture, body string, arrived <-chan struct{}, cause error) (Result, *httptest.ResponseRecorder) {
		t.Helper()
		ctx, cancel := context.WithCancelCause(context.Background())
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
		ri, err := openai.ParseRequest(openai.KindCompletion, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		kr := &kvroute.Request{ID: "stop", Model: ri.Model, Prompt: ri.Prompt, PromptTokens: ri.PromptTokens(),
			MaxTokens: ri.MaxTokens, Stream: ri.Stream, Arrival: time.Now()}
		w := &firstWrite{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{})}
		if arrived == nil {
			arrived = w.wrote
		}
		go func() {
			<-arrived
			cancel(cause)
		}()
		return f.h.Serve(w, req, "/v1/completions", []byte(body), kr), w.ResponseRecorder
	}
	t.Run("before the answer", func(t *testing.T) {
		hang, arrived := hangingEngine(t)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", hang.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		res, rec := serve(t, f, completion(false, 2), arrived, stopErr)
		if res.Status != 503 || rec.Code != 503 || !strings.Contains(rec.Body.String(), "shutting down") {
			t.Errorf("got result %d, response %d %s; want the 503 stop error", res.Status, rec.Code, rec.Body)
		}
	})
	t.Run("in a stream", func(t *testing.T) {
		p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
		slow := fake(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // then a closed connection cancels r
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"n\":0}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		})
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", slow.URL, kvroute.RoleDecode))
		res, rec := serve(t, f, completion(true, 4), nil, stopErr)
		body := rec.Body.String()
		if res.Status != 503 || !strings.HasPrefix(body, "data: {\"n\":0}\n\n") || !strings.Contains(body, "shutting down") ||
			!strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Errorf("got result %d, stream %q; want the first event, the stop error event and [DONE]", res.Status, body)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		hang, arrived := hangingEngine(t)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", hang.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		res, rec := serve(t, f, completion(false, 2), arrived, nil)
		if res.Status != StatusClientClosed || rec.Body.Len() != 0 {
			t.Errorf("got result %d, body %q; want 499 and nothing written", res.Status, rec.Body)
		}
	})
}

// hangingEngine is an engine that takes requests and never answers;
// arrived is closed when the first one has come.
func hangingEngine(t *testing.T) (*httptest.Server, <-chan struct{}) {
	arrived := make(chan struct{})
	var once sync.Once
	return fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then a closed connection cancels r
		once.Do(func() { close(arrived) })
		<-r.Context().Done()
	}), arrived
}

// firstWrite is a ResponseRecorder that closes wrote at its first Write.
type firstWrite struct {
	*httptest.ResponseRecorder
	once  sync.Once
	wrote chan struct{}
}

func (w *firstWrite) Write(b []byte) (int, error) {
	n, err := w.ResponseRecorder.Write(b)
	w.once.Do(func() { close(w.wrote) })
	return n, err
}

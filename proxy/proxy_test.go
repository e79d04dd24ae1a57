package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/policy"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
const streamBody = `{"model":"m","prompt":"hello","stream":true}`

func TestNonStreamingForwardsBodyByteForByte(t *testing.T) {
	got := make(chan []byte, 1)
	gotHdr := make(chan http.Header, 1)
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		gotHdr <- r.Header.Clone()
		okHandler("a")(w, r)
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	// Odd spacing, escapes and unknown fields must reach the engine as sent.
	body := ` {"model" : "m", "messages":[{"role":"user","content":"h\u00e9llo \"x\""}], "x_extra":[1, 2.50e1] } `
	req, _ := http.NewRequest(http.MethodPost, tp.srv.URL+PathChatCompletions, strings.NewReader(body))
	req.Header.Set("X-Request-Id", "client-id-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(out, "from a") {
		t.Fatalf("got %d %s, want 200 from a", resp.StatusCode, out)
	}
	if b := <-got; string(b) != body {
		t.Errorf("engine got body %q, want %q", b, body)
	}
	h := <-gotHdr
	if id := h.Get(HeaderRequestID); id != "client-id-1" {
		t.Errorf("engine got X-Request-Id %q, want client-id-1", id)
	}
	if ids := resp.Header.Values(HeaderRequestID); len(ids) != 1 || ids[0] != "client-id-1" {
		t.Errorf("response X-Request-Id: got %q, want [client-id-1]", ids)
	}
	// The request is counted when the handler returns, maybe after the
	// client has read the answer.
	waitFor(t, "kvroute_requests_total{code=200} to be 1", func() bool {
		return tp.metric(t, tp.metrics.requests, "m", be.URL, "200") == 1
	})
}

func TestStreamChunksArriveOneByOne(t *testing.T) {
	release := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\n")
		select { // the last chunks wait until the client has seen the first
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: {\"n\":1}\n\ndata: [DONE]\n\n")
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	resp := tp.post(t, PathCompletions, streamBody)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type: got %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	if line := recv(t, "the first chunk before the backend writes the last", first); line != "data: {\"n\":0}\n" {
		t.Fatalf("first line: got %q", line)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if want := "\ndata: {\"n\":1}\n\ndata: [DONE]\n\n"; string(rest) != want {
		t.Errorf("rest of stream: got %q, want %q", rest, want)
	}
}

func TestRetryBeforeFirstByteLandsOnAnotherEndpoint(t *testing.T) {
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "http://" + dead.Addr().String()
	dead.Close() // connection refused from now on
	tests := []struct {
		name   string
		first  string
		reason string
	}{
		{"5xx", "", "status_5xx"},
		{"connect error", deadURL, "connect_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := newBackend(t, "bad", statusHandler(503))
			good := newBackend(t, "good", okHandler("good"))
			first := tc.first
			if first == "" {
				first = bad.URL
			}
			tp := newTestProxy(t, testConfig("first", first, good.URL))
			for _, body := range []string{chatBody, streamBody} {
				path := PathChatCompletions
				if strings.Contains(body, "prompt") {
					path = PathCompletions
				}
				resp := tp.post(t, path, body)
				out := readAll(t, resp)
				if resp.StatusCode != 200 || !strings.Contains(out, "good") {
					t.Errorf("got %d %q, want 200 from good", resp.StatusCode, out)
				}
			}
			if n := good.hits.Load(); n != 2 {
				t.Errorf("good endpoint: got %d requests, want 2", n)
			}
			if tc.first == "" && bad.hits.Load() != 2 {
				t.Errorf("bad endpoint: got %d requests, want 2", bad.hits.Load())
			}
			if v := tp.metric(t, tp.metrics.retries, "m", first, tc.reason); v != 2 {
				t.Errorf("kvroute_retries_total{reason=%s}: got %v, want 2", tc.reason, v)
			}
		})
	}
}

func TestRetryExhaustedReturnsUpstreamFailure(t *testing.T) {
	a := newBackend(t, "a", statusHandler(500))
	b := newBackend(t, "b", statusHandler(502))
	cfg := testConfig("first", a.URL, b.URL)
	cfg.Retry.Attempts = 3 // more attempts than endpoints
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	out := readAll(t, resp)
	if resp.StatusCode != 502 || !strings.Contains(out, "engine says 502") {
		t.Errorf("got %d %q, want the last endpoint's 502", resp.StatusCode, out)
	}
	if ids := resp.Header.Values(HeaderRequestID); len(ids) != 1 {
		t.Errorf("X-Request-Id: got %q, want one", ids)
	}
	// One retry happened (a to b); b's failure had nowhere to go.
	if va, vb := tp.metric(t, tp.metrics.retries, "m", a.URL, "status_5xx"), tp.metric(t, tp.metrics.retries, "m", b.URL, "status_5xx"); va+vb != 1 {
		t.Errorf("kvroute_retries_total: got %v from a and %v from b, want 1 in all", va, vb)
	}
	// One endpoint only: its own 5xx body comes back, and nothing was retried.
	tp1 := newTestProxy(t, testConfig("first", a.URL))
	resp = tp1.post(t, PathChatCompletions, chatBody)
	out = readAll(t, resp)
	if resp.StatusCode != 500 || !strings.Contains(out, "engine says 500") {
		t.Errorf("single endpoint: got %d %q, want its 500", resp.StatusCode, out)
	}
	if v := tp1.metric(t, tp1.metrics.retries, "m", a.URL, "status_5xx"); v != 0 {
		t.Errorf("single endpoint: kvroute_retries_total = %v, want 0 (no other endpoint to retry on)", v)
	}
}

func TestEjectionAndRecovery(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	a := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			statusHandler(500)(w, r)
			return
		}
		okHandler("a")(w, r)
	})
	b := newBackend(t, "b", okHandler("b"))
	cfg := testConfig("first", a.URL, b.URL)
	cfg.Retry.Attempts = 1
	cfg.Models[0].Router.FailThreshold = 2
	cfg.Models[0].Router.BaseEjection = 10 * time.Second
	tp := newTestProxy(t, cfg)
	send := func() (int, string) {
		resp := tp.post(t, PathChatCompletions, chatBody)
		return resp.StatusCode, readAll(t, resp)
	}
	for i := range 2 { // two failures reach the client (no retries), then a is ejected
		if code, _ := send(); code != 500 {
			t.Fatalf("request %d: got %d, want a's 500", i, code)
		}
	}
	if v := tp.metric(t, tp.metrics.ejections, "m", a.URL, "passive"); v != 1 {
		t.Errorf("kvroute_ejections_total: got %v, want 1", v)
	}
	for i := range 3 {
		if code, out := send(); code != 200 || !strings.Contains(out, "from b") {
			t.Fatalf("while a is ejected, request %d: got %d %q, want b", i, code, out)
		}
	}
	failing.Store(false)
	tp.clock.Advance(11 * time.Second)
	if code, out := send(); code != 200 || !strings.Contains(out, "from a") {
		t.Fatalf("after the ejection: got %d %q, want a back", code, out)
	}
}

func TestNoHealthyEndpoint503(t *testing.T) {
	a := newBackend(t, "a", statusHandler(500))
	cfg := testConfig("first", a.URL)
	cfg.Retry.Attempts = 1
	cfg.Models[0].Router.FailThreshold = 1
	cfg.Models[0].Router.BaseEjection = 5 * time.Second
	tp := newTestProxy(t, cfg)
	readAll(t, tp.post(t, PathChatCompletions, chatBody)) // ejects a
	resp := tp.post(t, PathChatCompletions, chatBody)
	out := readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Fatalf("got %d %s, want 503", resp.StatusCode, out)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "5" {
		t.Errorf("Retry-After: got %q, want 5", ra)
	}
	var e openai.ErrorResponse
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.Error.Type != "service_unavailable_error" {
		t.Errorf("body: got %s (%v)", out, err)
	}
	resp, _ = http.Get(tp.srv.URL + PathReadyz)
	if out := readAll(t, resp); resp.StatusCode != 503 || !strings.Contains(out, `"m"`) {
		t.Errorf("/readyz: got %d %s, want 503 naming m", resp.StatusCode, out)
	}
}

func TestActiveHealthChecks(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", a.URL)
	cfg.HealthCheck = config.HealthCheck{Interval: 5 * time.Millisecond, Timeout: 5 * time.Millisecond, UnhealthyThreshold: 2, HealthyThreshold: 1}
	tp := newTestProxy(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunHealthChecks(ctx) }()
	defer func() {
		cancel()
		if err := recv(t, "health checks to stop", done); err != nil {
			t.Errorf("RunHealthChecks: %v", err)
		}
	}()
	isHealthy := func() bool { return tp.Router("m").Status(tp.clock.Now())[0].Healthy }
	a.down.Store(true)
	waitFor(t, "a to fail its health checks", func() bool { return !isHealthy() })
	resp := tp.post(t, PathChatCompletions, chatBody)
	if readAll(t, resp); resp.StatusCode != 503 {
		t.Errorf("while unhealthy: got %d, want 503", resp.StatusCode)
	}
	a.down.Store(false)
	waitFor(t, "a to pass its health checks", isHealthy)
	resp = tp.post(t, PathChatCompletions, chatBody)
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("after recovery: got %d, want 200", resp.StatusCode)
	}
}

func TestClientDisconnectCancelsBackend(t *testing.T) {
	canceled := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\n")
		<-r.Context().Done() // the engine generates until its request is cancelled
		close(canceled)
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tp.srv.URL+PathCompletions, strings.NewReader(streamBody))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if line != "data: {\"n\":0}\n" {
		t.Fatalf("first line: got %q", line)
	}
	cancel()
	resp.Body.Close()
	recv(t, "the backend request to be cancelled", canceled)
	waitFor(t, "the request to be counted as 499", func() bool {
		return tp.metric(t, tp.metrics.requests, "m", be.URL, "499") == 1
	})
	if v := tp.metric(t, tp.metrics.inflight, "m", be.URL); v != 0 {
		t.Errorf("in-flight after the disconnect: got %v, want 0", v)
	}
}

func TestMidStreamFailureEndsWithErrorEvent(t *testing.T) {
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\ndata: {\"n\":")
		panic(http.ErrAbortHandler) // the engine dies mid-event
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	resp := tp.post(t, PathCompletions, streamBody)
	got := events(t, strings.NewReader(readAll(t, resp)))
	if len(got) != 4 || got[0] != `{"n":0}` || got[1] != `{"n":` || got[3] != "[DONE]" {
		t.Fatalf("events: got %q, want the first chunk, the broken one, an error event and [DONE]", got)
	}
	var e openai.ErrorResponse
	if err := json.Unmarshal([]byte(got[2]), &e); err != nil || e.Error.Code != float64(502) || e.Error.Type != "upstream_error" {
		t.Errorf("error event: got %s (%v), want a vLLM-style error with code 502", got[2], err)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 1 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 1", v)
	}
}

func TestBadInputs(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Limits.MaxBodyBytes = 1024
	tp := newTestProxy(t, cfg)
	big := `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`
	tests := []struct {
		name, method, path, body string
		wantStatus               int
		wantType, wantParam      string
	}{
		{"unknown model", "POST", PathChatCompletions, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error", "model"},
		{"oversized body", "POST", PathCompletions, big, 413, "invalid_request_error", ""},
		{"malformed json", "POST", PathChatCompletions, `{"model":"m",`, 400, "invalid_request_error", ""},
		{"not an object", "POST", PathChatCompletions, `"hi"`, 400, "invalid_request_error", ""},
		{"empty body", "POST", PathChatCompletions, ``, 400, "invalid_request_error", ""},
		{"missing model", "POST", PathChatCompletions, `{"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", "model"},
		{"model wrong type", "POST", PathChatCompletions, `{"model":["m"],"messages":[]}`, 400, "invalid_request_error", "model"},
		{"empty messages", "POST", PathChatCompletions, `{"model":"m","messages":[]}`, 400, "invalid_request_error", "messages"},
		{"messages missing", "POST", PathChatCompletions, `{"model":"m","prompt":"x"}`, 400, "invalid_request_error", "messages"},
		{"stream wrong type", "POST", PathCompletions, `{"model":"m","prompt":"x","stream":1}`, 400, "invalid_request_error", "stream"},
		{"max_tokens wrong type", "POST", PathCompletions, `{"model":"m","prompt":"x","max_tokens":"9"}`, 400, "invalid_request_error", "max_tokens"},
		{"prompt missing", "POST", PathCompletions, `{"model":"m"}`, 400, "invalid_request_error", "prompt"},
		{"message without role", "POST", PathChatCompletions, `{"model":"m","messages":[{"content":"x"}]}`, 400, "invalid_request_error", "messages[0].role"},
		{"wrong method", "GET", PathCompletions, ``, 405, "invalid_request_error", ""},
		{"unknown path", "POST", "/v1/embeddingz", `{}`, 404, "not_found_error", ""},
		{"admin disabled", "PUT", PathAdminPolicy, `{}`, 404, "not_found_error", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, tp.srv.URL+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			out := readAll(t, resp)
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("status: got %d, want %d (%s)", resp.StatusCode, tc.wantStatus, out)
			}
			var e struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal([]byte(out), &e); err != nil {
				t.Fatalf("body %q is not an OpenAI error: %v", out, err)
			}
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := e.Error[k]; !ok {
					t.Errorf("error body %s lacks %q", out, k)
				}
			}
			param, _ := e.Error["param"].(string)
			if e.Error["type"] != tc.wantType || param != tc.wantParam {
				t.Errorf("got type %v param %q, want %q %q", e.Error["type"], param, tc.wantType, tc.wantParam)
			}
		})
	}
	if n := be.hits.Load(); n != 0 {
		t.Errorf("the engine saw %d bad requests, want 0", n)
	}
}

func TestRoutingHeadersStrippedUnlessTrusted(t *testing.T) {
	got := make(chan http.Header, 1)
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		okHandler("a")(w, r)
	})
	for _, tc := range []struct {
		name    string
		trusted []string
		want    string
	}{
		{"untrusted", nil, ""},
		{"untrusted network", []string{"10.0.0.0/8"}, ""},
		{"trusted", []string{"127.0.0.0/8"}, "p1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("first", be.URL)
			cfg.TrustedClients = tc.trusted
			tp := newTestProxy(t, cfg)
			req, _ := http.NewRequest("POST", tp.srv.URL+PathChatCompletions, strings.NewReader(chatBody))
			req.Header.Set("X-Kvroute-Prefill-Endpoint", "p1")
			req.Header.Set("x-kvroute-tenant", "t")
			req.Header.Set("X-Other", "kept")
			readAll(t, must(http.DefaultClient.Do(req)))
			h := <-got
			if v := h.Get("X-Kvroute-Prefill-Endpoint"); v != tc.want {
				t.Errorf("engine got X-Kvroute-Prefill-Endpoint %q, want %q", v, tc.want)
			}
			if h.Get("X-Other") != "kept" {
				t.Error("other headers must be forwarded")
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestDebugHeaderAndDecisions(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Debug.Enabled = true
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	readAll(t, resp)
	if got := resp.Header.Get(HeaderEndpoint); got != be.URL {
		t.Errorf("%s: got %q, want %q", HeaderEndpoint, got, be.URL)
	}
	resp = must(http.Get(tp.srv.URL + PathDecisions + "?model=m&n=5"))
	out := readAll(t, resp)
	var d map[string][]struct {
		Decision struct{ Endpoint string } `json:"decision"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || len(d["m"]) != 1 || d["m"][0].Decision.Endpoint != be.URL {
		t.Errorf("/debug/decisions: got %s (%v)", out, err)
	}
	for _, path := range []string{PathEndpoints, PathModels, PathHealthz, PathReadyz, PathMetrics} {
		resp := must(http.Get(tp.srv.URL + path))
		if out := readAll(t, resp); resp.StatusCode != 200 {
			t.Errorf("GET %s: got %d %s", path, resp.StatusCode, out)
		}
	}
	out = readAll(t, must(http.Get(tp.srv.URL+PathMetrics)))
	for _, name := range []string{"kvroute_requests_total", "kvroute_inflight_requests", "kvroute_upstream_ttfb_seconds",
		"kvroute_request_duration_seconds", "kvroute_decision_duration_seconds", "kvroute_endpoint_healthy"} {
		if !strings.Contains(out, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestPromptBuffersNotSharedWithRouter: the proxy parses each prompt into
// a recycled buffer, so the next request's prompt is often written over the
// last one's. Two requests in a row with prompts that share nothing: the
// second must find nothing cached (the router once kept the last prompt
// by reference and took the second for a repeat of the first).
func TestPromptBuffersNotSharedWithRouter(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Debug.Enabled = true
	tp := newTestProxy(t, cfg)
	body := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
	}
	a := strings.Repeat("You are a helpful assistant. ", 40)
	b := strings.Repeat("Tell me about the big city. ", 42)[:len(a)]
	readAll(t, tp.post(t, PathChatCompletions, body(a)))
	readAll(t, tp.post(t, PathChatCompletions, body(b)))
	out := readAll(t, must(http.Get(tp.srv.URL+PathDecisions+"?model=m&n=1")))
	var d map[string][]struct {
		Blocks     int `json:"blocks"`
		Candidates []struct {
			CachedBlocks int `json:"cached_blocks"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || len(d["m"]) != 1 || len(d["m"][0].Candidates) != 1 {
		t.Fatalf("/debug/decisions: got %s (%v)", out, err)
	}
	if got := d["m"][0]; got.Blocks < 9 || got.Candidates[0].CachedBlocks != 0 {
		t.Fatalf("second prompt: %d blocks, %d of them cached; want at least 9, none cached", got.Blocks, got.Candidates[0].CachedBlocks)
	}
}

func TestDebugNeedsTokenWhenDisabled(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Admin.Token = "0123456789abcdef"
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	if readAll(t, resp); resp.Header.Get(HeaderEndpoint) != "" {
		t.Error("debug header sent with debug disabled")
	}
	resp = must(http.Get(tp.srv.URL + PathDecisions))
	if readAll(t, resp); resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != `Bearer realm="kvroute"` {
		t.Errorf("/debug/decisions without token: got %d (WWW-Authenticate %q), want 401 with a Bearer challenge",
			resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	req, _ := http.NewRequest("GET", tp.srv.URL+PathDecisions, nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef")
	resp = must(http.DefaultClient.Do(req))
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("/debug/decisions with token: got %d, want 200", resp.StatusCode)
	}
}

// TestDebugClosedWithoutToken: with neither debug.enabled nor an admin
// token, no credential opens the debug endpoints: 403, no challenge.
func TestDebugClosedWithoutToken(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	tp := newTestProxy(t, testConfig("first", be.URL))
	req, _ := http.NewRequest("GET", tp.srv.URL+PathDecisions, nil)
	req.Header.Set("Authorization", "Bearer anything")
	resp := must(http.DefaultClient.Do(req))
	body := readAll(t, resp)
	if resp.StatusCode != 403 || resp.Header.Get("WWW-Authenticate") != "" || !strings.Contains(body, "no admin.token") {
		t.Errorf("/debug/decisions with no admin token configured: got %d (WWW-Authenticate %q) %s, want 403 without a challenge",
			resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
	}
}

func TestAdminPolicy(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Admin.Token = "0123456789abcdef"
	tp := newTestProxy(t, cfg)
	tests := []struct {
		name, token, body string
		want              int
	}{
		{"no token", "", `{"model":"m","policy":"rr"}`, 401},
		{"wrong token", "0123456789abcdeX", `{"model":"m","policy":"rr"}`, 401},
		{"not bearer", "Basic 0123456789abcdef", `{"model":"m","policy":"rr"}`, 401},
		{"unknown model", "0123456789abcdef", `{"model":"x","policy":"rr"}`, 404},
		{"unknown policy", "0123456789abcdef", `{"model":"m","policy":"nope"}`, 400},
		{"bad body", "0123456789abcdef", `{"model":"m","policy":"rr","extra":1}`, 400},
		{"trailing data", "0123456789abcdef", `{"model":"m","policy":"rr"} {"model":"m","policy":"nope"}`, 400},
		{"trailing garbage", "0123456789abcdef", `{"model":"m","policy":"rr"}x`, 400},
		// Valid JSON, but over the 1 MiB limit: 413, not a 400 "unexpected EOF".
		{"too large", "0123456789abcdef", `{"model":"m","policy":"rr","params":{"x":"` + strings.Repeat("a", 1<<20) + `"}}`, 413},
		{"ok", "0123456789abcdef", `{"model":"m","policy":"rr","params":{"x":1}}`, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("PUT", tp.srv.URL+PathAdminPolicy, strings.NewReader(tc.body))
			switch {
			case strings.Contains(tc.token, " "):
				req.Header.Set("Authorization", tc.token)
			case tc.token != "":
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp := must(http.DefaultClient.Do(req))
			if out := readAll(t, resp); resp.StatusCode != tc.want {
				t.Errorf("got %d %s, want %d", resp.StatusCode, out, tc.want)
			} else if tc.want == 413 {
				wantErrorBody(t, resp.StatusCode, out, 413, "larger than the limit of 1048576 bytes")
			} else if challenge := resp.Header.Get("WWW-Authenticate"); (tc.want == 401) != (challenge != "") {
				t.Errorf("status %d with WWW-Authenticate %q: a 401, and only a 401, carries the challenge", resp.StatusCode, challenge)
			}
		})
	}
	if got := tp.Router("m").Policy(); got != "rr" {
		t.Errorf("policy after the switch: got %q, want rr", got)
	}
}

func TestModelsUnion(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Models = append(cfg.Models, cfg.Models[0])
	cfg.Models[1].Name = "b-model"
	tp := newTestProxy(t, cfg)
	out := readAll(t, must(http.Get(tp.srv.URL+PathModels)))
	var l modelList
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Data) != 2 || l.Data[0].ID != "b-model" || l.Data[1].ID != "m" {
		t.Errorf("/v1/models: got %s", out)
	}
}

func TestNewErrors(t *testing.T) {
	cfg := testConfig("nope", "http://127.0.0.1:1")
	if _, err := New(Options{Config: cfg, NewPicker: testPickers}); err == nil ||
		!strings.Contains(err.Error(), `models[0].policy: unknown policy "nope"`) {
		t.Errorf("unknown policy: got %v", err)
	}
	cfg = testConfig("first", "htp://x")
	if _, err := New(Options{Config: cfg, NewPicker: testPickers}); err == nil ||
		!strings.Contains(err.Error(), `models[0].endpoints[0].url: "htp://x" is not an http(s) URL`) {
		t.Errorf("bad url: got %v", err)
	}
	if _, err := New(Options{Config: testConfig("first", "http://127.0.0.1:1")}); err == nil {
		t.Error("nil NewPicker: got nil error")
	}
}

// servingStream is a proxy serving on a fresh listener with one stream in
// progress, read up to the engine's first event ({"n":0}).
type servingStream struct {
	ln     net.Listener       // the listener Serve accepts on
	stop   context.CancelFunc // ends Serve's context, as SIGTERM does
	served <-chan error       // what Serve returns
	rest   *bufio.Reader      // the stream after its first event
	resp   *http.Response
}

// startServe runs p.Serve on a new loopback listener until stop (or the
// test's end) and reports what it returns on served.
func startServe(t *testing.T, p *Proxy) (ln net.Listener, stop context.CancelFunc, served <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	ch := make(chan error, 1)
	go func() { ch <- p.Serve(ctx, ln) }()
	return ln, stop, ch
}

// startStream serves p and posts body, a stream whose engine first sends
// the event {"n":0}.
func startStream(t *testing.T, p *Proxy, body string) *servingStream {
	t.Helper()
	ln, stop, served := startServe(t, p)
	resp, err := http.Post("http://"+ln.Addr().String()+PathCompletions, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "data: {\"n\":0}\n" {
		t.Fatalf("first line: got %q", line)
	}
	return &servingStream{ln: ln, stop: stop, served: served, rest: br, resp: resp}
}

func TestGracefulShutdownDrainsStreams(t *testing.T) {
	release := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\n")
		<-release
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	cfg := testConfig("first", be.URL)
	p, err := New(Options{Config: cfg, NewPicker: testPickers})
	if err != nil {
		t.Fatal(err)
	}
	st := startStream(t, p, streamBody)
	stop, served, br, resp := st.stop, st.served, st.rest, st.resp
	stop() // SIGTERM: stop accepting, drain
	waitFor(t, "the proxy to stop accepting", func() bool {
		c, err := net.Dial("tcp", st.ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(release)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if string(rest) != "\ndata: [DONE]\n\n" {
		t.Errorf("the in-flight stream was not drained: rest %q", rest)
	}
	if err := recv(t, "Serve to return", served); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestServeListenerFailureDrains: when the listener fails (Serve's own
// error, no shutdown asked for), the stream in progress is drained and,
// at the drain deadline, ended as at a shutdown (error event, [DONE]).
// Serve returned at once instead, without waiting for its handlers, and
// the cancel of their base context on its way out cut the stream short
// with no error event (the stream's rest was "\n"), as if its client had
// gone.
func TestServeListenerFailureDrains(t *testing.T) {
	release := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\n")
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	cfg := testConfig("first", be.URL)
	cfg.Timeouts.Shutdown = 50 * time.Millisecond
	p, err := New(Options{Config: cfg, NewPicker: testPickers})
	if err != nil {
		t.Fatal(err)
	}
	st := startStream(t, p, streamBody)
	served, br := st.served, st.rest
	defer st.resp.Body.Close()
	st.ln.Close() // the listener fails
	rest := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(br)
		rest <- string(b)
	}()
	if got := recv(t, "the stream to end", rest); !strings.Contains(got, "shutting down") || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("the stream's end: got %q, want the drain deadline's error event and [DONE]", got)
	}
	if err := recv(t, "Serve to return", served); err == nil {
		t.Error("Serve: got nil, want the listener's error")
	}
}

func TestShedIs429WithRetryAfter(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	tp := newTestProxy(t, testConfig("shed", be.URL))
	resp := tp.post(t, PathChatCompletions, chatBody)
	out := readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(out, "overloaded") {
		t.Errorf("got %d Retry-After %q %s, want 429, 1 and an overloaded error", resp.StatusCode, resp.Header.Get("Retry-After"), out)
	}
	if be.hits.Load() != 0 {
		t.Error("a shed request reached the engine")
	}
}

func TestSlowBodyGets408(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Timeouts.ReadBody = 50 * time.Millisecond
	tp := newTestProxy(t, cfg)
	c, err := net.Dial("tcp", strings.TrimPrefix(tp.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Promise 100 bytes, send 10, then stall.
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":", PathChatCompletions)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // hang guard
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	if out := readAll(t, resp); resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(out, "request_timeout") {
		t.Errorf("got %d %s, want 408", resp.StatusCode, out)
	}
}

func TestRequestIDOnEveryAnswer(t *testing.T) {
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	echo := newBackend(t, "echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderRequestID, r.Header.Get(HeaderRequestID)) // vLLM echoes it
		okHandler("echo")(w, r)
	})
	cfgDead := testConfig("first", deadURL)
	cfgDead.Retry.Attempts = 1
	tests := []struct {
		name string
		tp   *testProxy
		body string
		want int
	}{
		{"proxied, engine echoes the id", newTestProxy(t, testConfig("first", echo.URL)), chatBody, 200},
		{"connect error", newTestProxy(t, cfgDead), chatBody, 502},
		{"bad request", newTestProxy(t, testConfig("first", echo.URL)), `{}`, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", tc.tp.srv.URL+PathChatCompletions, strings.NewReader(tc.body))
			req.Header.Set(HeaderRequestID, "rid-42")
			resp := must(http.DefaultClient.Do(req))
			out := readAll(t, resp)
			if resp.StatusCode != tc.want {
				t.Errorf("status: got %d %s, want %d", resp.StatusCode, out, tc.want)
			}
			if ids := resp.Header.Values(HeaderRequestID); len(ids) != 1 || ids[0] != "rid-42" {
				t.Errorf("X-Request-Id: got %q, want [rid-42]", ids)
			}
		})
	}
	req, _ := http.NewRequest("POST", tests[0].tp.srv.URL+PathChatCompletions, strings.NewReader(chatBody))
	req.Header.Set(HeaderRequestID, "bad id with spaces")
	resp := must(http.DefaultClient.Do(req))
	readAll(t, resp)
	if id := resp.Header.Get(HeaderRequestID); !strings.HasPrefix(id, "kvr-") {
		t.Errorf("an invalid client id must be replaced: got %q", id)
	}
}

func TestSessionAndTenantReachTheRouter(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	body := `{"model":"m","user":"alice","messages":[{"role":"user","content":"hello"}]}`
	tests := []struct {
		name        string
		trusted     []string
		headers     map[string]string
		wantSession string
		wantTenant  string
	}{
		{"user field", nil, nil, "", "alice"},
		{"session header", nil, map[string]string{"X-Session-Id": "s1"}, "s1", "alice"},
		{"untrusted routing headers ignored", nil, map[string]string{"X-Session-Id": "s1", "X-Kvroute-Session": "s2", "X-Kvroute-Tenant": "t2"}, "s1", "alice"},
		{"trusted routing headers win", []string{"127.0.0.1"}, map[string]string{"X-Session-Id": "s1", "X-Kvroute-Session": "s2", "X-Kvroute-Tenant": "t2"}, "s2", "t2"},
		// The API key, which a client cannot vary as it can "user", names
		// the tenant, by a digest: the key shows nowhere.
		{"api key wins over the user field", nil, map[string]string{"Authorization": "Bearer sk-secret-1"}, "", keyTenant("sk-secret-1")},
		{"api key scheme is case-insensitive", nil, map[string]string{"Authorization": "bearer sk-secret-1"}, "", keyTenant("sk-secret-1")},
		{"another api key, another tenant", nil, map[string]string{"Authorization": "Bearer sk-secret-2"}, "", keyTenant("sk-secret-2")},
		{"not a bearer token", nil, map[string]string{"Authorization": "Basic dTpw"}, "", "alice"},
		{"trusted tenant header wins over the api key", []string{"127.0.0.1"}, map[string]string{"Authorization": "Bearer sk-secret-1", "X-Kvroute-Tenant": "t2"}, "", "t2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("first", be.URL)
			cfg.TrustedClients = tc.trusted
			tp := newTestProxy(t, cfg)
			req, _ := http.NewRequest("POST", tp.srv.URL+PathChatCompletions, strings.NewReader(body))
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			readAll(t, must(http.DefaultClient.Do(req)))
			d := tp.Router("m").Decisions(1)
			if len(d) != 1 || d[0].SessionKey != tc.wantSession || d[0].Tenant != tc.wantTenant {
				t.Errorf("decision: got %+v, want session %q tenant %q", d, tc.wantSession, tc.wantTenant)
			}
			if b, _ := json.Marshal(d); bytes.Contains(b, []byte("sk-secret")) {
				t.Errorf("the decision log shows the API key: %s", b)
			}
		})
	}
	if keyTenant("sk-secret-1") == keyTenant("sk-secret-2") {
		t.Error("two API keys share a tenant")
	}
}

// keyTenant is the tenant of requests authenticated with key.
func keyTenant(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:8])
}

// TestWithEveryPolicy routes through the real policies: every one must
// serve requests on a healthy pool, and the baselines must spread them.
func TestWithEveryPolicy(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	for _, name := range policy.Names() {
		t.Run(name, func(t *testing.T) {
			tp := newTestProxyWith(t, testConfig(name, a.URL, b.URL), policy.New)
			seen := map[string]int{}
			for i := range 8 {
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i)
				resp := tp.post(t, PathChatCompletions, body)
				readAll(t, resp)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: got %d", i, resp.StatusCode)
				}
				seen[resp.Header.Get("X-Backend")]++
			}
			if name == policy.NameRoundRobin && (seen["a"] != 4 || seen["b"] != 4) {
				t.Errorf("round_robin spread: got %v, want 4 and 4", seen)
			}
		})
	}
}

func TestOutcomesReachLearningPolicies(t *testing.T) {
	var tp *testProxy
	var fail atomic.Bool
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		tp.clock.Advance(40 * time.Millisecond) // the engine's prefill
		if fail.Load() {
			statusHandler(500)(w, r)
			return
		}
		okHandler("a")(w, r)
	})
	cfg := testConfig("learn", be.URL)
	cfg.Retry.Attempts = 1
	l := &learner{}
	tp = newTestProxyWith(t, cfg, onePicker(l))
	for i, body := range []string{streamBody, chatBody, chatBody} {
		path := PathChatCompletions
		if body == streamBody {
			path = PathCompletions
		}
		fail.Store(i == 2)
		readAll(t, tp.post(t, path, body))
		// Done runs as the handler returns, maybe after the client has read.
		waitFor(t, "the outcome", func() bool { return len(l.got()) == i+1 })
	}
	got := l.got()
	want := []struct {
		ttft   time.Duration
		failed bool
	}{{40 * time.Millisecond, false}, {0, false}, {0, true}}
	for i, w := range want {
		if got[i].TTFT != w.ttft || got[i].Failed != w.failed || got[i].Endpoint != be.URL || got[i].PromptTokens == 0 {
			t.Errorf("outcome %d: got %+v, want TTFT %v failed %v", i, got[i], w.ttft, w.failed)
		}
	}
}

// TestErrorAnswerIsAFailedOutcome: an engine's error answer (a prompt over
// the context length is vLLM's 400, at once) is a failed outcome without a
// TTFT (kvroute.Outcome: Failed reports an error response), though it is not
// the endpoint's failure for passive health: the first byte of an error
// body is no first token, and a learning policy took it for a prefill of
// the whole prompt in a few milliseconds.
func TestErrorAnswerIsAFailedOutcome(t *testing.T) {
	var tp *testProxy
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		tp.clock.Advance(3 * time.Millisecond)
		statusHandler(http.StatusBadRequest)(w, r)
	})
	cfg := testConfig("learn", be.URL)
	l := &learner{}
	tp = newTestProxyWith(t, cfg, onePicker(l))
	bodies := []string{streamBody, `{"model":"m","prompt":"hello"}`, streamBody, streamBody} // more than fail_threshold
	for _, body := range bodies {
		resp := tp.post(t, PathCompletions, body)
		if b := readAll(t, resp); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status: got %d (%s), want the engine's 400", resp.StatusCode, b)
		}
	}
	waitFor(t, "the outcomes", func() bool { return len(l.got()) == len(bodies) })
	for i, o := range l.got() {
		if !o.Failed || o.TTFT != 0 {
			t.Errorf("outcome %d: got %+v, want failed without a TTFT", i, o)
		}
	}
	if got := tp.Router("m").Status(tp.clock.Now())[0]; !got.Healthy || got.Ejections != 0 {
		t.Errorf("endpoint: got healthy %v, %d ejections; an error answer is not the endpoint's failure", got.Healthy, got.Ejections)
	}
}

// TestClientClosingAfterDoneIsNotA499: a client that hangs up once it has
// the final event, before the engine closes its response, got everything.
func TestClientClosingAfterDoneIsNotA499(t *testing.T) {
	finish := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\ndata: [DONE]\n\n")
		select { // keep the response open after [DONE]
		case <-finish:
		case <-r.Context().Done():
		}
	})
	defer close(finish)
	tp := newTestProxy(t, testConfig("first", be.URL))
	c, err := net.Dial("tcp", strings.TrimPrefix(tp.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", PathCompletions, len(streamBody), streamBody)
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if line == "data: [DONE]\n" {
			break
		}
	}
	c.Close()
	waitFor(t, "the request to be counted as 200", func() bool {
		return tp.metric(t, tp.metrics.requests, "m", be.URL, "200") == 1
	})
	if v := tp.metric(t, tp.metrics.requests, "m", be.URL, "499"); v != 0 {
		t.Errorf("kvroute_requests_total{code=499}: got %v, want 0", v)
	}
}

// A client's X-Request-Id names its request to the engine and back, but two
// requests in progress must reach the routing core under different IDs:
// kv-aware keeps each request's queued prefill under its ID, and a reused
// ID made it forget all but the last of them.
func TestDuplicateClientRequestIDsRouteApart(t *testing.T) {
	release := make(chan struct{})
	var engineIDs sync.Map // X-Request-Id the engine saw -> count
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		n, _ := engineIDs.LoadOrStore(r.Header.Get(HeaderRequestID), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		<-release
		okHandler("a")(w, r)
	})
	var mu sync.Mutex
	var routed []string
	pickers := func(name string, params map[string]any, seed uint64) (kvroute.Picker, error) {
		return kvroute.PickerFunc(func(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
			mu.Lock()
			routed = append(routed, req.ID)
			mu.Unlock()
			return firstHealthy(now, req, cands)
		}), nil
	}
	tp := newTestProxyWith(t, testConfig("rec", be.URL), pickers)
	send := func() *http.Response {
		req, _ := http.NewRequest("POST", tp.srv.URL+PathCompletions, strings.NewReader(`{"model":"m","prompt":"hi"}`))
		req.Header.Set(HeaderRequestID, "dup")
		return must(http.DefaultClient.Do(req))
	}
	const n = 3
	resps := make(chan *http.Response, n)
	for range n {
		go func() { resps <- send() }()
	}
	waitFor(t, "every request at the engine", func() bool { return be.hits.Load() == n })
	close(release)
	for range n {
		resp := recv(t, "a response", resps)
		readAll(t, resp)
		if got := resp.Header.Get(HeaderRequestID); got != "dup" {
			t.Errorf("response X-Request-Id: got %q, want the client's %q", got, "dup")
		}
	}
	if c, ok := engineIDs.Load("dup"); !ok || c.(*atomic.Int32).Load() != n {
		t.Errorf("the engine must see the client's X-Request-Id on every request")
	}
	mu.Lock()
	got := append([]string(nil), routed...)
	mu.Unlock()
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			t.Errorf("routing IDs of requests in progress together: got %q, want distinct", got)
			break
		}
		seen[id] = true
	}
	if !seen["dup"] {
		t.Errorf("routing IDs: got %q, want the client's %q among them", got, "dup")
	}
	// Once they are done the client's ID is free again.
	readAll(t, send())
	mu.Lock()
	last := routed[len(routed)-1]
	mu.Unlock()
	if last != "dup" {
		t.Errorf("routing ID of a later request: got %q, want %q", last, "dup")
	}
}

// A chunked request body is read whole before routing, so it goes to the
// engine with its Content-Length: not every engine's server reads chunked
// request bodies.
func TestChunkedRequestForwardedWithLength(t *testing.T) {
	type seen struct {
		length int64
		te     []string
		body   string
	}
	got := make(chan seen, 1)
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.ContentLength, r.TransferEncoding, string(b)}
		okHandler("a")(w, r)
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	req, _ := http.NewRequest("POST", tp.srv.URL+PathChatCompletions, io.MultiReader(strings.NewReader(chatBody)))
	req.ContentLength = -1 // unknown: sent chunked
	resp := must(http.DefaultClient.Do(req))
	if out := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status: got %d %s, want 200", resp.StatusCode, out)
	}
	s := recv(t, "the engine's request", got)
	if s.length != int64(len(chatBody)) || len(s.te) != 0 || s.body != chatBody {
		t.Errorf("engine request: got Content-Length %d, Transfer-Encoding %q, body %q; want %d, none, %q",
			s.length, s.te, s.body, len(chatBody), chatBody)
	}
}

// With debug on, an engine's error response names the endpoint that sent
// it, also when it was kept for a retry that found no other endpoint and
// is replayed.
func TestDebugHeaderOnReplayedFailure(t *testing.T) {
	be := newBackend(t, "a", statusHandler(http.StatusInternalServerError))
	cfg := testConfig("first", be.URL)
	cfg.Debug.Enabled = true
	cfg.Retry.Attempts = 2
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	out := readAll(t, resp)
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(out, "engine says 500") {
		t.Fatalf("got %d %s, want the engine's 500", resp.StatusCode, out)
	}
	if got := resp.Header.Get(HeaderEndpoint); got != be.URL {
		t.Errorf("%s: got %q, want %q", HeaderEndpoint, got, be.URL)
	}
}

// A stream still running when the drain deadline passes is ended the way a
// broken upstream stream is, with an error event and [DONE], not cut off;
// the engine's request is cancelled, the endpoint is not blamed, and Serve
// returns once the request is accounted for.
func TestShutdownDeadlineEndsStreamsWithErrorEvent(t *testing.T) {
	cancelled := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then a closed connection cancels r
		flushEvents(w, "data: {\"n\":0}\n\n")
		<-r.Context().Done() // generates until cancelled
		close(cancelled)
	})
	cfg := testConfig("first", be.URL)
	cfg.Timeouts.Shutdown = 50 * time.Millisecond
	cfg.Models[0].Router.FailThreshold = 1
	cfg.Models[0].Signals.Disabled = true // the backend serves no /metrics
	reg := prometheus.NewRegistry()
	p, err := New(Options{Config: cfg, NewPicker: testPickers, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	st := startStream(t, p, streamBody)
	stop, served, br, resp := st.stop, st.served, st.rest, st.resp
	stop()
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	got := events(t, bytes.NewReader(rest))
	if len(got) != 2 || got[1] != "[DONE]" {
		t.Fatalf("after the deadline: got %q, want an error event and [DONE]", rest)
	}
	var e openai.ErrorResponse
	if err := json.Unmarshal([]byte(got[0]), &e); err != nil || e.Error.Code != float64(http.StatusServiceUnavailable) {
		t.Errorf("error event: got %s (%v), want a vLLM-style error with code 503", got[0], err)
	}
	if err := recv(t, "Serve to return", served); err != nil {
		t.Errorf("Serve: %v", err)
	}
	recv(t, "the engine's request to be cancelled", cancelled)
	tp := &testProxy{Proxy: p}
	if v := tp.metric(t, p.metrics.requests, "m", be.URL, "503"); v != 1 {
		t.Errorf("requests answered 503 when Serve returned: got %v, want 1", v)
	}
	if v := tp.metric(t, p.metrics.inflight, "m", be.URL); v != 0 {
		t.Errorf("in flight when Serve returned: got %v, want 0", v)
	}
	if st := p.Router("m").Status(time.Now()); !st[0].Healthy {
		t.Errorf("the endpoint was blamed for the shutdown: %+v", st[0])
	}
}

// A request still waiting for its engine's response headers when the drain
// deadline passes gets a 503 rather than a closed connection, with
// Retry-After (TestEvery503HasRetryAfter).
func TestShutdownDeadlineAnswersWaitingRequests503(t *testing.T) {
	arrived := make(chan struct{})
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then a closed connection cancels r
		close(arrived)
		<-r.Context().Done() // a long non-streaming generation
	})
	cfg := testConfig("first", be.URL)
	cfg.Timeouts.Shutdown = 50 * time.Millisecond
	cfg.Models[0].Signals.Disabled = true
	p, err := New(Options{Config: cfg, NewPicker: testPickers})
	if err != nil {
		t.Fatal(err)
	}
	ln, stop, served := startServe(t, p)
	type result struct {
		status int
		body   string
		header http.Header
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+PathChatCompletions, "application/json", strings.NewReader(chatBody))
		if err != nil {
			done <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{resp.StatusCode, string(b), resp.Header, err}
	}()
	recv(t, "the request at the engine", arrived)
	stop()
	res := recv(t, "the answer", done)
	if res.err != nil || res.status != http.StatusServiceUnavailable || !strings.Contains(res.body, "shutting down") {
		t.Errorf("got %d %q (%v), want a 503 saying the router is shutting down", res.status, res.body, res.err)
	}
	if ra := res.header.Get("Retry-After"); ra != "1" { // as the router's other 503s (writeRoutingError)
		t.Errorf("Retry-After: got %q, want 1", ra)
	}
	if err := recv(t, "Serve to return", served); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// retry.attempts covers connect errors and 5xx: an engine that took the
// request and did not answer within timeouts.upstream_header is not tried
// again elsewhere (that would run the whole generation a second time and
// double the client's wait); the client gets a 504.
func TestUpstreamHeaderTimeoutIsNotRetried(t *testing.T) {
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	})
	fast := newBackend(t, "fast", okHandler("fast"))
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "http://" + dead.Addr().String()
	dead.Close()

	cfg := testConfig("first", slow.URL, fast.URL)
	cfg.Timeouts.UpstreamHeader = 50 * time.Millisecond
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	out := readAll(t, resp)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("got %d %s, want 504", resp.StatusCode, out)
	}
	if n := fast.hits.Load(); n != 0 {
		t.Errorf("requests retried on the other endpoint: got %d, want 0", n)
	}
	// A connect error is still retried.
	tp2 := newTestProxy(t, testConfig("first", deadURL, fast.URL))
	resp = tp2.post(t, PathChatCompletions, chatBody)
	if out := readAll(t, resp); resp.StatusCode != http.StatusOK || fast.hits.Load() != 1 {
		t.Errorf("after a connect error: got %d %s and %d requests on the other endpoint, want 200 and 1",
			resp.StatusCode, out, fast.hits.Load())
	}
}

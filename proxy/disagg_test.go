package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/policy"
)

// pdEngine starts an emulated engine in a P/D role and records the bodies
// it receives.
func pdEngine(t *testing.T, role kvroute.Role, proto string) (*httptest.Server, func() []map[string]any) {
	t.Helper()
	return pdEngineHook(t, role, proto, nil)
}

// pdEngineHook is pdEngine whose engine first runs hook, when not nil, on
// each request for /v1/ it records; a hook returning true has answered it.
func pdEngineHook(t *testing.T, role kvroute.Role, proto string, hook func(http.ResponseWriter, *http.Request) bool) (*httptest.Server, func() []map[string]any) {
	t.Helper()
	var mu sync.Mutex
	var bodies []map[string]any
	record := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/v1/") {
				b, _ := io.ReadAll(r.Body)
				var m map[string]any
				_ = json.Unmarshal(b, &m)
				mu.Lock()
				bodies = append(bodies, m)
				mu.Unlock()
				r.Body = io.NopCloser(strings.NewReader(string(b)))
				if hook != nil && hook(w, r) {
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	}
	_, hs := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: role, PDProtocol: proto,
		LoadFailure: emulator.LoadFailureFail}, record)
	return hs, func() []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		return append([]map[string]any(nil), bodies...)
	}
}

// TestDisaggregatedEndToEnd runs kvroute serve's handler in front of an
// emulated prefill engine and an emulated decode engine, in both
// protocols: the client sees one ordinary OpenAI response.
func TestDisaggregatedEndToEnd(t *testing.T) {
	for _, proto := range []string{"nixl", "sglang"} {
		t.Run(proto, func(t *testing.T) {
			ps, pbodies := pdEngine(t, kvroute.RolePrefill, proto)
			ds, dbodies := pdEngine(t, kvroute.RoleDecode, proto)
			_, port, _ := net.SplitHostPort(strings.TrimPrefix(ps.URL, "http://"))
			cfg := config.Config{
				Models: []config.Model{{
					Name: "tiny",
					Endpoints: []config.Endpoint{
						{ID: "p0", URL: ps.URL, Role: "prefill", Labels: map[string]string{"bootstrap_port": port}},
						{ID: "d0", URL: ds.URL, Role: "decode"},
					},
					PD: config.PD{Protocol: proto, Mode: "always", Profile: "tiny"},
				}},
				HealthCheck: config.HealthCheck{Disabled: true},
				Debug:       config.Debug{Enabled: true},
			}
			reg := prometheus.NewRegistry()
			px, err := New(Options{Config: cfg, NewPicker: policy.New, Registerer: reg, Gatherer: reg})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(px)
			defer srv.Close()
			post := func(body string, hdr ...string) (int, string, http.Header) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
				for i := 0; i+1 < len(hdr); i += 2 {
					req.Header.Set(hdr[i], hdr[i+1])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b), resp.Header
			}
			const prompt = "The router places the prompt on a compute-heavy prefill node, then a memory-heavy decode node."
			code, body, h := post(`{"model":"tiny","prompt":"` + prompt + `","max_tokens":4}`)
			if code != 200 {
				t.Fatalf("got %d %s", code, body)
			}
			var c openai.Completion
			if err := json.Unmarshal([]byte(body), &c); err != nil || c.Usage.CompletionTokens != 4 || c.KVTransferParams != nil {
				t.Errorf("got %s (%v), want 4 tokens and no kv_transfer_params", body, err)
			}
			if h.Get(HeaderRequestID) == "" {
				t.Error("no X-Request-Id on the answer")
			}
			if got := h.Get(HeaderEndpoint); got != "d0" { // debug is on: kvroute bench reads it
				t.Errorf("%s: got %q, want the decode endpoint d0", HeaderEndpoint, got)
			}
			code, body, _ = post(`{"model":"tiny","prompt":"` + prompt + `","max_tokens":3,"stream":true}`)
			if code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Errorf("stream: got %d %s", code, body)
			}
			if n, m := len(pbodies()), len(dbodies()); n != 2 || m != 2 {
				t.Errorf("got %d prefill and %d decode legs, want 2 and 2", n, m)
			}
			// A client naming the prefill engine itself is refused.
			code, body, _ = post(`{"model":"tiny","prompt":"hi","kv_transfer_params":{"remote_host":"169.254.169.254","remote_port":80}}`)
			if code != 400 || !strings.Contains(body, "reserved") {
				t.Errorf("injection: got %d %s", code, body)
			}
			if n := len(pbodies()) + len(dbodies()); n != 4 {
				t.Errorf("injection reached an engine: %d legs", n-4)
			}
			// The P/D metrics are on the proxy's registry.
			mfs, _ := reg.Gather()
			found := false
			var ttfbs uint64 // the decode engine's, as for an aggregated endpoint
			for _, mf := range mfs {
				switch mf.GetName() {
				case "kvroute_pd_decisions_total":
					found = true
				case "kvroute_upstream_ttfb_seconds":
					for _, m := range mf.GetMetric() {
						for _, l := range m.GetLabel() {
							if l.GetName() == "endpoint" && l.GetValue() == "d0" {
								ttfbs += m.GetHistogram().GetSampleCount()
							}
						}
					}
				}
			}
			if !found {
				t.Error("kvroute_pd_decisions_total not registered")
			}
			if ttfbs != 2 {
				t.Errorf("kvroute_upstream_ttfb_seconds{endpoint=d0}: %d observations, want 2 (the two answered requests)", ttfbs)
			}
			if err := px.SetPolicy("tiny", "round_robin", nil); err == nil {
				t.Error("SetPolicy on a P/D pool: got no error")
			}
			// /debug/endpoints names the policy as the decisions do.
			resp, err := http.Get(srv.URL + PathEndpoints)
			if err != nil {
				t.Fatal(err)
			}
			var eps map[string]struct {
				Policy        string `json:"policy"`
				PrefillPolicy string `json:"prefill_policy"`
			}
			err = json.NewDecoder(resp.Body).Decode(&eps)
			resp.Body.Close()
			if err != nil || eps["tiny"].Policy != "pd" || eps["tiny"].PrefillPolicy != policy.Default {
				t.Errorf("%s: got %+v (%v), want policy pd, prefill_policy %s", PathEndpoints, eps, err, policy.Default)
			}
		})
	}
}

// TestDisaggregatedShutdownDeadline: on a P/D pool too, a stream still
// running at the drain deadline ends with a 503 error event and [DONE],
// and the decode engine's request is cancelled.
func TestDisaggregatedShutdownDeadline(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	cancelled := make(chan struct{})
	ds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			http.NotFound(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // then a closed connection cancels r
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"n\":0}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // generates until cancelled
		close(cancelled)
	}))
	defer ds.Close()
	cfg := pdTestConfig("", "nixl", ps.URL, ds.URL)
	cfg.Timeouts.Shutdown = 50 * time.Millisecond
	cfg.ApplyDefaults()
	px, err := New(Options{Config: cfg, NewPicker: policy.New})
	if err != nil {
		t.Fatal(err)
	}
	st := startStream(t, px, `{"model":"tiny","prompt":"a prompt for the prefill node","max_tokens":50,"stream":true}`)
	stop, served, br, resp := st.stop, st.served, st.rest, st.resp
	stop()
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	got := events(t, bytes.NewReader(rest))
	if len(got) != 2 || got[1] != "[DONE]" || !strings.Contains(got[0], "503") {
		t.Fatalf("after the deadline: got %q, want a 503 error event and [DONE]", rest)
	}
	if err := recv(t, "Serve to return", served); err != nil {
		t.Errorf("Serve: %v", err)
	}
	recv(t, "the decode engine's request to be cancelled", cancelled)
}

// TestPDRecoveredLegLogsSuccess: a P/D request whose first decode leg
// failed (a 500) and whose retry answered it is logged as the success it
// is: status 200 and no error (before, the log line carried the failure
// the retry recovered from).
func TestPDRecoveredLegLogsSuccess(t *testing.T) {
	var decodeLegs atomic.Int32
	failFirst := func(w http.ResponseWriter, r *http.Request) bool {
		if decodeLegs.Add(1) > 1 {
			return false
		}
		statusHandler(http.StatusInternalServerError)(w, r)
		return true
	}
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	dA, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", failFirst)
	dB, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", failFirst)
	cfg := pdTestConfig("", "nixl", ps.URL, dA.URL)
	cfg.Models[0].Endpoints = append(cfg.Models[0].Endpoints, config.Endpoint{ID: "d1", URL: dB.URL, Role: "decode"})
	var logs syncbuf.Buffer
	tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: policy.New,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	resp := tp.post(t, "/v1/completions", `{"model":"tiny","prompt":"hello there","max_tokens":2}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	if n := decodeLegs.Load(); n != 2 {
		t.Fatalf("%d decode legs, want a failed one and its retry", n)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "msg=request ") {
			line = l
		}
	}
	if !strings.Contains(line, "status=200") || !strings.Contains(line, "error=<nil>") {
		t.Errorf("request log: got %q, want status=200 and no error", line)
	}
}

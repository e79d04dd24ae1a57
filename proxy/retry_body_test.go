package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// silent5xx answers 500 with the first bytes of a JSON body, then hangs:
// neither more bytes nor a closed connection, until release is closed or
// the request is cancelled.
func silent5xx(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":`)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
}

// TestRetried5xxSilentBodyBounded: a 5xx that will be retried has its body
// read before anything reaches the client; a body gone silent is bounded by
// timeouts.upstream_header like any other silence of a response, and the
// request is retried on another endpoint rather than held until the client
// gives up.
func TestRetried5xxSilentBodyBounded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	bad := newBackend(t, "bad", silent5xx(release))
	good := newBackend(t, "good", okHandler("good"))
	cfg := testConfig("first", bad.URL, good.URL)
	cfg.Timeouts.UpstreamHeader = 200 * time.Millisecond
	cfg.Retry.Attempts = 2
	tp := newTestProxy(t, cfg)
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post(tp.srv.URL+PathChatCompletions, "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatalf("client: %v (held past upstream_header=200ms)", err)
	}
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(b, "good") {
		t.Fatalf("got %d %q, want the retry's 200", resp.StatusCode, b)
	}
	if v := tp.metric(t, tp.metrics.retries, "m", bad.URL, "status_5xx"); v != 1 {
		t.Errorf("kvroute_retries_total{reason=status_5xx}: got %v, want 1", v)
	}
}

// TestLast5xxSilentBodyAnswered504: when no retry is left (retry.attempts
// 1, or no other endpoint), a 5xx whose body goes silent is answered 504 in
// OpenAI's error shape, as a response whose headers never came is, within
// about upstream_header; it is the router's answer, not the engine's.
func TestLast5xxSilentBodyAnswered504(t *testing.T) {
	for _, tc := range []struct {
		name     string
		attempts int
	}{
		{"attempts 1", 1},        // modifyResponse's last attempt: upstreamError answers
		{"no other endpoint", 2}, // retried, the retry finds no endpoint: writeLastFailure answers
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			bad := newBackend(t, "bad", silent5xx(release))
			cfg := testConfig("first", bad.URL)
			cfg.Timeouts.UpstreamHeader = 200 * time.Millisecond
			cfg.Retry.Attempts = tc.attempts
			tp := newTestProxy(t, cfg)
			c := &http.Client{Timeout: 5 * time.Second}
			resp, err := c.Post(tp.srv.URL+PathChatCompletions, "application/json", strings.NewReader(chatBody))
			if err != nil {
				t.Fatalf("client: %v (held past upstream_header=200ms)", err)
			}
			b := readAll(t, resp)
			if e := wantErrorBody(t, resp.StatusCode, b, http.StatusGatewayTimeout, "sent nothing for 200ms"); e.Error.Type != kvroute.TypeUpstream {
				t.Errorf("error type %q, want %q", e.Error.Type, kvroute.TypeUpstream)
			}
			if src := resp.Header.Get(HeaderErrorSource); src != "" {
				t.Errorf("%s: got %q, want none (the router's answer)", HeaderErrorSource, src)
			}
			if v := tp.metric(t, tp.metrics.requests, "m", bad.URL, "504"); v != 1 {
				t.Errorf(`kvroute_requests_total{status="504"}: got %v, want 1`, v)
			}
			if v := tp.metric(t, tp.metrics.inflight, "m", bad.URL); v != 0 {
				t.Errorf("kvroute_inflight_requests: got %v, want 0", v)
			}
		})
	}
}

// TestLast5xxBodyPassedWhole: on the last attempt, a 5xx body that comes
// in time (after a pause shorter than upstream_header), larger than the
// part read ahead, reaches the client whole and marked as the engine's.
func TestLast5xxBodyPassedWhole(t *testing.T) {
	big := `{"error":{"message":"` + strings.Repeat("x", 2*maxSavedBody) + `","code":500}}`
	bad := newBackend(t, "bad", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		fmt.Fprint(w, big)
	})
	cfg := testConfig("first", bad.URL)
	cfg.Timeouts.UpstreamHeader = 500 * time.Millisecond
	cfg.Retry.Attempts = 1
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	if b := readAll(t, resp); resp.StatusCode != http.StatusInternalServerError || b != big {
		t.Fatalf("got %d and %d bytes, want 500 and the engine's %d bytes", resp.StatusCode, len(b), len(big))
	}
	if src := resp.Header.Get(HeaderErrorSource); src != errorSourceUpstream {
		t.Errorf("%s: got %q, want %q", HeaderErrorSource, src, errorSourceUpstream)
	}
}

// tookAndDied reads the whole request, then drops the connection before
// any response header, as a vLLM server that crashes mid-generation of a
// non-streamed answer does.
func tookAndDied(took chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		took <- struct{}{}
		time.Sleep(50 * time.Millisecond)
		panic(http.ErrAbortHandler)
	}
}

// TestEngineThatTookTheRequestIsRetried: an engine that took the request
// and died before its headers is retried on another endpoint (nothing
// reached the client), counted as upstream_reset, not connect_error.
func TestEngineThatTookTheRequestIsRetried(t *testing.T) {
	took := make(chan struct{}, 1)
	ran := newBackend(t, "ran", tookAndDied(took))
	other := newBackend(t, "other", okHandler("other"))
	tp := newTestProxy(t, testConfig("first", ran.URL, other.URL))
	resp := tp.post(t, PathChatCompletions, chatBody)
	out := readAll(t, resp)
	recv(t, "the first engine's request", took)
	if resp.StatusCode != http.StatusOK || !strings.Contains(out, "from other") || other.hits.Load() != 1 {
		t.Fatalf("got %d %q, %d requests to the other engine; want its 200, after 1 request", resp.StatusCode, out, other.hits.Load())
	}
	for _, tc := range []struct {
		reason string
		want   float64
	}{{"upstream_reset", 1}, {"connect_error", 0}} {
		if v := tp.metric(t, tp.metrics.retries, "m", ran.URL, tc.reason); v != tc.want {
			t.Errorf("kvroute_retries_total{reason=%q}: got %v, want %v", tc.reason, v, tc.want)
		}
	}
}

// TestDataParallelResetRetryMayUseSibling: a data-parallel rank that took
// the request and died says nothing of its server's other ranks (the
// server took the connection), so the retry may go to a sibling rank,
// unlike after a connect error (TestDataParallelConnectRetrySkipsSiblings).
func TestDataParallelResetRetryMayUseSibling(t *testing.T) {
	took := make(chan struct{}, 1)
	died, ok := tookAndDied(took), okHandler("dp")
	dp := newBackend(t, "dp", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(kvroute.HeaderDataParallelRank) == "0" {
			died(w, r)
			return
		}
		ok(w, r)
	})
	plain := newBackend(t, "plain", okHandler("plain"))
	tp := newTestProxy(t, dpConfig("first", dp.URL, 2, plain.URL))
	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
	body := readAll(t, resp)
	recv(t, "rank 0's request", took)
	if got := resp.Header.Get(HeaderEndpoint); resp.StatusCode != http.StatusOK || got != "dp#dp1" {
		t.Fatalf("got %d from %q (%s), want 200 from the sibling rank dp#dp1", resp.StatusCode, got, body)
	}
	if v := tp.metric(t, tp.metrics.retries, "m", "dp#dp0", "upstream_reset"); v != 1 {
		t.Errorf("kvroute_retries_total{endpoint=dp#dp0,reason=upstream_reset}: got %v, want 1", v)
	}
}

// TestLast5xxBrokenBodyAnswered502: on the last attempt, a 5xx whose body
// breaks before its end (the engine dropped the connection) is answered
// 502 in OpenAI's error shape, not a truncated 500 and a cut connection.
func TestLast5xxBrokenBodyAnswered502(t *testing.T) {
	bad := newBackend(t, "bad", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	cfg := testConfig("first", bad.URL)
	cfg.Retry.Attempts = 1
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	b := readAll(t, resp)
	wantErrorBody(t, resp.StatusCode, b, http.StatusBadGateway, "answered 500, then its body broke")
}

// wantErrorBody fails t unless an answer of status and body is want in
// OpenAI's error shape with a message containing msg, and returns it.
func wantErrorBody(t *testing.T, status int, body string, want int, msg string) openai.ErrorResponse {
	t.Helper()
	var e openai.ErrorResponse
	if jerr := json.Unmarshal([]byte(body), &e); status != want || jerr != nil || !strings.Contains(e.Error.Message, msg) {
		t.Fatalf("got %d %q (%v), want %d in OpenAI's error shape saying %q", status, body, jerr, want, msg)
	}
	return e
}

// TestRetryAttemptsAboveThePool: retry.attempts larger than any pool
// ("try every endpoint", which config accepts) retries as usual; the
// handler once sized a slice by it per request, and a huge value panicked
// every request (makeslice: cap out of range).
func TestRetryAttemptsAboveThePool(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	live := newBackend(t, "live", okHandler("live"))
	cfg := testConfig("first", deadURL, live.URL)
	cfg.Retry.Attempts = 1 << 40
	tp := newTestProxy(t, cfg)
	resp, err := http.Post(tp.srv.URL+PathCompletions, "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		t.Fatalf("POST: %v (want 200 from live after a connect error)", err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d %s, want 200 from live after a connect error", resp.StatusCode, body)
	}
}

// TestLarge5xxReplayedWhole: a 5xx whose body is larger than the router
// keeps for a replay (maxSavedBody), retried and then with no endpoint left
// to take the retry, reaches the client as a whole, well-formed answer with
// a correct Content-Length. Before, the client got the body's first 64 KiB
// under a Content-Length that matched them: a cut JSON document it could
// not tell from a whole one. A body that fits is replayed as the engine
// sent it; one whose last attempt streams it gets it whole too.
func TestLarge5xxReplayedWhole(t *testing.T) {
	big := `{"error":{"message":"` + strings.Repeat("x", 100<<10) + `","type":"InternalServerError","param":null,"code":500}}`
	small := `{"error":{"message":"engine says 500","type":"InternalServerError","param":null,"code":500}}`
	for _, tc := range []struct {
		name     string
		body     string
		attempts int
		same     bool // the client gets the engine's body
	}{
		{"large, replayed", big, 2, false},
		{"small, replayed", small, 2, true},
		{"large, last attempt", big, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := newBackend(t, "bad", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", fmt.Sprint(len(tc.body)))
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, tc.body)
			})
			cfg := testConfig("first", bad.URL)
			cfg.Retry.Attempts = tc.attempts
			tp := newTestProxy(t, cfg)
			resp := tp.post(t, PathChatCompletions, chatBody)
			b := readAll(t, resp)
			if resp.StatusCode != http.StatusInternalServerError {
				t.Errorf("status: got %d, want the engine's 500", resp.StatusCode)
			}
			if cl := resp.Header.Get("Content-Length"); cl != fmt.Sprint(len(b)) {
				t.Errorf("Content-Length %s, body %d bytes", cl, len(b))
			}
			var e openai.ErrorResponse
			if err := json.Unmarshal([]byte(b), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("body (%d bytes) is not a whole error document: %v", len(b), err)
			}
			if got := b == tc.body; got != tc.same {
				t.Errorf("the engine's body passed on: %v, want %v (got %.200s)", got, tc.same, b)
			}
			if !tc.same && (resp.Header.Get(HeaderErrorSource) != "" || !strings.Contains(e.Error.Message, "answered 500")) {
				t.Errorf("the router's answer: %s %q, %q; want no %s and a message saying what the engine answered",
					HeaderErrorSource, resp.Header.Get(HeaderErrorSource), e.Error.Message, HeaderErrorSource)
			}
		})
	}
}

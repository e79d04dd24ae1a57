package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

// vllmNotFound is vLLM's answer to a model it does not serve under the
// name asked for.
const vllmNotFound = `{"error":{"message":"The model ` + "`m`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`

// loggedProxy is a test proxy of cfg whose logs, at the default level
// (info), go to logs.
func loggedProxy(t *testing.T, cfg config.Config, logs *syncbuf.Buffer) *testProxy {
	t.Helper()
	return newTestProxyOpts(t, Options{Config: cfg, NewPicker: testPickers,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
}

// notFoundWarnings returns the log lines warning of an engine's 404.
func notFoundWarnings(logs *syncbuf.Buffer) []string {
	var out []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "engine answered 404") {
			out = append(out, l)
		}
	}
	return out
}

// TestEngineNotFoundIsDiagnosable: an engine that does not serve the
// model under the router's name answers 404. The client gets the engine's
// body unchanged, marked as the engine's (HeaderErrorSource) but without
// the endpoint's name (debug is off), and the operator a warning naming
// model, endpoint, path and the likely cause, once per endpoint per
// minute with the count of those suppressed.
func TestEngineNotFoundIsDiagnosable(t *testing.T) {
	eng := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, vllmNotFound)
	})
	var logs syncbuf.Buffer
	tp := loggedProxy(t, testConfig("first", eng.URL), &logs)

	resp := tp.post(t, PathChatCompletions, chatBody)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusNotFound || body != vllmNotFound {
		t.Errorf("got %d %s, want the engine's 404 %s unchanged", resp.StatusCode, body, vllmNotFound)
	}
	if got := resp.Header.Get(HeaderErrorSource); got != "upstream" {
		t.Errorf("%s: got %q, want \"upstream\"", HeaderErrorSource, got)
	}
	if got := resp.Header.Get(HeaderEndpoint); got != "" {
		t.Errorf("%s: got %q, want none with debug off", HeaderEndpoint, got)
	}
	w := notFoundWarnings(&logs)
	if len(w) != 1 {
		t.Fatalf("got %d warnings %q, want 1\nlogs:\n%s", len(w), w, logs.String())
	}
	for _, want := range []string{"model=m", "endpoint=" + eng.URL, "path=/v1/chat/completions", "--served-model-name", "suppressed=0"} {
		if !strings.Contains(w[0], want) {
			t.Errorf("warning %q: want %q in it", w[0], want)
		}
	}

	// A flood within the minute is counted, not logged.
	for range 3 {
		readAll(t, tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`))
	}
	if w := notFoundWarnings(&logs); len(w) != 1 {
		t.Fatalf("within the minute: got %d warnings %q, want still 1", len(w), w)
	}
	tp.clock.Advance(time.Minute)
	readAll(t, tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`))
	w = notFoundWarnings(&logs)
	if len(w) != 2 || !strings.Contains(w[1], "suppressed=3") || !strings.Contains(w[1], "path=/v1/completions") {
		t.Errorf("a minute later: got %q, want a second warning with suppressed=3 on /v1/completions", w)
	}

	// The router's own 404 is not marked.
	resp = tp.post(t, PathChatCompletions, `{"model":"other","messages":[{"role":"user","content":"hi"}]}`)
	if readAll(t, resp); resp.StatusCode != http.StatusNotFound || resp.Header.Get(HeaderErrorSource) != "" {
		t.Errorf("unknown model: got %d with %s %q, want the router's 404 unmarked", resp.StatusCode,
			HeaderErrorSource, resp.Header.Get(HeaderErrorSource))
	}

	// An endpoint removed by a reload leaves the rate limiter's map.
	other := newBackend(t, "b", okHandler("b"))
	if _, err := tp.Reload(reloadTo(testConfig("first", other.URL))); err != nil {
		t.Fatal(err)
	}
	tp.notFound.mu.Lock()
	n := len(tp.notFound.last)
	tp.notFound.mu.Unlock()
	if n != 0 {
		t.Errorf("after the endpoint's removal the 404 log keeps %d entries, want 0", n)
	}
}

// TestErrorSourceHeader: the engine's error responses passed through are
// marked, a 5xx replayed after a retry found no other endpoint too; the
// router's own (no endpoint answered) are not, and a success is not.
func TestErrorSourceHeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		h      http.HandlerFunc
		status int
		want   string
	}{
		{"engine 400", statusHandler(http.StatusBadRequest), http.StatusBadRequest, "upstream"},
		{"engine 500 replayed", statusHandler(http.StatusInternalServerError), http.StatusInternalServerError, "upstream"},
		{"success", okHandler("a"), http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newBackend(t, "a", tc.h)
			var logs syncbuf.Buffer
			tp := loggedProxy(t, testConfig("first", eng.URL), &logs)
			resp := tp.post(t, PathChatCompletions, chatBody)
			if readAll(t, resp); resp.StatusCode != tc.status || resp.Header.Get(HeaderErrorSource) != tc.want {
				t.Errorf("got %d with %s %q, want %d with %q", resp.StatusCode, HeaderErrorSource,
					resp.Header.Get(HeaderErrorSource), tc.status, tc.want)
			}
			if w := notFoundWarnings(&logs); len(w) != 0 {
				t.Errorf("got 404 warnings %q, want none", w)
			}
		})
	}
	t.Run("no engine answers", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		var logs syncbuf.Buffer
		tp := loggedProxy(t, testConfig("first", dead.URL), &logs)
		resp := tp.post(t, PathChatCompletions, chatBody)
		if readAll(t, resp); resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderErrorSource) != "" {
			t.Errorf("got %d with %s %q, want the router's 502 unmarked", resp.StatusCode, HeaderErrorSource,
				resp.Header.Get(HeaderErrorSource))
		}
	})
}

// TestPDEngineNotFound: on a P/D model, an engine's 404 for its leg is
// replayed to the client marked as the engine's, and logged like the
// aggregated path's.
func TestPDEngineNotFound(t *testing.T) {
	ps, _ := pdEngineHook(t, kvroute.RolePrefill, "nixl", func(w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, vllmNotFound)
		return true
	})
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	var logs syncbuf.Buffer
	tp := loggedProxy(t, pdTestConfig("first", "nixl", ps.URL, ds.URL), &logs)
	resp := tp.post(t, PathCompletions, pdPrompt)
	if body := readAll(t, resp); resp.StatusCode != http.StatusNotFound || body != vllmNotFound {
		t.Errorf("got %d %s, want the engine's 404 %s", resp.StatusCode, body, vllmNotFound)
	}
	if got := resp.Header.Get(HeaderErrorSource); got != "upstream" {
		t.Errorf("%s: got %q, want \"upstream\"", HeaderErrorSource, got)
	}
	if w := notFoundWarnings(&logs); len(w) != 1 || !strings.Contains(w[0], "endpoint=p0") {
		t.Errorf("got warnings %q, want one naming endpoint p0\nlogs:\n%s", w, logs.String())
	}
}

package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/policy"
)

// requestLogLines returns the "request" log lines in logs.
func requestLogLines(logs string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "msg=request ") {
			out = append(out, l)
		}
	}
	return out
}

// TestAdapterRequestLog: the per-request log line names the LoRA adapter a
// request asks for (adapter=, as the decision log does), and has no
// adapter attribute for the base model.
func TestAdapterRequestLog(t *testing.T) {
	cfg, _ := adapterConfig(t)
	var logs syncbuf.Buffer
	tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: testPickers,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	tp.postOK(t, 1, PathCompletions, adapterBody("sql"))
	tp.postOK(t, 1, PathCompletions, adapterBody("m"))
	lines := requestLogLines(logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d request log lines, want 2:\n%s", len(lines), logs.String())
	}
	if !strings.Contains(lines[0], " model=m adapter=sql ") {
		t.Errorf("adapter request: log line %q, want model=m adapter=sql", lines[0])
	}
	if strings.Contains(lines[1], "adapter") {
		t.Errorf("base model request: log line %q names an adapter", lines[1])
	}
}

// TestAdapterRequestLogPD: the disaggregated path's request log line names
// the adapter too.
func TestAdapterRequestLogPD(t *testing.T) {
	// The emulated engines serve no adapter: they answer for the base model.
	asBase := func(w http.ResponseWriter, r *http.Request) bool {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(strings.Replace(string(b), `"model":"sql"`, `"model":"tiny"`, 1)))
		r.ContentLength = -1
		return false
	}
	ps, _ := pdEngineHook(t, kvroute.RolePrefill, "nixl", asBase)
	ds, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", asBase)
	cfg := pdTestConfig("", "nixl", ps.URL, ds.URL)
	cfg.Models[0].Adapters = []string{"sql"}
	var logs syncbuf.Buffer
	tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: policy.New,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for _, model := range []string{"sql", "tiny"} {
		resp := tp.post(t, "/v1/completions", `{"model":"`+model+`","prompt":"hello there","max_tokens":2}`)
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("model %s: got %d %s", model, resp.StatusCode, body)
		}
	}
	lines := requestLogLines(logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d request log lines, want 2:\n%s", len(lines), logs.String())
	}
	if !strings.Contains(lines[0], " model=tiny adapter=sql ") || !strings.Contains(lines[0], "disaggregated=") {
		t.Errorf("adapter request: log line %q, want model=tiny adapter=sql", lines[0])
	}
	if strings.Contains(lines[1], "adapter") {
		t.Errorf("base model request: log line %q names an adapter", lines[1])
	}
}

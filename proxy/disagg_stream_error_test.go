package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// TestPDStreamBreakIsCounted: on a P/D pool, a decode engine's stream that
// breaks after its first event is ended with the error event, and counted
// in kvroute_upstream_stream_errors_total on the decode endpoint, as on an
// aggregated pool. It was counted nowhere (neither there nor in
// kvroute_pd_leg_failures_total): a P/D fleet's broken streams did not
// show in the router's metrics. A whole answer is not counted.
func TestPDStreamBreakIsCounted(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	var breaking atomic.Bool
	ds, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", func(w http.ResponseWriter, r *http.Request) bool {
		if !breaking.Load() {
			return false // the emulated engine answers whole
		}
		flushEvents(w, "data: {\"n\":0}\n\n")
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	})
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, ds.URL), policy.New)
	const body = `{"model":"tiny","prompt":"a prompt handed off to decode","stream":true,"max_tokens":4}`
	if out := readAll(t, tp.post(t, PathCompletions, body)); !strings.HasSuffix(out, "data: [DONE]\n\n") || strings.Contains(out, `"error"`) {
		t.Fatalf("whole answer: got %q", out)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "tiny", "d0"); v != 0 {
		t.Fatalf("kvroute_upstream_stream_errors_total{endpoint=d0} after a whole answer: got %v, want 0", v)
	}
	breaking.Store(true)
	if out := readAll(t, tp.post(t, PathCompletions, body)); !strings.Contains(out, `"code":502`) {
		t.Fatalf("broken answer: got %q, want it ended with a 502 error event", out)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "tiny", "d0"); v != 1 {
		t.Errorf("kvroute_upstream_stream_errors_total{endpoint=d0} after a broken stream: got %v, want 1", v)
	}
}

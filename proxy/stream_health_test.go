package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStreamsBrokenMidwayEject: an engine whose every stream breaks after
// its first event (it dies or is cut mid-generation, yet takes the next
// request and sends its first token) is passively ejected after
// fail_threshold such responses in a row, as one that fails before its
// first byte is. The attempt was reported healthy at its first byte, which
// reset the endpoint's consecutive failures before each break counted one,
// so such an engine was never ejected: every request routed to it broke,
// for as long as it kept breaking. A response's success is now reported
// when it ends whole.
func TestStreamsBrokenMidwayEject(t *testing.T) {
	a := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\n")
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	})
	b := newBackend(t, "b", okHandler("b"))
	cfg := testConfig("first", a.URL, b.URL)
	cfg.Models[0].Router.FailThreshold = 2
	cfg.Models[0].Router.BaseEjection = time.Minute
	tp := newTestProxy(t, cfg)
	for i := range 2 { // two broken streams in a row, then a is ejected
		out := readAll(t, tp.post(t, PathCompletions, streamBody))
		if !strings.Contains(out, `"code":502`) {
			t.Fatalf("request %d: got %q, want a's stream ended with an error event", i, out)
		}
	}
	if v := tp.metric(t, tp.metrics.ejections, "m", a.URL, "passive"); v != 1 {
		t.Errorf("kvroute_ejections_total{endpoint=a}: got %v, want 1", v)
	}
	out := readAll(t, tp.post(t, PathCompletions, streamBody))
	if !strings.Contains(out, "b-2") || strings.Contains(out, "error") {
		t.Errorf("third request: got %q, want b's whole stream (a ejected)", out)
	}
}

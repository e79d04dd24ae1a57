package proxy

import (
	"net/http"
	"strconv"
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

// TestStreamsEndingInServerErrorEject: an engine whose streams end with
// its own error event under a 5xx code (vLLM's 500 InternalServerError
// for a request its engine failed after the 200, finish_reason "error")
// is passively ejected after fail_threshold of them in a row, as one whose
// streams break; one whose streams end with a 4xx event (a request it
// refused after its 200, SGLang's adapter it does not serve) is not.
// Both streams were passed on whole, and counted as the endpoint's
// success.
func TestStreamsEndingInServerErrorEject(t *testing.T) {
	for _, tc := range []struct {
		code  int
		eject bool
	}{{500, true}, {503, true}, {400, false}, {501, false}} {
		event := `data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":` +
			strconv.Itoa(tc.code) + "}}\n\ndata: [DONE]\n\n"
		a := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
			flushEvents(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n"+event)
		})
		b := newBackend(t, "b", okHandler("b"))
		cfg := testConfig("first", a.URL, b.URL)
		cfg.Models[0].Router.FailThreshold = 2
		cfg.Models[0].Router.BaseEjection = time.Minute
		tp := newTestProxy(t, cfg)
		for i := range 2 {
			out := readAll(t, tp.post(t, PathCompletions, streamBody))
			if !strings.HasSuffix(out, event) {
				t.Fatalf("code %d, request %d: got %q, want a's stream passed on whole", tc.code, i, out)
			}
		}
		want := 0.0
		if tc.eject {
			want = 1
		}
		if v := tp.metric(t, tp.metrics.ejections, "m", a.URL, "passive"); v != want {
			t.Errorf("code %d: kvroute_ejections_total{endpoint=a}: got %v, want %v", tc.code, v, want)
		}
	}
}

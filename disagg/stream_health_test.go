package disagg

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/router"
)

// brokenStream is an engine whose every answer is an event stream that
// breaks after its first event: it dies or is cut mid-generation, yet
// takes the next request and sends its first token.
func brokenStream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"n\":0}\n\n")
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

// healthPD is a handoff over eps whose router ejects an endpoint after
// two consecutive failures, for a minute.
func healthPD(t *testing.T, eps ...kvroute.Endpoint) (*Handoff, *router.Router) {
	t.Helper()
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1,
		Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl, Endpoints: eps,
		Health: router.HealthConfig{FailThreshold: 2, BaseEjection: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: &http.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	return h, r
}

// ejections returns how many times r has ejected endpoint id.
func ejections(t *testing.T, r *router.Router, id string) int {
	t.Helper()
	for _, s := range r.Status(time.Now()) {
		if s.ID == id {
			return s.Ejections
		}
	}
	t.Fatalf("no endpoint %q in the router", id)
	return 0
}

// TestPDStreamsBrokenMidwayEject: a P/D decode engine (or one running
// requests whole on a P/D pool) whose every stream breaks after its first
// event is passively ejected after fail_threshold such answers in a row,
// as on the aggregated path (proxy's TestStreamsBrokenMidwayEject). The
// leg was reported healthy before its answer was streamed, which reset
// the endpoint's consecutive failures, and a break was reported only when
// the answer went silent: four broken streams in a row left it with no
// ejection, and every request placed there kept breaking.
func TestPDStreamsBrokenMidwayEject(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  func(broken string) []kvroute.Endpoint
	}{
		{"decode leg", func(broken string) []kvroute.Endpoint {
			p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
			return []kvroute.Endpoint{endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", broken, kvroute.RoleDecode)}
		}},
		{"aggregated", func(broken string) []kvroute.Endpoint {
			return []kvroute.Endpoint{endpoint("d", broken, kvroute.RoleBoth)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := fake(t, brokenStream)
			h, r := healthPD(t, tc.eps(d.URL)...)
			for i := range 2 { // two broken streams in a row, then d is ejected
				res, got := serveStream(t, h)
				if res.Decode != "d" || !strings.Contains(got, `"code":502`) {
					t.Fatalf("request %d: got decode %q, body %q; want d's stream ended with a 502 error event", i, res.Decode, got)
				}
			}
			if n := ejections(t, r, "d"); n != 1 {
				t.Errorf("ejections of d after two broken streams: got %d, want 1", n)
			}
		})
	}
}

// TestPDStreamsEndingInServerErrorEject: a decode engine (or one running
// requests whole) whose streams end with its own error event under a 5xx
// code (vLLM's 500 for a request its engine failed after the 200) is
// passively ejected after fail_threshold of them in a row, as on the
// aggregated path (proxy's TestStreamsEndingInServerErrorEject); one whose
// streams end with a 400 event, requests it refused, is not.
func TestPDStreamsEndingInServerErrorEject(t *testing.T) {
	for _, tc := range []struct {
		code       int
		aggregated bool
		ejections  int
	}{{500, false, 1}, {500, true, 1}, {400, false, 0}, {400, true, 0}} {
		t.Run(fmt.Sprintf("%d aggregated=%v", tc.code, tc.aggregated), func(t *testing.T) {
			event := fmt.Sprintf(`data: {"error":{"message":"x","type":"InternalServerError","param":null,"code":%d}}`, tc.code) +
				"\n\ndata: [DONE]\n\n"
			d := fake(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "data: {\"n\":0}\n\n"+event)
			})
			eps := []kvroute.Endpoint{endpoint("d", d.URL, kvroute.RoleBoth)}
			if !tc.aggregated {
				p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
				eps = []kvroute.Endpoint{endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode)}
			}
			h, r := healthPD(t, eps...)
			for i := range 2 {
				if res, got := serveStream(t, h); res.Decode != "d" || !strings.HasSuffix(got, event) {
					t.Fatalf("request %d: got decode %q, body %q; want d's stream passed on whole", i, res.Decode, got)
				}
			}
			if n := ejections(t, r, "d"); n != tc.ejections {
				t.Errorf("ejections of d: got %d, want %d", n, tc.ejections)
			}
		})
	}
}

// TestPDWholeStreamsKeepHealth: a whole answer is the endpoint's success,
// which resets its consecutive failures: a broken stream, a whole one,
// then a broken one again do not eject it (fail_threshold 2).
func TestPDWholeStreamsKeepHealth(t *testing.T) {
	var n atomic.Int32
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"n\":0}\n\ndata: [DONE]\n\n")
			return
		}
		brokenStream(w, r)
	})
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	h, r := healthPD(t, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	for i := range 3 {
		if res, got := serveStream(t, h); res.Decode != "d" {
			t.Fatalf("request %d: got decode %q, body %q; want d", i, res.Decode, got)
		}
	}
	if n := ejections(t, r, "d"); n != 0 {
		t.Errorf("ejections of d after broken, whole, broken: got %d, want 0", n)
	}
}

// TestPDSGLangPrefillBreakSparesDecode: an SGLang decode stream cut
// because its prefill leg failed (the two legs share one context) is not
// the decode engine's failure: the prefill's failures eject the prefill
// engine, never the decode engine that was answering.
func TestPDSGLangPrefillBreakSparesDecode(t *testing.T) {
	var wrote atomic.Pointer[chan struct{}] // the current request's firstWrite.wrote
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":0}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // waits for KV that never comes: the router cuts it
	})
	p := fake(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-*wrote.Load(): // the decode answer is flowing to the client
			status500(w, r)
		case <-r.Context().Done():
		}
	})
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1,
		Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl,
		Endpoints: []kvroute.Endpoint{endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode)},
		Health:    router.HealthConfig{FailThreshold: 2, BaseEjection: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: &http.Client{}, Protocol: ProtocolSGLang})
	if err != nil {
		t.Fatal(err)
	}
	body := completion(true, 4)
	for i := range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		kr := &kvroute.Request{ID: "sglang", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Stream: true, Arrival: time.Now()}
		w := &firstWrite{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{})}
		wrote.Store(&w.wrote)
		if res := h.Serve(w, req, "/v1/completions", []byte(body), kr); res.Decode != "d" || !strings.Contains(w.Body.String(), `"code":502`) {
			t.Fatalf("request %d: got decode %q, body %q; want d's stream ended with a 502 error event", i, res.Decode, w.Body)
		}
	}
	if n := ejections(t, r, "d"); n != 0 {
		t.Errorf("ejections of decode d after its prefill failed twice mid-stream: got %d, want 0", n)
	}
	if n := ejections(t, r, "p"); n != 1 {
		t.Errorf("ejections of prefill p after failing twice: got %d, want 1", n)
	}
}

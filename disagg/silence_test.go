package disagg

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/router"
)

// silentPD is a nixl P/D handoff over an emulated prefill engine and the
// decode engine d, with Silence set.
func silentPD(t *testing.T, d *httptest.Server, silence time.Duration) *Handoff {
	t.Helper()
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1,
		Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl, Endpoints: []kvroute.Endpoint{
		endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode)}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: &http.Client{}, Silence: silence})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// serveStream runs one streamed request through h and returns its result
// and the body the client got.
func serveStream(t *testing.T, h *Handoff) (Result, string) {
	t.Helper()
	body := completion(true, 4)
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	kr := &kvroute.Request{ID: "silence", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Stream: true, Arrival: time.Now()}
	w := httptest.NewRecorder()
	res := h.Serve(w, req, "/v1/completions", []byte(body), kr)
	return res, w.Body.String()
}

// serveWithin is serveStream, failing the test with msg when the request
// has not ended within limit.
func serveWithin(t *testing.T, h *Handoff, limit time.Duration, msg string) (Result, string) {
	t.Helper()
	done := make(chan struct{})
	var res Result
	var got string
	go func() {
		defer close(done)
		res, got = serveStream(t, h)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatal(msg)
	}
	return res, got
}

// TestPDSilentDecodeEndsTheStream: a decode engine that hangs after the
// first event of its answer (SIGSTOP, a wedged GPU) held the client as
// long as it hung; with Silence (the proxy's timeouts.upstream_header) the
// stream ends with a 504 error event and [DONE] once the engine has been
// silent that long.
func TestPDSilentDecodeEndsTheStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"n\":0}\n\n")
		w.(http.Flusher).Flush()
		select { // hung
		case <-r.Context().Done():
		case <-release:
		}
	})
	h := silentPD(t, d, 300*time.Millisecond)
	start := time.Now()
	res, got := serveWithin(t, h, 30*time.Second, "the stream of a silent decode engine did not end")
	if !errors.Is(res.Err, errSilent) {
		t.Errorf("result error %v, want the answer gone silent", res.Err)
	}
	if !strings.HasPrefix(got, "data: {\"n\":0}\n\n") || !strings.Contains(got, `"code":504`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("client got %q, want the first event, a 504 error event and [DONE]", got)
	}
	t.Logf("ended after %v", time.Since(start).Round(time.Millisecond))
}

// TestPDSlowSteadyDecodeIsNotCut: Silence bounds each silence, not the
// answer: a stream whose events come slower than that in total, but each
// within it, runs to its end.
func TestPDSlowSteadyDecodeIsNotCut(t *testing.T) {
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 8 {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	h := silentPD(t, d, 2*time.Second)
	res, got := serveStream(t, h)
	if res.Err != nil || res.Status != http.StatusOK {
		t.Errorf("result %d (%v), want 200 and no error", res.Status, res.Err)
	}
	if strings.Count(got, "data: {\"n\":") != 8 || !strings.HasSuffix(got, "data: [DONE]\n\n") || strings.Contains(got, "error") {
		t.Errorf("client got %q, want the 8 events and [DONE]", got)
	}
}

// TestPDSilentErrorBodyIsBounded: a decode engine that sends a 500's
// headers and part of its body, then hangs, held the request as long as
// it hung (the router reads an error body whole, to replay it); with
// Silence the read is cut, the leg counts as failed (not an answer to
// replay) and the request ends.
func TestPDSilentErrorBodyIsBounded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":`)
		w.(http.Flusher).Flush()
		select { // hung
		case <-r.Context().Done():
		case <-release:
		}
	})
	h := silentPD(t, d, 300*time.Millisecond)
	res, _ := serveWithin(t, h, 20*time.Second, "a decode engine's silent 500 body held the request")
	if !errors.Is(res.Err, errSilent) {
		t.Errorf("result error %v, want the 500's body gone silent", res.Err)
	}
}

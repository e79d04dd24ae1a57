package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/openai"
)

// An engine that stops after sending its stream's headers and first chunk
// (SIGSTOP, a wedged GPU) must not hold the client forever: once the
// stream has been silent for timeouts.upstream_header it ends with a 504
// error event and [DONE], and counts as the endpoint's failure.
func TestStalledStreamEndsWithErrorEvent(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"n\":0}\n\n")
		select { // hung: neither more bytes nor a closed connection
		case <-release:
		case <-r.Context().Done():
		}
	})
	cfg := testConfig("first", be.URL)
	cfg.Timeouts.UpstreamHeader = 200 * time.Millisecond
	tp := newTestProxy(t, cfg)

	type answer struct {
		status int
		events []string
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Post(tp.srv.URL+PathCompletions, "application/json", strings.NewReader(streamBody))
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		got <- answer{status: resp.StatusCode, events: events(t, resp.Body)}
	}()
	a := recv(t, "the stalled stream's end (the router waited for the hung engine)", got)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != http.StatusOK || len(a.events) != 3 || a.events[0] != `{"n":0}` || a.events[2] != "[DONE]" {
		t.Fatalf("got %d %q, want 200 with the first chunk, an error event and [DONE]", a.status, a.events)
	}
	var e openai.ErrorResponse
	if err := json.Unmarshal([]byte(a.events[1]), &e); err != nil || e.Error.Code != float64(504) || !strings.Contains(e.Error.Message, "sent nothing") {
		t.Errorf("error event: got %s (%v), want code 504 saying the endpoint sent nothing", a.events[1], err)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 1 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 1", v)
	}
	if v := tp.metric(t, tp.metrics.inflight, "m", be.URL); v != 0 {
		t.Errorf("kvroute_inflight_requests: got %v, want 0", v)
	}
}

// A stream that keeps sending, each gap shorter than upstream_header, runs
// to its end however long it takes in all (here twice the bound). Each gap
// is a fifth of the bound: with 50 ms gaps under a 150 ms bound the test
// failed once on a loaded machine.
func TestSlowSteadyStreamIsNotCut(t *testing.T) {
	const chunks = 10
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range chunks {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	cfg := testConfig("first", be.URL)
	cfg.Timeouts.UpstreamHeader = 500 * time.Millisecond
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathCompletions, streamBody)
	got := events(t, strings.NewReader(readAll(t, resp)))
	if len(got) != chunks+1 || got[chunks] != "[DONE]" || strings.Contains(strings.Join(got, ""), "error") {
		t.Fatalf("events: got %q, want %d chunks and [DONE]", got, chunks)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 0 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 0", v)
	}
}

// A client that stops reading for a while (a full TCP window) stalls the
// copy, not the engine: the response is not cut, and the endpoint is not
// blamed.
func TestSlowClientIsNotAStalledEngine(t *testing.T) {
	const size = 32 << 20 // more than loopback's socket buffers hold
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(size))
		chunk := []byte(strings.Repeat("x", 64<<10))
		for n := 0; n < size; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	cfg := testConfig("first", be.URL)
	// The client stops reading for three times the engine's silence bound.
	// The bound is not shorter: with -race on a loaded machine the engine's
	// own writes of 32 MiB paused for over 100 ms once the client read
	// again, and that is a silent engine (the test failed so under load).
	cfg.Timeouts.UpstreamHeader = time.Second
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathChatCompletions, chatBody)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
	}
	time.Sleep(3 * time.Second) // the client reads nothing; the buffers fill
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n != size {
		t.Fatalf("read %d bytes, %v; want %d bytes", n, err, size)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 0 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 0", v)
	}
}

package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestEvery503HasRetryAfter: the router's own 503 answers carry
// Retry-After, as its other 503s and 429s do (writeRoutingError), so that
// a client backs off as told: a request whose endpoint a reload removed
// between its routing and its sending, with no other attempt left
// (endpoint_removed), and a request still waiting for its engine's answer
// at the drain deadline (a request held in the queue then already got
// one). Both were written without it.
func TestEvery503HasRetryAfter(t *testing.T) {
	t.Run("endpoint removed", func(t *testing.T) {
		a := newBackend(t, "a", okHandler("a"))
		b := newBackend(t, "b", okHandler("b"))
		start := testConfig("first", a.URL)
		start.Retry.Attempts = 1
		next := testConfig("first", b.URL)
		next.Retry.Attempts = 1
		_, status, body, h := reloadWhileRoutingHeader(t, start, next, a.URL)
		if status != http.StatusServiceUnavailable || !strings.Contains(body, "endpoint_removed") {
			t.Fatalf("got %d %q, want 503 endpoint_removed", status, body)
		}
		if ra := h.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After: got %q, want 1", ra)
		}
	})
	t.Run("drain deadline", func(t *testing.T) {
		arrived := make(chan struct{})
		be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			close(arrived)
			<-r.Context().Done() // a long non-streaming generation
		})
		cfg := testConfig("first", be.URL)
		cfg.Timeouts.Shutdown = 50 * time.Millisecond
		cfg.Models[0].Signals.Disabled = true
		p, err := New(Options{Config: cfg, NewPicker: testPickers})
		if err != nil {
			t.Fatal(err)
		}
		ln, stop, served := startServe(t, p)
		type result struct {
			status int
			header http.Header
			err    error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := http.Post("http://"+ln.Addr().String()+PathChatCompletions, "application/json", strings.NewReader(chatBody))
			if err != nil {
				done <- result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- result{resp.StatusCode, resp.Header, nil}
		}()
		recv(t, "the request at the engine", arrived)
		stop()
		res := recv(t, "the answer", done)
		if res.err != nil || res.status != http.StatusServiceUnavailable {
			t.Fatalf("got %d (%v), want 503", res.status, res.err)
		}
		if ra := res.header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After: got %q, want 1", ra)
		}
		if err := recv(t, "Serve to return", served); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

package proxy

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEvery503HasRetryAfter: the router's own 503 answers carry
// Retry-After, as its other 503s and 429s do (writeRoutingError), so that
// a client backs off as told: a request whose endpoint a reload removed
// between its routing and its sending, with no other attempt left
// (endpoint_removed), and a request still waiting for its engine's answer
// at the drain deadline (TestShutdownDeadlineAnswersWaitingRequests503; a
// request held in the queue then already got one). Both were written
// without it.
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
}

// TestOversize503RetryAfter: an engine's retried 503 whose body is too
// large to replay is answered with the router's error under that status,
// saying when to try again: the engine's Retry-After when it gave one, else
// 1 second, as every 503 the router writes.
func TestOversize503RetryAfter(t *testing.T) {
	for _, engineRA := range []string{"30", ""} {
		be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if engineRA != "" {
				w.Header().Set("Retry-After", engineRA)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, `{"error":{"message":"%s","type":"ServiceUnavailable","param":null,"code":503}}`, strings.Repeat("x", maxSavedBody+1))
		})
		cfg := testConfig("first", be.URL)
		cfg.Retry.Attempts = 2
		tp := newTestProxy(t, cfg)
		resp := tp.post(t, PathChatCompletions, chatBody)
		body := readAll(t, resp)
		want := cmp.Or(engineRA, "1")
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "upstream_error") || resp.Header.Get("Retry-After") != want {
			t.Errorf("engine Retry-After %q: got %d, Retry-After %q, %.200s; want 503 upstream_error, Retry-After %s",
				engineRA, resp.StatusCode, resp.Header.Get("Retry-After"), body, want)
		}
	}
}

// TestExpectContinueKeepsRequestID: a client's Expect: 100-continue (curl
// sends it with large bodies) is not passed to the engine, whose 100
// Continue the reverse proxy would relay after clearing the response's
// headers: the final response carries the request's X-Request-Id.
func TestExpectContinueKeepsRequestID(t *testing.T) {
	sawExpect := make(chan string, 1)
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		sawExpect <- r.Header.Get("Expect")
		okHandler("a")(w, r)
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	req, _ := http.NewRequest(http.MethodPost, tp.srv.URL+PathChatCompletions, strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderRequestID, "client-id-1")
	req.Header.Set("Expect", "100-continue")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := resp.Header.Get(HeaderRequestID); resp.StatusCode != 200 || got != "client-id-1" {
		t.Errorf("got %d with X-Request-Id %q, want 200 with client-id-1", resp.StatusCode, got)
	}
	if e := <-sawExpect; e != "" {
		t.Errorf("the engine was sent Expect: %q", e)
	}
}

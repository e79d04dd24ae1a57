package proxy

import (
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

package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestDataParallelConnectRetrySkipsSiblings: a data-parallel server that
// refuses connections refuses them for every rank, so a retry after a
// connect error goes to another server, not to a sibling rank of the same
// URL (with 2 attempts and 8 dead ranks listed first, it would fail).
func TestDataParallelConnectRetrySkipsSiblings(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	live := newBackend(t, "plain", okHandler("plain"))
	cfg := dpConfig("first", deadURL, 8, live.URL)
	tp := newTestProxy(t, cfg)
	for i := range 3 {
		resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderEndpoint) != "plain" {
			t.Fatalf("request %d: got %d from %q (%s), want 200 from plain after one failed rank", i, resp.StatusCode,
				resp.Header.Get(HeaderEndpoint), body)
		}
	}
}

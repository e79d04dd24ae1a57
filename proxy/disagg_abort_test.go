package proxy

import (
	"io"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// TestPDBrokenAnswerIsAborted: on a P/D pool, a decode engine's JSON answer
// that breaks after its status was sent reaches the client as a broken
// response, as on an aggregated pool (the reverse proxy aborts it), never
// as a complete-looking 200 with a truncated body; the request is still
// accounted for.
func TestPDBrokenAnswerIsAborted(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	decode := httptest.NewServer(headersThenDie(t, "application/json",
		`{"id":"cmpl-d","object":"text_completion","choices":[{"index":0,"text":"trunc`))
	t.Cleanup(decode.Close)
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, decode.URL), policy.New)
	resp := tp.post(t, PathCompletions, `{"model":"tiny","prompt":"a JSON answer cut short","max_tokens":2}`)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("got a complete %d response %q, want its body's read to fail (an aborted response)", resp.StatusCode, b)
	}
	waitFor(t, "the request accounted for", func() bool {
		return tp.metric(t, tp.metrics.requests, "tiny", "d0", "200") == 1
	})
}

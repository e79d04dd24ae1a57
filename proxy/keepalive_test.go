package proxy

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/keepalive"
)

// TestUpstreamIdleBelowEngineKeepAlive: the router drops a connection to
// an engine once it has been idle for timeouts.upstream_idle, so with that
// below the engine's keep-alive timeout no request is sent on a connection
// the engine is closing. With the transport's 90 s the second request,
// sent after the engine's keep-alive had passed, went out on the stale
// connection and was lost (502 with no other endpoint to retry on).
func TestUpstreamIdleBelowEngineKeepAlive(t *testing.T) {
	e := keepalive.Start(t, 300*time.Millisecond)
	cfg := testConfig("first", e.URL())
	cfg.Timeouts.UpstreamIdle = 100 * time.Millisecond
	tp := newTestProxy(t, cfg)
	for i := range 2 {
		if i > 0 {
			time.Sleep(600 * time.Millisecond) // past the engine's keep-alive
		}
		resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if d := e.Dropped.Load(); d != 0 {
		t.Errorf("%d requests sent on a connection the engine had closed", d)
	}
	if c := e.Conns.Load(); c != 2 {
		t.Errorf("engine accepted %d connections, want 2 (the idle one dropped by the router)", c)
	}
}

package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
)

// TestKVAwareQueueHoldsThenRoutes: with overload=queue the requests that
// find every engine's waiting queue at queue_cap are held in the router,
// not answered 429, and routed as the load drains, within queue_wait.
func TestKVAwareQueueHoldsThenRoutes(t *testing.T) {
	a := startEngine(t, "a", engineOpts{speed: 1})
	b := startEngine(t, "b", engineOpts{speed: 1})
	m := modelConfig("kv-aware", false, a, b)
	m.Policy.Params = map[string]any{"overload": "queue", "queue_cap": 1}
	cfg := config.Config{Models: []config.Model{m}, Debug: config.Debug{Enabled: true},
		HealthCheck: config.HealthCheck{Interval: time.Second, Timeout: 500 * time.Millisecond},
		Timeouts:    config.Timeouts{Shutdown: 2 * time.Second},
		Retry:       config.Retry{QueueWait: time.Minute}} // a hang guard, not a timing assertion
	r := startRouterConfig(t, cfg)

	const n = 40
	codes := make(chan int, n)
	for i := range n {
		go func() {
			res, err := tryPost(r.url, "/v1/completions", completionBody(fmt.Sprintf("burst %d %s", i, text(uint64(i), 20)), 8))
			if err != nil {
				t.Log(err)
			}
			codes <- res.status
		}()
	}
	for range n {
		select {
		case code := <-codes:
			if code != http.StatusOK {
				t.Fatalf("got %d, want every request routed (held while the fleet was over its cap)", code)
			}
		case <-time.After(time.Minute):
			t.Fatal("requests not answered")
		}
	}
	if v, _ := r.metric(t, "kvroute_queued_requests_total", map[string]string{"model": model}); v == 0 {
		t.Fatal("no request was queued: the test did not overload the fleet")
	}
}

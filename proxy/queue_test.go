package proxy

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// queueingPicker sheds with the "queue" action for its first n calls, then
// picks the first healthy candidate; with n < 0 it always queues.
type queueingPicker struct {
	n     int64
	calls atomic.Int64
}

func (q *queueingPicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	if c := q.calls.Add(1); q.n < 0 || c <= q.n {
		d := kvroute.None("queueing", policy.OverloadQueue+": every endpoint over its cap")
		d.Shed = true
		return d
	}
	return firstHealthy.Pick(now, req, cands)
}

func TestQueueHoldsThenRoutes(t *testing.T) {
	engine := httptest.NewServer(statusHandler(http.StatusOK))
	t.Cleanup(engine.Close)
	for _, tt := range []struct {
		name      string
		sheds     int64
		want      int
		wantCalls int64 // at least
	}{
		{"drains", 3, http.StatusOK, 4},
		{"never drains", -1, http.StatusTooManyRequests, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			qp := &queueingPicker{n: tt.sheds}
			cfg := testConfig("queueing", engine.URL)
			cfg.Retry.QueueWait = 100 * time.Millisecond
			tp := newTestProxyWith(t, cfg, func(string, map[string]any, uint64) (kvroute.Picker, error) { return qp, nil })
			resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hello"}`)
			body := readAll(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("status: got %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			if tt.want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			if got := qp.calls.Load(); got < tt.wantCalls {
				t.Fatalf("picker calls: got %d, want at least %d", got, tt.wantCalls)
			}
			if got := tp.metric(t, tp.metrics.queued, "m"); got != 1 {
				t.Fatalf("kvroute_queued_requests_total: got %v, want 1", got)
			}
		})
	}
}

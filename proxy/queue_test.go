package proxy

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
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

// TestQueueOnDisaggregatedPool: the queue escape hatch holds a P/D
// request the prefill policy sheds, then places it on both pools.
func TestQueueOnDisaggregatedPool(t *testing.T) {
	ps, pbodies := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, dbodies := pdEngine(t, kvroute.RoleDecode, "nixl")
	for _, tt := range []struct {
		name  string
		sheds int64
		want  int
		legs  int // prefill legs the engines saw after this case
	}{
		{"drains", 3, http.StatusOK, 1},
		{"never drains", -1, http.StatusTooManyRequests, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			qp := &queueingPicker{n: tt.sheds}
			cfg := config.Config{
				Models: []config.Model{{
					Name: "tiny",
					Endpoints: []config.Endpoint{
						{ID: "p0", URL: ps.URL, Role: "prefill"},
						{ID: "d0", URL: ds.URL, Role: "decode"},
					},
					Policy: config.Policy{Name: "queueing"},
					PD:     config.PD{Protocol: "nixl", Mode: "always", Profile: "tiny"},
				}},
				HealthCheck: config.HealthCheck{Disabled: true},
				Retry:       config.Retry{QueueWait: 100 * time.Millisecond},
			}
			tp := newTestProxyWith(t, cfg, func(string, map[string]any, uint64) (kvroute.Picker, error) { return qp, nil })
			resp := tp.post(t, PathCompletions, `{"model":"tiny","prompt":"held until the prefill pool drains","max_tokens":2}`)
			body := readAll(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("status: got %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			if tt.want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			if got := qp.calls.Load(); got < 2 {
				t.Fatalf("picker calls: got %d, want the request routed again after queueing", got)
			}
			if got := tp.metric(t, tp.metrics.queued, "tiny"); got != 1 {
				t.Fatalf("kvroute_queued_requests_total: got %v, want 1", got)
			}
			if n, m := len(pbodies()), len(dbodies()); n != tt.legs || m != tt.legs {
				t.Fatalf("engine legs: %d prefill, %d decode; want %d each", n, m, tt.legs)
			}
		})
	}
}

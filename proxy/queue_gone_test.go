package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
)

// TestQueueClientGoneIs499: a request whose client goes away while it is
// held in the queue is counted as the client's (499), on aggregated and
// P/D pools alike, not as shed (429): the fleet did not refuse it.
func TestQueueClientGoneIs499(t *testing.T) {
	engine := httptest.NewServer(statusHandler(http.StatusOK))
	t.Cleanup(engine.Close)
	for _, tt := range []struct {
		name, model string
		cfg         config.Config
	}{
		{"aggregated", "m", testConfig("queueing", engine.URL)},
		{"disaggregated", "tiny", pdTestConfig("queueing", "nixl", engine.URL, engine.URL)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			qp := &queueingPicker{n: -1}
			tt.cfg.Retry.QueueWait = time.Minute
			tp := newTestProxyWith(t, tt.cfg, onePicker(qp))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tp.srv.URL+PathCompletions,
					strings.NewReader(`{"model":"`+tt.model+`","prompt":"held, then its client leaves","max_tokens":2}`))
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			waitFor(t, "the request held", func() bool { return tp.pools[tt.model].line.waiting() == 1 })
			cancel()
			recv(t, "the client's end", errc)
			waitFor(t, "the request accounted for", func() bool {
				return tp.metric(t, tp.metrics.requests, tt.model, "", "499")+tp.metric(t, tp.metrics.requests, tt.model, "", "429") == 1
			})
			if got := tp.metric(t, tp.metrics.requests, tt.model, "", "429"); got != 0 {
				t.Errorf("kvroute_requests_total{code=429}: got %v, want 0 (the client went away)", got)
			}
			if n := tp.pools[tt.model].line.waiting(); n != 0 {
				t.Errorf("%d requests still in line", n)
			}
		})
	}
}

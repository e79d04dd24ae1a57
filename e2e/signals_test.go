package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// holdStreams opens n long streaming requests to base and keeps them open
// until the returned function is called (which waits for them to end).
func holdStreams(t *testing.T, base string, n int) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		body := chatBody("hold", fmt.Sprintf("a long answer please %d", i), 8000, true)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			resp, err := client.Do(req)
			if err != nil {
				return // cancelled
			}
			buf := make([]byte, 4096)
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// TestScrapedSignalsReachRouter: requests sent to an engine behind the
// router's back show up in the router's view of that engine (waiting +
// running, KV usage) within a few scrape intervals, with the KV capacity
// from vllm:cache_config_info; the other engine stays idle; the values are
// exported on the router's /metrics.
func TestScrapedSignalsReachRouter(t *testing.T) {
	a := startEngine(t, "a", engineOpts{speed: 1})
	b := startEngine(t, "b", engineOpts{speed: 1})
	r := startRouter(t, modelConfig("least_request", false, a, b))

	eventually(t, 5*time.Second, "first scrapes", func() (bool, string) {
		for _, id := range []string{"a", "b"} {
			st := r.status(t, id)
			if st.Signals.Scrapes == 0 || st.Load.Stale {
				return false, fmt.Sprintf("%s: scrapes %d, stale %v, errors %q", id, st.Signals.Scrapes, st.Load.Stale, st.Signals.LastError)
			}
			if want := 2048 * blockSize; st.Load.KVCapacityTokens != want {
				return false, fmt.Sprintf("%s: KV capacity %d, want %d", id, st.Load.KVCapacityTokens, want)
			}
		}
		return true, ""
	})

	const n = 4
	release := holdStreams(t, a.url(), n)
	eventually(t, 5*time.Second, "engine a's load in the router", func() (bool, string) {
		st := r.status(t, "a")
		l := st.Load
		if l.Waiting+l.Running != n || l.KVUsage <= 0 || l.InFlight != 0 || l.Stale {
			return false, fmt.Sprintf("a: waiting %d running %d kv %.4f in flight %d stale %v", l.Waiting, l.Running, l.KVUsage, l.InFlight, l.Stale)
		}
		if sb := r.status(t, "b").Load; sb.Waiting+sb.Running != 0 {
			return false, fmt.Sprintf("b: waiting %d running %d, want idle", sb.Waiting, sb.Running)
		}
		return true, ""
	})
	if got, ok := r.metric(t, "kvroute_endpoint_running", map[string]string{"model": model, "endpoint": "a"}); !ok || got+0 < 1 {
		t.Errorf("kvroute_endpoint_running{endpoint=a}: got %v (present %v), want >= 1", got, ok)
	}
	if got, ok := r.metric(t, "kvroute_endpoint_kv_capacity_tokens", map[string]string{"model": model, "endpoint": "a"}); !ok || got != 2048*blockSize {
		t.Errorf("kvroute_endpoint_kv_capacity_tokens{endpoint=a}: got %v (present %v), want %d", got, ok, 2048*blockSize)
	}
	release()
	eventually(t, 5*time.Second, "engine a idle again", func() (bool, string) {
		l := r.status(t, "a").Load
		return l.Waiting+l.Running == 0, fmt.Sprintf("a: waiting %d running %d", l.Waiting, l.Running)
	})
}

// TestStaleSignalsFallBack: when an engine's scrapes fail its endpoint is
// reported stale (and counted on /metrics) while routing goes on with the
// router's own counts, and it turns fresh again when scrapes recover.
func TestStaleSignalsFallBack(t *testing.T) {
	a := startEngine(t, "a", engineOpts{speed: 1})
	b := startEngine(t, "b", engineOpts{speed: 1})
	r := startRouter(t, modelConfig("round_robin", false, a, b))
	fresh := func(id string) func() (bool, string) {
		return func() (bool, string) {
			st := r.status(t, id)
			return st.Signals.Scrapes > 0 && !st.Load.Stale, fmt.Sprintf("%s: scrapes %d stale %v", id, st.Signals.Scrapes, st.Load.Stale)
		}
	}
	eventually(t, 5*time.Second, "a fresh", fresh("a"))
	eventually(t, 5*time.Second, "b fresh", fresh("b"))

	a.failMetrics.Store(true)
	eventually(t, 5*time.Second, "a stale after failed scrapes", func() (bool, string) {
		st := r.status(t, "a")
		return st.Load.Stale && st.Signals.ConsecutiveErrors > 0 && st.Signals.LastError != "",
			fmt.Sprintf("a: stale %v consecutive errors %d last error %q", st.Load.Stale, st.Signals.ConsecutiveErrors, st.Signals.LastError)
	})
	if st := r.status(t, "b"); st.Load.Stale {
		t.Errorf("b: stale while its scrapes succeed")
	}
	if got, _ := r.metric(t, "kvroute_endpoint_signal_stale", map[string]string{"model": model, "endpoint": "a"}); got != 1 {
		t.Errorf("kvroute_endpoint_signal_stale{endpoint=a}: got %v, want 1", got)
	}
	if got, _ := r.metric(t, "kvroute_endpoint_scrape_errors_total", map[string]string{"model": model, "endpoint": "a"}); got < 1 {
		t.Errorf("kvroute_endpoint_scrape_errors_total{endpoint=a}: got %v, want >= 1", got)
	}

	// Routing goes on: round robin puts one of two held streams on a, and
	// the router counts it there itself.
	release := holdStreams(t, r.url, 2)
	eventually(t, 5*time.Second, "router-local count on stale a", func() (bool, string) {
		l := r.status(t, "a").Load
		return l.Stale && l.InFlight == 1 && l.Waiting+l.Running == 1,
			fmt.Sprintf("a: stale %v in flight %d waiting %d running %d", l.Stale, l.InFlight, l.Waiting, l.Running)
	})
	release()
	for i := range 4 {
		if res := post(t, r.url, "/v1/completions", completionBody(fmt.Sprintf("still routed %d", i), 2)); res.status != 200 {
			t.Fatalf("request %d: status %d", i, res.status)
		}
	}

	a.failMetrics.Store(false)
	eventually(t, 5*time.Second, "a fresh again", fresh("a"))
}

package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
)

// These tests move an endpoint ID to another engine (its url changes) with
// a reload while something of the old engine is still going on: what the
// old engine does next must not be held against the new one.

// TestReloadNewEngineNotEjectedForOld: a request still running on the old
// engine that then fails does not eject the new engine under the ID.
func TestReloadNewEngineNotEjectedForOld(t *testing.T) {
	release := make(chan struct{})
	old := newBackend(t, "old", func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusInternalServerError)
	})
	fresh := newBackend(t, "fresh", okHandler("fresh"))
	mk := func(u string) config.Config {
		c := testConfig("first", u)
		m := &c.Models[0]
		m.Endpoints[0].ID = "gpu-0"
		m.Signals.Disabled = true
		m.Router.FailThreshold = 1
		m.Router.BaseEjection = time.Minute
		return c
	}
	tp := newTestProxy(t, mk(old.URL))
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(tp.srv.URL+PathCompletions, "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
		if err != nil {
			done <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitFor(t, "the request on the old engine", func() bool { return old.hits.Load() == 1 })
	if _, err := tp.Reload(reloadTo(mk(fresh.URL))); err != nil {
		t.Fatal(err)
	}
	close(release)
	if code := <-done; code != http.StatusInternalServerError {
		t.Fatalf("the request on the old engine: got %d, want its 500", code)
	}
	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || fresh.hits.Load() != 1 {
		t.Errorf("next request: got %d %s (fresh engine hits %d), want 200 from the new engine under gpu-0", resp.StatusCode, body,
			fresh.hits.Load())
	}
}

// TestReloadBetweenRouteAndDispatchSameID: a request routed to gpu-0 just
// before a reload moved gpu-0 to another engine goes to the new engine
// (the ID was never tried), not a 502.
func TestReloadBetweenRouteAndDispatchSameID(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	mk := func(u string) config.Config {
		c := testConfig("first", u)
		c.Models[0].Endpoints[0].ID = "gpu-0"
		return c
	}
	_, status, body := reloadWhileRouting(t, mk(a.URL), mk(b.URL), a.URL)
	if status != http.StatusOK || b.hits.Load() != 1 || a.hits.Load() != 0 {
		t.Errorf("got %d %s (a hits %d, b hits %d), want 200 from b, gpu-0's engine now", status, body, a.hits.Load(), b.hits.Load())
	}
}

// TestReloadStopsProbeMidCheck: a health probe stopped by a reload in the
// middle of a check does not count the cancelled check as a failure.
func TestReloadStopsProbeMidCheck(t *testing.T) {
	var n atomic.Int32
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			if n.Add(1) == 1 {
				w.WriteHeader(http.StatusInternalServerError) // one real failure: the next would eject
				return
			}
			<-r.Context().Done() // hangs until the probe is stopped
			return
		}
		okHandler("old")(w, r)
	}))
	t.Cleanup(old.Close)
	fresh := newBackend(t, "fresh", okHandler("fresh"))
	mk := func(u string) config.Config {
		c := testConfig(policy.Default, u)
		c.Models[0].Endpoints[0].ID = "gpu-0"
		c.Models[0].Signals.Disabled = true
		// The hung check would time out only after 3s: the reload stops it first.
		c.HealthCheck = config.HealthCheck{Interval: 3 * time.Second, Timeout: 3 * time.Second, UnhealthyThreshold: 2, HealthyThreshold: 1}
		return c
	}
	tp := newTestProxyWith(t, mk(old.URL), policy.New)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunHealthChecks(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the second check in progress", func() bool { return n.Load() >= 2 })
	if _, err := tp.Reload(reloadTo(mk(fresh.URL))); err != nil {
		t.Fatal(err)
	}
	if got := tp.metric(t, tp.metrics.ejections, "m", "gpu-0", "active"); got != 0 {
		t.Errorf("kvroute_ejections_total{endpoint=gpu-0,kind=active} = %v after the reload stopped a check: want 0", got)
	}
}

package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
)

// goneConfig is a one-model config over the endpoints "gone" (at goneURL,
// unless empty) and "stay" (at stayURL), policy "first" (gone is tried
// first), engine signals and active health checks off.
func goneConfig(goneURL, stayURL string, failThreshold int) config.Config {
	c := testConfig("first")
	m := &c.Models[0]
	if goneURL != "" {
		m.Endpoints = append(m.Endpoints, config.Endpoint{ID: "gone", URL: goneURL})
	}
	m.Endpoints = append(m.Endpoints, config.Endpoint{ID: "stay", URL: stayURL})
	m.Signals.Disabled = true
	m.Router.FailThreshold = failThreshold
	return c
}

// requestEnded is in /metrics once the test's one request has ended: finish
// observes its duration after it counted it.
const requestEnded = `kvroute_request_duration_seconds_count{model="m"} 1`

// TestReloadRacingWriterLeavesNoSeries: a write of a series labelled with
// an endpoint that found the endpoint still in the pool, and that a
// reload removing the endpoint overtakes (here: the reload runs right
// between the writer's check and its write, until it is about to delete
// the endpoint's series, and is let finish if it can), does not leave the
// series in /metrics after the reload: each writer by endpoint label in
// turn.
func TestReloadRacingWriterLeavesNoSeries(t *testing.T) {
	engineDies := func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"choices\":[{\"index\":0,\"text\":\"gone-0\"}]}\n\n")
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	}
	tests := []struct {
		name          string
		gone          http.HandlerFunc
		failThreshold int
		body          string // the request; "" for none: the writer is a rank found absent
	}{
		{"requests", okHandler("gone"), 100, `{"model":"m","prompt":"hi"}`},
		{"retries", statusHandler(http.StatusInternalServerError), 100, `{"model":"m","prompt":"hi"}`},
		{"ejections passive", statusHandler(http.StatusInternalServerError), 1, `{"model":"m","prompt":"hi"}`},
		{"stream errors", engineDies, 100, `{"model":"m","prompt":"hi","stream":true}`},
		{"ejections absent", okHandler("gone"), 100, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newBackend(t, "gone", tc.gone)
			b := newBackend(t, "stay", okHandler("stay"))
			// Registered before the proxy's server: its Close (which waits
			// for the handlers, the hooks' callers) runs first.
			t.Cleanup(func() { testHookLabel, testHookForget = nil, nil })
			tp := newTestProxy(t, goneConfig(a.URL, b.URL, tc.failThreshold))
			next := goneConfig("", b.URL, tc.failThreshold)

			var fired atomic.Bool
			reached := make(chan struct{}, 1) // the reload is about to delete gone's series
			done := make(chan error, 1)       // the reload returned
			testHookForget = func() { reached <- struct{}{} }
			testHookLabel = func(model, id string) {
				if model != "m" || id != "gone" || !fired.CompareAndSwap(false, true) {
					return
				}
				go func() {
					_, err := tp.Reload(reloadTo(next))
					done <- err
				}()
				select {
				case <-reached:
				case <-time.After(10 * time.Second):
					t.Error("timed out waiting for the reload to reach the deletion of gone's series")
					return
				}
				// Let the reload delete the series before the write if it
				// can (it cannot once the check and the write are atomic).
				select {
				case err := <-done:
					done <- err
				case <-time.After(200 * time.Millisecond):
				}
			}

			if tc.body == "" {
				tp.onAbsent(tp.pools["m"], "gone")(tp.clock.Now(), true)
			} else {
				readAll(t, tp.post(t, PathCompletions, tc.body))
				// The request's last write by endpoint label is its count
				// (finish), before its duration.
				waitFor(t, "the request's end", func() bool { return strings.Contains(gather(t, tp), requestEnded) })
			}
			if !fired.Load() {
				t.Fatal("no write found gone in the pool: the interleaving was not exercised")
			}
			if err := recv(t, "the reload", done); err != nil {
				t.Fatal(err)
			}
			if got := endpointIDs(tp, "m"); len(got) != 1 || got[0] != "stay" {
				t.Fatalf("endpoints after the reload: %v, want stay alone", got)
			}
			if out := gather(t, tp); strings.Contains(out, `endpoint="gone"`) {
				t.Errorf("/metrics still names the removed endpoint:\n%s", grepLines(out, `endpoint="gone"`))
			}
		})
	}
}

// TestReloadInflightRemovedThenAdded: a request in progress on an
// endpoint that a reload removes, and another adds back under the same ID,
// leaves the endpoint's in-flight gauge at 0 when it ends (its Inc and Dec
// are the removed series', not the new one's), and no ghost between.
func TestReloadInflightRemovedThenAdded(t *testing.T) {
	release := make(chan struct{})
	a := newBackend(t, "gone", func(w http.ResponseWriter, r *http.Request) {
		<-release
		okHandler("gone")(w, r)
	})
	b := newBackend(t, "stay", okHandler("stay"))
	cfg := goneConfig(a.URL, b.URL, 100)
	tp := newTestProxy(t, cfg)
	status := make(chan int, 1)
	go func() {
		resp, err := http.Post(tp.srv.URL+PathCompletions, "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
		if err != nil {
			status <- -1
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	waitFor(t, "the request on gone", func() bool { return a.hits.Load() == 1 })
	const inflight = `kvroute_inflight_requests{endpoint="gone",model="m"}`
	if out := gather(t, tp); !strings.Contains(out, inflight+" 1") {
		t.Fatalf("in flight on gone before the reload:\n%s", grepLines(out, `endpoint="gone"`))
	}
	if _, err := tp.Reload(reloadTo(goneConfig("", b.URL, 100))); err != nil {
		t.Fatal(err)
	}
	if out := gather(t, tp); strings.Contains(out, `endpoint="gone"`) {
		t.Errorf("/metrics names gone once removed:\n%s", grepLines(out, `endpoint="gone"`))
	}
	if _, err := tp.Reload(reloadTo(cfg)); err != nil {
		t.Fatal(err)
	}
	close(release)
	if code := recv(t, "the request's end", status); code != http.StatusOK {
		t.Fatalf("the request on gone: status %d", code)
	}
	waitFor(t, "the request's end", func() bool { return strings.Contains(gather(t, tp), requestEnded) })
	if out := gather(t, tp); !strings.Contains(out, inflight+" 0") {
		t.Errorf("in flight on gone (added back) after the request ended: want 0\n%s", grepLines(out, inflight))
	}
}

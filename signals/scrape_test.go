package signals

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/kvindex"
)

func promServer(t *testing.T, file string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	body, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestScrapeOnce(t *testing.T) {
	srv, _ := promServer(t, "vllm.prom")
	v := NewView(ViewConfig{})
	var seen Metrics
	s, err := NewScraper(ScrapeConfig{Client: srv.Client()}, Target{Endpoint: "e", MetricsURL: srv.URL + "/metrics", View: v,
		OnMetrics: func(_ time.Time, m Metrics) { seen = m }})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	s.ScrapeOnce(context.Background())
	st := v.Snapshot()
	if st.Scrapes != 1 || st.Errors != 0 || st.Last.Waiting != 1 || st.Last.Running != 5 || st.ObservedAt.Before(before) {
		t.Fatalf("snapshot %+v", st)
	}
	if seen.NumGPUBlocks != 4096 || s.DetectedFlavor() != FlavorVLLM || s.LastDuration() <= 0 {
		t.Fatalf("OnMetrics saw %+v, flavor %q", seen, s.DetectedFlavor())
	}
}

func TestScrapeFailures(t *testing.T) {
	big := strings.Repeat("# padding comment\n", 1000)
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, "status 500"},
		{"body cap", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(big)) }, "exceeds"},
		{"garbage", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("{not metrics")) }, "parse metrics"},
		{"not an engine", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("up 1\n")) }, "no known engine"},
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			v := NewView(ViewConfig{})
			s, err := NewScraper(ScrapeConfig{Client: srv.Client(), Timeout: 200 * time.Millisecond, MaxBodyBytes: 1000},
				Target{Endpoint: "e", MetricsURL: srv.URL, View: v})
			if err != nil {
				t.Fatal(err)
			}
			s.ScrapeOnce(context.Background())
			st := v.Snapshot()
			if st.Errors != 1 || st.Scrapes != 0 || !strings.Contains(st.LastError, tt.want) {
				t.Fatalf("snapshot errors=%d scrapes=%d last=%q, want one error containing %q", st.Errors, st.Scrapes, st.LastError, tt.want)
			}
		})
	}
	// Connection refused.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	v := NewView(ViewConfig{})
	s, _ := NewScraper(ScrapeConfig{}, Target{Endpoint: "e", MetricsURL: url, View: v})
	s.ScrapeOnce(context.Background())
	if st := v.Snapshot(); st.Errors != 1 {
		t.Fatalf("refused: %+v", st)
	}
}

func TestNewScraperValidate(t *testing.T) {
	v := NewView(ViewConfig{})
	for _, tg := range []Target{
		{MetricsURL: "http://x", View: v},
		{Endpoint: "e", MetricsURL: "http://x"},
		{Endpoint: "e", View: v},
		{Endpoint: "e", MetricsURL: "http://x", View: v, Flavor: "nope"},
		{Endpoint: "e", MetricsURL: "://bad", View: v},
	} {
		if _, err := NewScraper(ScrapeConfig{}, tg); err == nil {
			t.Errorf("NewScraper(%+v): no error", tg)
		}
	}
}

func TestOffset(t *testing.T) {
	seen := map[time.Duration]bool{}
	for _, ep := range []string{"a", "b", "c", "d", "e", "f"} {
		o := Offset(ep, 100*time.Millisecond)
		if o < 0 || o >= 100*time.Millisecond || o != Offset(ep, 100*time.Millisecond) {
			t.Fatalf("Offset(%s) = %v", ep, o)
		}
		seen[o] = true
	}
	if len(seen) < 5 {
		t.Fatalf("offsets not spread: %v", seen)
	}
	if Offset("a", 0) != 0 {
		t.Fatal("zero interval")
	}
}

func TestScraperRunStops(t *testing.T) {
	srv, hits := promServer(t, "sglang.prom")
	v := NewView(ViewConfig{})
	s, err := NewScraper(ScrapeConfig{Client: srv.Client(), Interval: 10 * time.Millisecond}, Target{Endpoint: "e", MetricsURL: srv.URL, View: v})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, "3 scrapes", func() bool { return v.Snapshot().Scrapes >= 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// A scrape sent just before the cancel may reach the server after Run
	// returned (the server counts it late); a loop still running would make
	// about five more in 50 ms.
	n := hits.Load()
	time.Sleep(50 * time.Millisecond)
	if got := hits.Load(); got > n+1 {
		t.Fatalf("%d scrapes after Run returned", got-n)
	}
}

func TestManager(t *testing.T) {
	srvA, _ := promServer(t, "vllm.prom")
	srvB, _ := promServer(t, "llamacpp.prom")
	reg := prometheus.NewRegistry()
	m, err := NewManager(ManagerConfig{Registerer: reg, Scrape: ScrapeConfig{Interval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng := newFakeEngine(t, true, EventEncoding{})
	rec := &recordingSink{}
	va, vb := NewView(ViewConfig{}), NewView(ViewConfig{})
	targets := []Target{
		{Endpoint: "a", MetricsURL: srvA.URL, View: va, KVEvents: &KVEventsTarget{Address: eng.pubAddr, ReplayAddress: eng.replayAddr, Topic: testTopic, Sink: rec}},
		{Endpoint: "b", MetricsURL: srvB.URL, View: vb},
	}
	if err := m.Sync(targets); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "scrapes", func() bool { return va.Snapshot().Scrapes > 0 && vb.Snapshot().Scrapes > 0 })
	eng.waitSubscribed()
	eng.publish(false, stored(0, 1))
	waitFor(t, "kv events", func() bool {
		st := m.Status()
		return len(st) == 2 && st[0].KVEvents != nil && st[0].KVEvents.Batches == 1
	})
	st := m.Status()
	if st[0].Endpoint != "a" || st[0].Flavor != FlavorVLLM || st[1].Flavor != FlavorLlamaCPP || st[1].KVEvents != nil {
		t.Fatalf("status %+v", st)
	}

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range fams {
		got[f.GetName()] = len(f.GetMetric())
	}
	for name, n := range map[string]int{
		"kvroute_endpoint_signal_age_seconds": 2, "kvroute_endpoint_scrape_errors_total": 2, "kvroute_endpoint_waiting": 2,
		"kvroute_endpoint_running": 2, "kvroute_endpoint_kv_usage": 1, "kvroute_endpoint_kv_event_batches_total": 1,
	} {
		if got[name] != n {
			t.Errorf("%s: %d series, want %d (families %v)", name, got[name], n, got)
		}
	}

	// Re-syncing the same targets keeps the loops; dropping "a" stops it
	// and removes its index entries.
	if err := m.Sync(targets); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(targets[1:]); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); len(st) != 1 || st[0].Endpoint != "b" {
		t.Fatalf("after removal: %+v", st)
	}
	rec.mu.Lock()
	calls := strings.Join(rec.calls, "; ")
	rec.mu.Unlock()
	if !strings.HasSuffix(calls, "remove a") {
		t.Fatalf("sink calls %q, want a final remove a", calls)
	}
	scrapes := va.Snapshot().Scrapes
	time.Sleep(60 * time.Millisecond)
	if va.Snapshot().Scrapes != scrapes {
		t.Fatal("removed endpoint still scraped")
	}
	// Invalid targets change nothing.
	if err := m.Sync([]Target{{Endpoint: "x"}}); err == nil {
		t.Fatal("Sync with nil View: no error")
	}
	if err := m.Sync([]Target{targets[1], targets[1]}); err == nil {
		t.Fatal("Sync with a duplicate: no error")
	}
	m.Close()
	if err := m.Sync(targets); err == nil {
		t.Fatal("Sync after Close: no error")
	}
	if fams, _ := reg.Gather(); len(fams) != 0 {
		t.Fatalf("metrics still registered after Close: %d families", len(fams))
	}
}

// TestManagerRemovePurgesIndex: removing an endpoint from the Manager
// removes its blocks from the precise index, and stops its goroutines.
func TestManagerRemovePurgesIndex(t *testing.T) {
	before := runtime.NumGoroutine()
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	m, err := NewManager(ManagerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	eng := newFakeEngine(t, true, EventEncoding{})
	v := NewView(ViewConfig{})
	if err := m.Sync([]Target{{Endpoint: "e1", View: v, KVEvents: &KVEventsTarget{Address: eng.pubAddr, Topic: testTopic, Sink: idx}}}); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed()
	eng.publish(false, stored(0, 3))
	q := kvindex.HashTokens(prompt, 4, nil)
	waitFor(t, "blocks indexed", func() bool { return len(idx.Match(q, nil)) == 1 })
	if err := m.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if hits := idx.Match(q, nil); len(hits) != 0 || idx.Stats().Entries != 0 || idx.Stats().Endpoints != 0 {
		t.Fatalf("after removal: hits %+v, stats %+v", hits, idx.Stats())
	}
	m.Close()
	eng.close()
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before+2 })
}

package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
)

// vllmMetrics serves a vLLM /metrics body with the given queue.
func vllmMetrics(waiting, running *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %d
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} %d
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1
`, waiting.Load(), running.Load())
	}
}

// TestRunSignals: RunSignals scrapes each endpoint at its URL plus the
// model's metrics_path (or its own metrics_url, or not at all when
// disabled) into its router's View, exports the values with model and
// endpoint labels, and stops with its context.
func TestRunSignals(t *testing.T) {
	var waiting, running atomic.Int32
	waiting.Store(3)
	running.Store(5)
	metricsOn := func(path string) *backend {
		return newBackend(t, "x", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != path {
				http.NotFound(w, r)
				return
			}
			vllmMetrics(&waiting, &running)(w, r)
		})
	}
	a := metricsOn("/custom/metrics")
	b := metricsOn("/elsewhere")
	off := metricsOn("/custom/metrics")
	cfg := testConfig("first", a.URL, b.URL, off.URL)
	m := &cfg.Models[0]
	m.Signals = config.Signals{ScrapeInterval: 10 * time.Millisecond, MetricsPath: "/custom/metrics", Flavor: "vllm"}
	m.Endpoints[1].Signals.MetricsURL = b.URL + "/elsewhere"
	m.Endpoints[1].Signals.ScrapeInterval = 20 * time.Millisecond // its own scrape group
	m.Endpoints[2].Signals.Disabled = true
	tp := newTestProxy(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunSignals(ctx) }()
	r := tp.Router("m")
	for _, id := range []string{a.URL, b.URL} {
		waitFor(t, "scrape of "+id, func() bool { return r.View(id).Snapshot().Scrapes > 0 })
		st := r.View(id).Snapshot()
		if st.Last.Waiting != 3 || st.Last.Running != 5 || st.Last.KVCapacityTokens != 16000 {
			t.Errorf("%s: waiting %v running %v capacity %d, want 3, 5, 16000", id, st.Last.Waiting, st.Last.Running, st.Last.KVCapacityTokens)
		}
	}
	if n := r.View(off.URL).Snapshot().Scrapes; n != 0 {
		t.Errorf("disabled endpoint scraped %d times", n)
	}
	if got := tp.sig.kvEvents("m"); got != nil {
		t.Errorf("KV-event status without kv_events: %v", got)
	}

	out := gather(t, tp)
	for _, want := range []string{
		fmt.Sprintf(`kvroute_endpoint_waiting{endpoint=%q,model="m"} 3`, a.URL),
		fmt.Sprintf(`kvroute_endpoint_running{endpoint=%q,model="m"} 5`, b.URL),
		fmt.Sprintf(`kvroute_endpoint_kv_capacity_tokens{endpoint=%q,model="m"} 16000`, a.URL),
		fmt.Sprintf(`kvroute_endpoint_signal_stale{endpoint=%q,model="m"} 1`, off.URL),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The scrape loops' own state is on the page too: how long each
	// endpoint's last scrape took (0 where it is not scraped).
	for _, id := range []string{a.URL, b.URL, off.URL} {
		prefix := fmt.Sprintf(`kvroute_endpoint_scrape_duration_seconds{endpoint=%q,model="m"} `, id)
		i := strings.Index(out, prefix)
		if i < 0 {
			t.Errorf("/metrics lacks %s", prefix)
			continue
		}
		v, _, _ := strings.Cut(out[i+len(prefix):], "\n")
		if scraped := id != off.URL; (v != "0") != scraped {
			t.Errorf("%s: scrape duration %s, want a positive one: %v", id, v, scraped)
		}
	}

	cancel()
	if err := recv(t, "RunSignals to return", done); err != nil {
		t.Fatalf("RunSignals: %v", err)
	}
	if got := tp.sig.kvEvents("m"); got != nil || len(tp.sig.managers) != 0 {
		t.Errorf("managers left after RunSignals returned: %v", tp.sig.managers)
	}
}

// gather renders the proxy's registry in the text format.
func gather(t *testing.T, tp *testProxy) string {
	t.Helper()
	resp, err := http.Get(tp.srv.URL + PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	return readAll(t, resp)
}

func TestKVEventsConfigErrors(t *testing.T) {
	tests := []struct {
		name, addr, replay string
		listen             bool
		want               string
	}{
		{"bind address dialled", "tcp://*:5557", "", false, ""}, // "*" implies listen
		{"bad scheme", "udp://a:1", "", false, "kv_events"},
		{"bind replay", "tcp://a:1", "tcp://*:2", false, "kv_events"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("first", "http://a:1")
			cfg.Models[0].Precise.Tokenizer = config.BuiltinTokenizer
			cfg.Models[0].Endpoints[0].KVEvents = config.KVEvents{Address: tc.addr, ReplayAddress: tc.replay, Listen: tc.listen}
			_, err := New(Options{Config: cfg, NewPicker: testPickers})
			if tc.want == "" && err != nil {
				t.Fatalf("got %v, want no error", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSignalsDefaults(t *testing.T) {
	c := Config{Models: []Model{{Name: "m", Endpoints: []Endpoint{
		{URL: "http://a:1/"},
		{URL: "http://b:1", Signals: EndpointSignals{ScrapeInterval: time.Second, Flavor: "sglang", MetricsURL: "http://b:2/m"}},
		{URL: "http://c:1", Signals: EndpointSignals{Disabled: true}},
	}, Router: Router{StaleAfter: 3 * time.Second}, Precise: Precise{Tokenizer: BuiltinTokenizer}}}}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := &c.Models[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"scrape interval", m.Signals.ScrapeInterval, DefaultScrapeInterval},
		{"scrape timeout", m.Signals.ScrapeTimeout, DefaultScrapeTimeout},
		{"stale after from router.stale_after", m.Signals.StaleAfter, 3 * time.Second},
		{"flavor", m.Signals.Flavor, "auto"},
		{"metrics path", m.Signals.MetricsPath, "/metrics"},
		{"endpoint inherits interval", m.Endpoints[0].Signals.ScrapeInterval, DefaultScrapeInterval},
		{"endpoint keeps interval", m.Endpoints[1].Signals.ScrapeInterval, time.Second},
		{"endpoint inherits timeout", m.Endpoints[1].Signals.ScrapeTimeout, DefaultScrapeTimeout},
		{"endpoint keeps flavor", m.Endpoints[1].Signals.Flavor, "sglang"},
		{"metrics url", m.MetricsURL(0), "http://a:1/metrics"},
		{"metrics url override", m.MetricsURL(1), "http://b:2/m"},
		{"metrics url disabled", m.MetricsURL(2), ""},
		{"precise block size", m.Precise.BlockSize, DefaultPreciseBlockSize},
		{"precise cache", m.Precise.CacheTokens, DefaultTokenizerCache},
		{"precise index", m.Precise.IndexCapacity, DefaultIndexCapacity},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	m.Signals.Disabled = true
	if got := m.MetricsURL(1); got != "" {
		t.Errorf("model signals disabled: metrics url %q, want none", got)
	}
}

func TestSignalsValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(m *Model)
		want string
	}{
		{"negative interval", func(m *Model) { m.Signals.ScrapeInterval = -time.Second }, "models[0].signals.scrape_interval: -1s is not positive"},
		{"tiny interval", func(m *Model) { m.Signals.ScrapeInterval = time.Nanosecond },
			"models[0].signals.scrape_interval: 1ns is shorter than 1ms: the router would probe its engines continuously"},
		{"tiny endpoint interval", func(m *Model) { m.Endpoints[0].Signals.ScrapeInterval = 999 * time.Microsecond },
			"models[0].endpoints[0].signals.scrape_interval: 999µs is shorter than 1ms"},
		{"bad flavor", func(m *Model) { m.Signals.Flavor = "vllm2" }, `models[0].signals.flavor: "vllm2" is not one of auto, vllm`},
		{"bad path", func(m *Model) { m.Signals.MetricsPath = "metrics" }, `models[0].signals.metrics_path: "metrics" does not start with /`},
		{"bad escape in path", func(m *Model) { m.Signals.MetricsPath = "/metrics%zz" },
			`models[0].signals.metrics_path: "/metrics%zz" is not a URL path: invalid URL escape "%zz"`},
		{"endpoint flavor", func(m *Model) { m.Endpoints[0].Signals.Flavor = "x" }, `models[0].endpoints[0].signals.flavor: "x"`},
		{"endpoint metrics url", func(m *Model) { m.Endpoints[0].Signals.MetricsURL = "ftp://x" }, `models[0].endpoints[0].signals.metrics_url: "ftp://x" is not an http(s) URL`},
		{"endpoint metrics url fragment", func(m *Model) { m.Endpoints[0].Signals.MetricsURL = "http://a:1/metrics#x" }, `models[0].endpoints[0].signals.metrics_url: "http://a:1/metrics#x" has a fragment`},
		{"endpoint url query", func(m *Model) { m.Endpoints[0].URL = "http://a:1/?x=1" }, `models[0].endpoints[0].url: "http://a:1/?x=1" has a query or fragment`},
		{"events without precise", func(m *Model) { m.Endpoints[0].KVEvents.Address = "tcp://a:5557" }, "models[0].endpoints[0].kv_events: needs models[0].precise.tokenizer"},
		{"events without address", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents.Topic = "kv"
		}, "models[0].endpoints[0].kv_events.address: is empty"},
		{"events address", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents.Address = "a:5557"
		}, `models[0].endpoints[0].kv_events.address: "a:5557" is not a tcp://, ipc:// or inproc:// address`},
		{"replay address", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents = KVEvents{Address: "tcp://a:1", ReplayAddress: "a:2"}
		}, `models[0].endpoints[0].kv_events.replay_address: "a:2"`},
		{"replay address is the address", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents = KVEvents{Address: "tcp://a:5557", ReplayAddress: "tcp://A:5557"}
		}, `models[0].endpoints[0].kv_events.replay_address: "tcp://A:5557" is kv_events.address again`},
		{"ipc replay address is the address", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents = KVEvents{Address: "ipc:///tmp/kv", ReplayAddress: "ipc:///tmp/kv"}
		}, `models[0].endpoints[0].kv_events.replay_address: "ipc:///tmp/kv" is kv_events.address again`},
		{"replay buffer steps", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents = KVEvents{Address: "tcp://a:1", ReplayBufferSteps: -1}
		}, `models[0].endpoints[0].kv_events.replay_buffer_steps: -1 is negative`},
		{"replay buffer steps without address", func(m *Model) {
			m.Precise.Tokenizer = BuiltinTokenizer
			m.Endpoints[0].KVEvents.ReplayBufferSteps = 20000
		}, "models[0].endpoints[0].kv_events.address: is empty"},
		{"precise fields without tokenizer", func(m *Model) { m.Precise.BlockSize = 32 }, "models[0].precise.tokenizer: is empty but other precise fields are set"},
		{"precise block size", func(m *Model) { m.Precise = Precise{Tokenizer: BuiltinTokenizer, BlockSize: -16} }, "models[0].precise.block_size: -16 is not positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Models: []Model{{Name: "m", Endpoints: []Endpoint{{URL: "http://a:1"}}}}}
			tc.mod(&c.Models[0])
			c.ApplyDefaults()
			err := c.Validate()
			var es Errors
			if !errors.As(err, &es) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestMetricsURLQuery: an endpoint's metrics_url may carry a query
// (llama.cpp's router mode serves a model's metrics at /metrics?model=NAME),
// scraped as written; its url may not.
func TestMetricsURLQuery(t *testing.T) {
	cfg, err := Parse([]byte(`models:
  - name: m
    signals: {flavor: llamacpp}
    endpoints:
      - url: http://a:8080
        signals: {metrics_url: "http://a:8080/metrics?model=qwen"}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got, want := cfg.Models[0].MetricsURL(0), "http://a:8080/metrics?model=qwen"; got != want {
		t.Errorf("MetricsURL: got %q, want %q", got, want)
	}
}

package config

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func valid() Config {
	c := Config{Models: []Model{{
		Name:      "llama",
		Endpoints: []Endpoint{{URL: "http://127.0.0.1:8001"}, {URL: "http://127.0.0.1:8002/"}},
	}}}
	c.ApplyDefaults()
	return c
}

func TestApplyDefaults(t *testing.T) {
	c := valid()
	checks := []struct {
		name string
		got  any
		want any
	}{
		{"listen", c.Listen, DefaultListen},
		{"endpoint id", c.Models[0].Endpoints[0].ID, "http://127.0.0.1:8001"},
		{"role", c.Models[0].Endpoints[0].Role, "both"},
		{"weight", c.Models[0].Endpoints[1].Weight, 1},
		{"policy", c.Models[0].Policy.Name, DefaultPolicy},
		{"block chars", c.Models[0].Router.BlockChars, DefaultBlockChars},
		{"max ejection", c.Models[0].Router.MaxEjection, DefaultMaxEjection},
		{"max body", c.Limits.MaxBodyBytes, int64(16 << 20)},
		{"attempts", c.Retry.Attempts, 2},
		{"health path", c.HealthCheck.Path, "/health"},
		{"health timeout", c.HealthCheck.Timeout, 2 * time.Second},
		{"read header", c.Timeouts.ReadHeader, DefaultReadHeader},
		{"upstream header", c.Timeouts.UpstreamHeader, time.Duration(0)},
		{"upstream idle", c.Timeouts.UpstreamIdle, 4 * time.Second}, // under uvicorn's 5 s keep-alive
		{"log", c.Log.Format + "/" + c.Log.Level, "text/info"},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate of defaults: %v", err)
	}
}

func TestApplyDefaultsKeepsSetValues(t *testing.T) {
	c := Config{Listen: "127.0.0.1:9", HealthCheck: HealthCheck{Interval: time.Second}, Retry: Retry{Attempts: -1}}
	c.ApplyDefaults()
	if c.Listen != "127.0.0.1:9" || c.Retry.Attempts != -1 {
		t.Errorf("got listen %q attempts %d, want the set values kept", c.Listen, c.Retry.Attempts)
	}
	if c.HealthCheck.Timeout != time.Second {
		t.Errorf("health timeout: got %v, want it capped at the 1s interval", c.HealthCheck.Timeout)
	}
}

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		// LoRA adapters: a request's model field names one model or
		// adapter; an endpoint picks from its model's adapters.
		{"adapter empty", func(c *Config) { c.Models[0].Adapters = []string{" "} },
			`models[0].adapters[0]: is empty`},
		{"adapter named as its model", func(c *Config) { c.Models[0].Adapters = []string{"sql", "llama"} },
			`models[0].adapters[1]: "llama" is models[0].name too: a request's model field must name one model or adapter`},
		{"adapter twice in a model", func(c *Config) { c.Models[0].Adapters = []string{"sql", "sql"} },
			`models[0].adapters[1]: "sql" is models[0].adapters[0] too: a request's model field must name one model or adapter`},
		{"adapter of two models", func(c *Config) {
			c.Models = append(c.Models, Model{Name: "qwen", Adapters: []string{"sql"}, Endpoints: []Endpoint{{URL: "http://127.0.0.1:9001"}}})
			c.Models[0].Adapters = []string{"sql"}
			c.ApplyDefaults()
		}, `models[1].adapters[0]: "sql" is models[0].adapters[0] too: a request's model field must name one model or adapter`},
		{"adapter named as another model", func(c *Config) {
			c.Models = append(c.Models, Model{Name: "qwen", Endpoints: []Endpoint{{URL: "http://127.0.0.1:9001"}}})
			c.Models[0].Adapters = []string{"qwen"}
			c.ApplyDefaults()
		}, `models[0].adapters[0]: "qwen" is models[1].name too: a request's model field must name one model or adapter`},
		{"endpoint adapter not the model's", func(c *Config) {
			c.Models[0].Adapters = []string{"sql"}
			c.Models[0].Endpoints[1].Adapters = []string{"sql", "chat"}
		}, `models[0].endpoints[1].adapters[1]: "chat" is not one of the model's adapters: list it there too (the model's adapters are the whole set)`},
		{"endpoint adapter twice", func(c *Config) {
			c.Models[0].Adapters = []string{"sql"}
			c.Models[0].Endpoints[1].Adapters = []string{"sql", "sql"}
		}, `models[0].endpoints[1].adapters[1]: "sql" duplicates adapters[0]`},
		{"discovery template adapter not the model's", func(c *Config) {
			c.Models[0].Endpoints = nil
			c.Models[0].Adapters = []string{"sql"}
			c.Models[0].Discovery = &Discovery{Kubernetes: &Kubernetes{Service: "llama", Endpoint: EndpointTemplate{Adapters: []string{"sql", "chat"}}}}
			c.ApplyDefaults()
		}, `models[0].discovery.kubernetes.endpoint.adapters[1]: "chat" is not one of the model's adapters: list it there too (the model's adapters are the whole set)`},
		{"adapter served by no endpoint", func(c *Config) {
			c.Models[0].Adapters = []string{"sql", "chat"}
			c.Models[0].Endpoints[0].Adapters = []string{"sql"}
			c.Models[0].Endpoints[1].Adapters = []string{"sql"}
		}, `models[0].adapters[1]: "chat" is served by no endpoint: every endpoint lists its adapters, and none lists it`},
		{"bad url scheme", func(c *Config) {
			c.Models[0].Endpoints = append(c.Models[0].Endpoints, Endpoint{ID: "x", URL: "htp://x", Role: "both", Weight: 1})
		},
			`models[0].endpoints[2].url: "htp://x" is not an http(s) URL`},
		{"url without host", func(c *Config) { c.Models[0].Endpoints[0].URL = "http://" },
			`models[0].endpoints[0].url: "http://" has no host`},
		{"url with query", func(c *Config) { c.Models[0].Endpoints[0].URL = "http://a:1/?x=1" },
			`models[0].endpoints[0].url: "http://a:1/?x=1" has a query or fragment`},
		{"empty url", func(c *Config) { c.Models[0].Endpoints[0].URL = "" },
			`models[0].endpoints[0].url: "" is empty`},
		// URLs and addresses no connection can use, refused by
		// --check-config rather than failing every request (or the start).
		{"url without host name", func(c *Config) { c.Models[0].Endpoints[0].URL = "http://:8000" },
			`models[0].endpoints[0].url: "http://:8000" has no host`},
		{"url port out of range", func(c *Config) { c.Models[0].Endpoints[0].URL = "http://a:99999" },
			`models[0].endpoints[0].url: "http://a:99999" has port 99999, not 1-65535`},
		{"url port 0", func(c *Config) { c.Models[0].Endpoints[0].URL = "http://a:0" },
			`models[0].endpoints[0].url: "http://a:0" has port 0, not 1-65535`},
		{"listen port out of range", func(c *Config) { c.Listen = ":99999" }, `listen: ":99999" has port 99999, not 0-65535`},
		{"listen port not a number", func(c *Config) { c.Listen = "127.0.0.1:8O80" },
			`listen: "127.0.0.1:8O80": port "8O80" is not a number or a known service name`},
		// ZMQ addresses the subscriber can never dial or bind (without
		// data parallelism, which parses the port, they failed at run time).
		{"kv_events port out of range", func(c *Config) {
			c.Models[0].Precise.Tokenizer = "builtin"
			c.Models[0].Endpoints[0].KVEvents.Address = "tcp://127.0.0.1:99999"
		}, `models[0].endpoints[0].kv_events.address: "tcp://127.0.0.1:99999" has no port 1-65535 (tcp://host:port)`},
		{"kv_events without port", func(c *Config) {
			c.Models[0].Precise.Tokenizer = "builtin"
			c.Models[0].Endpoints[0].KVEvents.Address = "tcp://127.0.0.1:5557"
			c.Models[0].Endpoints[0].KVEvents.ReplayAddress = "tcp://127.0.0.1"
		}, `models[0].endpoints[0].kv_events.replay_address: "tcp://127.0.0.1" has no port 1-65535 (tcp://host:port)`},
		// Two endpoints whose events the router binds at one address
		// (here rank 1 of a data-parallel endpoint, at port + 1): the
		// second bind fails at run time.
		{"kv_events bound twice", func(c *Config) {
			c.Models[0].Precise = Precise{Tokenizer: "builtin", BlockSize: 16, CacheTokens: 1 << 20, IndexCapacity: 1 << 20}
			c.Models[0].Endpoints[0].DataParallelSize = 2
			c.Models[0].Endpoints[0].KVEvents = KVEvents{Address: "tcp://127.0.0.1:5557", Listen: true}
			c.Models[0].Endpoints[1].KVEvents = KVEvents{Address: "tcp://*:5558"}
		}, `models[0].endpoints[1].kv_events.address: "tcp://*:5558" (bound at tcp://*:5558) is bound by models[0].endpoints[0].kv_events.address too: each endpoint's events need an address of their own`},
		// The router drops an untrusted client's X-Kvroute-* headers:
		// sessions keyed by one would never stick.
		{"session header in the router's namespace", func(c *Config) { c.Models[0].Router.Session.Header = "X-Kvroute-Affinity" },
			`models[0].router.session.header: "X-Kvroute-Affinity" is in the router's X-Kvroute- namespace, whose headers the router drops from untrusted clients: name another header`},
		{"bootstrap_port label not a port", func(c *Config) {
			c.Models[0].Endpoints[0].Labels = map[string]string{"bootstrap_port": "9O01"}
		}, `models[0].endpoints[0].labels.bootstrap_port: "9O01" is not a port 1-65535`},
		// OpenAI clients' base URLs end in /v1; an engine URL that does
		// sends every request to /v1/v1/... and every scrape and health
		// check to /v1/metrics and /v1/health, all 404.
		{"url ends in /v1", func(c *Config) { c.Models[0].Endpoints[0].URL = "http://a:1/v1" },
			`models[0].endpoints[0].url: "http://a:1/v1" ends in /v1: give the engine's base URL (http://a:1); the router adds each request's /v1/... path`},
		{"url ends in /v1/", func(c *Config) { c.Models[0].Endpoints[1].URL = "http://gw/llama/v1/" },
			`models[0].endpoints[1].url: "http://gw/llama/v1/" ends in /v1: give the engine's base URL (http://gw/llama); the router adds each request's /v1/... path`},
		{"dup id", func(c *Config) { c.Models[0].Endpoints[1].ID = c.Models[0].Endpoints[0].ID },
			`models[0].endpoints[1].id: "http://127.0.0.1:8001" duplicates models[0].endpoints[0].id`},
		// One engine twice in a role, under two ids (or one URL with and
		// without its trailing slash): it would take two shares.
		{"dup engine", func(c *Config) {
			c.Models[0].Endpoints[1].URL = "HTTP://127.0.0.1:8001/"
		},
			`models[0].endpoints[1].url: "HTTP://127.0.0.1:8001/" is the engine of models[0].endpoints[0] again; list each engine once`},
		// The same engine spelt another way: the scheme's default port
		// written out, a leading zero, another form of an IP address.
		{"dup engine, default port", func(c *Config) {
			c.Models[0].Endpoints[0].URL, c.Models[0].Endpoints[1].URL = "http://10.0.0.7", "http://10.0.0.7:80"
		}, `models[0].endpoints[1].url: "http://10.0.0.7:80" is the engine of models[0].endpoints[0] again; list each engine once`},
		{"dup engine, https default port", func(c *Config) {
			c.Models[0].Endpoints[0].URL, c.Models[0].Endpoints[1].URL = "https://10.0.0.7:443", "https://10.0.0.7"
		}, `models[0].endpoints[1].url: "https://10.0.0.7" is the engine of models[0].endpoints[0] again; list each engine once`},
		{"dup engine, leading zero", func(c *Config) { c.Models[0].Endpoints[1].URL = "http://127.0.0.1:08001" },
			`models[0].endpoints[1].url: "http://127.0.0.1:08001" is the engine of models[0].endpoints[0] again; list each engine once`},
		{"dup engine, IPv6 spelling", func(c *Config) {
			c.Models[0].Endpoints[0].URL, c.Models[0].Endpoints[1].URL = "http://[::1]:8000", "http://[0:0:0:0:0:0:0:1]:8000"
		}, `models[0].endpoints[1].url: "http://[0:0:0:0:0:0:0:1]:8000" is the engine of models[0].endpoints[0] again; list each engine once`},
		{"bad role", func(c *Config) { c.Models[0].Endpoints[1].Role = "leader" },
			`models[0].endpoints[1].role: "leader" is not one of both, prefill, decode`},
		{"prefill only", func(c *Config) {
			for i := range c.Models[0].Endpoints {
				c.Models[0].Endpoints[i].Role = "prefill"
			}
		},
			`models[0].endpoints: every endpoint has role prefill: at least one needs role both or decode to generate tokens`},
		{"bad weight", func(c *Config) { c.Models[0].Endpoints[0].Weight = -2 },
			`models[0].endpoints[0].weight: -2 is not positive`},
		{"weight too large", func(c *Config) { c.Models[0].Endpoints[0].Weight = 2_000_000 },
			`models[0].endpoints[0].weight: 2000000 is above the largest weight, 1000000`},
		{"negative kv", func(c *Config) { c.Models[0].Endpoints[0].KVCapacityTokens = -1 },
			`models[0].endpoints[0].kv_capacity_tokens: -1 is negative`},
		{"no models", func(c *Config) { c.Models = nil }, `models: at least one model is required`},
		{"no endpoints", func(c *Config) { c.Models[0].Endpoints = nil }, `models[0].endpoints: at least one endpoint is required`},
		{"empty name", func(c *Config) { c.Models[0].Name = " " }, `models[0].name: is empty`},
		{"dup model", func(c *Config) { c.Models = append(c.Models, c.Models[0]) }, `models[1].name: "llama" duplicates models[0].name`},
		{"listen", func(c *Config) { c.Listen = "8080" }, `listen: "8080" is not a host:port address`},
		{"negative timeout", func(c *Config) { c.Timeouts.Dial = -time.Second }, `timeouts.dial: -1s is negative`},
		{"negative upstream idle", func(c *Config) { c.Timeouts.UpstreamIdle = -time.Second }, `timeouts.upstream_idle: -1s is negative`},
		{"attempts", func(c *Config) { c.Retry.Attempts = 0 }, `retry.attempts: 0 is not positive`},
		{"body limit", func(c *Config) { c.Limits.MaxBodyBytes = -5 }, `limits.max_body_bytes: -5 is not positive`},
		{"health path", func(c *Config) { c.HealthCheck.Path = "health" }, `health_check.path: "health" does not start with /`},
		{"health path bad escape", func(c *Config) { c.HealthCheck.Path = "/health%" },
			`health_check.path: "/health%" is not a URL path: invalid URL escape "%"`},
		{"health interval", func(c *Config) { c.HealthCheck.Interval, c.HealthCheck.Timeout = time.Nanosecond, time.Nanosecond },
			`health_check.interval: 1ns is shorter than 1ms: the router would probe its engines continuously`},
		{"health timeout", func(c *Config) { c.HealthCheck.Timeout = time.Minute },
			`health_check.timeout: 1m0s is longer than health_check.interval (5s)`},
		{"trusted", func(c *Config) { c.TrustedClients = []string{"10.0.0.0/8", "10.0.0.300"} },
			`trusted_clients[1]: "10.0.0.300" is not an IP address or CIDR prefix`},
		{"admin token", func(c *Config) { c.Admin.Token = "short" }, `admin.token: is shorter than 16 characters`},
		{"admin token newline", func(c *Config) { c.Admin.Token = "0123456789abcdef\n" }, // a YAML block scalar (token: |)
			`admin.token: starts or ends with white space, or holds a control character: no Authorization header carries it as it is, so every token sent would be refused`},
		{"admin token leading space", func(c *Config) { c.Admin.Token = " 0123456789abcdef" },
			`admin.token: starts or ends with white space, or holds a control character: no Authorization header carries it as it is, so every token sent would be refused`},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, `log.format: "xml" is not one of text, json`},
		{"log level", func(c *Config) { c.Log.Level = "loud" }, `log.level: "loud" is not one of debug, info, warn, error`},
		{"ejection", func(c *Config) { c.Models[0].Router.MaxEjection = time.Millisecond },
			`models[0].router.max_ejection: 1ms is shorter than router.base_ejection (1s)`},
		{"block chars", func(c *Config) { c.Models[0].Router.BlockChars = -1 }, `models[0].router.block_chars: -1 is not positive`},
		{"decision log too large", func(c *Config) { c.Models[0].Router.DecisionLog = 1 << 30 },
			`models[0].router.decision_log: 1073741824 is above 100000 (the log is allocated whole at start)`},
		{"policy", func(c *Config) { c.Models[0].Policy.Name = " " }, `models[0].policy.name: is empty`},
		{"scrape slower than stale", func(c *Config) { c.Models[0].Signals.ScrapeInterval = c.Models[0].Signals.StaleAfter },
			`models[0].signals.scrape_interval: 1s is not shorter than signals.stale_after (1s): each scrape would go stale before the next; shorten the interval or raise stale_after`},
		// Non-finite floats: every comparison with NaN is false, so a
		// range check alone let .nan through, and .inf passed "positive"
		// and "not more than 1" checks; a NaN efficiency made the P/D
		// placement's transfer time NaN.
		{"pd efficiency nan", func(c *Config) { c.Models[0].PD.DefaultLink = PDLink{Gbps: 100, Efficiency: math.NaN()} },
			`models[0].pd.default_link.efficiency: NaN is not a finite number`},
		{"pd rule efficiency -inf", func(c *Config) {
			c.Models[0].PD.Links = []PDLink{{Same: []string{"node"}, Gbps: 100, Efficiency: math.Inf(-1)}}
		},
			`models[0].pd.links[0].efficiency: -Inf is not a finite number`},
		{"pd gbps +inf", func(c *Config) {
			c.Models[0].PD.Links = []PDLink{{Same: []string{"node"}, Gbps: math.Inf(1)}}
		},
			`models[0].pd.links[0].gbps: +Inf is not a finite number`},
		{"pd default gbps nan", func(c *Config) { c.Models[0].PD.DefaultLink = PDLink{Gbps: math.NaN()} },
			`models[0].pd.default_link.gbps: NaN is not a finite number`},
		{"pd local ratio nan", func(c *Config) { c.Models[0].PD.LocalRatio = math.NaN() },
			`models[0].pd.local_ratio: NaN is not a finite number`},
		{"pd local ratio -inf", func(c *Config) { c.Models[0].PD.LocalRatio = math.Inf(-1) },
			`models[0].pd.local_ratio: -Inf is not a finite number`},
		{"pd margin nan", func(c *Config) { c.Models[0].PD.Margin = math.NaN() },
			`models[0].pd.margin: NaN is not a finite number`},
		{"pd margin -inf", func(c *Config) { c.Models[0].PD.Margin = math.Inf(-1) },
			`models[0].pd.margin: -Inf is not a finite number`},
		{"endpoint scrape slower than stale", func(c *Config) { c.Models[0].Endpoints[1].Signals.ScrapeInterval = 2 * time.Second },
			`models[0].endpoints[1].signals.scrape_interval: 2s is not shorter than signals.stale_after (1s): each scrape would go stale before the next; shorten the interval or raise stale_after`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("Validate: got nil, want %q", tc.want)
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("Validate: got %T, want config.Errors", err)
			}
			found := false
			for _, e := range es {
				if e.Error() == tc.want {
					found = true
				}
			}
			if !found {
				t.Errorf("Validate:\n got %v\nwant an error %q", err, tc.want)
			}
		})
	}
}

// A scrape interval at or past stale_after is refused only while scraping
// is on: with signals disabled neither is used.
func TestValidateScrapeIntervalDisabled(t *testing.T) {
	c := valid()
	c.Models[0].Signals.ScrapeInterval = 5 * time.Second
	c.Models[0].Endpoints[1].Signals.ScrapeInterval = 5 * time.Second
	c.Models[0].Signals.Disabled = true
	if err := c.Validate(); err != nil {
		t.Errorf("Validate with signals disabled: got %v, want nil", err)
	}
	c = valid()
	c.Models[0].Signals.StaleAfter = 10 * time.Second
	c.Models[0].Signals.ScrapeInterval = 5 * time.Second
	if err := c.Validate(); err != nil {
		t.Errorf("Validate with stale_after 10s: got %v, want nil", err)
	}
}

func TestValidateReportsAll(t *testing.T) {
	c := valid()
	c.Listen = ""
	c.Models[0].Endpoints[0].URL = "ftp://x"
	c.Log.Format = "xml"
	err := c.Validate()
	var es Errors
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("got %v, want 3 errors", err)
	}
	if !strings.HasPrefix(err.Error(), "listen: is empty; models[0].endpoints[0].url") {
		t.Errorf("got %q, want errors in field order", err)
	}
}

func TestParsePrefix(t *testing.T) {
	tests := []struct{ in, want string }{
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"127.0.0.1", "127.0.0.1/32"},
		{"::1", "::1/128"},
		{"::ffff:10.0.0.1", "10.0.0.1/32"},
	}
	for _, tc := range tests {
		p, err := ParsePrefix(tc.in)
		if err != nil || p.String() != tc.want {
			t.Errorf("ParsePrefix(%q): got %v, %v, want %s", tc.in, p, err, tc.want)
		}
	}
	if _, err := ParsePrefix("nope"); err == nil {
		t.Error("ParsePrefix(nope): got nil error")
	}
}

func TestKVEndpoints(t *testing.T) {
	c := valid()
	c.Models[0].Endpoints[1].Role = "decode"
	c.Models[0].Endpoints[1].Labels = map[string]string{"zone": "a"}
	eps, err := c.Models[0].KVEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	if eps[1].URL != "http://127.0.0.1:8002" || eps[1].Role.String() != "decode" || eps[1].Labels["zone"] != "a" {
		t.Errorf("got %+v", eps[1])
	}
	c.Models[0].Endpoints[1].Labels["zone"] = "b"
	if eps[1].Labels["zone"] != "a" {
		t.Error("KVEndpoints shares the labels map with the config")
	}
}

// TestValidateEngineInTwoRoles: one engine may be listed once per role
// (prefill and decode), only not twice in one.
func TestValidateEngineInTwoRoles(t *testing.T) {
	c := valid()
	c.Models[0].Endpoints[0].Role = "prefill"
	c.Models[0].Endpoints[1].URL, c.Models[0].Endpoints[1].Role = "http://127.0.0.1:8001", "decode"
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: got %v, want nil", err)
	}
}

// TestAdapters: a valid config with LoRA adapters; KVEndpoints gives each
// endpoint its adapters sorted (nil: every adapter of the model), and
// AdapterModel finds an adapter's model.
func TestAdapters(t *testing.T) {
	c := valid()
	c.Models[0].Adapters = []string{"sql", "chat"}
	c.Models[0].Endpoints[1].Adapters = []string{"sql", "chat"}
	c.Models[0].Endpoints[1].DataParallelSize = 2
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	eps, err := c.Models[0].KVEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	if eps[0].Adapters != nil || !eps[0].ServesAdapter("sql") || !eps[0].ServesAdapter("any") {
		t.Errorf("endpoint without adapters: Adapters %q, want nil (every adapter)", eps[0].Adapters)
	}
	for _, e := range eps[1:] {
		if strings.Join(e.Adapters, ",") != "chat,sql" || !e.ServesAdapter("chat") || e.ServesAdapter("fr") || !e.ServesAdapter("") {
			t.Errorf("%s: Adapters %q, want chat,sql", e.ID, e.Adapters)
		}
	}
	if m := c.AdapterModel("chat"); m == nil || m.Name != "llama" {
		t.Errorf("AdapterModel(chat) = %v, want llama", m)
	}
	if m := c.AdapterModel("llama"); m != nil {
		t.Errorf("AdapterModel(llama) = %v, want nil (a model, not an adapter)", m.Name)
	}
}

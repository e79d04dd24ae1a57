package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

const discoveryYAML = `
models:
  - name: llama
    precise: {tokenizer: builtin}
    discovery:
      kubernetes:
        service: vllm-llama
        namespace: inference
        port: http
        endpoint:
          weight: 2
          labels: {zone: pinned, gpu: h100}
          kv_events: {port: 5557, replay_port: 5657}
`

// discovered returns a valid config with a discovered model, its
// defaults applied.
func discovered(t *testing.T) Config {
	t.Helper()
	c, err := Parse([]byte(discoveryYAML))
	if err != nil {
		t.Fatal(err)
	}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return c
}

func TestDiscoveryDefaultsAndEndpoint(t *testing.T) {
	c := discovered(t)
	m := &c.Models[0]
	if !m.Discovered() || m.Disaggregated() {
		t.Fatalf("Discovered %v Disaggregated %v, want true false", m.Discovered(), m.Disaggregated())
	}
	k := m.Discovery.Kubernetes
	if k.Scheme != "http" || k.Endpoint.Role != "both" || k.Endpoint.DataParallelSize != 1 ||
		k.Endpoint.Signals.ScrapeInterval != m.Signals.ScrapeInterval || k.Endpoint.Signals.Flavor != "auto" {
		t.Errorf("defaults: got %+v", k)
	}
	e := k.EndpointOf(DiscoveredEngine{ID: "vllm-0", Host: "10.0.0.7", Port: 8000, Zone: "us-a", Node: "n1"})
	if e.ID != "vllm-0" || e.URL != "http://10.0.0.7:8000" || e.Weight != 2 || e.Role != "both" {
		t.Errorf("endpoint: got %+v", e)
	}
	if e.Labels["zone"] != "pinned" || e.Labels["node"] != "n1" || e.Labels["gpu"] != "h100" {
		t.Errorf("labels: got %v, want the template's zone over the discovered one, the node, gpu", e.Labels)
	}
	if e.KVEvents.Address != "tcp://10.0.0.7:5557" || e.KVEvents.ReplayAddress != "tcp://10.0.0.7:5657" {
		t.Errorf("kv_events: got %+v", e.KVEvents)
	}
	e = k.EndpointOf(DiscoveredEngine{ID: "[fd00::1]:8000", Host: "fd00::1", Port: 8000})
	if e.URL != "http://[fd00::1]:8000" || e.KVEvents.Address != "tcp://[fd00::1]:5557" {
		t.Errorf("IPv6: got %s %s", e.URL, e.KVEvents.Address)
	}
	k.Endpoint.Adapters = []string{"sql"}
	if e := k.EndpointOf(DiscoveredEngine{ID: "vllm-1", Host: "10.0.0.8", Port: 8000}); len(e.Adapters) != 1 || e.Adapters[0] != "sql" {
		t.Errorf("adapters: got %q, want the template's [sql]", e.Adapters)
	}
	k.Endpoint.Labels["gpu"] = "a100"
	if e.Labels["gpu"] != "h100" {
		t.Error("EndpointOf shares the template's labels map")
	}
}

// pdSource is a valid Kubernetes source of c's discovered model: Service
// svc in namespace inference, endpoint role role, defaults applied.
func pdSource(c *Config, svc, role string) *Kubernetes {
	k := &Kubernetes{Service: svc, Namespace: "inference", Endpoint: EndpointTemplate{Role: role}}
	c.Models[0].applyKubernetesDefaults(k)
	return k
}

// TestDiscoveryPDSources: a prefill Service and a decode Service, each
// with its own template, make a disaggregated model whose sources come in
// order with their config paths.
func TestDiscoveryPDSources(t *testing.T) {
	c, err := Parse([]byte(`
models:
  - name: llama
    discovery:
      kubernetes:
        service: llama-prefill
        endpoint: {role: prefill, labels: {bootstrap_port: "8998"}}
      sources:
        - kubernetes:
            service: llama-decode
            endpoint: {role: decode}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := &c.Models[0]
	if !m.Discovered() || !m.Disaggregated() {
		t.Fatalf("Discovered %v Disaggregated %v, want true true", m.Discovered(), m.Disaggregated())
	}
	srcs, paths := m.Discovery.KubernetesSources()
	if len(srcs) != 2 || srcs[0].Service != "llama-prefill" || srcs[1].Service != "llama-decode" ||
		paths[0] != "kubernetes" || paths[1] != "sources[0].kubernetes" {
		t.Fatalf("sources: got %v at %v", srcs, paths)
	}
	if srcs[1].Scheme != "http" || srcs[1].Endpoint.Weight != 1 || srcs[1].Endpoint.Signals.Flavor != "auto" {
		t.Errorf("the second source's defaults: got %+v", srcs[1])
	}
	e := srcs[1].EndpointOf(DiscoveredEngine{ID: "llama-decode-0", Host: "10.0.0.9", Port: 8000})
	if e.Role != "decode" {
		t.Errorf("a decode Service's engine: role %q, want decode", e.Role)
	}
}

func TestDiscoveryValidation(t *testing.T) {
	k := func(c *Config) *Kubernetes { return c.Models[0].Discovery.Kubernetes }
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"both static and discovery", func(c *Config) { c.Models[0].Endpoints = []Endpoint{{URL: "http://127.0.0.1:8001"}} },
			`models[0].discovery: is set with endpoints: a model's endpoints are listed or discovered, not both`},
		{"no source", func(c *Config) { c.Models[0].Discovery.Kubernetes = nil },
			`models[0].discovery.kubernetes: is required unless sources lists a source`},
		{"empty source", func(c *Config) { c.Models[0].Discovery.Sources = []Source{{}} },
			`models[0].discovery.sources[0].kubernetes: is required`},
		{"second source checked", func(c *Config) {
			c.Models[0].Discovery.Sources = []Source{{Kubernetes: &Kubernetes{Service: "d", Scheme: "ftp"}}}
		},
			`models[0].discovery.sources[0].kubernetes.scheme: "ftp" is not one of http, https`},
		{"same Service twice", func(c *Config) {
			c.Models[0].Discovery.Sources = []Source{{Kubernetes: pdSource(c, "vllm-llama", "decode")}}
		}, `models[0].discovery.sources[0].kubernetes.service: "vllm-llama" is the Service of models[0].discovery.kubernetes again; list each Service once`},
		{"prefill only", func(c *Config) { k(c).Endpoint.Role = "prefill" },
			`models[0].discovery: every source's endpoint role is prefill: at least one needs role both or decode to generate tokens`},
		{"missing service", func(c *Config) { k(c).Service = "" }, `models[0].discovery.kubernetes.service: is required`},
		{"bad service", func(c *Config) { k(c).Service = "Vllm_llama" },
			`models[0].discovery.kubernetes.service: "Vllm_llama" is not a Service name (a DNS-1035 label)`},
		{"bad namespace", func(c *Config) { k(c).Namespace = "a/b" },
			`models[0].discovery.kubernetes.namespace: "a/b" is not a namespace name (a DNS-1123 label)`},
		{"port number out of range", func(c *Config) { k(c).Port = "70000" },
			`models[0].discovery.kubernetes.port: 70000 is not a port number (1-65535)`},
		{"port zero", func(c *Config) { k(c).Port = "0" }, `models[0].discovery.kubernetes.port: 0 is not a port number (1-65535)`},
		{"bad port name", func(c *Config) { k(c).Port = "HTTP_port" },
			`models[0].discovery.kubernetes.port: "HTTP_port" is neither a port number nor a port name`},
		{"scheme", func(c *Config) { k(c).Scheme = "grpc" }, `models[0].discovery.kubernetes.scheme: "grpc" is not one of http, https`},
		{"role", func(c *Config) { k(c).Endpoint.Role = "leader" },
			`models[0].discovery.kubernetes.endpoint.role: "leader" is not one of both, prefill, decode`},
		{"weight", func(c *Config) { k(c).Endpoint.Weight = -1 }, `models[0].discovery.kubernetes.endpoint.weight: -1 is not positive`},
		{"weight too large", func(c *Config) { k(c).Endpoint.Weight = 1 << 40 }, `models[0].discovery.kubernetes.endpoint.weight: 1099511627776 is above the largest weight, 1000000`},
		{"metrics url", func(c *Config) { k(c).Endpoint.Signals.MetricsURL = "http://x/metrics" },
			`models[0].discovery.kubernetes.endpoint.signals.metrics_url: is not allowed in a template: it would name one engine (use signals.metrics_path)`},
		{"kv events port", func(c *Config) { k(c).Endpoint.KVEvents.Port = 70000 },
			`models[0].discovery.kubernetes.endpoint.kv_events.port: 70000 is not a port number (1-65535)`},
		{"replay without port", func(c *Config) { k(c).Endpoint.KVEvents.Port = 0 },
			`models[0].discovery.kubernetes.endpoint.kv_events.port: is not set but other kv_events fields are`},
		{"kv events without tokenizer", func(c *Config) { c.Models[0].Precise = Precise{} },
			`models[0].discovery.kubernetes.endpoint.kv_events: needs models[0].precise.tokenizer: KV events are matched on token ids`},
		{"replay port is the port", func(c *Config) { k(c).Endpoint.KVEvents.ReplayPort = 5557 },
			`models[0].discovery.kubernetes.endpoint.kv_events.replay_port: 5557 is kv_events.port again: the engine's replay socket (vLLM's replay_endpoint, a ROUTER) and its event socket (PUB) are two sockets on two ports`},
		{"dp replay overlap", func(c *Config) { k(c).Endpoint.DataParallelSize = 4; k(c).Endpoint.KVEvents.ReplayPort = 5559 },
			`models[0].discovery.kubernetes.endpoint.kv_events.replay_port: 5559 overlaps the event ports of the 4 ranks from 5557`},
		{"dp with sglang metrics", func(c *Config) { k(c).Endpoint.DataParallelSize = 2; k(c).Endpoint.Signals.Flavor = "sglang" },
			`models[0].discovery.kubernetes.endpoint.data_parallel_size: 2 needs vLLM metrics, whose engine label tells the ranks apart; signals.flavor "sglang" has no such label (use auto, vllm or vllm-legacy, or set signals.disabled to route on router-local counts)`},
		{"dp with the model's llamacpp metrics", func(c *Config) {
			c.Models[0].Signals.Flavor = "llamacpp"
			k(c).Endpoint.Signals.Flavor = "llamacpp"
			k(c).Endpoint.DataParallelSize = 2
		},
			`models[0].discovery.kubernetes.endpoint.data_parallel_size: 2 needs vLLM metrics, whose engine label tells the ranks apart; signals.flavor "llamacpp" has no such label (use auto, vllm or vllm-legacy, or set signals.disabled to route on router-local counts)`},
		{"scrape slower than stale", func(c *Config) { k(c).Endpoint.Signals.ScrapeInterval = 2 * time.Second },
			`models[0].discovery.kubernetes.endpoint.signals.scrape_interval: 2s is not shorter than signals.stale_after (1s): each scrape would go stale before the next; shorten the interval or raise stale_after`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := discovered(t)
			tc.mutate(&c)
			err := c.Validate()
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("Validate: got %v, want config.Errors with %q", err, tc.want)
			}
			for _, e := range es {
				if e.Error() == tc.want {
					return
				}
			}
			t.Errorf("Validate:\n got %v\nwant an error %q", err, tc.want)
		})
	}
}

// TestDiscoveryScrapeIntervalStale: a template's scrape_interval at or
// past signals.stale_after is refused as an endpoint's is, once (a
// template that inherits the model's is reported for the model), and not
// with scraping off.
func TestDiscoveryScrapeIntervalStale(t *testing.T) {
	c := discovered(t)
	c.Models[0].Signals.ScrapeInterval = 2 * time.Second
	c.Models[0].Discovery.Kubernetes.Endpoint.Signals.ScrapeInterval = 2 * time.Second
	var es Errors
	if err := c.Validate(); !errors.As(err, &es) || len(es) != 1 || es[0].Path != "models[0].signals.scrape_interval" {
		t.Errorf("Validate with the model's interval past stale_after: got %v, want one error for models[0].signals.scrape_interval", err)
	}
	c = discovered(t)
	c.Models[0].Discovery.Kubernetes.Endpoint.Signals.ScrapeInterval = 2 * time.Second
	c.Models[0].Discovery.Kubernetes.Endpoint.Signals.Disabled = true
	if err := c.Validate(); err != nil {
		t.Errorf("Validate with the template's scraping off: got %v, want nil", err)
	}
	c.Models[0].Discovery.Kubernetes.Endpoint.Signals.Disabled = false
	c.Models[0].Signals.Disabled = true
	if err := c.Validate(); err != nil {
		t.Errorf("Validate with the model's scraping off: got %v, want nil", err)
	}
}

// TestStaticModelStillNeedsEndpoints: without discovery, endpoints: [] is
// still an error.
func TestStaticModelStillNeedsEndpoints(t *testing.T) {
	_, err := Parse([]byte("models:\n  - name: llama\n    endpoints: []\n"))
	if err == nil || !strings.Contains(err.Error(), "models[0].endpoints: at least one endpoint is required") {
		t.Errorf("Validate: got %v, want models[0].endpoints: at least one endpoint is required", err)
	}
}

// TestExampleDiscovery: the commented discovery example of
// kvroute.example.yaml parses, validates and names every field.
func TestExampleDiscovery(t *testing.T) {
	b, err := os.ReadFile("../kvroute.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "# BEGIN discovery example\n")
	block, _, ok2 := strings.Cut(rest, "  # END discovery example")
	if !ok || !ok2 {
		t.Fatal("kvroute.example.yaml has no BEGIN/END discovery example")
	}
	var y strings.Builder
	y.WriteString("models:\n")
	for _, l := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
		u, found := strings.CutPrefix(l, "  # ")
		if !found {
			t.Fatalf("line %q of the example is not commented as \"  # \"", l)
		}
		y.WriteString("  " + u + "\n")
	}
	c, err := Parse([]byte(y.String()))
	if err != nil {
		t.Fatalf("Parse of the example:\n%s\n%v", y.String(), err)
	}
	if k := c.Models[0].Discovery.Kubernetes; k.Service != "vllm-llama" || k.Port != "http" {
		t.Errorf("got %+v", k)
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[Discovery](), reflect.TypeFor[Source](), reflect.TypeFor[Kubernetes](), reflect.TypeFor[EndpointTemplate](),
		reflect.TypeFor[KVEventPorts](), reflect.TypeFor[EndpointSignals]()} {
		for i := range typ.NumField() {
			if name, _, _ := strings.Cut(typ.Field(i).Tag.Get("yaml"), ","); !strings.Contains(block, " "+name+":") {
				t.Errorf("the discovery example lacks %s.%s", typ.Name(), name)
			}
		}
	}
}

// TestDiscoveryPortNames: discovery.kubernetes.port names an EndpointSlice
// port, whose name is its Service port's: a DNS-1123 label of up to 63
// characters (not a container port's IANA service name of up to 15).
func TestDiscoveryPortNames(t *testing.T) {
	long := "openai-compatible-http-" + strings.Repeat("x", 40) // 63 characters
	for _, port := range []string{"http", "vllm-openai-api-http", long} {
		c := discovered(t)
		c.Models[0].Discovery.Kubernetes.Port = port
		if err := c.Validate(); err != nil {
			t.Errorf("port %q (%d characters): got %v, want valid", port, len(port), err)
		}
	}
	for _, port := range []string{long + "x", "-http", "http-", "Http", "8000 "} {
		c := discovered(t)
		c.Models[0].Discovery.Kubernetes.Port = port
		want := `models[0].discovery.kubernetes.port: "` + port + `" is neither a port number nor a port name`
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("port %q: got %v, want %s", port, err, want)
		}
	}
}

// TestDiscoveryPortNumberForm: a port number written otherwise than as its
// digits would match no slice's port (the discovery compares the texts):
// it is refused at load, not skipped slice after slice at run time.
func TestDiscoveryPortNumberForm(t *testing.T) {
	for _, port := range []string{"+80", "080"} {
		c := discovered(t)
		c.Models[0].Discovery.Kubernetes.Port = port
		want := `models[0].discovery.kubernetes.port: "` + port + `": write the port number as 80`
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("port %q: got %v, want %s", port, err, want)
		}
	}
}

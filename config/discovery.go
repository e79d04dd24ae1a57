package config

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"

	"github.com/kvroute/kvroute"
)

// Discovery finds a model's endpoints at run time instead of listing them
// (Model.Endpoints): the pool follows the engines as they come and go. The
// endpoint list of a model with discovery belongs to it: a reload does not
// change it, and a change of the discovery block itself needs a restart.
//
// A model may have several sources, each with its own endpoint template:
// its pool is the union of their engines. A prefill/decode model has two,
// its prefill Service (endpoint role prefill) and its decode Service (role
// decode), which grow and shrink separately.
type Discovery struct {
	// Kubernetes discovers the ready endpoints of a Service from its
	// EndpointSlices. Required unless Sources lists a source.
	Kubernetes *Kubernetes `yaml:"kubernetes"`
	// Sources are more sources whose engines join the pool, after
	// Kubernetes's (if set); default none. An engine's ID is its pod's
	// name; <namespace>/<pod> when the sources watch more than one
	// namespace; <cluster>/<namespace>/<pod> when they use more than one
	// kubeconfig, the cluster named after its kubeconfig file (base name
	// without extension; "" is "local").
	Sources []Source `yaml:"sources"`
}

// Source is one of Discovery.Sources.
type Source struct {
	// Kubernetes discovers the ready endpoints of a Service. Required.
	Kubernetes *Kubernetes `yaml:"kubernetes"`
}

// KubernetesSources returns the discovery's sources in order
// (Discovery.Kubernetes first, then Sources), each with its config path
// below the discovery block ("kubernetes", "sources[1].kubernetes");
// nil for a nil Discovery. Sources left nil (invalid) are skipped.
func (d *Discovery) KubernetesSources() (srcs []*Kubernetes, paths []string) {
	if d == nil {
		return nil, nil
	}
	if d.Kubernetes != nil {
		srcs, paths = append(srcs, d.Kubernetes), append(paths, "kubernetes")
	}
	for i, s := range d.Sources {
		if s.Kubernetes != nil {
			srcs, paths = append(srcs, s.Kubernetes), append(paths, fmt.Sprintf("sources[%d].kubernetes", i))
		}
	}
	return srcs, paths
}

// Kubernetes discovers a model's engines from the EndpointSlices of a
// Kubernetes Service (those labelled kubernetes.io/service-name=<service>),
// watched with an informer. Every ready endpoint (conditions.ready and
// conditions.serving, not terminating: a Service with
// publishNotReadyAddresses says ready for every pod, and only serving
// tells one still loading) is an engine: its ID is the endpoint's
// targetRef name (the pod's name), else IP:port; it gets the labels zone
// and node from the endpoint's zone and nodeName, under Endpoint.Labels. A dual-stack
// Service lists each backend in an IPv4 and an IPv6 slice: it is one
// engine, at its IPv4 address, when its endpoints have a targetRef (the
// same pod) or, without one, a hostname (each IPv6 endpoint pairs with an
// IPv4 one of the same hostname). Endpoints with neither are keyed by
// IP:port: nothing tells that two addresses are one backend's, so such a
// backend listed in both families is two engines (twice its share), and
// the router logs a warning once.
type Kubernetes struct {
	// Service is the Service whose EndpointSlices are watched. Required.
	Service string `yaml:"service"`
	// Namespace is the Service's namespace; default "": the router pod's
	// own namespace when it runs in a cluster, else the kubeconfig's
	// current context's (as kubectl), else "default".
	Namespace string `yaml:"namespace"`
	// Port is the EndpointSlice port the engines serve HTTP on, by name
	// (e.g. "http") or number; default "": the slice's only port (a slice
	// with several is skipped and the error logged).
	Port string `yaml:"port"`
	// Scheme is the engines' URL scheme, http or https; default "http".
	Scheme string `yaml:"scheme"`
	// Kubeconfig is the kubeconfig file used to reach the API server;
	// default "": the in-cluster config (service account) when running in
	// a pod, else $KUBECONFIG or ~/.kube/config.
	Kubeconfig string `yaml:"kubeconfig"`
	// Endpoint is applied to every discovered engine.
	Endpoint EndpointTemplate `yaml:"endpoint"`
}

// EndpointTemplate is what a discovered engine's endpoint has besides its
// address: the fields of Endpoint that do not name the engine, with
// KV-event ports instead of addresses.
type EndpointTemplate struct {
	// Role is both, prefill or decode; default both. A model whose
	// sources' roles include prefill or decode is disaggregated (see
	// Model.PD): e.g. one source of role prefill and one of role decode.
	Role string `yaml:"role"`
	// Weight scales each engine's share of the load as an endpoint's
	// Weight does (which policies honour it is said there); 1 to
	// 1,000,000, default 1.
	Weight int `yaml:"weight,omitempty" zero:"to send an endpoint nothing, remove it"`
	// Labels are added to each engine's, over the discovered zone and node;
	// default none.
	Labels map[string]string `yaml:"labels"`
	// KVCapacityTokens is each engine's KV capacity in tokens; default 0:
	// learnt from the engine's metrics (llama.cpp: see
	// Endpoint.KVCapacityTokens).
	KVCapacityTokens int `yaml:"kv_capacity_tokens"`
	// Signals overrides the model's signals settings for each engine, as
	// Endpoint.Signals does; metrics_url is not allowed (it would name one
	// engine).
	Signals EndpointSignals `yaml:"signals"`
	// KVEvents are the ports each engine publishes its KV-cache events on,
	// dialled at tcp://<endpoint IP>:<port>; default none.
	KVEvents KVEventPorts `yaml:"kv_events"`
	// DataParallelSize is each engine's data-parallel ranks behind its URL,
	// as Endpoint.DataParallelSize; default 1.
	DataParallelSize int `yaml:"data_parallel_size,omitempty" zero:"an engine has at least one rank: leave it out, or write 1"`
	// Adapters are the model's LoRA adapters each engine serves, as
	// Endpoint.Adapters (a Service whose pods serve only some); default
	// none: every adapter of the model.
	Adapters []string `yaml:"adapters"`
}

// KVEventPorts are a discovered engine's KV-event ports.
type KVEventPorts struct {
	// Port is the ZMQ PUB port; default 0: no events.
	Port int `yaml:"port"`
	// ReplayPort is the ZMQ ROUTER replay port; default 0: none.
	ReplayPort int `yaml:"replay_port"`
	// Topic is the ZMQ topic subscribed to; default "" (all).
	Topic string `yaml:"topic"`
	// ReplayBufferSteps is as KVEvents.ReplayBufferSteps; default 0:
	// 10000.
	ReplayBufferSteps int `yaml:"replay_buffer_steps"`
}

// DefaultDiscoveryScheme is discovery.kubernetes.scheme's default.
const DefaultDiscoveryScheme = "http"

// Discovered reports whether the model's endpoints are discovered.
func (m *Model) Discovered() bool { return m.Discovery != nil }

// DiscoveredEngine is one ready engine a discovery found.
type DiscoveredEngine struct {
	// ID names it: the pod's name, else host:port.
	ID string
	// Host is its IP address, Port its HTTP port.
	Host string
	Port int
	// Zone and Node are where it runs, "" when unknown.
	Zone, Node string
}

// EndpointOf returns the endpoint of a discovered engine: the template (with
// defaults applied) at its address.
func (k *Kubernetes) EndpointOf(d DiscoveredEngine) Endpoint {
	t := &k.Endpoint
	labels := make(map[string]string, len(t.Labels)+2)
	if d.Zone != "" {
		labels["zone"] = d.Zone
	}
	if d.Node != "" {
		labels["node"] = d.Node
	}
	for key, v := range t.Labels {
		labels[key] = v // the template's win
	}
	e := Endpoint{
		ID:               d.ID,
		URL:              k.Scheme + "://" + net.JoinHostPort(d.Host, strconv.Itoa(d.Port)),
		Role:             t.Role,
		Weight:           t.Weight,
		Labels:           labels,
		KVCapacityTokens: t.KVCapacityTokens,
		Signals:          t.Signals,
		DataParallelSize: t.DataParallelSize,
		Adapters:         slices.Clone(t.Adapters),
	}
	if t.KVEvents.Port > 0 {
		e.KVEvents = KVEvents{Address: "tcp://" + net.JoinHostPort(d.Host, strconv.Itoa(t.KVEvents.Port)), Topic: t.KVEvents.Topic,
			ReplayBufferSteps: t.KVEvents.ReplayBufferSteps}
		if t.KVEvents.ReplayPort > 0 {
			e.KVEvents.ReplayAddress = "tcp://" + net.JoinHostPort(d.Host, strconv.Itoa(t.KVEvents.ReplayPort))
		}
	}
	return e
}

// applyDiscoveryDefaults fills the discovery's defaults, after the
// model's signals defaults.
func (m *Model) applyDiscoveryDefaults() {
	srcs, _ := m.Discovery.KubernetesSources()
	for _, k := range srcs {
		m.applyKubernetesDefaults(k)
	}
}

func (m *Model) applyKubernetesDefaults(k *Kubernetes) {
	setDefault(&k.Scheme, DefaultDiscoveryScheme)
	t := &k.Endpoint
	setDefault(&t.Role, kvroute.RoleBoth.String())
	setDefault(&t.Weight, 1)
	setDefault(&t.DataParallelSize, 1)
	setDefault(&t.Signals.ScrapeInterval, m.Signals.ScrapeInterval)
	setDefault(&t.Signals.ScrapeTimeout, m.Signals.ScrapeTimeout)
	setDefault(&t.Signals.Flavor, m.Signals.Flavor)
}

var (
	dns1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// validateDiscovery checks the discovery block of model p.
func (m *Model) validateDiscovery(v *validator, p string) {
	if m.Discovery == nil {
		return
	}
	mp := p
	p += ".discovery"
	if len(m.Endpoints) > 0 {
		v.addf(p, "is set with endpoints: a model's endpoints are listed or discovered, not both")
	}
	d := m.Discovery
	if d.Kubernetes == nil && len(d.Sources) == 0 {
		v.addf(p+".kubernetes", "is required unless sources lists a source")
		return
	}
	for i, s := range d.Sources {
		if s.Kubernetes == nil {
			v.addf(fmt.Sprintf("%s.sources[%d].kubernetes", p, i), "is required")
		}
	}
	srcs, paths := d.KubernetesSources()
	services := map[string]string{} // kubeconfig, namespace and Service -> first source's path
	decoders := 0
	for i, k := range srcs {
		sp := p + "." + paths[i]
		m.validateKubernetes(v, mp, sp, k)
		key := k.Kubeconfig + "\x00" + k.Namespace + "\x00" + k.Service
		if first, dup := services[key]; dup && k.Service != "" {
			v.addf(sp+".service", "%q is the Service of %s again; list each Service once", k.Service, first)
		} else {
			services[key] = sp
		}
		r, err := kvroute.ParseRole(k.Endpoint.Role)
		if err != nil || r.CanDecode() {
			decoders++ // (an invalid role is reported for its source)
		}
	}
	if len(srcs) > 0 && decoders == 0 {
		v.addf(p, "every source's endpoint role is prefill: at least one needs role both or decode to generate tokens")
	}
}

// validateKubernetes checks Kubernetes source k, at config path p, of the
// model at path mp.
func (m *Model) validateKubernetes(v *validator, mp, p string, k *Kubernetes) {
	switch {
	case k.Service == "":
		v.addf(p+".service", "is required")
	case len(k.Service) > 63 || !dns1035Label.MatchString(k.Service):
		v.addf(p+".service", "%q is not a Service name (a DNS-1035 label)", k.Service)
	}
	if k.Namespace != "" && (len(k.Namespace) > 63 || !dns1123Label.MatchString(k.Namespace)) {
		v.addf(p+".namespace", "%q is not a namespace name (a DNS-1123 label)", k.Namespace)
	}
	if k.Port != "" {
		switch n, err := strconv.Atoi(k.Port); {
		case err == nil && strconv.Itoa(n) != k.Port: // the discovery compares it with a slice's port as text
			v.addf(p+".port", "%q: write the port number as %d", k.Port, n)
		case err == nil && (n < 1 || n > 65535):
			v.addf(p+".port", "%d is not a port number (1-65535)", n)
		case err != nil && (len(k.Port) > 63 || !dns1123Label.MatchString(k.Port)): // an EndpointSlice port's name is its Service port's
			v.addf(p+".port", "%q is neither a port number nor a port name", k.Port)
		}
	}
	if k.Scheme != "http" && k.Scheme != "https" {
		v.addf(p+".scheme", "%q is not one of http, https", k.Scheme)
	}
	t := &k.Endpoint
	ep := p + ".endpoint"
	if _, err := kvroute.ParseRole(t.Role); err != nil {
		v.addf(ep+".role", "%q is not one of both, prefill, decode", t.Role)
	}
	v.weight(ep+".weight", t.Weight)
	m.checkEndpointAdapters(v, ep, t.Adapters)
	if t.KVCapacityTokens < 0 {
		v.addf(ep+".kv_capacity_tokens", "%d is negative", t.KVCapacityTokens)
	}
	if n := t.DataParallelSize; n < 1 || n > MaxDataParallelSize {
		v.addf(ep+".data_parallel_size", "%d is not in 1-%d", n, MaxDataParallelSize)
	} else if n > 1 && validFlavor(t.Signals.Flavor) {
		m.checkRankMetrics(v, ep+".data_parallel_size", n, t.Signals)
	}
	es := t.Signals
	v.interval(ep+".signals.scrape_interval", es.ScrapeInterval)
	if es.ScrapeInterval != m.Signals.ScrapeInterval && !es.Disabled && !m.Signals.Disabled { // (the model's is reported for the model)
		v.fresh(ep+".signals.scrape_interval", es.ScrapeInterval, m.Signals.StaleAfter)
	}
	v.positiveDuration(ep+".signals.scrape_timeout", es.ScrapeTimeout)
	v.flavor(ep+".signals.flavor", es.Flavor)
	if es.MetricsURL != "" {
		v.addf(ep+".signals.metrics_url", "is not allowed in a template: it would name one engine (use signals.metrics_path)")
	}
	ev := t.KVEvents
	for _, f := range []struct {
		name string
		port int
	}{{"port", ev.Port}, {"replay_port", ev.ReplayPort}} {
		if f.port < 0 || f.port > 65535 {
			v.addf(ep+".kv_events."+f.name, "%d is not a port number (1-65535)", f.port)
		}
	}
	switch {
	case ev.ReplayBufferSteps < 0:
		v.addf(ep+".kv_events.replay_buffer_steps", "%d is negative", ev.ReplayBufferSteps)
	case ev.Port == 0 && (ev.ReplayPort != 0 || ev.Topic != "" || ev.ReplayBufferSteps != 0):
		v.addf(ep+".kv_events.port", "is not set but other kv_events fields are")
	case ev.Port != 0 && !m.Precise.Enabled():
		v.addf(ep+".kv_events", "needs %s.precise.tokenizer: KV events are matched on token ids", mp)
	case t.DataParallelSize > 1 && ev.Port > 0 && max(ev.Port, ev.ReplayPort)+t.DataParallelSize-1 > 65535:
		v.addf(ep+".kv_events.port", "%d + data-parallel ranks is above 65535", ev.Port)
	case t.DataParallelSize > 1 && ev.ReplayPort > 0 && ev.ReplayPort < ev.Port+t.DataParallelSize && ev.Port < ev.ReplayPort+t.DataParallelSize:
		v.addf(ep+".kv_events.replay_port", "%d overlaps the event ports of the %d ranks from %d", ev.ReplayPort, t.DataParallelSize, ev.Port)
	case ev.Port > 0 && ev.ReplayPort == ev.Port:
		v.addf(ep+".kv_events.replay_port", "%d is kv_events.port again: the engine's replay socket (vLLM's replay_endpoint, a ROUTER) and its event socket (PUB) are two sockets on two ports", ev.ReplayPort)
	}
}

// String names the discovery source, for logs: kubernetes
// service namespace/name (namespace "" when defaulted at run time).
func (k *Kubernetes) String() string {
	return fmt.Sprintf("kubernetes service %s/%s", k.Namespace, k.Service)
}

package proxy

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// TestDiscoveryPD: a P/D model discovers its prefill engines from one
// Service and its decode engines from another, each with its own endpoint
// template; its pool takes the two lists together, and follows the decode
// Service as it grows and shrinks while the prefill side stays.
func TestDiscoveryPD(t *testing.T) {
	ps, pbodies := pdEngine(t, kvroute.RolePrefill, "nixl")
	d0, d0bodies := pdEngine(t, kvroute.RoleDecode, "nixl")
	d1, d1bodies := pdEngine(t, kvroute.RoleDecode, "nixl")
	source := func(svc, role string) *config.Kubernetes {
		return &config.Kubernetes{Service: svc, Namespace: "inference", Port: "http", Endpoint: config.EndpointTemplate{Role: role}}
	}
	cfg := withEndpoints(pdTestConfig("first", "nixl", "", ""))
	cfg.Models[0].Discovery = &config.Discovery{Kubernetes: source("llama-prefill", "prefill"),
		Sources: []config.Source{{Kubernetes: source("llama-decode", "decode")}}}
	cluster := newFakeCluster()
	ph, pp := hostPort(t, ps.URL)
	d0h, d0p := hostPort(t, d0.URL)
	d1h, d1p := hostPort(t, d1.URL)
	cluster.put(t, slice("llama-prefill-a", "llama-prefill", "http", pp, readyEndpoint("prefill-0", ph)))
	sd0 := slice("llama-decode-a", "llama-decode", "http", d0p, readyEndpoint("decode-0", d0h))
	cluster.put(t, sd0)
	tp := discoveryProxy(t, cfg, cluster)
	if tp.pools["tiny"].pd == nil {
		t.Fatal("the discovered model is not served as P/D")
	}
	pool := func() []string {
		var out []string
		for _, e := range tp.Router("tiny").Endpoints() {
			out = append(out, e.ID+" "+e.Role.String())
		}
		return out
	}
	waitFor(t, "the prefill and decode engines discovered", func() bool {
		return slices.Equal(pool(), []string{"prefill-0 prefill", "decode-0 decode"})
	})
	waitFor(t, "both sources' informers watching", func() bool { return cluster.watches.Load() >= 2 })
	tp.postOK(t, 1, PathCompletions, pdPrompt)
	if np, nd := len(pbodies()), decodeLegs(d0bodies()); np != 1 || nd != 1 {
		t.Fatalf("got %d prefill legs and %d decode legs on decode-0, want 1 and 1", np, nd)
	}

	// The decode Service grows: its new engine takes decode legs.
	cluster.put(t, slice("llama-decode-b", "llama-decode", "http", d1p, readyEndpoint("decode-1", d1h)))
	waitFor(t, "decode-1 discovered", func() bool {
		return slices.Equal(pool(), []string{"prefill-0 prefill", "decode-0 decode", "decode-1 decode"})
	})
	tp.postOK(t, 4, PathCompletions, pdPrompt)
	if n := decodeLegs(d1bodies()); n == 0 {
		t.Error("the decode engine added to the decode Service got no decode leg")
	}
	if got := tp.metric(t, tp.disc.endpoints, "tiny"); got != 3 {
		t.Errorf("kvroute_discovery_endpoints: got %v, want 3", got)
	}

	// It shrinks: decode-0 takes no more legs; the prefill side is as it was.
	cluster.remove(t, sd0)
	waitFor(t, "decode-0 gone", func() bool {
		return slices.Equal(pool(), []string{"prefill-0 prefill", "decode-1 decode"})
	})
	n0 := decodeLegs(d0bodies())
	tp.postOK(t, 2, PathCompletions, pdPrompt)
	if n := decodeLegs(d0bodies()); n != n0 {
		t.Errorf("decode-0 got %d decode legs after it left the Service", n-n0)
	}
}

// TestDiscoverySourcesInTwoNamespaces: a prefill and a decode
// StatefulSet of one name in two namespaces both have a pod vllm-0; they
// are two engines. A model whose sources watch several namespaces names
// its engines <namespace>/<pod>, so both join and requests are served.
func TestDiscoverySourcesInTwoNamespaces(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	source := func(ns, role string) *config.Kubernetes {
		return &config.Kubernetes{Service: "vllm", Namespace: ns, Port: "http", Endpoint: config.EndpointTemplate{Role: role}}
	}
	cfg := withEndpoints(pdTestConfig("first", "nixl", "", ""))
	cfg.Models[0].Discovery = &config.Discovery{Sources: []config.Source{
		{Kubernetes: source("prefill-ns", "prefill")}, {Kubernetes: source("decode-ns", "decode")}}}
	cluster := newFakeCluster()
	ph, pp := hostPort(t, ps.URL)
	dh, dp := hostPort(t, ds.URL)
	sp := slice("vllm-a", "vllm", "http", pp, readyEndpoint("vllm-0", ph))
	sp.Namespace = "prefill-ns"
	sd := slice("vllm-b", "vllm", "http", dp, readyEndpoint("vllm-0", dh))
	sd.Namespace = "decode-ns"
	cluster.put(t, sp)
	cluster.put(t, sd)
	tp := discoveryProxy(t, cfg, cluster)
	waitFor(t, "both vllm-0 pods discovered", func() bool {
		var pool []string
		for _, e := range tp.Router("tiny").Endpoints() {
			pool = append(pool, e.ID+" "+e.URL+" "+e.Role.String())
		}
		return slices.Equal(pool, []string{"prefill-ns/vllm-0 " + ps.URL + " prefill", "decode-ns/vllm-0 " + ds.URL + " decode"})
	})
	tp.postOK(t, 2, PathCompletions, pdPrompt)
}

package proxy

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// TestDiscoverySourcesInTwoClusters: a P/D model discovers its prefill
// engines in one cluster and its decode engines in another (two
// kubeconfigs), each a StatefulSet vllm in a namespace inference: both
// have a pod vllm-0, and they are two engines. A model whose sources use
// several kubeconfigs names its engines <cluster>/<namespace>/<pod>, the
// cluster named after its kubeconfig file, so both join and requests are
// served (rather than the decode vllm-0 being dropped as listed by two
// sources, leaving the pool without a decode engine).
func TestDiscoverySourcesInTwoClusters(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	source := func(kubeconfig, role string) *config.Kubernetes {
		return &config.Kubernetes{Service: "vllm", Namespace: "inference", Port: "http", Kubeconfig: kubeconfig,
			Endpoint: config.EndpointTemplate{Role: role}}
	}
	cfg := withEndpoints(pdTestConfig("first", "nixl", "", ""))
	cfg.Models[0].Discovery = &config.Discovery{Sources: []config.Source{
		{Kubernetes: source("/etc/kube/prefill-cluster.yaml", "prefill")}, {Kubernetes: source("/etc/kube/decode-cluster.yaml", "decode")}}}
	pc, dc := newFakeCluster(), newFakeCluster()
	ph, pp := hostPort(t, ps.URL)
	dh, dp := hostPort(t, ds.URL)
	pc.put(t, slice("vllm-a", "vllm", "http", pp, readyEndpoint("vllm-0", ph)))
	dc.put(t, slice("vllm-a", "vllm", "http", dp, readyEndpoint("vllm-0", dh)))
	kube := func(k *config.Kubernetes) (kubernetes.Interface, string, error) {
		if k.Kubeconfig == "/etc/kube/decode-cluster.yaml" {
			return dc.kubeClient(k)
		}
		return pc.kubeClient(k)
	}
	tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: testPickers, KubeClient: kube})
	tp.Proxy.debounce = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.Proxy.RunDiscovery(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := recv(t, "RunDiscovery to return", done); err != nil {
			t.Errorf("RunDiscovery: %v", err)
		}
	})
	pool := func() []string {
		var out []string
		for _, e := range tp.Router("tiny").Endpoints() {
			out = append(out, e.ID+" "+e.URL+" "+e.Role.String())
		}
		return out
	}
	want := []string{"prefill-cluster/inference/vllm-0 " + ps.URL + " prefill", "decode-cluster/inference/vllm-0 " + ds.URL + " decode"}
	got := pool()
	for deadline := time.Now().Add(5 * time.Second); !slices.Equal(got, want) && time.Now().Before(deadline); got = pool() {
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pool: got %q, want %q", got, want)
	}
	if got := tp.metric(t, tp.disc.errors, "tiny"); got != 0 {
		t.Errorf("kvroute_discovery_errors_total: got %v, want 0 (no engine listed by two sources)", got)
	}
	tp.postOK(t, 2, PathCompletions, pdPrompt)
}

// TestClusterNames: the kubeconfigs of a model's sources are named by
// their files' base names without extension, files that share one by as
// many parent directories as tell them apart, and numbered when even
// their whole paths do not.
func TestClusterNames(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kubeconfigs []string
		want        []string
	}{
		{"one kubeconfig", []string{"/etc/kube/a.yaml", "/etc/kube/./a.yaml"}, nil},
		{"all default", []string{"", ""}, nil},
		{"base names", []string{"/etc/kube/prefill.yaml", "/etc/kube/decode.kubeconfig", "/etc/kube/prefill.yaml"},
			[]string{"prefill", "decode", "prefill"}},
		{"the default config", []string{"", "/etc/kube/east"}, []string{"local", "east"}},
		{"shared base names", []string{"/etc/kube/east/config", "/etc/kube/west/config", "/home/me/.kube/west.yaml"},
			[]string{"east-config", "west-config", "west"}},
		{"one name shared with the default", []string{"/etc/kube/local", ""}, []string{"kube-local", "local"}},
		{"a hidden directory", []string{"/home/me/.kube/config", "/etc/kube/config"}, []string{"me-kube-config", "etc-kube-config"}},
		{"same path but for its root", []string{"kube/config", "/kube/config"}, []string{"kube-config", "kube-config-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clusterNames(tc.kubeconfigs); !slices.Equal(got, tc.want) {
				t.Errorf("clusterNames(%q): got %q, want %q", tc.kubeconfigs, got, tc.want)
			}
		})
	}
}

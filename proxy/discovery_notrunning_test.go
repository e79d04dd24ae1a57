package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	clienttesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// pdDiscoveryConfig is pdTestConfig ("tiny") discovering its prefill
// engines from Service llama-prefill and its decode engines from
// llama-decode, both in namespace inference; decode configures the decode
// source further.
func pdDiscoveryConfig(decode func(k *config.Kubernetes)) config.Config {
	source := func(svc, role string) *config.Kubernetes {
		return &config.Kubernetes{Service: svc, Namespace: "inference", Port: "http", Endpoint: config.EndpointTemplate{Role: role}}
	}
	cfg := withEndpoints(pdTestConfig("first", "nixl", "", ""))
	cfg.Debug.Enabled = true
	d := source("llama-decode", "decode")
	decode(d)
	cfg.Models[0].Discovery = &config.Discovery{Kubernetes: source("llama-prefill", "prefill"),
		Sources: []config.Source{{Kubernetes: d}}}
	return cfg
}

// TestDiscoverySourceCannotStartPD: a P/D model whose decode source
// cannot start (its kubeconfig cannot be loaded) stays without endpoints,
// its prefill source's included, whether the source fails before the
// sources' wait is over or after the prefill engines have joined: its
// requests are answered 503 discovery_not_running and /readyz names it
// under models_without_running_discovery. (The wait is for a source that
// runs but has not listed; one that cannot start will not list.) Without
// that, the prefill engines joined after the wait: a prefill-only pool
// answering every request no_healthy_endpoint while /readyz said ready.
func TestDiscoverySourceCannotStartPD(t *testing.T) {
	for _, tc := range []struct {
		name string
		late bool // the decode source fails after the prefill engines joined
	}{
		{name: "before the wait is over"},
		{name: "after the prefill engines joined", late: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
			cfg := pdDiscoveryConfig(func(k *config.Kubernetes) { k.Kubeconfig = "/nonexistent/kubeconfig" })
			cluster := newFakeCluster()
			ph, pp := hostPort(t, ps.URL)
			cluster.put(t, slice("llama-prefill-a", "llama-prefill", "http", pp, readyEndpoint("prefill-0", ph)))
			release := make(chan struct{})
			var once sync.Once
			kube := func(k *config.Kubernetes) (kubernetes.Interface, string, error) {
				if k.Kubeconfig == "" {
					return cluster.kubeClient(k)
				}
				if tc.late {
					<-release
				}
				return nil, "", errors.New("kubeconfig " + k.Kubeconfig + ": no such file or directory")
			}
			tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: testPickers, KubeClient: kube})
			p := tp.Proxy
			p.debounce, p.discWait = 10*time.Millisecond, 200*time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.RunDiscovery(ctx) }()
			t.Cleanup(func() {
				cancel()
				err := recv(t, "RunDiscovery to return", done)
				if want := "models[0].discovery.sources[0].kubernetes: kubeconfig"; err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("RunDiscovery: got %v, want an error naming %s", err, want)
				}
			})
			t.Cleanup(func() { once.Do(func() { close(release) }) }) // first, should the test end early
			d := p.pools["tiny"].disc
			settled := func() bool { // the wait is over and the prefill source has listed
				p.reloadMu.Lock()
				defer p.reloadMu.Unlock()
				return d.waited && d.listed[0] != nil
			}
			failed := func() bool { // and applied: fail holds reloadMu
				p.reloadMu.Lock()
				defer p.reloadMu.Unlock()
				return d.failed.Load() != nil
			}
			waitFor(t, "the prefill source's list and the end of the wait", settled)
			if tc.late {
				waitFor(t, "the prefill engine to join meanwhile", func() bool { return len(tp.Router("tiny").Endpoints()) == 1 })
				once.Do(func() { close(release) })
			}
			waitFor(t, "the decode source to fail", failed)
			if eps := tp.Router("tiny").Endpoints(); len(eps) != 0 {
				t.Errorf("pool: got %v, want no endpoints (a source of the model is not running)", eps)
			}
			if got := tp.metric(t, p.disc.endpoints, "tiny"); got != 0 {
				t.Errorf("kvroute_discovery_endpoints: got %v, want 0", got)
			}
			resp := tp.post(t, PathCompletions, pdPrompt)
			if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"discovery_not_running"`) ||
				!strings.Contains(body, "models[0].discovery.sources[0].kubernetes") {
				t.Errorf("request: got %d %s, want 503 discovery_not_running naming models[0].discovery.sources[0].kubernetes", resp.StatusCode, body)
			}
			if code, body := readyz(t, tp.srv.URL); code != http.StatusServiceUnavailable ||
				!strings.Contains(body, `"models_without_running_discovery":["tiny"]`) {
				t.Errorf("/readyz: got %d %s, want 503 naming tiny under models_without_running_discovery", code, body)
			}
		})
	}
}

// TestDiscoveryPDSourceNeverLists: a P/D model's decode source runs but
// is refused its list (no Role in its namespace). Its prefill engines join
// once the sources have had their wait, as any model's listed sources do;
// the model, with no decode engine, is not ready, and /readyz says what
// it lacks.
func TestDiscoveryPDSourceNeverLists(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	cfg := pdDiscoveryConfig(func(k *config.Kubernetes) { k.Namespace = "locked" })
	cluster := newFakeCluster()
	cluster.client.PrependReactor("list", "endpointslices", func(a clienttesting.Action) (bool, k8sruntime.Object, error) {
		if a.GetNamespace() == "locked" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", nil)
		}
		return false, nil, nil
	})
	ph, pp := hostPort(t, ps.URL)
	cluster.put(t, slice("llama-prefill-a", "llama-prefill", "http", pp, readyEndpoint("prefill-0", ph)))
	tp := discoveryProxy(t, cfg, cluster)
	waitFor(t, "the listed source's engine to join", func() bool {
		eps := tp.Router("tiny").Endpoints()
		return len(eps) == 1 && eps[0].ID == "inference/prefill-0"
	})
	code, body := readyz(t, tp.srv.URL)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"models_without_healthy_decode_endpoint":["tiny"]`) ||
		strings.Contains(body, "models_without_running_discovery") || strings.Contains(body, "models_without_healthy_endpoint") {
		t.Errorf("/readyz: got %d %s, want 503 naming tiny under models_without_healthy_decode_endpoint only", code, body)
	}
}

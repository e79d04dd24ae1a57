package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
)

// TestDiscoveryNotRunningIsSaid: a model whose discovery could not start
// (no cluster, no kubeconfig) will get no endpoints: its requests are told
// so (503 discovery_not_running, no Retry-After, which would say waiting
// helps) rather than "none discovered ready yet", and /readyz names it.
func TestDiscoveryNotRunningIsSaid(t *testing.T) {
	cfg := discoveryConfig("first")
	reg := prometheus.NewRegistry()
	p, err := New(Options{Config: cfg, NewPicker: testPickers, Registerer: reg, Gatherer: reg,
		KubeClient: func(*config.Kubernetes) (kubernetes.Interface, string, error) {
			return nil, "", errors.New("no configuration has been provided")
		}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	if err := p.RunDiscovery(context.Background()); err == nil || !strings.Contains(err.Error(), "models[0].discovery.kubernetes") {
		t.Fatalf("RunDiscovery: got %v, want the error naming models[0].discovery.kubernetes", err)
	}
	for _, path := range []string{PathCompletions, PathChatCompletions} {
		body := `{"model":"m","prompt":"hi"}`
		if path == PathChatCompletions {
			body = chatBody
		}
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out := readAll(t, resp)
		var e openai.ErrorResponse
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatalf("%s: body %s: %v", path, out, err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "discovery_not_running" ||
			!strings.Contains(e.Error.Message, `model "m" has no endpoints: its Kubernetes discovery`) ||
			!strings.Contains(e.Error.Message, "is not running") {
			t.Errorf("%s: got %d %s, want 503 discovery_not_running saying the discovery is not running", path, resp.StatusCode, out)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("%s: Retry-After: got %q, want none", path, ra)
		}
	}
	resp, err := http.Get(srv.URL + PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	out := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(out, `"models_without_running_discovery":["m"]`) ||
		!strings.Contains(out, `"models_without_healthy_endpoint":["m"]`) {
		t.Errorf("/readyz: got %d %s, want 503 naming m without running discovery", resp.StatusCode, out)
	}
}

// TestDiscoveryRunningSaysNoneYet: a discovery that runs but has found
// no ready engine keeps its answer (no_endpoints, with Retry-After), and
// /readyz does not call it not running.
func TestDiscoveryRunningSaysNoneYet(t *testing.T) {
	tp := discoveryProxy(t, discoveryConfig("first"), newFakeCluster())
	checkNoEndpoints(t, tp)
	resp, err := http.Get(tp.srv.URL + PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	if out := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(out, "discovery") {
		t.Errorf("/readyz: got %d %s, want 503 not naming the discovery", resp.StatusCode, out)
	}
}

package proxy

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
)

// TestReloadReportsEveryChangedEndpoint: a reload that changes only an
// endpoint's own signals settings (or its kv_events) changes the endpoint
// in place: its scrape restarts. The change and its log line named no
// endpoint (changed=[]), as if nothing had changed; they now name it.
func TestReloadReportsEveryChangedEndpoint(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	cfg := testConfig(policy.Default, a.URL, b.URL)
	cfg.Models[0].Endpoints[0].ID, cfg.Models[0].Endpoints[1].ID = "a", "b"
	tp := newTestProxyWith(t, cfg, policy.New)
	next := testConfig(policy.Default, a.URL, b.URL)
	next.Models[0].Endpoints[0].ID, next.Models[0].Endpoints[1].ID = "a", "b"
	next.Models[0].Endpoints[1].Signals.ScrapeInterval = 50 * time.Millisecond
	res, err := tp.Reload(reloadTo(next))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Models) != 1 || !slices.Equal(res.Models[0].Changed, []string{"b"}) || len(res.Models[0].Added)+len(res.Models[0].Removed) != 0 {
		t.Errorf("reload of b's scrape_interval: got %+v, want model m with b changed", res.Models)
	}
	if iv := tp.pools["m"].set.Load().model.Endpoints[1].Signals.ScrapeInterval; iv != 50*time.Millisecond {
		t.Errorf("b's scrape interval: got %v, want 50ms", iv)
	}
}

// TestDiscoveryEmptyListIsNoChange: a discovered pool has no endpoints
// until its discovery lists (nil), and a Service without a ready engine
// lists none (empty): that was a change, applied and logged at each start
// as "endpoints changed" naming nothing. It is no change.
func TestDiscoveryEmptyListIsNoChange(t *testing.T) {
	p, err := New(Options{Config: discoveryConfig("first"), NewPicker: testPickers, KubeClient: newFakeCluster().kubeClient})
	if err != nil {
		t.Fatal(err)
	}
	pl := p.pools["m"]
	p.reloadMu.Lock()
	pc, err := p.planEndpoints(pl, "models[0]", []config.Endpoint{})
	p.reloadMu.Unlock()
	if err != nil || pc != nil {
		t.Errorf("planEndpoints of no endpoints on a pool with none: got %+v, %v; want no change", pc, err)
	}
}

package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// TestReloadRoleChangeProbesAnew: an engine failing its health checks is
// out of rotation; a reload changes its role (prefill to decode) under the
// same ID and URL. The router takes it as another engine, which starts
// healthy, so its probe must start anew and take it out again; a probe
// kept from the old role had already reported it down and would never
// report again, leaving a failing engine in rotation.
func TestReloadRoleChangeProbesAnew(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable) // /health and everything else
	}))
	t.Cleanup(bad.Close)
	cfg := pdTestConfig("first", "nixl", ps.URL, ds.URL)
	cfg.HealthCheck = config.HealthCheck{Path: "/health", Interval: 20 * time.Millisecond, Timeout: 20 * time.Millisecond,
		UnhealthyThreshold: 1, HealthyThreshold: 1}
	cfg = withEndpoints(cfg, append(slices.Clone(cfg.Models[0].Endpoints), config.Endpoint{ID: "x", URL: bad.URL, Role: "prefill"})...)
	tp := newTestProxy(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunHealthChecks(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	xOut := func(role string) func() bool {
		return func() bool {
			for _, s := range tp.Router("tiny").Status(time.Now()) {
				if s.ID == "x" && s.Role == role {
					return !s.Healthy
				}
			}
			return false
		}
	}
	waitFor(t, "x (prefill) out of rotation by its failed checks", xOut("prefill"))

	next := withEndpoints(cfg, append(slices.Clone(cfg.Models[0].Endpoints[:2]), config.Endpoint{ID: "x", URL: bad.URL, Role: "decode"})...)
	if _, err := tp.Reload(reloadTo(next)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "x (now decode) out of rotation by its failed checks", xOut("decode"))
}

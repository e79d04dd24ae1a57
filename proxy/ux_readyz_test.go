package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// serveProxy serves a proxy of cfg with Serve (health checks, discovery
// and all) on a loopback port until the test ends, and returns its URL.
func serveProxy(t *testing.T, cfg config.Config) (*Proxy, string) {
	t.Helper()
	p, err := New(Options{Config: cfg, NewPicker: testPickers})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, stop, done := startServe(t, p)
	t.Cleanup(func() {
		stop()
		if err := recv(t, "Serve to return", done); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return p, "http://" + ln.Addr().String()
}

func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url + PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	return resp.StatusCode, body
}

// closedURL is the URL of a port nothing listens on.
func closedURL(t *testing.T) string {
	s := httptest.NewServer(http.NotFoundHandler())
	s.Close()
	return s.URL
}

// TestReadyzWaitsForHealthChecks: with active health checks, the router is
// not ready at start while no endpoint of a model has passed a check
// (every engine down: it would answer 502), and ready once one has. With
// them disabled, every endpoint counts at once, as before.
func TestReadyzWaitsForHealthChecks(t *testing.T) {
	t.Run("every engine down", func(t *testing.T) {
		cfg := testConfig("first", closedURL(t), closedURL(t))
		cfg.HealthCheck = config.HealthCheck{} // defaults: on, every 5s
		cfg.Models[0].Signals.Disabled = true
		_, url := serveProxy(t, cfg)
		if code, body := readyz(t, url); code != http.StatusServiceUnavailable || !strings.Contains(body, `"models_without_healthy_endpoint":["m"]`) {
			t.Errorf("at start: got %d %s, want 503 naming m", code, body)
		}
	})
	t.Run("a long interval", func(t *testing.T) {
		// The first check comes within firstProbeSpread of the start,
		// not up to an interval (10 minutes) later.
		a := newBackend(t, "a", okHandler("a"))
		cfg := testConfig("first", a.URL)
		cfg.HealthCheck = config.HealthCheck{Interval: 10 * time.Minute}
		cfg.Models[0].Signals.Disabled = true
		_, url := serveProxy(t, cfg)
		waitFor(t, "/readyz 200", func() bool { code, _ := readyz(t, url); return code == http.StatusOK })
	})
	t.Run("health checks disabled", func(t *testing.T) {
		cfg := testConfig("first", closedURL(t), closedURL(t))
		cfg.Models[0].Signals.Disabled = true
		_, url := serveProxy(t, cfg)
		if code, body := readyz(t, url); code != http.StatusOK {
			t.Errorf("at start: got %d %s, want 200 (nothing checks the endpoints)", code, body)
		}
	})
	t.Run("an engine up", func(t *testing.T) {
		a := newBackend(t, "a", okHandler("a"))
		cfg := testConfig("first", closedURL(t), a.URL)
		cfg.HealthCheck = config.HealthCheck{Interval: 20 * time.Millisecond, Timeout: 20 * time.Millisecond}
		cfg.Models[0].Signals.Disabled = true
		p, url := serveProxy(t, cfg)
		waitFor(t, "/readyz 200", func() bool { code, _ := readyz(t, url); return code == http.StatusOK })

		// An engine added later that has not passed a check (it fails
		// them) does not make the model unready while a is healthy.
		b := newBackend(t, "b", okHandler("b"))
		b.down.Store(true)
		next := cfg
		next.Models = []config.Model{cfg.Models[0]}
		next.Models[0].Endpoints = append([]config.Endpoint{{URL: b.URL}}, cfg.Models[0].Endpoints...)
		if _, err := p.Reload(func() (config.Config, error) { return next, nil }); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		if code, body := readyz(t, url); code != http.StatusOK {
			t.Errorf("after adding b: got %d %s, want 200", code, body)
		}
		isDown := func(id string) func() bool {
			return func() bool {
				for _, st := range p.Router("m").Status(time.Now()) {
					if st.ID == id {
						return !st.Healthy
					}
				}
				return false
			}
		}
		waitFor(t, "b to fail its health checks", isDown(b.URL))
		if code, body := readyz(t, url); code != http.StatusOK {
			t.Errorf("b failing: got %d %s, want 200", code, body)
		}

		// a down too: no endpoint left.
		a.down.Store(true)
		waitFor(t, "a to fail its health checks", isDown(a.URL))
		if code, body := readyz(t, url); code != http.StatusServiceUnavailable {
			t.Errorf("every engine down: got %d %s, want 503", code, body)
		}
	})
}

// TestReadyzPD: a prefill/decode model is ready only with a healthy
// endpoint that can decode (without a prefill engine the planner runs
// requests whole on decode engines; a prefill engine alone serves
// nothing); /readyz names it under models_without_healthy_decode_endpoint.
// A model without any healthy endpoint is named as before.
func TestReadyzPD(t *testing.T) {
	for _, tc := range []struct {
		name              string
		prefillUp, decUp  bool
		wantCode          int
		wantIn, wantNotIn string
	}{
		{"both up", true, true, http.StatusOK, `"status":"ready"`, "models_without"},
		{"decode down", true, false, http.StatusServiceUnavailable,
			`"models_without_healthy_decode_endpoint":["tiny"]`, "models_without_healthy_endpoint"},
		{"prefill down", false, true, http.StatusOK, `"status":"ready"`, "models_without"},
		{"both down", false, false, http.StatusServiceUnavailable,
			`"models_without_healthy_endpoint":["tiny"]`, "models_without_healthy_decode_endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := func(role kvroute.Role, up bool) string {
				if !up {
					return closedURL(t)
				}
				s, _ := pdEngine(t, role, "nixl")
				return s.URL
			}
			cfg := pdTestConfig("first", "nixl", engine(kvroute.RolePrefill, tc.prefillUp), engine(kvroute.RoleDecode, tc.decUp))
			cfg.HealthCheck = config.HealthCheck{Interval: 50 * time.Millisecond, Timeout: 50 * time.Millisecond}
			p, url := serveProxy(t, cfg)
			checked := func() bool { // every endpoint checked (passed, or failed and out)
				passed, _ := p.health.passedBy("tiny")
				for _, st := range p.Router("tiny").Status(time.Now()) {
					if st.Healthy && !passed[st.ID] {
						return false
					}
				}
				return true
			}
			waitFor(t, "the health checks", checked)
			code, body := readyz(t, url)
			if code != tc.wantCode || !strings.Contains(body, tc.wantIn) || strings.Contains(body, tc.wantNotIn) {
				t.Errorf("got %d %s, want %d with %s and without %s", code, body, tc.wantCode, tc.wantIn, tc.wantNotIn)
			}
		})
	}
}

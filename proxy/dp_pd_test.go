package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/policy"
)

// TestDataParallelPDEndToEnd runs kvroute serve's handler in front of a
// two-rank prefill server and a two-rank decode server (vLLM
// --data-parallel-size 2 on both sides, NixlConnector): every leg carries
// a rank header, the answer names the decode rank, and no request needs a
// second placement (an emulated decode rank pulling from the wrong prefill
// rank fails its leg).
func TestDataParallelPDEndToEnd(t *testing.T) {
	var mu sync.Mutex // protects ranks
	ranks := map[string][]string{}
	start := func(role kvroute.Role) string {
		record := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(r.URL.Path, "/v1/") {
					mu.Lock()
					ranks[role.String()] = append(ranks[role.String()], strings.Join(r.Header[kvroute.HeaderDataParallelRank], ","))
					mu.Unlock()
				}
				h.ServeHTTP(w, r)
			})
		}
		_, hs := emulatortest.StartDP(t, emulator.Config{Model: "tiny", Role: role, PDProtocol: emulator.PDNixl,
			LoadFailure: emulator.LoadFailureFail}, 2, record)
		return hs.URL
	}
	cfg := config.Config{
		Models: []config.Model{{
			Name: "tiny",
			Endpoints: []config.Endpoint{
				{ID: "p0", URL: start(kvroute.RolePrefill), Role: "prefill", DataParallelSize: 2},
				{ID: "d0", URL: start(kvroute.RoleDecode), Role: "decode", DataParallelSize: 2},
			},
			PD: config.PD{Protocol: "nixl", Mode: "always", Profile: "tiny"},
		}},
		HealthCheck: config.HealthCheck{Disabled: true},
		Debug:       config.Debug{Enabled: true},
	}
	tp := newTestProxyWith(t, cfg, policy.New)
	const n = 6
	for i := range n {
		body := fmt.Sprintf(`{"model":"tiny","prompt":"request %d: the prefill rank holds the KV and the decode rank pulls it.","max_tokens":3}`, i)
		resp, err := http.Post(tp.srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: got %d %s", i, resp.StatusCode, b)
		}
		if got := resp.Header.Get(HeaderEndpoint); got != "d0#dp0" && got != "d0#dp1" {
			t.Errorf("request %d: %s: got %q, want a rank of d0", i, HeaderEndpoint, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, role := range []string{"prefill", "decode"} {
		if len(ranks[role]) != n {
			t.Errorf("%s legs: got %d, want %d (one per request)", role, len(ranks[role]), n)
		}
		for _, r := range ranks[role] {
			if r != "0" && r != "1" {
				t.Errorf("%s leg's %s: got %q, want 0 or 1", role, kvroute.HeaderDataParallelRank, r)
			}
		}
	}
}

// TestReloadPDDataParallel: a reload may make a P/D pool's decode endpoint
// data-parallel: its ranks replace it as decode endpoints.
func TestReloadPDDataParallel(t *testing.T) {
	cfg := pdTestConfig("first", "nixl", "http://127.0.0.1:1", "http://127.0.0.1:2")
	tp := newTestProxy(t, cfg)
	p0, dp := cfg.Models[0].Endpoints[0], cfg.Models[0].Endpoints[1]
	dp.DataParallelSize = 2
	if _, err := tp.Reload(reloadTo(withEndpoints(cfg, p0, dp))); err != nil {
		t.Fatalf("got %v, want the data-parallel decode endpoint taken", err)
	}
	want := "p0=http://127.0.0.1:1 prefill, d0#dp0=http://127.0.0.1:2 decode, d0#dp1=http://127.0.0.1:2 decode"
	if got := strings.Join(pdEndpoints(tp), ", "); got != want {
		t.Errorf("endpoints: got %s, want %s", got, want)
	}
}

package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDashboardMounted(t *testing.T) {
	engine := httptest.NewServer(statusHandler(http.StatusOK))
	t.Cleanup(engine.Close)
	backend := engine.URL
	cfg := testConfig("rr", backend)
	cfg.Admin.Token = "s3cret-dashboard-token"
	tp := newTestProxy(t, cfg)

	get := func(path, token string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, tp.srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp, readAll(t, resp)
	}
	resp, body := get("/ui/", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "<html") {
		t.Fatalf("GET /ui/: got %d %.80q, want the page", resp.StatusCode, body)
	}
	// The state API is as protected as /debug/*: refused without the token.
	if resp, body := get("/ui/api/state", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /ui/api/state without token: got %d %q, want 401", resp.StatusCode, body)
	}
	resp, body = get("/ui/api/state", "s3cret-dashboard-token")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, backend) {
		t.Fatalf("GET /ui/api/state with token: got %d %.200q, want the fleet naming %s", resp.StatusCode, body, backend)
	}
}

package proxy

import (
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/policy"
)

// TestMethodNotAllowedAllow: a 405 names in Allow every method the route
// serves: a GET route serves HEAD too (RFC 9110 15.5.6: Allow lists the
// methods the resource supports), as the dashboard's routes say.
func TestMethodNotAllowedAllow(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	tp := newTestProxyWith(t, testConfig(policy.Default, a.URL), policy.New)
	for _, path := range []string{PathDecisions, PathEndpoints, PathMetrics} {
		req, err := http.NewRequest(http.MethodDelete, tp.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("DELETE %s: got %d, Allow %q; want 405, Allow \"GET, HEAD\"", path, resp.StatusCode, resp.Header.Get("Allow"))
		}
		head, err := http.Head(tp.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		head.Body.Close()
		if head.StatusCode == http.StatusMethodNotAllowed {
			t.Errorf("HEAD %s: got 405, want it served as GET", path)
		}
	}
}

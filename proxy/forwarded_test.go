package proxy

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// forwardedSeen records the forwarding headers of the requests an engine
// serves, per path.
type forwardedSeen struct {
	mu  sync.Mutex
	got []http.Header
}

func (s *forwardedSeen) record(r *http.Request) {
	h := http.Header{}
	for _, k := range append([]string{"Forwarded"}, forwardedHeaders...) {
		if v := r.Header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	s.mu.Lock()
	s.got = append(s.got, h)
	s.mu.Unlock()
}

func (s *forwardedSeen) all() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.got...)
}

// postForwarded sends a completion request to url claiming, in its
// forwarding headers, to come from 203.0.113.7 through example.com over
// https.
func postForwarded(t *testing.T, url, model string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"`+model+`","prompt":"hello","max_tokens":2}`))
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("X-Forwarded-Host", "example.com")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("Forwarded", "for=203.0.113.7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

// TestForwardedHeaders: the engine sees the client's address in
// X-Forwarded-For, and the host and scheme it asked for in
// X-Forwarded-Host and X-Forwarded-Proto, as behind Caddy or nginx
// (before, the reverse proxy dropped them all, so the engines logged the
// router as every request's client). An untrusted client's own forwarding
// headers are replaced (it could name any address); a trusted one's (a
// gateway in front, trusted_clients) are kept, its address appended.
func TestForwardedHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted []string
		want    http.Header
	}{
		{"untrusted", nil, http.Header{"X-Forwarded-For": {"127.0.0.1"}, "X-Forwarded-Proto": {"http"}}},
		{"trusted", []string{"127.0.0.1"}, http.Header{"X-Forwarded-For": {"203.0.113.7, 127.0.0.1"},
			"X-Forwarded-Host": {"example.com"}, "X-Forwarded-Proto": {"https"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen forwardedSeen
			b := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
				seen.record(r)
				okHandler("a")(w, r)
			})
			cfg := testConfig("first", b.URL)
			cfg.TrustedClients = tc.trusted
			tp := newTestProxy(t, cfg)
			postForwarded(t, tp.srv.URL, "m")
			want := tc.want.Clone()
			if want.Get("X-Forwarded-Host") == "" {
				want.Set("X-Forwarded-Host", strings.TrimPrefix(tp.srv.URL, "http://"))
			}
			checkForwarded(t, seen.all(), want)
		})
	}
}

// TestForwardedHeadersPD: each leg of a disaggregated request carries the
// forwarding headers too.
func TestForwardedHeadersPD(t *testing.T) {
	var seen forwardedSeen
	hook := func(_ http.ResponseWriter, r *http.Request) bool {
		seen.record(r)
		return false
	}
	ps, _ := pdEngineHook(t, kvroute.RolePrefill, "nixl", hook)
	ds, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", hook)
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, ds.URL), policy.New)
	postForwarded(t, tp.srv.URL, "tiny")
	got := seen.all()
	if len(got) != 2 {
		t.Fatalf("%d legs seen, want 2", len(got))
	}
	checkForwarded(t, got, http.Header{"X-Forwarded-For": {"127.0.0.1"}, "X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host": {strings.TrimPrefix(tp.srv.URL, "http://")}})
}

func checkForwarded(t *testing.T, got []http.Header, want http.Header) {
	t.Helper()
	if len(got) == 0 {
		t.Fatal("the engine saw no request")
	}
	for i, h := range got {
		for _, k := range append([]string{"Forwarded"}, forwardedHeaders...) {
			if g, w := strings.Join(h.Values(k), "|"), strings.Join(want.Values(k), "|"); g != w {
				t.Errorf("request %d: %s: got %q, want %q", i, k, g, w)
			}
		}
	}
}

package ui

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/signals"
)

func TestHistQuantile(t *testing.T) {
	inf := math.Inf(1)
	h := hist{bounds: []float64{0.1, 0.2, 0.4, inf}, counts: []float64{10, 30, 40, 40}}
	tests := []struct {
		name string
		h    hist
		q    float64
		want float64
	}{
		{"first bucket", h, 0.125, 0.05}, // rank 5 of 10 in [0, 0.1]
		{"second bucket", h, 0.5, 0.15},  // rank 20: 10 below, 20 in (0.1, 0.2]
		{"top bucket", h, 1, 0.4},        // rank 40 ends the third bucket
		{"inf bucket", hist{bounds: []float64{0.1, inf}, counts: []float64{1, 4}}, 0.99, 0.1},
		{"empty", hist{}, 0.5, math.NaN()},
		{"no observations", hist{bounds: []float64{1, inf}, counts: []float64{0, 0}}, 0.5, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.h.quantile(tt.q)
			if math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && math.Abs(got-tt.want) > 1e-9) {
				t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func TestHistSubAndAdd(t *testing.T) {
	inf := math.Inf(1)
	prev := hist{bounds: []float64{1, inf}, counts: []float64{2, 3}}
	cur := hist{bounds: []float64{1, inf}, counts: []float64{5, 7}}
	if got := cur.sub(prev); got.counts[0] != 3 || got.counts[1] != 4 {
		t.Errorf("sub = %v, want [3 4]", got.counts)
	}
	// A reset (counts went down) makes the whole current histogram the delta.
	reset := hist{bounds: []float64{1, inf}, counts: []float64{1, 1}}
	if got := reset.sub(cur); got.counts[0] != 1 || got.counts[1] != 1 {
		t.Errorf("sub after reset = %v, want [1 1]", got.counts)
	}
	if got := (hist{}).add(cur).add(prev); got.counts[0] != 7 || got.counts[1] != 10 {
		t.Errorf("add = %v, want [7 10]", got.counts)
	}
}

// fakeSource serves one router.
type fakeSource struct{ r *router.Router }

func (f fakeSource) Models() []string { return []string{f.r.Model()} }
func (f fakeSource) Router(m string) *router.Router {
	if m == f.r.Model() {
		return f.r
	}
	return nil
}

func newTestRouter(t *testing.T) *router.Router {
	t.Helper()
	pk, err := policy.New("kv-aware", nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{
		Model:     "m",
		Endpoints: []kvroute.Endpoint{{ID: "a", URL: "http://a"}, {ID: "b", URL: "http://b"}},
		Policy:    "kv-aware",
		Picker:    pk,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// testMetrics registers the two router metrics the dashboard reads.
func testMetrics(t *testing.T) (*prometheus.Registry, *prometheus.CounterVec, *prometheus.HistogramVec) {
	reg := prometheus.NewRegistry()
	req := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRequests, Help: "h"}, []string{"endpoint"})
	ttfb := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricTTFB, Help: "h", Buckets: []float64{.05, .1, .2, .5}}, []string{"endpoint"})
	reg.MustRegister(req, ttfb)
	return reg, req, ttfb
}

func TestDashboardState(t *testing.T) {
	r := newTestRouter(t)
	reg, reqs, ttfb := testMetrics(t)
	now := time.Unix(1000, 0)
	d, err := New(Options{Source: fakeSource{r}, Gatherer: reg, AdminEnabled: true, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	d.Mark(now, "kv-aware")
	for i := range 3 {
		f, err := r.Route(now, &kvroute.Request{ID: "r" + string(rune('0'+i)), Model: "m", Prompt: strings.Repeat("shared prefix ", 40), PromptTokens: 100}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(now, f, kvroute.Outcome{TTFT: 80 * time.Millisecond})
		reqs.WithLabelValues(f.Endpoint.ID).Inc()
		ttfb.WithLabelValues(f.Endpoint.ID).Observe(0.08)
	}
	now = now.Add(time.Second)
	absent := r.Endpoints()[1].ID // as a data-parallel rank its server does not have
	r.SetAbsent(now, absent, true)

	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /ui/api/state = %d %s", rec.Code, rec.Body)
	}
	var st state
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("state is not JSON: %v", err)
	}
	if len(st.Models) != 1 || len(st.Models[0].Endpoints) != 2 {
		t.Fatalf("models = %+v, want one model with two endpoints", st.Models)
	}
	for _, e := range st.Models[0].Endpoints {
		if e.Absent != (e.ID == absent) || e.Absent && e.Healthy {
			t.Errorf("endpoint %s: absent %v healthy %v, want %s alone absent (and not healthy)", e.ID, e.Absent, e.Healthy, absent)
		}
	}
	if got := st.Models[0].Policy; got != "kv-aware" {
		t.Errorf("policy = %q, want kv-aware", got)
	}
	if got := len(st.Models[0].Decisions); got != 3 {
		t.Errorf("decisions = %d, want 3", got)
	}
	if dec := st.Models[0].Decisions[0]; len(dec.Candidates) != 2 || len(dec.Decision.Scores) != 2 {
		t.Errorf("decision candidates/scores = %d/%d, want 2/2", len(dec.Candidates), len(dec.Decision.Scores))
	}
	if st.Totals.Requests != 3 || st.Totals.Label != "kv-aware" {
		t.Errorf("totals = %+v, want 3 requests since the kv-aware mark", st.Totals)
	}
	if p50 := st.Totals.TTFTP50; p50 == nil || *p50 < 50 || *p50 > 100 {
		t.Errorf("TTFT p50 = %v ms, want within the (50, 100] ms bucket", p50)
	}
	if n := len(st.Series.T); n != 2 {
		t.Errorf("chart points = %d, want 2 (the mark and the poll)", n)
	}
	if got := st.Series.RPS[len(st.Series.RPS)-1]; got == nil || *got != 3 {
		t.Errorf("last throughput point = %v, want 3 req/s", got)
	}
	if len(st.Series.Marks) != 1 || st.Series.Marks[0].Label != "kv-aware" {
		t.Errorf("marks = %+v, want the kv-aware mark", st.Series.Marks)
	}
	if !st.Admin.Enabled || st.Admin.Path != "/admin/policy" {
		t.Errorf("admin = %+v, want enabled at /admin/policy", st.Admin)
	}
	if st.Run != nil {
		t.Errorf("run = %+v, want none without Options.Run", st.Run)
	}
}

func TestDashboardRoutes(t *testing.T) {
	d, err := New(Options{Source: fakeSource{newTestRouter(t)}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method, path string
		code         int
		contains     string
	}{
		{"GET", "/ui", http.StatusFound, ""},
		{"GET", "/ui/", http.StatusOK, "fleet dashboard"},
		{"GET", "/ui/app.js", http.StatusOK, "api/state"},
		{"GET", "/ui/app.css", http.StatusOK, "--accent"},
		{"GET", "/ui/api/state", http.StatusOK, `"models"`},
		{"POST", "/ui/api/state", http.StatusMethodNotAllowed, ""},
		{"GET", "/ui/missing.js", http.StatusNotFound, ""},
		{"GET", "/elsewhere", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.code {
				t.Fatalf("code = %d, want %d", rec.Code, tt.code)
			}
			if !strings.Contains(rec.Body.String(), tt.contains) {
				t.Errorf("body lacks %q", tt.contains)
			}
		})
	}
}

// TestAssetsOffline checks that the page loads nothing from the network.
func TestAssetsOffline(t *testing.T) {
	for _, name := range []string{"assets/index.html", "assets/app.js", "assets/app.css"} {
		b, err := assets.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "@import", "fonts.googleapis"} {
			s := strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", "")
			if strings.Contains(s, bad) {
				t.Errorf("%s contains %q: the page must work offline", name, bad)
			}
		}
	}
}

func TestNewNeedsSource(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a Source: got nil error, want one")
	}
}

func TestDashboardAuthorize(t *testing.T) {
	authorize := func(r *http.Request) bool {
		return r.Header.Get("Authorization") == "Bearer secret-token-0123456789"
	}
	tests := []struct {
		admin      bool // the router has an admin token
		path, auth string
		code       int
	}{
		{true, "/ui/api/state", "", http.StatusUnauthorized},
		{true, "/ui/api/state", "Bearer wrong", http.StatusUnauthorized},
		{true, "/ui/api/state", "Bearer secret-token-0123456789", http.StatusOK},
		{true, "/ui/", "", http.StatusOK}, // the page itself is public
		{false, "/ui/api/state", "Bearer wrong", http.StatusForbidden},
		{false, "/ui/", "", http.StatusOK},
	}
	for _, tt := range tests {
		d, err := New(Options{Source: fakeSource{newTestRouter(t)}, Authorize: authorize, AdminEnabled: tt.admin})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodGet, tt.path, nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		if rec.Code != tt.code {
			t.Errorf("admin %v: GET %s (auth %q) = %d, want %d", tt.admin, tt.path, tt.auth, rec.Code, tt.code)
		}
		if challenge := rec.Header().Get("WWW-Authenticate"); (tt.code == http.StatusUnauthorized) != (challenge != "") {
			t.Errorf("admin %v: GET %s = %d with WWW-Authenticate %q: a 401, and only a 401, carries the challenge",
				tt.admin, tt.path, rec.Code, challenge)
		}
	}
}

// TestDashboardErrorBodies: the dashboard's API errors are the router's
// OpenAI-style JSON bodies ({"error":{"message","type","param","code"}}),
// as /debug/* and /admin/policy answer them. The 405 was "method not
// allowed" in text/plain, the 401 and 403 bodies had no "param", and an
// unknown API path was the file server's "404 page not found".
func TestDashboardErrorBodies(t *testing.T) {
	tests := []struct {
		admin        bool
		method, path string
		code         int
		typ, errCode string
		allow        string
	}{
		{true, "POST", "/ui/api/state", http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "GET, HEAD"},
		{true, "DELETE", "/ui/", http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "GET, HEAD"},
		{true, "GET", "/ui/api/state", http.StatusUnauthorized, "authentication_error", "invalid_token", ""},
		{false, "GET", "/ui/api/state", http.StatusForbidden, "permission_error", "forbidden", ""},
		{true, "GET", "/ui/api/nope", http.StatusNotFound, "not_found_error", "not_found", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			d, err := New(Options{Source: fakeSource{newTestRouter(t)}, AdminEnabled: tt.admin,
				Authorize: func(*http.Request) bool { return false }})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.code {
				t.Fatalf("code = %d, want %d", rec.Code, tt.code)
			}
			if got := rec.Header().Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			var body struct {
				Error map[string]json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v, want an OpenAI-style JSON error", rec.Body.String(), err)
			}
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := body.Error[k]; !ok {
					t.Errorf("body %q lacks error.%s", rec.Body.String(), k)
				}
			}
			if got := string(body.Error["type"]); got != `"`+tt.typ+`"` {
				t.Errorf("error.type = %s, want %q", got, tt.typ)
			}
			if got := string(body.Error["code"]); got != `"`+tt.errCode+`"` {
				t.Errorf("error.code = %s, want %q", got, tt.errCode)
			}
		})
	}
}

// TestDashboardSignalAgeNotNegative: a scrape sent after the state's clock
// reading (signals' observed_at is when the scrape was sent, and scrapes
// run while the state is built) is 0 ms old, not -1 ms as the fleet table
// showed it.
func TestDashboardSignalAgeNotNegative(t *testing.T) {
	r := newTestRouter(t)
	now := time.Unix(1000, 0)
	r.View("a").Observe(now.Add(time.Millisecond), signals.Metrics{Flavor: signals.FlavorVLLM, Have: signals.HasWaiting, Waiting: 1})
	d, err := New(Options{Source: fakeSource{r}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	var st struct {
		Models []struct {
			Endpoints []struct {
				ID          string   `json:"id"`
				SignalAgeMS *float64 `json:"signal_age_ms"`
			} `json:"endpoints"`
		} `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || len(st.Models) != 1 {
		t.Fatalf("state %q: %v, want one model", rec.Body.String(), err)
	}
	for _, e := range st.Models[0].Endpoints {
		if e.ID != "a" {
			continue
		}
		if e.SignalAgeMS == nil {
			t.Errorf("endpoint a: signal_age_ms = null, want 0 (observed 1ms after the state's now)")
		} else if *e.SignalAgeMS != 0 {
			t.Errorf("endpoint a: signal_age_ms = %v, want 0 (observed 1ms after the state's now)", *e.SignalAgeMS)
		}
	}
}

// TestDashboardEmptyPool: a pool without endpoints (discovered, none ready
// yet, or a discovery that could not start) sends "endpoints": [], as it
// sends "decisions": []. It sent null, and the page's script, which reads
// the list (forEach, reduce, length), failed on every poll: the dashboard
// said "disconnected" while the router was up.
func TestDashboardEmptyPool(t *testing.T) {
	d := emptyPoolDashboard(t)
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /ui/api/state = %d %s", rec.Code, rec.Body)
	}
	var st struct {
		Models []map[string]json.RawMessage `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("state is not JSON: %v", err)
	}
	if len(st.Models) != 1 {
		t.Fatalf("models: got %d, want 1", len(st.Models))
	}
	for _, k := range []string{"endpoints", "decisions"} {
		if got := string(st.Models[0][k]); got != "[]" {
			t.Errorf("models[0].%s: got %s, want []", k, got)
		}
	}
}

// emptyPoolDashboard is the dashboard of a kv-aware pool without
// endpoints (a discovered model with none ready yet).
func emptyPoolDashboard(t *testing.T) *Dashboard {
	t.Helper()
	pk, err := policy.New("kv-aware", nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "m", AllowEmpty: true, Policy: "kv-aware", Picker: pk})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Source: fakeSource{r}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

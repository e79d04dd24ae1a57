package ui

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// multiSource serves several routers, in order.
type multiSource []*router.Router

func (s multiSource) Models() []string {
	var out []string
	for _, r := range s {
		out = append(out, r.Model())
	}
	return out
}

func (s multiSource) Router(m string) *router.Router {
	for _, r := range s {
		if r.Model() == m {
			return r
		}
	}
	return nil
}

func newModelRouter(t *testing.T, model string, ids ...string) *router.Router {
	t.Helper()
	return newPolicyRouter(t, model, "round_robin", ids...)
}

func newPolicyRouter(t *testing.T, model, pol string, ids ...string) *router.Router {
	t.Helper()
	pk, err := policy.New(pol, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	var eps []kvroute.Endpoint
	for _, id := range ids {
		eps = append(eps, kvroute.Endpoint{ID: id, URL: "http://" + model + "-" + id})
	}
	r, err := router.New(router.Config{Model: model, Endpoints: eps, Policy: pol, Picker: pk})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSeriesLoadPerModel checks that the load chart's series are kept per
// model: endpoint IDs are unique per model only, and two models whose pools
// both have an endpoint "a" must not have their loads summed into one line,
// nor show each other's endpoints.
func TestSeriesLoadPerModel(t *testing.T) {
	m1 := newModelRouter(t, "m1", "a", "b")
	m2 := newModelRouter(t, "m2", "a")
	now := time.Unix(1000, 0)
	d, err := New(Options{Source: multiSource{m1, m2}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// Four requests in flight on m1 (two per endpoint), none on m2.
	for i := range 4 {
		if _, err := m1.Route(now, &kvroute.Request{ID: "r" + string(rune('0'+i)), Model: "m1", Prompt: strings.Repeat("x ", 50), PromptTokens: 50}, nil); err != nil {
			t.Fatal(err)
		}
	}
	d.Sample(now)
	now = now.Add(time.Second)

	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	var st struct {
		Models []struct {
			Name      string `json:"name"`
			Endpoints []struct {
				ID      string `json:"id"`
				Waiting int    `json:"waiting"`
				Running int    `json:"running"`
			} `json:"endpoints"`
		} `json:"models"`
		Series struct {
			Load  map[string]map[string][]*float64 `json:"load"`
			Order map[string][]string              `json:"endpoints"`
		} `json:"series"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("state: %v\n%s", err, rec.Body)
	}
	if got := st.Series.Order["m1"]; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("m1's chart endpoints = %q, want [a b]", got)
	}
	if got := st.Series.Order["m2"]; !slices.Equal(got, []string{"a"}) {
		t.Errorf("m2's chart endpoints = %q, want [a]", got)
	}
	// The last chart point of every endpoint equals its row in the fleet.
	for _, m := range st.Models {
		for _, e := range m.Endpoints {
			vals := st.Series.Load[m.Name][e.ID]
			if len(vals) != 2 || vals[1] == nil {
				t.Errorf("load of %s/%s = %v, want 2 points", m.Name, e.ID, vals)
				continue
			}
			if want := float64(e.Waiting + e.Running); *vals[1] != want {
				t.Errorf("load of %s/%s = %v, want %v (waiting+running of its fleet row)", m.Name, e.ID, *vals[1], want)
			}
		}
	}
	if a := st.Series.Load["m1"]["a"]; len(a) == 2 && a[1] != nil && *a[1] == 0 {
		t.Errorf("m1/a load = 0, want its requests in flight counted (test premise)")
	}
}

// TestHistAddDifferentBounds checks that histograms with different bounds
// add into a cumulative histogram: no count lost at a bound one side
// lacks (the merged counts never go down).
func TestHistAddDifferentBounds(t *testing.T) {
	inf := math.Inf(1)
	h := hist{bounds: []float64{.005, .01, 60, inf}, counts: []float64{1, 2, 3, 3}}
	o := hist{bounds: []float64{.001, .005, 30, inf}, counts: []float64{1, 1, 2, 2}}
	got := h.add(o)
	wantB := []float64{.001, .005, .01, 30, 60, inf}
	wantC := []float64{1, 2, 3, 4, 5, 5}
	if !slices.Equal(got.bounds, wantB) || !slices.Equal(got.counts, wantC) {
		t.Errorf("add = %v %v, want %v %v", got.bounds, got.counts, wantB, wantC)
	}
	if got.total() != h.total()+o.total() {
		t.Errorf("total = %v, want %v", got.total(), h.total()+o.total())
	}
}

// TestPDModelTTFT checks that a P/D model's requests show in the TTFT
// tiles and chart: the P/D handoff records its time to first byte in
// kvroute_pd_stage_seconds{stage="ttfb"}, not kvroute_upstream_ttfb_seconds,
// and the two histograms' bounds differ.
func TestPDModelTTFT(t *testing.T) {
	reg, reqs, _ := testMetrics(t)
	stage := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricPDStage, Help: "h",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1}}, []string{"model", "stage"})
	reg.MustRegister(stage)
	now := time.Unix(1000, 0)
	d, err := New(Options{Source: multiSource{newModelRouter(t, "pd", "p", "d")}, Gatherer: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	d.Mark(now, "start")
	for range 10 {
		reqs.WithLabelValues("d").Inc()
		stage.WithLabelValues("pd", "ttfb").Observe(0.004)  // the client's first byte: 4 ms
		stage.WithLabelValues("pd", "prefill").Observe(0.2) // another stage: not a TTFT
	}
	now = now.Add(time.Second)
	d.Sample(now)
	tot := d.Totals()
	if tot.Requests != 10 {
		t.Errorf("requests = %d, want 10", tot.Requests)
	}
	if tot.TTFTP50 <= 2500*time.Microsecond || tot.TTFTP50 > 5*time.Millisecond ||
		tot.TTFTP99 <= 2500*time.Microsecond || tot.TTFTP99 > 5*time.Millisecond {
		t.Errorf("TTFT p50/p99 = %v/%v, want within the (2.5, 5] ms bucket", tot.TTFTP50, tot.TTFTP99)
	}
	d.mu.Lock()
	se := d.s.series()
	d.mu.Unlock()
	if last := se.TTFTP50[len(se.TTFTP50)-1]; last == nil || *last <= 2.5 || *last > 5 {
		t.Errorf("TTFT chart's last p50 = %v ms, want within (2.5, 5] ms", last)
	}
}

// TestReadFamiliesPDTTFBOnce: a P/D model's TTFB is its stage="ttfb"
// timing (from the request's start); its decode engines' upstream TTFB
// (from the decode leg's start) is not counted a second time. An
// aggregated model's upstream TTFB still counts.
func TestReadFamiliesPDTTFBOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	up := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricTTFB, Help: "h", Buckets: []float64{.01, .1}},
		[]string{"model", "endpoint"})
	stage := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricPDStage, Help: "h", Buckets: []float64{.01, .1}},
		[]string{"model", "stage"})
	reg.MustRegister(up, stage)
	up.WithLabelValues("pd", "d").Observe(0.05)
	stage.WithLabelValues("pd", "ttfb").Observe(0.005)
	stage.WithLabelValues("pd", "prefill").Observe(0.003)
	up.WithLabelValues("agg", "a").Observe(0.05)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	g := readFamilies(mfs)
	if n, pd := histDelta(g.ttfb, nil).total(), histDelta(g.pdTTFB, nil).total(); n != 1 || pd != 1 {
		t.Errorf("upstream TTFB counts %v requests, P/D TTFB %v; want 1 (agg's) and 1 (pd's)", n, pd)
	}
}

// TestFirstPointIsBaseline: the dashboard's first point (its first poll,
// perhaps long after the router started) only sets the baselines of the
// router's counters. Before, it held every TTFB the router had observed,
// and the TTFT chart's sliding window showed the router's lifetime
// quantiles for its first points instead of the last seconds'.
func TestFirstPointIsBaseline(t *testing.T) {
	reg, reqs, ttfb := testMetrics(t)
	for range 500 { // before the dashboard's first point: slow
		reqs.WithLabelValues("a").Inc()
		ttfb.WithLabelValues("a").Observe(0.3)
	}
	now := time.Unix(1000, 0)
	d, err := New(Options{Source: fakeSource{newTestRouter(t)}, Gatherer: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	d.Sample(now)
	for range 2 {
		reqs.WithLabelValues("a").Inc()
		ttfb.WithLabelValues("a").Observe(0.08)
	}
	now = now.Add(time.Second)
	d.Sample(now)
	d.mu.Lock()
	se := d.s.series()
	d.mu.Unlock()
	if p99 := se.TTFTP99[len(se.TTFTP99)-1]; p99 == nil || *p99 <= 50 || *p99 > 100 {
		t.Errorf("TTFT chart's p99 after the first second = %v ms, want within (50, 100] (the 2 requests since the first point)", deref(p99))
	}
	if p50 := se.TTFTP50[0]; p50 != nil {
		t.Errorf("TTFT chart's first point = %v ms, want none (a baseline)", *p50)
	}
}

// churnSource serves one model whose router is replaced at will (endpoints
// coming and going, as with discovery).
type churnSource struct{ r *router.Router }

func (s *churnSource) Models() []string             { return []string{s.r.Model()} }
func (s *churnSource) Router(string) *router.Router { return s.r }

// TestSeriesForgetsDepartedEndpoints: an endpoint that left the pool is
// dropped from the load chart once its last point has aged out of the
// history. Before, every endpoint ever seen stayed, and with discovery
// churn (a new pod ID per rollout) each state response carried a series
// of History nulls for each of them, without bound.
func TestSeriesForgetsDepartedEndpoints(t *testing.T) {
	src := &churnSource{}
	now := time.Unix(1000, 0)
	d, err := New(Options{Source: src, History: 3, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		src.r = newModelRouter(t, "m", "stable", "pod-"+strconv.Itoa(i))
		d.Sample(now)
		now = now.Add(time.Second)
	}
	d.mu.Lock()
	se := d.s.series()
	d.mu.Unlock()
	want := []string{"pod-17", "pod-18", "pod-19", "stable"}
	if got := se.Order["m"]; !slices.Equal(got, want) {
		t.Errorf("chart endpoints = %q, want %q (those in the last 3 points)", got, want)
	}
	if n := len(se.Load["m"]); n != len(want) {
		t.Errorf("%d load series, want %d", n, len(want))
	}
	for id, vals := range se.Load["m"] {
		if len(vals) != 3 {
			t.Errorf("load series %s has %d points, want 3", id, len(vals))
		}
	}
}

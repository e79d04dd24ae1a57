package ui

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/browsertest"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// newPDRouter builds a P/D pool's router as the proxy does: the configured
// policy (kv-aware) places the prefill stage inside a disagg.Planner, which
// is the router's picker.
func newPDRouter(t *testing.T) *router.Router {
	t.Helper()
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	prefill, err := policy.New("kv-aware", nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := disagg.NewPlanner(disagg.Config{Profile: prof, Prefill: prefill, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{
		Model: "pd-model",
		Endpoints: []kvroute.Endpoint{
			{ID: "p0", URL: "http://p0", Role: kvroute.RolePrefill},
			{ID: "d0", URL: "http://d0", Role: kvroute.RoleDecode},
		},
		Policy: "kv-aware",
		Picker: pl,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDashboardPDPolicy: a P/D pool's policy on the dashboard is what its
// decisions say placed them ("pd"), with the configured policy shown as
// the prefill stage's, not the configured policy alone (the badge said
// kv-aware while every decision said pd). An aggregated pool keeps its
// policy.
func TestDashboardPDPolicy(t *testing.T) {
	now := time.Unix(1000, 0)
	pd, agg := newPDRouter(t), newPolicyRouter(t, "agg", "kv-aware", "a", "b")
	d, err := New(Options{Source: multiSource{pd, agg}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*router.Router{pd, agg} {
		f, err := r.Route(now, &kvroute.Request{ID: "r1", Model: r.Model(), PromptTokens: 4000, MaxTokens: 100}, nil)
		if err != nil {
			t.Fatalf("%s: route: %v", r.Model(), err)
		}
		r.Done(now, f, kvroute.Outcome{TTFT: 50 * time.Millisecond})
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	// The page's view of the JSON, so that a field renamed or dropped fails.
	type modelView struct {
		Name          string `json:"name"`
		Policy        string `json:"policy"`
		PD            bool   `json:"pd"`
		PrefillPolicy string `json:"prefill_policy"`
		Decisions     []struct {
			Decision struct {
				Policy string `json:"policy"`
			} `json:"decision"`
		} `json:"decisions"`
	}
	var st struct {
		Models []modelView `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("state: %v: %s", err, rec.Body)
	}
	want := map[string]modelView{
		"pd-model": {Policy: "pd", PD: true, PrefillPolicy: "kv-aware"},
		"agg":      {Policy: "kv-aware"},
	}
	for _, m := range st.Models {
		if len(m.Decisions) == 0 {
			t.Fatalf("%s: no decisions", m.Name)
		}
		if got := m.Decisions[0].Decision.Policy; got != m.Policy {
			t.Errorf("%s: dashboard policy %q, its decisions' %q", m.Name, m.Policy, got)
		}
		w := want[m.Name]
		if m.Policy != w.Policy || m.PD != w.PD || m.PrefillPolicy != w.PrefillPolicy {
			t.Errorf("%s: policy %q pd %v prefill %q, want %q %v %q", m.Name, m.Policy, m.PD, m.PrefillPolicy, w.Policy, w.PD, w.PrefillPolicy)
		}
	}
	if len(st.Models) != 2 {
		t.Errorf("%d models, want 2", len(st.Models))
	}
}

// TestPDBadgeInBrowser: in headless Chromium, a P/D pool's policy badge
// reads "pd · prefill: kv-aware" (what its decisions say, and what places
// the prefill stage), and the policy switch says that the admin API does
// not switch a P/D pool instead of offering a switch it refuses.
func TestPDBadgeInBrowser(t *testing.T) {
	browsertest.Require(t) // before the set-up
	pd := newPDRouter(t)
	if _, err := pd.Route(time.Now(), &kvroute.Request{ID: "r1", Model: "pd-model", PromptTokens: 4000, MaxTokens: 100}, nil); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Source: multiSource{pd}, AdminEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	bctx, page := browse(t, d)
	if err := chromedp.Do(bctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	const expr = `document.getElementById('current-policy').textContent === 'pd · prefill: kv-aware' &&
		document.getElementById('admin-note').textContent.includes('disaggregated')`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		got, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('current-policy').textContent + " | " + document.getElementById('admin-note').textContent`))
		t.Fatalf("badge | note = %q: %v; want pd · prefill: kv-aware and a note that the pool is disaggregated", got, err)
	}
}

package disagg

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// TestPlanAdapter: the P/D planner, as a router's picker, places both legs
// of a request for a LoRA adapter on endpoints that serve it, prefill and
// decode, whatever serves the base model: the router offers the others as
// not healthy.
func TestPlanAdapter(t *testing.T) {
	eps := []kvroute.Endpoint{
		{ID: "p0", URL: "http://p0:1", Role: kvroute.RolePrefill, Adapters: []string{"chat"}},
		{ID: "p1", URL: "http://p1:1", Role: kvroute.RolePrefill},
		{ID: "d0", URL: "http://d0:1", Role: kvroute.RoleDecode, Adapters: []string{"chat"}},
		{ID: "d1", URL: "http://d1:1", Role: kvroute.RoleDecode, Adapters: []string{"sql"}},
	}
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Endpoints: eps, Policy: "pd", Picker: pl})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20 {
		adapter := []string{"sql", "chat"}[i%2]
		req := &kvroute.Request{ID: fmt.Sprint(i), Model: "tiny", Adapter: adapter, Prompt: fmt.Sprintf("prompt %d of some length", i), PromptTokens: 64}
		f, err := r.Route(t0, req, nil)
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, adapter, err)
		}
		plan, ok := pl.Take(req)
		if !ok {
			t.Fatalf("request %d: no plan", i)
		}
		got := plan.Prefill.ID + " " + plan.Decode.ID
		if adapter == "sql" && got != "p1 d1" {
			t.Errorf("request %d (sql): planned %s, want p1 d1 (the only engines serving it)", i, got)
		}
		if !plan.Prefill.ServesAdapter(adapter) || !plan.Decode.ServesAdapter(adapter) {
			t.Errorf("request %d (%s): planned %s, which does not serve it", i, adapter, got)
		}
		r.Done(t0, f, kvroute.Outcome{})
	}
}

// TestPlanAdapterReasons: the plan's reason names the adapter when no
// prefill endpoint serving it is available (the request runs whole on a
// decode endpoint that serves it), and so does the decision of a request
// no decode endpoint serves.
func TestPlanAdapterReasons(t *testing.T) {
	eps := []kvroute.Endpoint{
		{ID: "p0", URL: "http://p0:1", Role: kvroute.RolePrefill, Adapters: []string{"chat", "solo"}},
		{ID: "d0", URL: "http://d0:1", Role: kvroute.RoleDecode, Adapters: []string{"chat", "sql"}},
	}
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Endpoints: eps, Policy: "pd", Picker: pl})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	req := &kvroute.Request{ID: "1", Model: "tiny", Adapter: "sql", Prompt: "a prompt of some length", PromptTokens: 600}
	f, err := r.Route(t0, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := pl.Take(req)
	r.Done(t0, f, kvroute.Outcome{})
	want := `aggregated: no prefill-capable endpoint serving adapter "sql" available`
	if plan.Disaggregated || plan.Decode == nil || plan.Decode.ID != "d0" || plan.Rule != "no_prefill" || plan.Reason != want {
		t.Errorf("sql (no prefill endpoint serves it): got rule %q, reason %q, want whole on d0, no_prefill, %q", plan.Rule, plan.Reason, want)
	}
	if _, err := r.Route(t0, &kvroute.Request{ID: "2", Model: "tiny", Adapter: "solo", Prompt: "p", PromptTokens: 600}, nil); err == nil {
		t.Fatal("solo (no decode endpoint serves it): routed")
	}
	want = `no healthy decode-capable endpoint serving adapter "solo"`
	if got := r.Decisions(1)[0].Decision.Reason; got != want {
		t.Errorf("solo's decision: reason %q, want %q", got, want)
	}
}

package disagg

import (
	"fmt"
	"strings"
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
	pl, r := adapterPool(t, eps)
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
	pl, r := adapterPool(t, eps)
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

// TestDecodePickerAdapterSlot: a decode leg for a LoRA adapter avoids an
// engine whose max_lora slots other adapters' running requests hold
// (vLLM's scheduler keeps the request waiting, its KV pull not started,
// until one leaves), unless nothing better is left; an engine that runs
// the adapter, or has a slot free, or reports no adapters, pays nothing.
// A base-model request ignores the slots.
func TestDecodePickerAdapterSlot(t *testing.T) {
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	dp := pl.NewDecodePicker()
	busy := kvroute.Load{Running: 8, DecodeTokens: 8 * 2000}
	cands := func(loras ...*kvroute.LoRALoad) []kvroute.Candidate {
		out := []kvroute.Candidate{
			{Endpoint: &kvroute.Endpoint{ID: "idle", Role: kvroute.RoleDecode}, Healthy: true, Load: kvroute.Load{LoRA: loras[0]}},
			{Endpoint: &kvroute.Endpoint{ID: "busy", Role: kvroute.RoleDecode}, Healthy: true, Load: busy},
		}
		out[1].Load.LoRA = loras[1]
		return out
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	free := &kvroute.LoRALoad{Running: []string{"chat"}, Max: 2}
	for _, tc := range []struct {
		name    string
		adapter string
		idle    *kvroute.LoRALoad
		want    string
	}{
		{"slots held by another adapter", "sql", &kvroute.LoRALoad{Running: []string{"chat"}, Max: 1}, "busy"},
		{"slots held by two others", "sql", &kvroute.LoRALoad{Running: []string{"chat", "fr"}, Max: 2}, "busy"},
		{"runs the adapter", "sql", &kvroute.LoRALoad{Running: []string{"sql"}, Max: 1}, "idle"},
		{"queues the adapter", "sql", &kvroute.LoRALoad{Running: []string{"chat"}, Waiting: []string{"sql"}, Max: 1}, "idle"},
		{"the last slot free", "sql", &kvroute.LoRALoad{Running: []string{"chat"}, Max: 2}, "idle"},
		{"slots to spare", "sql", &kvroute.LoRALoad{Running: []string{"chat"}, Max: 3}, "idle"},
		{"no adapter signals", "sql", nil, "idle"},
		{"base model", "", &kvroute.LoRALoad{Running: []string{"chat"}, Max: 1}, "idle"},
	} {
		cs := cands(tc.idle, free)
		d := dp.Pick(t0, &kvroute.Request{Model: "tiny", Adapter: tc.adapter, PromptTokens: 600, MaxTokens: 100}, cs)
		if d.Index < 0 || cs[d.Index].Endpoint.ID != tc.want {
			t.Errorf("%s: got %+v, want %s", tc.name, d, tc.want)
		}
		wait := -1.0
		for _, p := range d.Scores[0].Parts {
			if p.Name == "adapter_ms" {
				wait = p.Value
			}
		}
		want := 0.0 // the engine holds the adapter, or has slots to spare
		switch {
		case tc.adapter == "":
			want = -1 // not priced
		case tc.want == "busy":
			want = -2 // a wait for a slot
		case tc.name == "the last slot free":
			want = pl.Config().Decode.AdapterLoadMs
		}
		if want == -2 && wait <= pl.Config().Decode.AdapterLoadMs || want != -2 && wait != want {
			t.Errorf("%s: idle's adapter_ms %v (-1: none), want %v (-2: over adapter_load_ms)", tc.name, wait, want)
		}
	}
}

// TestPlanAdapterPrefix: the plan prices an adapter's request from the
// prefix matches of the adapter's own blocks (the router keys them with
// its name): the prompt routed again for the same adapter is cached on
// both of its nodes (little to prefill, little to pull), while the same
// prompt for the base model or another adapter holds nothing there.
func TestPlanAdapterPrefix(t *testing.T) {
	eps := []kvroute.Endpoint{
		{ID: "p0", URL: "http://p0:1", Role: kvroute.RolePrefill},
		{ID: "d0", URL: "http://d0:1", Role: kvroute.RoleDecode},
	}
	pl, r := adapterPool(t, eps)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prompt := strings.Repeat("a system prompt that every turn repeats ", 60)
	const tokens = 600
	plan := func(id, adapter string) Plan {
		t.Helper()
		req := &kvroute.Request{ID: id, Model: "tiny", Adapter: adapter, Prompt: prompt, PromptTokens: tokens}
		f, err := r.Route(t0, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := pl.Take(req)
		if !p.Disaggregated {
			t.Fatalf("%s: not disaggregated: %s", id, p.Reason)
		}
		dreq := *req
		pl.PinEndpoint(&dreq, p.Decode)
		df, err := r.Route(t0, &dreq, nil) // the decode leg: recorded on d0
		if err != nil {
			t.Fatal(err)
		}
		r.Done(t0, df, kvroute.Outcome{Decode: true})
		r.Done(t0, f, kvroute.Outcome{})
		pl.Finish(p.Ticket)
		return p
	}
	first := plan("1", "sql")
	if first.UncachedPrefill != tokens || first.UncachedDecode != tokens {
		t.Fatalf("first sql request: uncached %d on the prefill node, %d on the decode node, want %d on both",
			first.UncachedPrefill, first.UncachedDecode, tokens)
	}
	again := plan("2", "sql")
	if again.UncachedPrefill >= tokens/10 || again.UncachedDecode >= tokens/10 || again.Transfer.Bytes >= first.Transfer.Bytes/10 {
		t.Errorf("sql again: uncached %d and %d, %d bytes pulled; want little of %d tokens, %d bytes",
			again.UncachedPrefill, again.UncachedDecode, again.Transfer.Bytes, tokens, first.Transfer.Bytes)
	}
	for _, adapter := range []string{"", "chat"} {
		p := plan("x"+adapter, adapter)
		if p.UncachedPrefill != tokens || p.UncachedDecode != tokens || p.Transfer.Bytes != first.Transfer.Bytes {
			t.Errorf("adapter %q: uncached %d and %d, %d bytes pulled; want %d, %d and %d (sql's blocks are not its)",
				adapter, p.UncachedPrefill, p.UncachedDecode, p.Transfer.Bytes, tokens, tokens, first.Transfer.Bytes)
		}
	}
}

// adapterPool is a P/D router over eps (model "tiny") whose picker is a
// Planner of the tiny profile that always disaggregates.
func adapterPool(t *testing.T, eps []kvroute.Endpoint) (*Planner, *router.Router) {
	t.Helper()
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Endpoints: eps, Policy: "pd", Picker: pl})
	if err != nil {
		t.Fatal(err)
	}
	return pl, r
}

// TestDecodePickerHoldsPlacedAdapters: the decode picker takes an engine
// to hold, for AdapterHold, the adapter it placed a request of there, as
// its signals do not show it until the leg arrives (after its prefill).
// Three idle decode engines at --max-loras 1, their signals showing no
// adapter: "chat"'s legs keep to the engine the first went to, "sql"'s
// take another (a slot there is free) and keep to it, and once the hold
// is over the signals alone count. Before, every engine looked free to
// each leg and ties were taken in turn: chat's second leg went to a third
// engine, and sql's would then wait there behind it.
func TestDecodePickerHoldsPlacedAdapters(t *testing.T) {
	p, _, _, _ := pool()
	d := []*kvroute.Endpoint{ep("d1", kvroute.RoleDecode, "rack", "r1"), ep("d2", kvroute.RoleDecode, "rack", "r1"),
		ep("d3", kvroute.RoleDecode, "rack", "r1")}
	pl := newPlanner(t, ModeAlways, DefaultLinks())
	free := kvroute.Load{LoRA: &kvroute.LoRALoad{Max: 1}}
	cs := cands(candSpec{ep: p}, candSpec{ep: d[0], load: free}, candSpec{ep: d[1], load: free}, candSpec{ep: d[2], load: free})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	decodeOf := func(at time.Duration, adapter string) string {
		t.Helper()
		r := req(adapter, 2000, 100)
		r.Adapter = adapter
		if dec := pl.Pick(t0.Add(at), r, cs); dec.Index < 0 {
			t.Fatalf("%s at %v: no decision: %s", adapter, at, dec.Reason)
		}
		plan, ok := pl.Take(r)
		if !ok || !plan.Disaggregated {
			t.Fatalf("%s at %v: plan %+v, want a disaggregated one", adapter, at, plan)
		}
		return plan.Decode.ID
	}
	chat := decodeOf(0, "chat")
	sql := decodeOf(10*time.Millisecond, "sql")
	if sql == chat {
		t.Errorf("sql's leg went to %s, which holds chat's (one slot)", sql)
	}
	for i, at := range []time.Duration{20 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond} {
		if got := decodeOf(at, "chat"); got != chat {
			t.Errorf("chat's leg %d at %v went to %s, want %s (holds chat)", i+2, at, got, chat)
		}
		if got := decodeOf(at, "sql"); got != sql {
			t.Errorf("sql's leg %d at %v went to %s, want %s (holds sql)", i+2, at, got, sql)
		}
	}
	// Past the hold, with signals showing no adapter anywhere, the
	// engines are alike again: legs are taken in turn.
	seen := map[string]bool{}
	for i := range 3 {
		seen[decodeOf(3*time.Second+time.Duration(i)*3*time.Second, "chat")] = true
	}
	if len(seen) != 3 {
		t.Errorf("after the hold, chat's legs went to %v, want each engine in turn", seen)
	}
}

// TestDecodePickerWaitsBehindARarelyUsedAdapter: every decode engine's one
// max_lora slot is held by an adapter that runs only there ("busy" on d1,
// whose legs the picker placed 40 of in the last two seconds, "rare" on
// d2, one): a leg of a third adapter waits for a slot either way, for the
// time until the adapter there has no leg left in the batch, long behind
// busy and short behind rare. It goes to d2, though d2's batch is busier.
// Before, both waits were half a decode, and the batch sent it to d1.
func TestDecodePickerWaitsBehindARarelyUsedAdapter(t *testing.T) {
	pl := newPlanner(t, ModeAlways, DefaultLinks())
	dp := pl.NewDecodePicker()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 40 {
		dp.Placed(t0.Add(time.Duration(i)*50*time.Millisecond), "d1", "busy")
	}
	dp.Placed(t0.Add(1990*time.Millisecond), "d2", "rare")
	cs := []kvroute.Candidate{
		{Endpoint: ep("d1", kvroute.RoleDecode, "rack", "r1"), Healthy: true,
			Load: kvroute.Load{Running: 4, DecodeTokens: 4 * 2000, LoRA: &kvroute.LoRALoad{Running: []string{"busy"}, Max: 1}}},
		{Endpoint: ep("d2", kvroute.RoleDecode, "rack", "r1"), Healthy: true,
			Load: kvroute.Load{Running: 12, DecodeTokens: 12 * 2000, LoRA: &kvroute.LoRALoad{Running: []string{"rare"}, Max: 1}}},
	}
	r := req("new", 2000, 100)
	r.Adapter = "new"
	d := dp.Pick(t0.Add(2*time.Second), r, cs)
	if d.Index != 1 {
		t.Fatalf("got %+v, want d2 (behind rare)", d)
	}
	part := func(s kvroute.Score) float64 {
		for _, p := range s.Parts {
			if p.Name == "adapter_ms" {
				return p.Value
			}
		}
		return -1
	}
	if a, b := part(d.Scores[0]), part(d.Scores[1]); a < 2*b {
		t.Errorf("adapter_ms behind busy %v, behind rare %v: want the first over twice the second", a, b)
	}
}

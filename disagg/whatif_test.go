package disagg

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestWhatIfMatchesPlan: WhatIf decides and prices a request as Plan does
// on one prefill and one decode node with the same loads, prefix hits and
// an idle fabric, for every rule of the conditional mode and for the
// other modes, and books nothing.
func TestWhatIfMatchesPlan(t *testing.T) {
	p1, _, _, d2 := pool()
	busy := kvroute.Load{Running: 40, DecodeTokens: 40 * 2000, Waiting: 3, InFlightTokens: 30000}
	for _, tc := range []struct {
		name           string
		mode           Mode
		prompt         int
		cachedP, cache int
		pl, dl         kvroute.Load
		rule           string
	}{
		{"short", ModeConditional, 200, 0, 0, kvroute.Load{}, kvroute.Load{}, "short"},
		{"cached on decode", ModeConditional, 3000, 0, 2400, kvroute.Load{}, kvroute.Load{}, "cached"},
		{"cheaper locally", ModeConditional, 4000, 0, 0, busy, kvroute.Load{Running: 2, DecodeTokens: 4000}, "cheaper"},
		{"long", ModeConditional, 30000, 0, 0, busy, kvroute.Load{}, "max_local"},
		{"cost", ModeConditional, 8000, 0, 0, kvroute.Load{}, busy, "cost"},
		{"always", ModeAlways, 200, 0, 0, kvroute.Load{}, kvroute.Load{}, "always"},
		{"never", ModeNever, 8000, 0, 0, kvroute.Load{}, busy, "never"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			links := UniformLinks(Link{Name: "rdma", Gbps: RDMAGbps, Setup: time.Millisecond})
			pl := newPlanner(t, tc.mode, links)
			r := req(tc.name, tc.prompt, 100)
			cs := cands(candSpec{ep: p1, load: tc.pl, cached: tc.cachedP}, candSpec{ep: d2, load: tc.dl, cached: tc.cache})
			now := time.Unix(1000, 0)
			want := pl.Plan(now, r, cs)
			pl.Finish(want.Ticket)
			got := pl.WhatIf(Scenario{PromptTokens: tc.prompt, CachedPrefill: tc.cachedP, CachedDecode: tc.cache,
				PrefillLoad: tc.pl, DecodeLoad: tc.dl, Link: links.Default})
			if got.Rule != want.Rule || got.Disaggregated != want.Disaggregated || got.Reason != want.Reason {
				t.Errorf("WhatIf: %v %q (%s), Plan: %v %q (%s)", got.Disaggregated, got.Rule, got.Reason, want.Disaggregated, want.Rule, want.Reason)
			}
			if got.Rule != tc.rule {
				t.Errorf("rule %q, want %q (%s)", got.Rule, tc.rule, got.Reason)
			}
			if got.AggregatedTTFT != want.AggregatedTTFT || got.DisaggregatedTTFT != want.DisaggregatedTTFT || got.Stall != want.Stall ||
				got.PrefillQueue != want.PrefillQueue || got.PrefillTime != want.PrefillTime || got.Transfer != want.Transfer ||
				got.DecodeStep != want.DecodeStep || got.UncachedDecode != want.UncachedDecode {
				t.Errorf("WhatIf estimates %+v\nPlan's %+v", got, want)
			}
			if n, _ := pl.Fabric().InFlight(now); n != 0 {
				t.Errorf("%d transfers booked, want 0", n)
			}
		})
	}
}

// TestHandsOff: HandsOff decides as WhatIf over random prompts, prefix
// hits and loads in every mode, and allocates nothing (WhatIf writes the
// plan's reason, which the capacity planner asks for per request and
// throws away).
func TestHandsOff(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	links := UniformLinks(Link{Name: "rdma", Gbps: RDMAGbps, Setup: time.Millisecond})
	for _, mode := range []Mode{ModeConditional, ModeAlways, ModeNever} {
		pl := newPlanner(t, mode, links)
		rules := map[string]bool{}
		for range 2000 {
			prompt := 1 + r.IntN(40000)
			run := r.IntN(100)
			s := Scenario{PromptTokens: prompt, CachedPrefill: r.IntN(prompt + 1), CachedDecode: r.IntN(prompt + 1),
				PrefillLoad: kvroute.Load{InFlightTokens: r.IntN(200_000)},
				DecodeLoad:  kvroute.Load{Running: run, DecodeTokens: run * r.IntN(4000), InFlightTokens: r.IntN(50_000)},
				Link:        links.Default}
			w := pl.WhatIf(s)
			rules[w.Rule] = true
			if got := pl.HandsOff(s); got != w.Disaggregated {
				t.Fatalf("%s: HandsOff(%+v) = %v, WhatIf: %v (%s)", mode, s, got, w.Disaggregated, w.Reason)
			}
			if w.Reason == "" {
				t.Fatalf("%s: WhatIf(%+v) has no reason", mode, s)
			}
		}
		if mode == ModeConditional && len(rules) < 5 {
			t.Errorf("conditional: only rules %v came up", rules)
		}
		s := Scenario{PromptTokens: 9000, PrefillLoad: kvroute.Load{InFlightTokens: 2_000_000}, Link: links.Default}
		if n := testing.AllocsPerRun(100, func() { pl.HandsOff(s) }); n != 0 {
			t.Errorf("%s: HandsOff allocates %v times, want 0", mode, n)
		}
	}
}

// TestWhatIfAdapterSlot: WhatIf prices a LoRA adapter's wait for a
// max_lora slot as Plan does, from the decode node's LoRA signals: "sql"
// on a decode node whose one slot "chat" holds waits there (AdapterWait,
// and DecodeAdapterWait for the decode leg), which turns the split as in
// TestPlanAdapterSlotAggregated; "chat" itself and the base model wait
// for nothing. The prefill node, prefill-only, adds no wait.
func TestWhatIfAdapterSlot(t *testing.T) {
	p1, _, _, d2 := pool()
	pload := kvroute.Load{InFlight: 1, InFlightTokens: 4000, PrefixHitRate: -1}
	dload := kvroute.Load{Running: 2, DecodeTokens: 4000, PrefixHitRate: -1, LoRA: slotHeld}
	pload.LoRA = slotHeld
	links := DefaultLinks()
	for _, adapter := range []string{"sql", "chat", ""} {
		pl := newPlanner(t, ModeConditional, links)
		r := req("a", 4000, 256)
		r.Adapter = adapter
		now := time.Unix(1_700_000_000, 0)
		want := pl.Plan(now, r, cands(candSpec{ep: p1, load: pload}, candSpec{ep: d2, load: dload}))
		pl.Finish(want.Ticket)
		got := pl.WhatIf(Scenario{PromptTokens: 4000, Adapter: adapter, PrefillLoad: pload, DecodeLoad: dload, Link: links.Between(p1, d2)})
		if got.AdapterWait != want.AdapterWait || got.PrefillAdapterWait != 0 || got.DecodeAdapterWait != want.DecodeAdapterWait ||
			got.Disaggregated != want.Disaggregated || got.Reason != want.Reason {
			t.Errorf("adapter %q: WhatIf waits %v/%v/%v, %v (%s); Plan's %v/%v/%v, %v (%s)", adapter,
				got.AdapterWait, got.PrefillAdapterWait, got.DecodeAdapterWait, got.Disaggregated, got.Reason,
				want.AdapterWait, want.PrefillAdapterWait, want.DecodeAdapterWait, want.Disaggregated, want.Reason)
		}
		if wantWait := adapter == "sql"; (got.AdapterWait > 0) != wantWait || got.Disaggregated != wantWait {
			t.Errorf("adapter %q: slot wait %v, disaggregated %v; want a wait and a handoff only for sql", adapter, got.AdapterWait, got.Disaggregated)
		}
		s := Scenario{PromptTokens: 4000, Adapter: adapter, PrefillLoad: pload, DecodeLoad: dload, Link: links.Between(p1, d2)}
		if pl.HandsOff(s) != got.Disaggregated {
			t.Errorf("adapter %q: HandsOff disagrees with WhatIf", adapter)
		}
	}
}

package disagg

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// part returns the value of the plan part named name, and whether the
// plan's Parts has it.
func part(pl Plan, name string) (float64, bool) {
	for _, p := range pl.Parts() {
		if p.Name == name {
			return p.Value, true
		}
	}
	return 0, false
}

// slotHeld is an engine's adapter signals with its one max_lora slot held
// by "chat"'s running requests.
var slotHeld = &kvroute.LoRALoad{Running: []string{"chat"}, Max: 1}

// TestPlanAdapterSlotAggregated: a request for adapter "sql" whose decode
// node's one max_lora slot other adapters' running requests hold would
// wait there for the slot (OutputTokens/2 decode steps, the decode
// stage's adapter_ms) before its prefill if run whole, while its decode
// leg, arriving once the prefill elsewhere is done, waits only what is
// left of it: the aggregated estimate carries the wait, and the split
// decision, "cheaper" aggregated for the base model and for an adapter
// the decode node runs, turns to disaggregated. The plan's parts and
// reason show the wait.
func TestPlanAdapterSlotAggregated(t *testing.T) {
	p1, _, _, d2 := pool()
	prefillLoad := kvroute.Load{InFlight: 1, InFlightTokens: 4000, PrefixHitRate: -1}
	decodeLoad := kvroute.Load{Running: 2, DecodeTokens: 4000, PrefixHitRate: -1}
	t0 := time.Unix(1_700_000_000, 0)
	plan := func(adapter string, lora *kvroute.LoRALoad) Plan {
		t.Helper()
		pl := newPlanner(t, ModeConditional, DefaultLinks())
		dl := decodeLoad
		dl.LoRA = lora
		r := req("a", 4000, 256)
		r.Adapter = adapter
		got := pl.Plan(t0, r, cands(candSpec{ep: p1, load: prefillLoad}, candSpec{ep: d2, load: dl}))
		if got.Decode == nil || got.Decode.ID != "d2" || got.Decision.Index < 0 {
			t.Fatalf("adapter %q: no plan onto d2: %s", adapter, got.Reason)
		}
		return got
	}
	base := plan("", slotHeld)
	if base.Disaggregated || base.Rule != "cheaper" {
		t.Fatalf("base model: %s (rule %s), want aggregated, cheaper (the fixture's premise)", base.Reason, base.Rule)
	}
	runs := plan("chat", slotHeld)
	if runs.AggregatedTTFT != base.AggregatedTTFT || runs.Disaggregated || runs.Rule != "cheaper" {
		t.Errorf("chat (the decode node runs it): aggregated %v, %s; want base's %v, cheaper", runs.AggregatedTTFT, runs.Reason, base.AggregatedTTFT)
	}
	if _, ok := part(runs, "adapter_ms"); ok {
		t.Errorf("chat: parts have adapter_ms, want none (no wait)")
	}

	got := plan("sql", slotHeld)
	wait := time.Duration(float64(newPlanner(t, ModeConditional, DefaultLinks()).Config().Decode.OutputTokens) / 2 * float64(got.DecodeStep))
	if want := base.AggregatedTTFT + wait; got.AggregatedTTFT != want {
		t.Errorf("sql: aggregated TTFT %v, want %v (base %v + slot wait %v)", got.AggregatedTTFT, want, base.AggregatedTTFT, wait)
	}
	// The decode leg arrives when the prefill is done and waits for
	// what is left of the slot wait, then pulls the KV.
	ready := got.PrefillQueue + got.PrefillTime
	if want := max(ready, wait) + got.Transfer.Total() + got.DecodeStep; got.DisaggregatedTTFT != want {
		t.Errorf("sql: disaggregated TTFT %v, want %v (max(ready %v, slot wait %v) + transfer %v + step %v)",
			got.DisaggregatedTTFT, want, ready, wait, got.Transfer.Total(), got.DecodeStep)
	}
	if !got.Disaggregated || got.Rule != "cost" {
		t.Errorf("sql: %s (rule %s), want disaggregated by cost", got.Reason, got.Rule)
	}
	if v, ok := part(got, "adapter_ms"); !ok || v != ms(wait) {
		t.Errorf("sql: adapter_ms %v (present %v), want %v", v, ok, ms(wait))
	}
	if v, ok := part(got, "decode_adapter_ms"); !ok || v != ms(wait-ready) {
		t.Errorf("sql: decode_adapter_ms %v (present %v), want %v", v, ok, ms(wait-ready))
	}
	if !strings.Contains(got.Reason, "adapter slot wait") {
		t.Errorf("sql: reason %q does not show the adapter slot wait", got.Reason)
	}
	// The decision's head score is the plan's parts; the decode
	// picker's own adapter_ms for d2 prices the same wait and the slot
	// (AdapterLoadMs).
	for _, s := range got.Decision.Scores[1:] {
		if s.Endpoint != "d2" {
			continue
		}
		for _, p := range s.Parts {
			if load := newPlanner(t, ModeConditional, DefaultLinks()).Config().Decode.AdapterLoadMs; p.Name == "adapter_ms" && p.Value != ms(wait)+load {
				t.Errorf("sql: decode picker's adapter_ms %v, want the plan's %v and adapter_load_ms %v", p.Value, ms(wait), load)
			}
		}
	}
}

// TestPlanAdapterSlotPrefill: the reverse: the only prefill-capable node
// is a "both" engine whose one max_lora slot "chat"'s running (decoding)
// requests hold, and the decode node runs "sql" already. The
// disaggregated estimate carries the prefill leg's wait for the slot, and
// the decision, disaggregated by cost for the base model, turns to
// aggregated on the decode node. A prefill-only engine's running requests
// are prefill legs, which end with their first token within the queue
// already priced: its slots cost nothing more.
func TestPlanAdapterSlotPrefill(t *testing.T) {
	_, _, _, d2 := pool()
	b1 := ep("b1", kvroute.RoleBoth, "node", "n1", "rack", "r1")
	p1 := ep("p1", kvroute.RolePrefill, "node", "n1", "rack", "r1")
	prefillLoad := kvroute.Load{Running: 4, DecodeTokens: 4 * 2000, KVUsage: 0.98, PrefixHitRate: -1, LoRA: slotHeld}
	decodeLoad := kvroute.Load{Running: 48, DecodeTokens: 48 * 3000, KVUsage: 0.4, PrefixHitRate: -1,
		LoRA: &kvroute.LoRALoad{Running: []string{"sql"}, Max: 1}}
	t0 := time.Unix(1_700_000_000, 0)
	plan := func(prefill *kvroute.Endpoint, adapter string) Plan {
		t.Helper()
		pl := newPlanner(t, ModeConditional, DefaultLinks())
		r := req("a", 3000, 256)
		r.Adapter = adapter
		got := pl.Plan(t0, r, cands(candSpec{ep: prefill, load: prefillLoad}, candSpec{ep: d2, load: decodeLoad}))
		if got.Decode == nil || got.Decode.ID != "d2" || got.Decision.Index < 0 {
			t.Fatalf("%s, adapter %q: no plan onto d2: %s", prefill.ID, adapter, got.Reason)
		}
		return got
	}
	base := plan(b1, "")
	if !base.Disaggregated || base.Rule != "cost" {
		t.Fatalf("base model: %s (rule %s), want disaggregated by cost (the fixture's premise)", base.Reason, base.Rule)
	}
	got := plan(b1, "sql")
	if got.AggregatedTTFT != base.AggregatedTTFT {
		t.Errorf("sql: aggregated TTFT %v, want base's %v (the decode node runs sql)", got.AggregatedTTFT, base.AggregatedTTFT)
	}
	step := newPlanner(t, ModeConditional, DefaultLinks()).cost.decodeStep(prefillLoad, 3000)
	wait := time.Duration(float64(newPlanner(t, ModeConditional, DefaultLinks()).Config().Decode.OutputTokens) / 2 * float64(step))
	if want := base.DisaggregatedTTFT + wait; got.DisaggregatedTTFT != want {
		t.Errorf("sql: disaggregated TTFT %v, want %v (base %v + b1's slot wait %v)", got.DisaggregatedTTFT, want, base.DisaggregatedTTFT, wait)
	}
	if got.Disaggregated || got.Rule != "cheaper" {
		t.Errorf("sql: %s (rule %s), want aggregated, cheaper", got.Reason, got.Rule)
	}
	if v, ok := part(got, "prefill_adapter_ms"); !ok || v != ms(wait) {
		t.Errorf("sql: prefill_adapter_ms %v (present %v), want %v", v, ok, ms(wait))
	}
	if !strings.Contains(got.Reason, "adapter slot wait") {
		t.Errorf("sql: reason %q does not show the adapter slot wait", got.Reason)
	}

	pbase, pgot := plan(p1, ""), plan(p1, "sql")
	if pgot.DisaggregatedTTFT != pbase.DisaggregatedTTFT || pgot.Disaggregated != pbase.Disaggregated {
		t.Errorf("sql on a prefill-only node: disaggregated TTFT %v (%s), want base's %v (%s)",
			pgot.DisaggregatedTTFT, pgot.Reason, pbase.DisaggregatedTTFT, pbase.Reason)
	}
	if _, ok := part(pgot, "prefill_adapter_ms"); ok {
		t.Errorf("sql on a prefill-only node: parts have prefill_adapter_ms, want none")
	}
}

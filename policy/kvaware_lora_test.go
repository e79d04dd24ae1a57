package policy

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestKVAwareInFlightAdaptersFillSlots: an engine whose last scrape shows
// a free adapter slot (max_lora 1, nothing running) has it taken by the
// requests of another adapter kv-aware routed there since: a request for
// a second adapter is priced the wait for the slot there (adapter_slots_full),
// not a load into a free one, and goes to the busier engine whose slot is
// free; once those requests are released, the slot is free again.
func TestKVAwareInFlightAdaptersFillSlots(t *testing.T) {
	cands := []candSpec{
		{ID: "a", MaxLoRA: 1, LoRARunning: []string{}},
		{ID: "b", MaxLoRA: 1, LoRARunning: []string{}, Running: 2, InFlight: 2, InFlightTokens: 2048},
	}
	req := func(id, adapter string) reqSpec {
		return reqSpec{ID: id, Adapter: adapter, PromptTokens: 1024, Blocks: 64, BlockSeed: uint64(len(id))}
	}
	sc := scenario{Policy: NameKVAware, Seed: 1, Steps: []step{
		{Request: req("x1", "x"), Candidates: cands},
		{AtMs: 10, Request: req("y1", "y"), Candidates: cands},
		{AtMs: 20, Release: []string{"x1", "y1"}, Request: req("y2z", "y"), Candidates: cands},
	}}
	ds, err := sc.run()
	if err != nil {
		t.Fatal(err)
	}
	slotFull := func(d kvroute.Decision, ep string) bool {
		for _, s := range d.Scores {
			if s.Endpoint == ep {
				return slices.ContainsFunc(s.Parts, func(p kvroute.Part) bool { return p.Name == "adapter_slots_full" })
			}
		}
		return false
	}
	if got := []string{ds[0].Endpoint, ds[1].Endpoint, ds[2].Endpoint}; !slices.Equal(got, []string{"a", "b", "a"}) {
		t.Errorf("endpoints %v, want [a b a]: %s; %s; %s", got, ds[0].Reason, ds[1].Reason, ds[2].Reason)
	}
	if !slotFull(ds[1], "a") || slotFull(ds[1], "b") || slotFull(ds[2], "a") {
		t.Errorf("slots full: y1 on a %v (want true), on b %v (want false); y2 after the release on a %v (want false)",
			slotFull(ds[1], "a"), slotFull(ds[1], "b"), slotFull(ds[2], "a"))
	}
}

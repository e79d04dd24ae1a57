package disagg

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestPlannerReleasesUndispatchedPrefillPick: when the plan does not send
// the request to the node the prefill picker chose (it runs aggregated on
// the decode node, or no decode node can take it), the prefill picker is
// told at once, so that a picker counting the prefill it placed per node
// (kv-aware) does not charge that node until the request ends.
func TestPlannerReleasesUndispatchedPrefillPick(t *testing.T) {
	p1, _, d1, _ := pool()
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name        string
		decodeDown  bool
		prompt      int
		wantRelease bool
	}{
		{"short prompt runs aggregated on the decode node", false, 64, true},
		{"no decode node", true, 64, true},
		{"long prompt disaggregated", false, 4096, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner := &hearingPicker{Picker: kvroute.PickerFunc(func(_ time.Time, _ *kvroute.Request, cs []kvroute.Candidate) kvroute.Decision {
				return kvroute.Chose("test", cs, 0, "p1")
			})}
			pl, err := NewPlanner(Config{Profile: mustProfile(t, "llama-3.1-8b-h100"), Prefill: inner, Mode: ModeConditional, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			cs := cands(candSpec{ep: p1}, candSpec{ep: d1, down: tc.decodeDown})
			plan := pl.Plan(now, req("r1", tc.prompt, 8), cs)
			var want []string
			if tc.wantRelease {
				want = []string{"r1@p1"}
			}
			if !slices.Equal(inner.releases, want) {
				t.Fatalf("plan %q (disaggregated %v): prefill picker heard releases %v, want %v", plan.Reason, plan.Disaggregated, inner.releases, want)
			}
		})
	}
}

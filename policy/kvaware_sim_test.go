package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// holderCounter wraps kv-aware and counts, for the picks after the first
// skip, how many healthy candidates cache a prefix of the request.
type holderCounter struct {
	*policy.KVAware
	skip, picks, holders int
}

func (h *holderCounter) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	if h.skip > 0 {
		h.skip--
	} else {
		h.picks++
		for _, c := range cands {
			if c.Healthy && c.CachedTokens > 0 {
				h.holders++
			}
		}
	}
	return h.KVAware.Pick(now, req, cands)
}

// TestKVAwareSharedPromptReplicas runs kv-aware through the simulator on
// the shared-system-prompt workload (4 prompts of 6,000 tokens, 8 engines,
// 100 requests/s) and counts the endpoints holding each request's prompt
// over the second half of the run. With the in-flight bound alone each
// prompt stayed on 2 or 3 endpoints (the holders' load could not be moved
// to the others, and p99 TTFT was 5% above round-robin's); a settled hot
// prefix keeps growing its replica set while its holders run above the
// mean and an endpoint without it is idle.
func TestKVAwareSharedPromptReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 80 s of traffic")
	}
	const n = 8000
	w, err := workload.Generate("sysprompt", workload.Options{Seed: 1, Requests: n, Arrivals: workload.Arrivals{Rate: 100}})
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.ParseFleet("8", "llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		params   map[string]any
		min, max float64 // mean holders per pick over the second half
	}{
		{"default", nil, 4.5, 8},
		{"without the settled bound", map[string]any{"hot_slack": 100}, 1, 3.5},
	}
	for _, tt := range tests {
		k, err := policy.NewKVAware(tt.params, 1)
		if err != nil {
			t.Fatal(err)
		}
		h := &holderCounter{KVAware: k, skip: n / 2}
		res, err := sim.Run(context.Background(), sim.Config{Fleet: fleet, Policy: policy.NameKVAware, Picker: h, Seed: 1}, w.Requests)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Row(0).Completed; got != n {
			t.Fatalf("%s: %d of %d requests completed", tt.name, got, n)
		}
		got := float64(h.holders) / float64(h.picks)
		if got < tt.min || got > tt.max {
			t.Errorf("%s: %.2f endpoints hold a request's prompt on average, want %.1f..%.1f", tt.name, got, tt.min, tt.max)
		}
		t.Logf("%s: %.2f holders per pick, p99 TTFT %v", tt.name, got, res.Row(0).TTFT.P99)
	}
}

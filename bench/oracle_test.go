package bench

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

// TestOracleHitRate: the bound is taken over the requests report.Summarize
// counts in hit% (worked by hand: three 32-token prompts with the same two
// blocks; an infinite cache misses the first and hits all of the others),
// and an oracle used for consecutive runs remembers the earlier ones.
func TestOracleHitRate(t *testing.T) {
	same := func(ids ...string) []workload.Request {
		var out []workload.Request
		for _, id := range ids {
			out = append(out, workload.Request{ID: id, PromptLen: 32, OutputLen: 1,
				Segments: []workload.Segment{{Key: 7, Len: 32}}})
		}
		return out
	}
	ok := func(id string, cached int) report.Sample {
		return report.Sample{ID: id, PromptTokens: 32, CachedTokens: cached}
	}
	failed := func(id string) report.Sample { return report.Sample{ID: id, Err: "http_500", CachedTokens: -1} }
	tests := []struct {
		name    string
		reqs    []workload.Request
		samples []report.Sample
		want    float64
	}{
		// All three counted: 64 of 96 tokens.
		{"all counted", same("a", "b", "c"), []report.Sample{ok("c", 32), ok("a", 0), ok("b", 32)}, 64.0 / 96},
		// The cold first request failed: hit% counts b and c only, both
		// hits, so the bound is 1 (over every request sent it was 2/3,
		// below a measured 30/32).
		{"failed cold request", same("a", "b", "c"), []report.Sample{failed("a"), ok("b", 30), ok("c", 32)}, 1},
		// c was never sent (an interrupted run): neither counted nor seen.
		{"unsent", same("a", "b", "c"), []report.Sample{ok("a", 0), ok("b", 32)}, 32.0 / 64},
		// The server reports no cached tokens (hit% unknown): the bound of
		// what was sent.
		{"no cached tokens", same("a", "b"), []report.Sample{ok("a", -1), ok("b", -1)}, 32.0 / 64},
		{"nothing sent", same("a", "b"), nil, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := NewOracle(16).HitRate(tt.reqs, tt.samples)
			if math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("HitRate = %.4f, want %.4f", got, tt.want)
			}
		})
	}

	t.Run("carries over runs", func(t *testing.T) {
		o := NewOracle(16)
		reqs := same("a", "b")
		samples := []report.Sample{ok("a", 0), ok("b", 32)}
		if got, want := o.HitRate(reqs, samples), 0.5; got != want {
			t.Errorf("first run: HitRate = %.4f, want %.4f", got, want)
		}
		// The same requests again against the same server: all cached.
		if got, want := o.HitRate(reqs, samples), 1.0; got != want {
			t.Errorf("second run: HitRate = %.4f, want %.4f", got, want)
		}
	})
}

// TestOracleObserveMatchesWorkloadOracle: the per-request counts add up to
// workload.Oracle's own rate on a generated workload.
func TestOracleObserveMatchesWorkloadOracle(t *testing.T) {
	w, err := workload.Generate("chat", workload.Options{Seed: 3, Requests: 300,
		Params: map[string]float64{"system_len": 100, "user_len": 40, "reply_len": 30, "max_len": 2000}})
	if err != nil {
		t.Fatal(err)
	}
	o := NewOracle(16)
	var hit, prompt int
	for i := range w.Requests {
		h := o.Observe(&w.Requests[i])
		if h < 0 || h > w.Requests[i].PromptLen {
			t.Fatalf("request %d: %d cached of %d tokens", i, h, w.Requests[i].PromptLen)
		}
		hit += h
		prompt += w.Requests[i].PromptLen
	}
	want := w.Stats(16).OracleHitRate
	if got := float64(hit) / float64(prompt); math.Abs(got-want) > 1e-12 || want == 0 {
		t.Errorf("sum of Observe = %.6f of the prompt tokens, workload.Oracle %.6f", got, want)
	}
}

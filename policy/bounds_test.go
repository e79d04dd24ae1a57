package policy

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestNumberParamsBounded: a number param of a score's terms above
// maxNumberParam is refused, naming it. kv-aware took decode_us_per_token
// 1e308: a running endpoint's step was +Inf, its empty queue's zero steps
// of it NaN, and the NaN score tied with nothing, so the tie break drew
// from no candidate and panicked; dynamo's prefill_load_scale 1e308 made
// every cost +Inf and answered "no healthy candidate". At the bound the
// policies still choose, with finite scores.
func TestNumberParamsBounded(t *testing.T) {
	huge := 1e308
	for _, tt := range []struct{ policy, param string }{
		{NameKVAware, "prefill_us_per_token"}, {NameKVAware, "attn_us_per_token_per_ktok"},
		{NameKVAware, "step_overhead_us"}, {NameKVAware, "decode_us_per_token"},
		{NameKVAware, "decode_us_per_ctx_ktok"}, {NameKVAware, "queued_request_ms"},
		{NameKVAware, "inflight_slack"}, {NameKVAware, "tie_ms"}, {NameKVAware, "session_slack_ms"},
		{NameKVAware, "session_tolerance"}, {NameKVAware, "hot_slack"}, {NameKVAware, "work_weight"},
		{NameKVAware, "progress_tok_per_ms"}, {NameKVAware, "work_load_gain"}, {NameKVAware, "decode_weight"},
		{NameDynamo, "prefill_load_scale"}, {NamePrebleE2, "prefill_us_per_token"}, {NamePrebleE2, "tpot_ms"},
	} {
		_, err := New(tt.policy, map[string]any{tt.param: huge}, 1)
		if err == nil || !strings.Contains(err.Error(), `"`+tt.param+`"`) || !strings.Contains(err.Error(), "at most") {
			t.Errorf("%s %s=%v: got error %v, want one naming the param's bound", tt.policy, tt.param, huge, err)
		}
	}

	// Every bounded param at the bound.
	atMax := map[string]map[string]any{NameKVAware: {}, NameDynamo: {"prefill_load_scale": maxNumberParam},
		NamePrebleE2: {"prefill_us_per_token": maxNumberParam, "tpot_ms": maxNumberParam}}
	for _, name := range []string{"prefill_us_per_token", "attn_us_per_token_per_ktok", "step_overhead_us",
		"decode_us_per_token", "decode_us_per_ctx_ktok", "queued_request_ms", "inflight_slack", "tie_ms",
		"session_slack_ms", "session_tolerance", "hot_slack", "work_weight", "progress_tok_per_ms",
		"work_load_gain", "decode_weight"} {
		atMax[NameKVAware][name] = maxNumberParam
	}
	for policy, params := range atMax {
		p, err := New(policy, params, 1)
		if err != nil {
			t.Fatalf("%s at the bounds: %v", policy, err)
		}
		hashes := []uint64{1, 2, 3}
		for i := range 3 {
			cands := []kvroute.Candidate{
				cand("running", kvroute.Load{Running: 3, InFlight: 3, DecodeTokens: 5000}, 0, 0),
				cand("idle", kvroute.Load{}, 0, 0),
				cand("cached", kvroute.Load{Waiting: 2, InFlight: 2, InFlightTokens: 9000}, 3, 3*16),
			}
			req := &kvroute.Request{ID: "r", PromptTokens: 5000, BlockSize: 16, BlockHashes: hashes, SessionKey: "s"}
			d := p.Pick(time.Unix(int64(i)*3600, 0), req, cands)
			if d.Index < 0 {
				t.Fatalf("%s at the bounds: chose nothing: %s", policy, d.Reason)
			}
			for _, s := range d.Scores {
				if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
					t.Errorf("%s at the bounds: %s scored %v", policy, s.Endpoint, s.Value)
				}
			}
			if r, ok := p.(kvroute.Releaser); ok {
				r.Release(time.Unix(int64(i)*3600, 0), req, d.Endpoint)
			}
		}
	}
}

package policy

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

func TestNamesAndNew(t *testing.T) {
	want := []string{"dynamo", "kubeai-chwbl", "kv-aware", "least_request", "llm-d", "power_of_two",
		"preble-e2", "random", "round_robin", "sglang-cache-aware"}
	if got := Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, name := range Names() {
		p, err := New(name, nil, 1)
		if err != nil || p == nil {
			t.Errorf("New(%q) = %v, %v; want a picker", name, p, err)
		}
	}
	if p, err := New("", nil, 1); err != nil {
		t.Errorf("New(\"\") error %v, want the default", err)
	} else if _, ok := p.(*KVAware); !ok {
		t.Errorf("New(\"\") = %T, want *KVAware", p)
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name    string
		policy  string
		params  map[string]any
		wantSub string
	}{
		{"unknown policy", "fastest", nil, `unknown policy "fastest"`},
		{"unknown param", NameKVAware, map[string]any{"cc": 1.5}, `unknown param "cc"`},
		{"baseline takes none", NameRoundRobin, map[string]any{"x": 1}, `unknown param "x"`},
		{"ill-typed number", NameKVAware, map[string]any{"c": "lots"}, `param "c": want a number`},
		{"ill-typed int", NameKVAware, map[string]any{"queue_cap": 1.5}, `param "queue_cap": want an integer`},
		{"ill-typed bool", NameKVAware, map[string]any{"learn": 1}, `param "learn": want a boolean`},
		{"ill-typed string", NameKVAware, map[string]any{"overload": 3}, `param "overload": want a string`},
		{"bad duration", NameKVAware, map[string]any{"pending_ttl": "soon"}, `param "pending_ttl": want a duration`},
		// Seconds a Duration cannot hold were the most negative Duration on
		// amd64 ("must be >= 0, got -2562047h47m16.854775808s").
		{"duration past range", NameKVAware, map[string]any{"hot_settle": 1e10}, `param "hot_settle": want a duration, got 1e+10 seconds`},
		{"duration NaN", NameKVAware, map[string]any{"thrash_horizon": math.NaN()}, `param "thrash_horizon": want a duration`},
		{"duration +Inf", NamePrebleE2, map[string]any{"window": math.Inf(1)}, `param "window": want a duration`},
		{"range c", NameKVAware, map[string]any{"c": 0.5}, `param "c": must be >= 1`},
		{"range overload", NameKVAware, map[string]any{"overload": "drop"}, `param "overload": must be one of`},
		{"range kv_cap", NameKVAware, map[string]any{"kv_cap": 1.5}, `param "kv_cap"`},
		{"range adapter_load", NameKVAware, map[string]any{"adapter_load": "-1ms"}, `param "adapter_load": must be >= 0`},
		{"sglang threshold", NameSGLangCacheAware, map[string]any{"cache_threshold": 2}, `param "cache_threshold"`},
		{"dynamo temperature", NameDynamo, map[string]any{"temperature": -1}, `param "temperature"`},
		{"kubeai factor", NameKubeAICHWBL, map[string]any{"mean_load_factor": 90}, `param "mean_load_factor"`},
		{"llmd weight", NameLLMD, map[string]any{"queue_weight": "two"}, `param "queue_weight"`},
		{"preble window", NamePrebleE2, map[string]any{"window": 0}, `param "window"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.policy, tt.params, 1)
			if err == nil || !strings.Contains(err.Error(), tt.wantSub) {
				t.Fatalf("New(%q, %v) error = %v, want it to contain %q", tt.policy, tt.params, err, tt.wantSub)
			}
		})
	}
}

func TestParamsDecoding(t *testing.T) {
	// Values as YAML (int), JSON (float64, json.Number) and strings decode alike.
	var fromJSON map[string]any
	dec := json.NewDecoder(strings.NewReader(`{"c": 1.5, "queue_cap": 32, "learn": false, "pending_ttl": "30s", "overload": "shed"}`))
	dec.UseNumber()
	if err := dec.Decode(&fromJSON); err != nil {
		t.Fatal(err)
	}
	for _, params := range []map[string]any{
		{"c": 1.5, "queue_cap": 32, "learn": false, "pending_ttl": 30, "overload": "shed"},
		{"c": float32(1.5), "queue_cap": int64(32), "learn": "false", "pending_ttl": "30s", "overload": "shed"},
		fromJSON,
	} {
		k, err := NewKVAware(params, 1)
		if err != nil {
			t.Fatalf("NewKVAware(%v): %v", params, err)
		}
		got := k.Params()
		want := DefaultKVAwareParams()
		want.C, want.QueueCap, want.Learn, want.PendingTTL, want.Overload = 1.5, 32, false, 30*time.Second, OverloadShed
		if got != want {
			t.Errorf("params from %v:\ngot  %+v\nwant %+v", params, got, want)
		}
	}
}

func TestNoCandidates(t *testing.T) {
	req := &kvroute.Request{ID: "r", PromptTokens: 10}
	for _, name := range Names() {
		p, _ := New(name, nil, 1)
		d := p.Pick(epoch, req, nil)
		if d.Index != -1 || d.Endpoint != "" {
			t.Errorf("%s with no candidates chose %d %q, want none", name, d.Index, d.Endpoint)
		}
		d = p.Pick(epoch, req, []kvroute.Candidate{{Endpoint: &kvroute.Endpoint{ID: "x"}}})
		if d.Index != -1 {
			t.Errorf("%s with only unhealthy candidates chose %d, want none", name, d.Index)
		}
		// A nil request or endpoint must not panic.
		d = p.Pick(epoch, nil, []kvroute.Candidate{{Healthy: true}, {Healthy: true, Endpoint: &kvroute.Endpoint{ID: "y"}}})
		if d.Index < 0 {
			t.Errorf("%s with a nil request chose nobody: %s", name, d.Reason)
		}
	}
}

func TestOverloadAction(t *testing.T) {
	over := []kvroute.Candidate{
		{Endpoint: &kvroute.Endpoint{ID: "a"}, Healthy: true, Load: kvroute.Load{Waiting: 300}}, // both over the default queue_cap 256
		{Endpoint: &kvroute.Endpoint{ID: "b"}, Healthy: true, Load: kvroute.Load{Waiting: 270}},
	}
	for _, mode := range []string{OverloadShed, OverloadQueue, OverloadLeastLoaded} {
		k, err := NewKVAware(map[string]any{"overload": mode}, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := k.Pick(epoch, &kvroute.Request{ID: "r", PromptTokens: 100}, over)
		want := mode
		if mode == OverloadLeastLoaded {
			want = ""
		}
		if got := OverloadAction(d); got != want {
			t.Errorf("overload=%s: OverloadAction = %q, want %q (decision %v)", mode, got, want, d)
		}
		if mode == OverloadLeastLoaded && d.Endpoint != "b" {
			t.Errorf("overload=least-loaded chose %q, want the less loaded b", d.Endpoint)
		}
	}
}

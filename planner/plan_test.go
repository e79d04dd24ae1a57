package planner

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/workload"
)

// smallInput is a plan small enough for unit tests: a summary workload of
// about 1200 requests of which the search simulates the first 600.
func smallInput(t testing.TB, rate float64) Input {
	t.Helper()
	return sizedInput(t, rate, 40*time.Second, 600)
}

func sizedInput(t testing.TB, rate float64, d time.Duration, simRequests int) Input {
	t.Helper()
	w, err := Summary{Rate: rate, Duration: d, PromptMean: 800, OutputMean: 60, SharedFraction: 0.5}.Workload(1)
	if err != nil {
		t.Fatal(err)
	}
	return Input{Profile: mustProfile(t, "llama-3.1-8b-h100"), Simulable: true, Workload: w, Seed: 1, SimRequests: simRequests,
		SLO: SLO{TTFT: Target{0.99, 300 * time.Millisecond}, TPOT: Target{0.99, 50 * time.Millisecond}}}
}

// TestPlanMatchesSimulation: the plan's aggregated prediction (from the
// simulated first half of a 3000-request workload) agrees with a simulation of the whole
// workload on the planned fleet with another seed: TTFT at the SLO quantile
// and throughput within 10%.
func TestPlanMatchesSimulation(t *testing.T) {
	for _, rate := range []float64{30, 60, 90, 150} {
		in := sizedInput(t, rate, time.Duration(float64(time.Second)*3000/rate), 1500)
		res, err := Plan(t.Context(), in)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Aggregated.Meets || res.Aggregated.Method != "simulated" {
			t.Fatalf("rate %v: aggregated fleet %+v, want a simulated fleet meeting the SLO", rate, res.Aggregated)
		}
		v, err := Verify(t.Context(), in, res)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("rate %v: %d engines; predicted TTFT p99 %v, %.2f req/s; simulated %v, %.2f req/s (errors %+.1f%%, %+.1f%%)", rate,
			res.Aggregated.Engines, res.Aggregated.TTFT.P99, res.Aggregated.ThroughputRPS, v.TTFT.P99, v.ThroughputRPS, 100*v.TTFTError, 100*v.ThroughputError)
		if v.Requests != len(in.Workload.Requests) || v.Seed == in.Seed {
			t.Errorf("verification ran %d requests with seed %d, want all %d with another seed", v.Requests, v.Seed, len(in.Workload.Requests))
		}
		if math.Abs(v.TTFTError) > 0.10 {
			t.Errorf("rate %v: TTFT p99 predicted %v, simulated %v: error %+.1f%% over 10%%", rate, res.Aggregated.TTFT.AtSLO, v.TTFT.AtSLO, 100*v.TTFTError)
		}
		if math.Abs(v.ThroughputError) > 0.10 {
			t.Errorf("rate %v: throughput predicted %.2f, simulated %.2f: error %+.1f%% over 10%%", rate, res.Aggregated.ThroughputRPS, v.ThroughputRPS, 100*v.ThroughputError)
		}
		if !v.Meets {
			t.Errorf("rate %v: the planned fleet misses the SLO on the whole workload", rate)
		}
	}
}

// TestPlanSearch: the chosen fleet is the smallest simulated one that meets
// the SLO, and the one below it was simulated and misses.
func TestPlanSearch(t *testing.T) {
	res, err := Plan(t.Context(), smallInput(t, 90))
	if err != nil {
		t.Fatal(err)
	}
	n := res.Aggregated.Engines
	byN := map[int]Candidate{}
	for _, c := range res.Candidates {
		byN[c.Engines] = c
		if c.Meets && c.Engines < n {
			t.Errorf("candidate %d meets the SLO but the plan chose %d", c.Engines, n)
		}
	}
	if c, ok := byN[n]; !ok || !c.Meets {
		t.Errorf("chosen fleet %d not among the passing candidates %+v", n, res.Candidates)
	}
	if n > 1 {
		if c, ok := byN[n-1]; !ok || c.Meets {
			t.Errorf("fleet %d (one fewer) not simulated or meets the SLO", n-1)
		}
	}
	if res.Aggregated.NodeLost == nil || res.Aggregated.Burst == nil {
		t.Error("no node-lost or burst headroom")
	}
}

// TestPlanMonotone: more load never needs fewer engines, aggregated
// (simulated) or disaggregated (analytical).
func TestPlanMonotone(t *testing.T) {
	prevA, prevD := 0, 0
	for _, rate := range []float64{20, 60, 120} {
		res, err := Plan(t.Context(), smallInput(t, rate))
		if err != nil {
			t.Fatal(err)
		}
		a, d := res.Aggregated.Engines, res.Disaggregated.Engines
		t.Logf("rate %v: aggregated %d, disaggregated %s", rate, a, res.Disaggregated.Ratio())
		if a < prevA || d < prevD {
			t.Errorf("rate %v: %d aggregated / %d disaggregated engines, fewer than %d / %d at a lower rate", rate, a, d, prevA, prevD)
		}
		prevA, prevD = a, d
	}
	// Twice the prompt: never fewer engines.
	in := smallInput(t, 60)
	base, err := Plan(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	in.Workload, err = WhatIf(in.Workload, "prompt-x2")
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Plan(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Aggregated.Engines < base.Aggregated.Engines || p2.Disaggregated.Engines < base.Disaggregated.Engines {
		t.Errorf("prompt-x2 needs %d / %d engines, fewer than %d / %d", p2.Aggregated.Engines, p2.Disaggregated.Engines,
			base.Aggregated.Engines, base.Disaggregated.Engines)
	}
}

func TestPlanDeterministic(t *testing.T) {
	enc := func() []byte {
		res, err := Plan(t.Context(), smallInput(t, 60))
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := res.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	if a, b := enc(), enc(); !bytes.Equal(a, b) {
		t.Error("two plans with the same seed differ")
	}
}

// TestPlanAnalyticalOnly: a profile from a config.json cannot be simulated;
// the plan is analytical and says so.
func TestPlanAnalyticalOnly(t *testing.T) {
	cfg := []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
		"num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"vocab_size":128256,"torch_dtype":"bfloat16",
		"max_position_embeddings":131072}`)
	p, err := engine.ProfileFromHFConfig(cfg, "a100", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	in := smallInput(t, 30)
	in.Profile, in.Simulable = p, false
	res, err := Plan(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	if res.Aggregated.Method != "analytical" || len(res.Candidates) != 0 || !strings.Contains(res.Simulated, "analytical") {
		t.Errorf("method %q, %d candidates, simulated %q: want analytical, none", res.Aggregated.Method, len(res.Candidates), res.Simulated)
	}
	if _, err := Verify(t.Context(), in, res); err == nil {
		t.Error("Verify of a non-simulable profile succeeded")
	}
}

func TestWriteDir(t *testing.T) {
	res, err := Plan(t.Context(), smallInput(t, 90))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	paths, err := res.WriteDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 6 {
		t.Errorf("wrote %v, want 6 files", paths)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "plan.md"))
	for _, want := range []string{"closed-form bounds", "compute", "memory", "bandwidth", "disaggregated", "![attainment.svg](attainment.svg)"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("plan.md lacks %q", want)
		}
	}
	svg, _ := os.ReadFile(filepath.Join(dir, "attainment.svg"))
	if !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("polyline")) && len(res.Candidates) > 1 {
		t.Errorf("attainment.svg is not a chart:\n%s", svg)
	}
	var back Result
	js, _ := os.ReadFile(filepath.Join(dir, "plan.json"))
	if err := json.Unmarshal(js, &back); err != nil || back.Aggregated.Engines != res.Aggregated.Engines {
		t.Errorf("plan.json: %v, engines %d want %d", err, back.Aggregated.Engines, res.Aggregated.Engines)
	}
	html, _ := os.ReadFile(filepath.Join(dir, "plan.html"))
	if !bytes.Contains(html, []byte("<svg")) || bytes.Contains(html, []byte("<script")) {
		t.Error("plan.html lacks inline charts or has a script")
	}
}

var _ = workload.Poisson

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// planArgs is a small summary-workload plan.
var planArgs = []string{"plan", "--rate", "20", "--prompt-mean", "800", "--output-mean", "60", "--shared-frac", "0.5",
	"--duration", "30s", "--slo-ttft-p99", "300ms", "--slo-tpot-p99", "50ms", "--quiet"}

func TestPlanCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := append(append([]string{}, planArgs...), "--out", dir, "--what-if", "rate-x2,node-lost", "--gpu-hour-cost", "2")
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	for _, want := range []string{"closed-form bounds", "compute", "aggregated", "disaggregated", "prefill:decode",
		"fabric / decode node", "verification:", "kvroute plan [rate-x2]", "what-if node-lost", "cost per hour"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, f := range []string{"plan.json", "plan.md", "plan.html", "attainment.svg", "rate-x2/plan.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
}

func TestPlanCommandJSON(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), append(append([]string{}, planArgs...), "--json", "--verify=false"), &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	var res struct {
		Aggregated struct {
			Engines int  `json:"engines"`
			Meets   bool `json:"meets"`
		} `json:"aggregated"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || !res.Aggregated.Meets || res.Aggregated.Engines < 1 {
		t.Errorf("json: %v, %+v\n%s", err, res, out.String())
	}
}

func TestPlanCommandBadInput(t *testing.T) {
	badConfig := filepath.Join(t.TempDir(), "config.json")
	// A config.json with a field out of range.
	if err := os.WriteFile(badConfig, []byte(`{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":-3,"vocab_size":1000}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"negative rate", []string{"plan", "--rate", "-2", "--prompt-mean", "100", "--output-mean", "10", "--slo-ttft-p99", "1s"}, "rate -2 req/s must be positive"},
		{"no slo", []string{"plan", "--rate", "2", "--prompt-mean", "100", "--output-mean", "10"}, "no SLO"},
		{"two ttft targets", []string{"plan", "--slo-ttft-p99", "1s", "--slo-ttft-p90", "500ms"}, "one --slo-ttft-pNN"},
		{"unknown profile", []string{"plan", "--profile", "gpt-9", "--slo-ttft-p99", "1s"}, `unknown profile "gpt-9"`},
		{"unknown what-if", []string{"plan", "--slo-ttft-p99", "1s", "--what-if", "meteor"}, `unknown what-if "meteor"`},
		{"bad config", []string{"plan", "--hf-config", badConfig, "--slo-ttft-p99", "1s"}, "num_hidden_layers -3 out of range"},
		{"infeasible ttft", []string{"plan", "--slo-ttft-p99", "50ms", "--quiet"}, "TTFT p99 of 50ms is below the prefill time"},
		{"trace and summary", []string{"plan", "--trace", "x.jsonl", "--rate", "1", "--slo-ttft-p99", "1s"}, "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errb)
			if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want one containing %q", err, tc.msg)
			}
		})
	}
}

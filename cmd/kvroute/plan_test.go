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
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/planner"
	"github.com/kvroute/kvroute/sim"
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
		{"zero burst", []string{"plan", "--burst", "0", "--slo-ttft-p99", "1s"}, "--burst 0"},
		{"zero max-engines", []string{"plan", "--max-engines", "0", "--slo-ttft-p99", "1s"}, "--max-engines"},
		{"zero max-util", []string{"plan", "--max-util", "0", "--slo-ttft-p99", "1s"}, "--max-util"},
		{"unknown policy", []string{"plan", "--policy", "nope", "--slo-ttft-p99", "5s"}, "(known: dynamo, kubeai-chwbl, kv-aware"},
		{"summary flag with a trace", []string{"plan", "--duration", "60s", "--slo-ttft-p99", "5s"}, "--duration shapes a summary workload"},
		{"summary flag with a trace file", []string{"plan", "--trace", "x.jsonl", "--shared-frac", "0.5", "--slo-ttft-p99", "5s"}, "--shared-frac shapes a summary workload"},
		{"rate-scale with a summary", []string{"plan", "--rate", "2", "--prompt-mean", "100", "--output-mean", "10", "--rate-scale", "2", "--slo-ttft-p99", "1s"}, "--rate-scale scales a trace"},
		{"tp without hf-config", []string{"plan", "--tp", "4", "--slo-ttft-p99", "1s"}, "--tp applies to --hf-config"},
		{"gpu without hf-config", []string{"plan", "--gpu", "a100", "--slo-ttft-p99", "1s"}, "--gpu applies to --hf-config"},
		{"profile and hf-config", []string{"plan", "--profile", "tiny", "--hf-config", "../../engine/testdata/hf/llama-3.1-8b.json", "--slo-ttft-p99", "1s"}, "not both"},
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

// TestPlanInterruptedShowsNoVerdict: a plan stopped mid-search (Ctrl-C)
// returns the cancellation and does not print the partial search as a plan
// whose fleets fail ("no fleet meets the SLO").
func TestPlanInterruptedShowsNoVerdict(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := sim.DefaultWorkload()
	if err != nil {
		t.Fatal(err)
	}
	w.Limit(0, 1500)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := planner.Input{Profile: prof, Workload: w, SimRequests: 300, ConfirmRequests: 600, Seeds: 1,
		SLO: planner.SLO{TTFT: planner.Target{Quantile: 0.9, Limit: 2 * time.Second}},
		// Stop once the aggregated search of the window is done (its two
		// runs), as Ctrl-C would: the plan then has candidates to show.
		Progress: func(done, total int) {
			if done >= 2 {
				cancel()
			}
		}}
	o := planOptions{quiet: true, verify: true}
	var errb bytes.Buffer
	res, err := o.plans(ctx, in, &errb)
	if !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("plans: got %v, %v; want a cancellation and no result", res, err)
	}
	if s := errb.String(); strings.Contains(s, "meets") || strings.Contains(s, "no plan") {
		t.Errorf("stderr shows a verdict of the interrupted search:\n%s", s)
	}
}

// TestPlanFloorsOnlyForTargets: the latency floors line shows a floor only
// for a target the SLO sets (it printed "TPOT 0" without a TPOT target).
func TestPlanFloorsOnlyForTargets(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"plan", "--rate", "20", "--prompt-mean", "800", "--output-mean", "60", "--duration", "20s", "--slo-ttft-p99", "300ms",
		"--quiet", "--verify=false"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	var line string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "latency floors") {
			line = l
		}
	}
	if !strings.Contains(line, "TTFT at the SLO quantile") || strings.Contains(line, "TPOT") {
		t.Errorf("floors line %q: want the TTFT floor only", line)
	}
}

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
	"github.com/kvroute/kvroute/workload"
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

// TestPlanCommandBadInput: a flag value plan cannot use is a usage error
// (exit status 2, as in the other commands; it was 1) on one line that
// names the flag ("--rate -2", not the planner's "rate -2 req/s"); an SLO
// no fleet can meet is an answer, exit status 1.
func TestPlanCommandBadInput(t *testing.T) {
	badConfig := filepath.Join(t.TempDir(), "config.json")
	// A config.json with a field out of range.
	if err := os.WriteFile(badConfig, []byte(`{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":-3,"vocab_size":1000}`), 0o644); err != nil {
		t.Fatal(err)
	}
	summary := []string{"plan", "--rate", "2", "--prompt-mean", "100", "--output-mean", "10", "--slo-ttft-p99", "1s"}
	quick := append(summary, "--quiet", "--sim-requests", "100", "--confirm-requests", "100", "--verify=false")
	quick = quick[:len(quick):len(quick)] // each case appends to its own copy
	for _, tc := range []struct {
		name  string
		args  []string
		msg   string
		usage bool
	}{
		{"negative rate", []string{"plan", "--rate", "-2", "--prompt-mean", "100", "--output-mean", "10", "--slo-ttft-p99", "1s"}, "--rate -2 must be positive", true},
		{"no prompt mean", []string{"plan", "--rate", "2", "--output-mean", "10", "--slo-ttft-p99", "1s"}, "--prompt-mean 0 must be at least 1 token", true},
		{"shared-frac 1", append(summary, "--shared-frac", "1"), "--shared-frac 1 must be in [0, 1)", true},
		{"max-util 2", []string{"plan", "--max-util", "2", "--slo-ttft-p99", "1s"}, "--max-util 2 must be in (0, 1)", true},
		{"negative kv-capacity", []string{"plan", "--kv-capacity", "-1", "--slo-ttft-p99", "1s"}, "--kv-capacity -1 must not be negative", true},
		// The simulated engines' caches took the memory: the runtime's
		// "fatal error: out of memory" and a stack trace.
		{"huge kv-capacity", append(quick, "--kv-capacity", "2000000000000"), "--kv-capacity 2000000000000 must be at most 268435440 tokens", true},
		// The planner's own check named its field ("kv capacity 8 tokens
		// is below one block"), not the flag.
		{"kv-capacity below a block", append(quick, "--kv-capacity", "8"), "--kv-capacity 8 must be at least one block of the profile (16 tokens)", true},
		{"pd-mode never", []string{"plan", "--pd-mode", "never", "--slo-ttft-p99", "1s"}, `--pd-mode "never" is not one of conditional, always`, true},
		{"seeds 17", []string{"plan", "--seeds", "17", "--slo-ttft-p99", "1s"}, "--seeds 17 must be in 1..16", true},
		// A scale stretching the trace past the clock is the flag's value,
		// not a failure (it was exit status 1).
		{"rate-scale past the clock", []string{"plan", "--rate-scale", "1e-300", "--slo-ttft-p99", "1s"}, "--rate-scale: workload: rate scale 1e-300 would stretch", true},
		{"no slo", []string{"plan", "--rate", "2", "--prompt-mean", "100", "--output-mean", "10"}, "no SLO", true},
		{"two ttft targets", []string{"plan", "--slo-ttft-p99", "1s", "--slo-ttft-p90", "500ms"}, "one --slo-ttft-pNN", true},
		{"unknown profile", []string{"plan", "--profile", "gpt-9", "--slo-ttft-p99", "1s"}, `--profile: unknown profile "gpt-9"`, true},
		{"unknown what-if", []string{"plan", "--slo-ttft-p99", "1s", "--what-if", "meteor"}, `--what-if "meteor" is not one of rate-x2, prompt-x2, node-lost`, true},
		{"bad config", []string{"plan", "--hf-config", badConfig, "--slo-ttft-p99", "1s"}, "num_hidden_layers -3 out of range", true},
		{"trace and summary", []string{"plan", "--trace", "x.jsonl", "--rate", "1", "--slo-ttft-p99", "1s"}, "not both", true},
		{"zero burst", []string{"plan", "--burst", "0", "--slo-ttft-p99", "1s"}, "--burst 0", true},
		{"zero max-engines", []string{"plan", "--max-engines", "0", "--slo-ttft-p99", "1s"}, "--max-engines", true},
		{"zero max-util", []string{"plan", "--max-util", "0", "--slo-ttft-p99", "1s"}, "--max-util", true},
		{"unknown policy", []string{"plan", "--policy", "nope", "--slo-ttft-p99", "5s"}, "(known: dynamo, kubeai-chwbl, kv-aware", true},
		{"summary flag with a trace", []string{"plan", "--duration", "60s", "--slo-ttft-p99", "5s"}, "--duration shapes a summary workload", true},
		{"summary flag with a trace file", []string{"plan", "--trace", "x.jsonl", "--shared-frac", "0.5", "--slo-ttft-p99", "5s"}, "--shared-frac shapes a summary workload", true},
		{"rate-scale with a summary", append(summary, "--rate-scale", "2"), "--rate-scale scales a trace", true},
		// Beyond what the arrivals model (was: planned a burst of 3408
		// requests within 2us as 1.7e9 req/s, exit status 0; at CV 1000
		// 129127 requests within 2ms; --rate-scale inf an exit status 1
		// naming the workload's "rate scale").
		{"rate above 1e6", []string{"plan", "--rate", "1e9", "--prompt-mean", "100", "--output-mean", "10", "--slo-ttft-p99", "1s"}, "--rate 1e+09 must be at most 1e+06", true},
		{"arrival-cv above 100", append(summary, "--arrival-cv", "1000"), "--arrival-cv 1000 must be at most 100", true},
		{"rate-scale inf", []string{"plan", "--rate-scale", "inf", "--slo-ttft-p99", "1s"}, "--rate-scale +Inf must be positive and at most 1e9", true},
		{"tp without hf-config", []string{"plan", "--tp", "4", "--slo-ttft-p99", "1s"}, "kvroute plan: --tp applies to --hf-config", true},
		{"gpu without hf-config", []string{"plan", "--gpu", "a100", "--slo-ttft-p99", "1s"}, "kvroute plan: --gpu applies to --hf-config", true},
		{"profile and hf-config", []string{"plan", "--profile", "tiny", "--hf-config", "../../engine/testdata/hf/llama-3.1-8b.json", "--slo-ttft-p99", "1s"}, "not both", true},
		{"infeasible ttft", []string{"plan", "--slo-ttft-p99", "50ms", "--quiet"}, "TTFT p99 of 50ms is below the prefill time", false},
		// A zero the summary reads as its default (was: planned as Poisson
		// arrivals, lengths of CV 1, 32768 tokens, 8 prefixes).
		{"zero arrival-cv", append(quick, "--arrival-cv", "0"), "--arrival-cv 0 must be positive (0 reads as the default 1", true},
		{"zero prompt-cv", append(quick, "--prompt-cv", "0"), "--prompt-cv 0 must be positive (0 reads as the default 1)", true},
		{"zero output-cv", append(quick, "--output-cv", "0"), "--output-cv 0 must be positive (0 reads as the default 1)", true},
		{"zero max-len", append(quick, "--max-len", "0"), "--max-len 0 must be positive", true},
		{"zero hot-prefixes", append(quick, "--shared-frac", "0.5", "--hot-prefixes", "0"), "--hot-prefixes 0 must be at least 1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errb)
			switch {
			case tc.usage && (!errors.Is(err, errUsage) || !strings.Contains(errb.String(), tc.msg) || strings.Count(errb.String(), "\n") != 1):
				t.Errorf("got %v, stderr %q; want a usage error, one line containing %q", err, errb.String(), tc.msg)
			case !tc.usage && (err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.msg)):
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

// TestPlanWhatIfInterrupted: Ctrl-C during a what-if stops the command with
// the interruption (exit status 130), as during the baseline; it printed
// the cut-short what-if as a plan ("no fleet meets") and exited 0. A
// what-if no fleet meets is still an answer.
func TestPlanWhatIfInterrupted(t *testing.T) {
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	w, err := planner.Summary{Rate: 5, Duration: 20 * time.Second, PromptMean: 300, OutputMean: 20, MaxLen: 1000}.Workload(1)
	if err != nil {
		t.Fatal(err)
	}
	in := planner.Input{Profile: prof, Workload: w, SimRequests: 50, ConfirmRequests: 50, Seeds: 1,
		SLO: planner.SLO{TTFT: planner.Target{Quantile: 0.99, Limit: 2 * time.Second}}}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := planWhatIf(ctx, in, "rate-x2"); !errors.Is(err, context.Canceled) {
		t.Errorf("interrupted what-if: got %v (result %v), want the cancellation", err, r != nil)
	}

	// Twice the prompts exceed the profile's 1024-token model length.
	r, err := planWhatIf(context.Background(), in, "prompt-x2")
	if err != nil || r == nil || r.Name != "prompt-x2" || !strings.Contains(r.Error, "SLO cannot be met") {
		t.Errorf("infeasible what-if: got %v, %+v; want a result that says why", err, r)
	}
}

// TestPlanAdapterFlags: --adapters, --adapter-skew and --max-loras are
// checked as the other flags are (a usage error naming the flag, exit
// status 2): out of range, with a trace (no summary to give adapters to),
// a skew without adapters, and slots for a workload naming no adapter.
func TestPlanAdapterFlags(t *testing.T) {
	summary := []string{"plan", "--rate", "2", "--prompt-mean", "100", "--output-mean", "10", "--slo-ttft-p99", "1s", "--quiet"}
	with := func(a ...string) []string { return append(append([]string{}, summary...), a...) }
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"negative adapters", with("--adapters", "-1"), "--adapters -1 must be in 0..10000"},
		{"too many adapters", with("--adapters", "10001"), "--adapters 10001 must be in 0..10000"},
		{"adapters with a trace", []string{"plan", "--adapters", "4", "--slo-ttft-p99", "1s"}, "--adapters shapes a summary workload"},
		{"adapters with a trace file", []string{"plan", "--trace", "x.jsonl", "--adapters", "4", "--slo-ttft-p99", "1s"}, "a Mooncake trace names none"},
		{"negative adapter-skew", with("--adapters", "4", "--adapter-skew", "-1"), "--adapter-skew -1 must be in [0, 100]"},
		{"nan adapter-skew", with("--adapters", "4", "--adapter-skew", "NaN"), "--adapter-skew NaN must be in [0, 100]"},
		{"adapter-skew without adapters", with("--adapter-skew", "2"), "--adapter-skew shapes the adapters' shares: give --adapters N too"},
		{"adapter-skew with a trace", []string{"plan", "--adapter-skew", "2", "--slo-ttft-p99", "1s"}, "--adapter-skew shapes a summary workload"},
		{"zero max-loras", with("--adapters", "4", "--max-loras", "0"), "--max-loras 0 must be at least 1"},
		{"max-loras without adapters", with("--max-loras", "4"), "--max-loras matters only to a workload whose requests name LoRA adapters"},
		{"max-loras with the mooncake trace", []string{"plan", "--max-loras", "2", "--slo-ttft-p99", "5s", "--quiet"}, "--max-loras matters only to a workload whose requests name LoRA adapters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errb)
			if !errors.Is(err, errUsage) || !strings.Contains(errb.String(), tc.msg) || strings.Count(errb.String(), "\n") != 1 {
				t.Errorf("got %v, stderr %q; want a usage error, one line containing %q", err, errb.String(), tc.msg)
			}
		})
	}
}

// TestPlanAdaptersCommand: a summary with adapters plans with them (the
// workload, the slots and the slots bound in the table and the JSON), and
// the same --seed prints the same plan.
func TestPlanAdaptersCommand(t *testing.T) {
	args := []string{"plan", "--rate", "10", "--prompt-mean", "1000", "--output-mean", "200", "--duration", "30s", "--adapters", "4",
		"--max-loras", "2", "--slo-ttft-p99", "2s", "--sim-requests", "300", "--confirm-requests", "300", "--seeds", "1", "--verify=false", "--quiet", "--seed", "7"}
	plan := func(extra ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if err := run(context.Background(), append(append([]string{}, args...), extra...), &out, &errb); err != nil {
			t.Fatalf("run: %v\nstderr: %s", err, errb.String())
		}
		return out.String()
	}
	table := plan()
	for _, want := range []string{"adapters=4, adapter-skew=1", "engines batch at most 2 adapters a step (--max-loras 2)", "  slots ", "/ 2 slots per engine"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	a, b := plan("--json"), plan("--json", "--parallel", "1")
	if a != b {
		t.Error("two plans with --seed 7 differ")
	}
	var res struct {
		MaxLoRAs int `json:"max_loras"`
		Demand   struct {
			Adapters int `json:"adapters"`
		} `json:"demand"`
		Bounds struct {
			Slots *struct {
				Need int `json:"need"`
			} `json:"slots"`
		} `json:"bounds"`
	}
	if err := json.Unmarshal([]byte(a), &res); err != nil || res.MaxLoRAs != 2 || res.Demand.Adapters != 4 || res.Bounds.Slots == nil {
		t.Errorf("json: %v, %+v", err, res)
	}
}

// TestPlanSeedsZero: --seeds 0 on the command line is a usage error (its
// default, 2 or 4 with adapters, is the flag left out).
func TestPlanSeedsZero(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"plan", "--seeds", "0", "--slo-ttft-p99", "1s"}, &out, &errb)
	if !errors.Is(err, errUsage) || !strings.Contains(errb.String(), "--seeds 0 must be in 1..16") {
		t.Errorf("got %v, stderr %q; want a usage error naming --seeds 0", err, errb.String())
	}
}

// TestPlanTraceAdapters: a trace whose requests name adapters (its adapter
// field) is planned with them and --max-loras: the lora workload written
// as a trace.
func TestPlanTraceAdapters(t *testing.T) {
	w, err := workload.Generate("lora", workload.Options{Seed: 1, Requests: 300,
		Arrivals: workload.Arrivals{Kind: workload.Poisson, Rate: 10}, Params: map[string]float64{"adapters": 3}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lora.jsonl")
	if err := workload.WriteTraceFile(path, w.Requests); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := []string{"plan", "--trace", path, "--max-loras", "2", "--slo-ttft-p99", "2s", "--seeds", "1", "--verify=false", "--quiet"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	for _, want := range []string{"one of 3 adapters; engines batch at most 2 adapters a step (--max-loras 2)", "  slots "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

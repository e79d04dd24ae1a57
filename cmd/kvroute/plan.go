package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/planner"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// maxPlanKVTokens bounds --kv-capacity: the simulated engines hold their
// caches in blocks, at most maxEngineKVBlocks of 16 tokens, as kvroute
// engine's --kv-blocks, one of them vLLM's null block.
const maxPlanKVTokens = (maxEngineKVBlocks - 1) * 16

func init() {
	register(command{name: "plan", summary: "capacity planning: the cheapest fleet meeting TTFT/TPOT SLOs, aggregated vs disaggregated", run: runPlan})
}

const planDescription = `Plan the cheapest fleet that meets latency SLOs for a workload, aggregated and
disaggregated (prefill:decode) side by side, with the same engine cost model,
routing policy, P/D placement and simulator that kvroute serve and kvroute sim run.

Method: closed-form bounds first (compute: prefill and decode tokens/s per engine
from the cost model against the demand after the oracle hit rate; memory: the KV
working set by Little's law against one engine's capacity; bandwidth: KV handoff
bytes/s per decode node), each printed with its arithmetic. Then a search with
the simulator on a window of the workload (--sim-requests): aggregated fleet
sizes from the bound (doubling up, then bisecting; stepping down if the bound
already passes), and prefill:decode fleets in the simulator's P/D mode (the
router's disagg placement, KV handoffs over a --fabric-gbps fabric with
queueing) from the analytical P:D estimate (growing the pool the misses point
at, then shrinking each pool). The chosen fleets are confirmed on the whole
workload (--confirm-requests) with --seeds seeds: the predicted TTFT, TPOT,
throughput and fabric bandwidth (total, and mean/p99/max per decode node) are
their mean, their spread is shown, and a smaller fleet that passes there is
taken instead (an aggregated one never below the bound). The analytical model's fleets are printed next to the simulated
ones. Utilisation, in both, is each engine's busy time over the wall time (first
arrival to last request's end), per pool for prefill:decode fleets and the mean
over the engines for the fleet; --max-util is the load the analytical estimates
plan for, not that figure. --verify re-simulates the whole workload on each planned fleet with a
seed the plan did not use and prints predicted vs simulated TTFT p90/p99 and
throughput.

Model: --profile NAME (` + "%s" + `), or --hf-config config.json with
--gpu, --tp and --dtype (simulated the same way). Workload: --trace FILE
(Mooncake JSONL; default the embedded conversation trace), or a summary: --rate
with --prompt-mean, --output-mean and optionally --shared-frac, --hot-prefixes,
--zipf, CVs and --duration.

LoRA: --adapters N makes a summary's requests name LoRA adapters adapter-0 to
adapter-N-1 of the base model, adapter i's share proportional to
1/(i+1)^--adapter-skew (the law of kvroute sim's lora workload); each adapter
has its own --hot-prefixes shared prefixes (with --hot-prefixes 1, one system
prompt each, as in the lora workload), none cached across adapters. A trace's
requests keep the adapters its adapter field names (a Mooncake trace names
none); --adapters with --trace is refused. --max-loras M (vLLM's, default 1)
is the distinct adapters one engine step may batch: the simulated engines
enforce it (a request of another adapter waits for a slot), the kv-aware
policy prices the slots as in kvroute sim, and the bounds add "slots": the
adapters that must run at once to meet the TTFT target, from the stretch each
request surely runs (from arrival + TTFT limit - its prefill floor to arrival
+ prefill floor + its decode steps at one sequence's speed), over M per engine
(with no TTFT target there is none).

SLO: --slo-ttft-pNN and --slo-tpot-pNN (NN = 50, 90, 95 or 99), e.g.
--slo-ttft-p99 2s --slo-tpot-p99 100ms. What-ifs: --what-if
rate-x2,prompt-x2,node-lost. Deterministic for --seed (whatever --parallel).
--json prints JSON; --out DIR writes plan.json, plan.txt, plan.md, plan.html and
SVG charts (SLO attainment against fleet size). Ctrl-C stops planning (exit
status 130) without a plan: a search cut short has no answer. Exit status 2 on
a bad flag value, 1 when no fleet meets the SLO (the search is printed) or the
trace cannot be read.`

type planOptions struct {
	profile     string
	hf          hfModel
	kvCapacity  int
	fabricGbps  float64
	fabricSetup time.Duration

	trace                                                  string
	rateScale                                              float64
	rate, promptMean, promptCV, outputMean, outputCV, zipf float64
	sharedFrac, arrivalCV                                  float64
	hotPrefixes, maxLen                                    int
	duration                                               time.Duration
	adapters, maxLoRAs                                     int
	adapterSkew                                            float64

	ttft, tpot map[string]*time.Duration

	gpuCost, burst, maxUtil float64
	seed                    uint64
	policy                  string
	maxEngines, simRequests int
	confirmRequests, seeds  int
	parallel                int
	pdMode                  string
	whatIf                  stringList
	verify                  bool
	json                    bool
	out                     string
	quiet                   bool
	given                   func(flag string) bool // whether the flag was on the command line; nil = none was
}

// summaryFlags shape a summary workload; a trace ignores them.
var summaryFlags = []string{"prompt-cv", "output-cv", "shared-frac", "hot-prefixes", "zipf", "arrival-cv", "max-len", "duration", "adapter-skew"}

var sloQuantiles = []string{"50", "90", "95", "99"}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", "[--profile NAME | --hf-config FILE] [--trace FILE | --rate R ...] --slo-ttft-p99 D [flags]",
		fmt.Sprintf(planDescription, strings.Join(engine.ProfileNames(), ", ")), stdout, stderr)
	o := planOptions{ttft: map[string]*time.Duration{}, tpot: map[string]*time.Duration{}}
	fs.StringVar(&o.profile, "profile", "llama-3.1-8b-h100", "engine profile `name`")
	o.hf.register(fs, "the model (instead of --profile; simulated like a built-in profile)")
	fs.IntVar(&o.kvCapacity, "kv-capacity", 0, "override one engine's KV capacity in `tokens`, at most 268435440 (default: derived from memory, less vLLM's null block)")
	fs.Float64Var(&o.fabricGbps, "fabric-gbps", disagg.RDMAGbps, "fabric bandwidth per decode node for KV handoffs, Gbps")
	fs.DurationVar(&o.fabricSetup, "fabric-setup", time.Millisecond, "fixed cost of one KV handoff")
	fs.StringVar(&o.trace, "trace", "", "Mooncake JSONL trace `file` (default: the embedded conversation trace)")
	fs.Float64Var(&o.rateScale, "rate-scale", 1, "multiply the trace's arrival rate by `X`")
	fs.Float64Var(&o.rate, "rate", 0, "summary workload: requests per second (instead of a trace)")
	fs.Float64Var(&o.promptMean, "prompt-mean", 0, "summary: mean prompt tokens")
	fs.Float64Var(&o.promptCV, "prompt-cv", 1, "summary: prompt length coefficient of variation (lognormal)")
	fs.Float64Var(&o.outputMean, "output-mean", 0, "summary: mean output tokens")
	fs.Float64Var(&o.outputCV, "output-cv", 1, "summary: output length coefficient of variation (lognormal)")
	fs.Float64Var(&o.sharedFrac, "shared-frac", 0, "summary: fraction of prompt tokens in shared prefixes, in [0, 1)")
	fs.IntVar(&o.hotPrefixes, "hot-prefixes", 8, "summary: number of distinct shared prefixes")
	fs.Float64Var(&o.zipf, "zipf", 1, "summary: popularity exponent over the shared prefixes (0 = uniform)")
	fs.Float64Var(&o.arrivalCV, "arrival-cv", 1, "summary: inter-arrival coefficient of variation (1 = Poisson)")
	fs.IntVar(&o.maxLen, "max-len", 32768, "summary: cap on prompt + output tokens")
	fs.DurationVar(&o.duration, "duration", 0, "summary: span of the generated stream (default: 2000 requests; at most 1,000,000 requests at --rate)")
	fs.IntVar(&o.adapters, "adapters", 0, "summary: LoRA adapters the requests are for, adapter-0..adapter-N-1 as in sim's lora workload, each with its own hot prefixes (0 = the base model only)")
	fs.Float64Var(&o.adapterSkew, "adapter-skew", 1, "summary, with --adapters: adapter i's share is proportional to 1/(i+1)^X (the lora workload's law; 0 = uniform)")
	fs.IntVar(&o.maxLoRAs, "max-loras", sim.DefaultMaxLoRAs, "LoRA adapters one engine step may batch (vLLM's --max-loras), for a workload whose requests name adapters (--adapters, or a trace's adapter field)")
	for _, q := range sloQuantiles {
		o.ttft[q], o.tpot[q] = new(time.Duration), new(time.Duration)
		fs.DurationVar(o.ttft[q], "slo-ttft-p"+q, 0, "SLO: p"+q+" time to first token limit")
		fs.DurationVar(o.tpot[q], "slo-tpot-p"+q, 0, "SLO: p"+q+" time per output token limit")
	}
	fs.Float64Var(&o.gpuCost, "gpu-hour-cost", 0, "price of one GPU-hour (0 = report GPUs only)")
	fs.Float64Var(&o.burst, "burst", 1.5, "report the headroom left for this rate factor")
	fs.Float64Var(&o.maxUtil, "max-util", 0.85, "target utilisation of the analytical estimates and the fabric")
	fs.Uint64Var(&o.seed, "seed", 1, "seed for the simulator, the policy and summary workloads")
	fs.StringVar(&o.policy, "policy", "", "routing policy simulated (default kv-aware)")
	fs.IntVar(&o.maxEngines, "max-engines", 512, "largest fleet considered")
	fs.IntVar(&o.simRequests, "sim-requests", 2500, "requests simulated per candidate fleet of the search (the workload's first ones; -1 = all)")
	fs.IntVar(&o.confirmRequests, "confirm-requests", 20000, "requests of the runs confirming the chosen fleets (the workload's first ones; -1 = all)")
	fs.IntVar(&o.seeds, "seeds", 0, "seeds the chosen fleets are confirmed with (the prediction is their mean; the spread is shown; default 2, 4 when requests name LoRA adapters)")
	fs.StringVar(&o.pdMode, "pd-mode", "conditional", "how the disaggregated fleet's router splits requests: conditional (as kvroute serve) or always")
	fs.IntVar(&o.parallel, "parallel", 0, "simulations run at once (default GOMAXPROCS; the plan does not depend on it)")
	fs.Var(&o.whatIf, "what-if", "what-if `scenarios`: rate-x2, prompt-x2, node-lost (comma-separated or repeated; default none)")
	fs.BoolVar(&o.verify, "verify", true, "re-simulate the whole workload on the planned fleets with a seed the plan did not use (--verify=false skips it)")
	fs.BoolVar(&o.json, "json", false, "print the plan as JSON")
	fs.StringVar(&o.out, "out", "", "write plan.json, plan.txt, plan.md, plan.html and SVG charts into `dir`")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress bar or timing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	o.given = func(name string) bool { return flagSet(fs, name) }
	in, err := o.input()
	for _, w := range o.whatIf {
		if err == nil && w != "rate-x2" && w != "prompt-x2" && w != "node-lost" {
			err = planFlagErrorf("--what-if %q is not one of rate-x2, prompt-x2, node-lost", w)
		}
	}
	var fe *planFlagError
	if errors.As(err, &fe) {
		fmt.Fprintf(stderr, "kvroute plan: %s\n", fe.msg)
		return errUsage
	}
	if err != nil {
		return err
	}
	if o.out != "" {
		// Before planning, not after it: an unwritable --out would lose the plan.
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return fmt.Errorf("plan: --out: %w", err)
		}
	}
	start := time.Now()
	results, err := o.plans(ctx, in, stderr)
	if errors.Is(err, planner.ErrBadInput) { // one the flag checks missed: still the flags'
		fmt.Fprintf(stderr, "kvroute %v\n", err)
		return errUsage
	}
	if err != nil {
		return err
	}
	if o.json {
		if len(results) == 1 {
			if err := results[0].WriteJSON(stdout); err != nil {
				return err
			}
		} else if err := writeJSONList(stdout, results); err != nil {
			return err
		}
	} else {
		for i, r := range results {
			if i > 0 {
				fmt.Fprintln(stdout, "\n"+strings.Repeat("=", 100))
			}
			if err := r.WriteTable(stdout); err != nil {
				return err
			}
		}
		if slicesContains(o.whatIf, "node-lost") {
			writeNodeLost(stdout, results[0])
		}
	}
	if o.out != "" {
		for _, r := range results {
			dir := o.out
			if r.Name != "baseline" {
				dir += "/" + r.Name
			}
			paths, err := r.WriteDir(dir)
			if err != nil {
				return err
			}
			if !o.quiet {
				fmt.Fprintf(stderr, "wrote %s\n", strings.Join(paths, ", "))
			}
		}
	}
	if !o.quiet {
		fmt.Fprintf(stderr, "planned in %s\n", time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func writeJSONList(w io.Writer, rs []*planner.Result) error {
	if _, err := io.WriteString(w, "[\n"); err != nil {
		return err
	}
	for i, r := range rs {
		if i > 0 {
			io.WriteString(w, ",\n")
		}
		if err := r.WriteJSON(w); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "]\n")
	return err
}

// writeNodeLost answers the node-lost what-if: the fleets that still meet the
// SLO after losing one engine.
func writeNodeLost(w io.Writer, r *planner.Result) {
	fmt.Fprintln(w, "\nwhat-if node-lost:")
	a, d := r.Aggregated, r.Disaggregated
	if a.Meets && a.NodeLost != nil {
		n := a.Engines
		if !a.NodeLost.Meets {
			n++
		}
		fmt.Fprintf(w, "  aggregated: %d engines leave %d after a loss (meets SLO: %v); to survive one lost node plan %d engines (%d GPUs)\n",
			a.Engines, a.Engines-1, a.NodeLost.Meets, n, n*r.TP)
	}
	if d.Meets && d.NodeLost != nil {
		p, dn := d.Prefill, d.Decode
		if !d.NodeLost.Meets {
			if strings.Contains(d.NodeLost.Note, "decode") {
				dn++
			} else {
				p++
			}
		}
		fmt.Fprintf(w, "  disaggregated: %s with %s (meets SLO: %v); to survive one lost node plan %d:%d (%d GPUs)\n",
			d.Ratio(), d.NodeLost.Note, d.NodeLost.Meets, p, dn, (p+dn)*r.TP)
	}
}

// input builds the planner input from the flags.
func (o *planOptions) input() (planner.Input, error) {
	var in planner.Input
	switch p, ok, err := o.hf.profile(); {
	case err != nil:
		return in, planFlagErrorf("%s", hfUsage(err))
	case ok:
		in.Profile = p
	default:
		p, err := engine.LookupProfile(o.profile)
		if err != nil {
			return in, planFlagErrorf("--profile: unknown profile %q (known: %s; or give --hf-config)", o.profile, strings.Join(engine.ProfileNames(), ", "))
		}
		in.Profile = p
	}
	in.KVCapacityTokens = o.kvCapacity
	in.MaxLoRAs = o.maxLoRAs
	if err := o.checkFlags(); err != nil {
		return in, err
	}
	if o.kvCapacity > 0 && o.kvCapacity < in.Profile.BlockSize {
		return in, planFlagErrorf("--kv-capacity %d must be at least one block of the profile (%d tokens)", o.kvCapacity, in.Profile.BlockSize)
	}
	in.Fabric = disagg.Link{Name: "fabric", Gbps: o.fabricGbps, Setup: o.fabricSetup}
	var err error
	in.Workload, err = o.workload()
	if err != nil {
		return in, err
	}
	if o.given != nil && o.given("max-loras") && !slices.ContainsFunc(in.Workload.Requests, func(r workload.Request) bool { return r.Adapter != "" }) {
		return in, planFlagErrorf("--max-loras matters only to a workload whose requests name LoRA adapters: give --adapters N with a summary (a trace names them in its adapter field; a Mooncake trace names none)")
	}
	for _, x := range []struct {
		name string
		m    map[string]*time.Duration
		t    *planner.Target
	}{{"ttft", o.ttft, &in.SLO.TTFT}, {"tpot", o.tpot, &in.SLO.TPOT}} {
		for _, q := range sloQuantiles {
			v := *x.m[q]
			if v == 0 {
				continue
			}
			if v < 0 {
				return in, planFlagErrorf("--slo-%s-p%s %v is negative", x.name, q, v)
			}
			if x.t.Set() {
				return in, planFlagErrorf("give one --slo-%s-pNN target, not several", x.name)
			}
			qq := map[string]float64{"50": 0.5, "90": 0.9, "95": 0.95, "99": 0.99}[q]
			*x.t = planner.Target{Quantile: qq, Limit: v}
		}
	}
	if !in.SLO.TTFT.Set() && !in.SLO.TPOT.Set() {
		return in, planFlagErrorf("no SLO: give --slo-ttft-pNN and/or --slo-tpot-pNN (e.g. --slo-ttft-p99 2s --slo-tpot-p99 100ms)")
	}
	in.GPUHourCost, in.Burst, in.MaxUtilisation = o.gpuCost, o.burst, o.maxUtil
	in.Seed, in.Policy, in.MaxEngines, in.SimRequests = o.seed, o.policy, o.maxEngines, o.simRequests
	in.ConfirmRequests, in.Seeds, in.PDMode, in.Parallel = o.confirmRequests, o.seeds, disagg.Mode(o.pdMode), o.parallel
	return in, nil
}

// planFlagError is a flag value plan cannot use: a usage error (exit
// status 2) whose message names the flag.
type planFlagError struct{ msg string }

func (e *planFlagError) Error() string { return "plan: " + e.msg }

func planFlagErrorf(format string, a ...any) error {
	return &planFlagError{fmt.Sprintf(format, a...)}
}

// checkFlags checks the flags planner.Input and planner.Summary would
// refuse (naming their fields, not the flags) or read as "the default": a
// zero given on the command line is a mistake, not a request for the
// default.
func (o *planOptions) checkFlags() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	summary := o.rate != 0 || o.promptMean != 0 || o.outputMean != 0
	switch {
	case summary && o.trace != "":
		return planFlagErrorf("give --trace or a summary (--rate, --prompt-mean, --output-mean), not both")
	case !finite(o.fabricGbps) || o.fabricGbps <= 0:
		return planFlagErrorf("--fabric-gbps %v must be positive", o.fabricGbps)
	case o.fabricSetup < 0:
		return planFlagErrorf("--fabric-setup %v must not be negative", o.fabricSetup)
	case o.kvCapacity < 0:
		return planFlagErrorf("--kv-capacity %d must not be negative (0 = derived from memory)", o.kvCapacity)
	case o.kvCapacity > maxPlanKVTokens: // 2e12 ended in the runtime's "fatal error: out of memory"
		return planFlagErrorf("--kv-capacity %d must be at most %d tokens", o.kvCapacity, maxPlanKVTokens)
	case summary && (!finite(o.rate) || o.rate <= 0):
		return planFlagErrorf("--rate %v must be positive", o.rate)
	case summary && o.rate > workload.MaxRate:
		return planFlagErrorf("--rate %v must be at most %g (arrival times are whole nanoseconds)", o.rate, float64(workload.MaxRate))
	case summary && (!finite(o.promptMean) || o.promptMean < 1):
		return planFlagErrorf("--prompt-mean %v must be at least 1 token", o.promptMean)
	case summary && (!finite(o.outputMean) || o.outputMean < 1):
		return planFlagErrorf("--output-mean %v must be at least 1 token", o.outputMean)
	case !finite(o.sharedFrac) || o.sharedFrac < 0 || o.sharedFrac >= 1:
		return planFlagErrorf("--shared-frac %v must be in [0, 1)", o.sharedFrac)
	case !finite(o.promptCV) || o.promptCV < 0:
		return planFlagErrorf("--prompt-cv %v must not be negative", o.promptCV)
	case o.promptCV == 0: // planner.Summary's zero value is its default (the flag's is 1)
		return planFlagErrorf("--prompt-cv 0 must be positive (0 reads as the default 1)")
	case !finite(o.outputCV) || o.outputCV < 0:
		return planFlagErrorf("--output-cv %v must not be negative", o.outputCV)
	case o.outputCV == 0:
		return planFlagErrorf("--output-cv 0 must be positive (0 reads as the default 1)")
	case !finite(o.arrivalCV) || o.arrivalCV < 0:
		return planFlagErrorf("--arrival-cv %v must not be negative", o.arrivalCV)
	case o.arrivalCV == 0:
		return planFlagErrorf("--arrival-cv 0 must be positive (0 reads as the default 1, Poisson)")
	case o.arrivalCV > 100:
		return planFlagErrorf("--arrival-cv %v must be at most 100", o.arrivalCV)
	case !finite(o.zipf) || o.zipf < 0:
		return planFlagErrorf("--zipf %v must not be negative", o.zipf)
	case o.hotPrefixes < 0:
		return planFlagErrorf("--hot-prefixes %d must not be negative", o.hotPrefixes)
	case o.hotPrefixes == 0 && o.sharedFrac > 0:
		return planFlagErrorf("--hot-prefixes 0 must be at least 1 with --shared-frac %v (0 reads as the default 8)", o.sharedFrac)
	case o.maxLen < 0:
		return planFlagErrorf("--max-len %d must not be negative", o.maxLen)
	case o.maxLen == 0:
		return planFlagErrorf("--max-len 0 must be positive (0 reads as the default 32768)")
	case o.duration < 0:
		return planFlagErrorf("--duration %v must not be negative", o.duration)
	case o.adapters < 0 || o.adapters > planner.MaxSummaryAdapters:
		return planFlagErrorf("--adapters %d must be in 0..%d (0 = the base model only)", o.adapters, planner.MaxSummaryAdapters)
	case o.adapters > 0 && !summary:
		return planFlagErrorf("--adapters shapes a summary workload (--rate, --prompt-mean, --output-mean); a trace's requests name their adapters in its adapter field (a Mooncake trace names none)")
	case !finite(o.adapterSkew) || o.adapterSkew < 0 || o.adapterSkew > 100:
		return planFlagErrorf("--adapter-skew %v must be in [0, 100]", o.adapterSkew)
	case o.given != nil && o.given("adapter-skew") && o.adapters == 0 && summary:
		return planFlagErrorf("--adapter-skew shapes the adapters' shares: give --adapters N too")
	case o.maxLoRAs < 1:
		return planFlagErrorf("--max-loras %d must be at least 1 (vLLM's default is 1)", o.maxLoRAs)
	case !finite(o.gpuCost) || o.gpuCost < 0:
		return planFlagErrorf("--gpu-hour-cost %v must not be negative", o.gpuCost)
	case !finite(o.burst) || o.burst < 1:
		return planFlagErrorf("--burst %v: the burst factor must be >= 1 (1 = no burst)", o.burst)
	case o.maxEngines < 1:
		return planFlagErrorf("--max-engines %d must be at least 1", o.maxEngines)
	case !(o.maxUtil > 0 && o.maxUtil < 1):
		return planFlagErrorf("--max-util %v must be in (0, 1)", o.maxUtil)
	case o.simRequests == 0 || o.simRequests < -1:
		return planFlagErrorf("--sim-requests %d must be positive or -1 (all)", o.simRequests)
	case o.confirmRequests == 0 || o.confirmRequests < -1:
		return planFlagErrorf("--confirm-requests %d must be positive or -1 (all)", o.confirmRequests)
	case o.seeds < 0 || o.seeds > 16 || o.seeds == 0 && o.given != nil && o.given("seeds"):
		return planFlagErrorf("--seeds %d must be in 1..16", o.seeds)
	case o.parallel < 0:
		return planFlagErrorf("--parallel %d must not be negative (0 = GOMAXPROCS)", o.parallel)
	case o.pdMode != string(disagg.ModeConditional) && o.pdMode != string(disagg.ModeAlways):
		return planFlagErrorf("--pd-mode %q is not one of conditional, always", o.pdMode)
	case o.policy != "" && !slices.Contains(policy.Names(), o.policy):
		return planFlagErrorf("--policy %q: unknown policy (known: %s)", o.policy, strings.Join(policy.Names(), ", "))
	}
	return nil
}

func (o *planOptions) workload() (*workload.Workload, error) {
	given := func(name string) bool { return o.given != nil && o.given(name) }
	if o.rate != 0 || o.promptMean != 0 || o.outputMean != 0 {
		if o.trace != "" {
			return nil, planFlagErrorf("give --trace or a summary (--rate, --prompt-mean, --output-mean), not both")
		}
		if given("rate-scale") {
			return nil, planFlagErrorf("--rate-scale scales a trace; a summary workload takes its rate from --rate")
		}
		s := planner.Summary{Rate: o.rate, Duration: o.duration, ArrivalCV: o.arrivalCV, PromptMean: o.promptMean,
			PromptCV: o.promptCV, OutputMean: o.outputMean, OutputCV: o.outputCV, MaxLen: o.maxLen,
			SharedFraction: o.sharedFrac, HotPrefixes: o.hotPrefixes, Zipf: o.zipf, Adapters: o.adapters, AdapterSkew: o.adapterSkew}
		w, err := s.Workload(o.seed)
		if err != nil {
			return nil, &planFlagError{err.Error()} // the summary's flags
		}
		return w, nil
	}
	for _, name := range summaryFlags {
		if given(name) {
			return nil, planFlagErrorf("--%s shapes a summary workload (--rate, --prompt-mean, --output-mean), not a trace", name)
		}
	}
	var w *workload.Workload
	var err error
	if o.trace != "" {
		if w, err = workload.ReadTraceFile(o.trace); err != nil {
			err = fmt.Errorf("--trace: %w", err)
		}
	} else {
		w, err = sim.DefaultWorkload()
	}
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if !(o.rateScale > 0) || o.rateScale > 1e9 {
		return nil, planFlagErrorf("--rate-scale %v must be positive and at most 1e9", o.rateScale)
	}
	if o.rateScale != 1 {
		if err := w.ScaleRate(o.rateScale); err != nil {
			return nil, planFlagErrorf("--rate-scale: %v", err) // stretches the trace past the clock
		}
		w.Name += fmt.Sprintf(" (rate x%g)", o.rateScale)
	}
	return w, nil
}

// plans runs the baseline plan, its verification and the what-ifs.
func (o *planOptions) plans(ctx context.Context, in planner.Input, stderr io.Writer) ([]*planner.Result, error) {
	var prog *report.Progress
	if !o.quiet && !o.json {
		prog = report.NewProgress(stderr, 8, "plan")
		last := 0
		in.Progress = func(done, total int) {
			prog.Add(done - last)
			last = done
		}
	}
	res, err := planner.Plan(ctx, in)
	if err != nil {
		if prog != nil {
			prog.Finish()
		}
		// A plan that searched and found nothing still shows its evidence;
		// an interrupted one found nothing only because it was stopped, and
		// its table would say "no fleet meets the SLO".
		if res != nil && len(res.Candidates) > 0 && !o.json && ctx.Err() == nil {
			res.WriteTable(stderr)
		}
		return nil, fmt.Errorf("plan: %w", err)
	}
	if o.verify && (res.Aggregated.Meets || res.Disaggregated.Meets) {
		if _, err := planner.Verify(ctx, in, res); err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
	}
	if prog != nil {
		prog.Finish()
	}
	out := []*planner.Result{res}
	for _, name := range o.whatIf {
		if name == "node-lost" {
			continue
		}
		r, err := planWhatIf(ctx, in, name)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// planWhatIf plans the what-if scenario name on in's workload. A scenario
// no fleet meets is an answer (the result says why), not a failure; any
// other error, an interruption among them, is.
func planWhatIf(ctx context.Context, in planner.Input, name string) (*planner.Result, error) {
	w, err := planner.WhatIf(in.Workload, name)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	in.Workload = w
	in.Progress = nil
	r, err := planner.Plan(ctx, in)
	if err != nil && (r == nil || !errors.Is(err, planner.ErrInfeasible)) {
		return nil, fmt.Errorf("plan: what-if %s: %w", name, err)
	}
	r.Name = name
	return r, nil
}

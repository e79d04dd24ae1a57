package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
	"golang.org/x/sync/errgroup"
)

func init() {
	register(command{name: "sim", summary: "simulate a fleet: replay a workload through the routing policies", run: runSim})
}

const simDescription = `Replay a workload through N modelled engines and the router's own decision code
(the same policies, prefix indexes and stale-signal model as 'kvroute serve') on a
virtual clock, and print one row per policy (and per load point of a sweep):
TTFT, TPOT and end-to-end percentiles, throughput, goodput under the SLO, the
prefix-cache hit rate next to the oracle bound (infinite cache, perfect affinity),
load imbalance, preemptions and rejections.

Under the table, the TTFT lower bound: for each request, the prompt tokens a
perfect cache would not hold (the oracle's: infinite, shared by the whole fleet,
every block an earlier request had is a hit) prefilled alone on an idle engine of
the fleet's fastest kind, in chunks of max_num_batched_tokens, plus the network
round trip; its p50, p90 and p99 over the workload (over each run's completed
requests, printed per run, when some fail). No router can beat it under
the model (no queueing and a perfect, infinite, shared cache): a policy's ttft99
close to the bound's p99 leaves nothing for routing to win.

The workload is --trace FILE (Mooncake JSONL), or --workload NAME (a generator),
or, with neither, the embedded Mooncake conversation trace (12,031 requests).
The fleet is --engines COUNT with --profile, or --engines 4xPROFILE,2xPROFILE,
or --fleet FILE (YAML: engines: [{count: 4, profile: NAME, num_gpu_blocks: N}]).
A fleet file's group may set speed (2 = twice as fast) and weight (the engines'
endpoint weight, default 1: their share of the load under the policies that
honour weights, see 'kvroute serve --help'; the --engines fleet has weight 1;
neither may be written as 0).
--hf-config config.json (with --gpu, --tp, --dtype) models a HuggingFace model:
--engines COUNT then runs it, and a group named hf (4xhf/prefill) takes it.
A group may take a role, 4xPROFILE/prefill,4xPROFILE/decode, or 4/prefill,4/decode
for engines of --profile (YAML: role: prefill; a fleet needs engines that decode,
and every engine of it runs one model, on any hardware):
such a fleet runs disaggregated (--pd-mode, --pd-gbps, --pd-setup), placed by the
same P/D planner as 'kvroute serve', with the TTFT split adding the KV transfer.
A workload's requests may name LoRA adapters (--workload lora; a trace's
"adapter" field): they route in the base model's pool, every engine serves every
adapter (a fleet file's group may list the only ones its engines serve, adapters:
[adapter-0, adapter-1]) with its blocks keyed apart (no cache shared across adapters), a step
batches at most --max-loras distinct adapters (vLLM's, default 1), and the
scraped metrics carry vllm:lora_requests_info (running and waiting adapters,
max_lora), which kv-aware prices (its adapter_load and adapter_hold parameters).
Profiles: ` + "%s" + `.
Policies: ` + "%s" + `.
Generators: ` + "%s" + `.

The run is deterministic for --seed. --out DIR writes report.json, report.csv,
report.txt (the table), report.html (charts, works offline), SVG charts and
requests.csv (one line per request, with the TTFT split into network, queue,
prefill, KV transfer and first step, and its LoRA adapter). Failed requests are counted per kind in
the table; the first of each kind is printed with its reason (e.g. a prompt
longer than the engines' max model length). Ctrl-C stops the runs in progress
and reports those that finished (exit status 130). Exit status: 0 when every
run finished (failed requests included), 2 on a bad flag or flag value (a
--fleet file that cannot be read or is invalid included), 1 on another error
(a --trace that cannot be read, an unwritable --out).`

// simOptions are the parsed flags of kvroute sim.
type simOptions struct {
	trace, workloadName, params, arrivals string
	requests, limit                       int
	rate, cv                              float64
	duration                              time.Duration

	engines, profile, fleetFile string
	hf                          hfModel
	policies                    stringList
	policyParams                stringList
	rateScale                   float64
	sweep                       string
	seed                        uint64
	sloTTFT, sloTPOT            time.Duration
	out                         string
	scrapeInterval, staleAfter  time.Duration
	kvEvents                    bool
	kvEventDelay, netLatency    time.Duration
	routers, routerBlock        int
	routerText                  bool
	drain, queueWait            time.Duration
	parallel                    int
	quiet                       bool
	pdMode                      string
	pdGbps                      float64
	pdSetup                     time.Duration
	maxLoRAs                    int
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	desc := fmt.Sprintf(simDescription, strings.Join(engine.ProfileNames(), ", "),
		strings.Join(policy.Names(), ", "), strings.Join(workload.GeneratorNames(), ", "))
	fs := newFlagSet("sim", "[--trace FILE | --workload NAME] [flags]", desc, stdout, stderr)
	var o simOptions
	fs.StringVar(&o.trace, "trace", "", "Mooncake JSONL trace `file` (default: the embedded conversation trace)")
	fs.StringVar(&o.workloadName, "workload", "", "generate a workload with this generator instead of a trace ('list' prints them with their parameters)")
	fs.StringVar(&o.params, "params", "", "generator parameters `k=v,...` (see --workload list)")
	fs.IntVar(&o.requests, "requests", 0, "generator: number of requests (default 1000)")
	fs.Float64Var(&o.rate, "rate", 0, "generator: mean arrivals per second (default 10)")
	fs.StringVar(&o.arrivals, "arrivals", "", "generator: arrival process poisson, gamma or constant (default poisson)")
	fs.Float64Var(&o.cv, "cv", 0, "generator: coefficient of variation of gamma arrivals (default 2; with --arrivals gamma only)")
	fs.DurationVar(&o.duration, "duration", 0, "keep only requests arriving within this (unscaled) `duration` of the first (0 = all)")
	fs.IntVar(&o.limit, "limit", 0, "keep only the first `N` requests (0 = all)")
	fs.StringVar(&o.engines, "engines", "8", "engine `count` (with --profile) or groups COUNTxPROFILE,...")
	fs.StringVar(&o.profile, "profile", "llama-3.1-8b-h100", "engine profile for --engines COUNT")
	fs.StringVar(&o.fleetFile, "fleet", "", "fleet `file` (YAML), instead of --engines")
	o.hf.register(fs, "the engines of --engines COUNT, or of groups named hf")
	fs.Var(&o.policies, "policies", "routing `policies` to compare, comma-separated (default kv-aware,round_robin,least_request)")
	fs.Var(&o.policyParams, "policy-param", "policy parameter `POLICY.NAME=VALUE` (repeatable)")
	fs.Float64Var(&o.rateScale, "rate-scale", 1, "multiply the workload's arrival rate by `X`")
	fs.StringVar(&o.sweep, "sweep", "", "sweep the rate scale: `FROM:TO:STEP` or a list X,Y,... (overrides --rate-scale)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed for the policies, scrape phases and generators")
	fs.DurationVar(&o.sloTTFT, "slo-ttft", 2*time.Second, "goodput SLO: TTFT limit (0 = none)")
	fs.DurationVar(&o.sloTPOT, "slo-tpot", 100*time.Millisecond, "goodput SLO: TPOT limit (0 = none)")
	fs.StringVar(&o.out, "out", "", "write report.json, report.csv, report.txt, report.html, SVG charts and requests.csv to `dir`")
	fs.DurationVar(&o.scrapeInterval, "scrape-interval", sim.DefaultScrapeInterval, "how often the router scrapes each engine's metrics (negative = never)")
	fs.DurationVar(&o.staleAfter, "stale-after", time.Second, "scraped signals older than this are stale")
	fs.BoolVar(&o.kvEvents, "kv-events", false, "feed a precise prefix index from the engines' KV events")
	fs.DurationVar(&o.kvEventDelay, "kv-event-delay", sim.DefaultKVEventDelay, "KV-event delivery delay")
	fs.DurationVar(&o.netLatency, "net-latency", sim.DefaultNetLatency, "one-way router<->engine latency (0 or negative = none)")
	fs.IntVar(&o.routers, "routers", 1, "router replicas behind a load balancer (each sees only its own dispatches between scrapes)")
	fs.IntVar(&o.routerBlock, "router-block-tokens", sim.DefaultRouterBlockTokens, "the router's prefix block size in tokens (with --kv-events: the engines')")
	fs.BoolVar(&o.routerText, "router-text", false, "route on the prompt text in characters, as kvroute serve does without a tokenizer (slower; for comparisons with kvroute bench)")
	fs.DurationVar(&o.queueWait, "queue-wait", sim.DefaultQueueWait, "how long a router holds a request the policy sheds with the queue action (kv-aware overload=queue) before answering 429, as serve's retry.queue_wait (0 or negative = no wait)")
	fs.DurationVar(&o.drain, "drain", 0, "stop each run this long after the last arrival; requests still open count as errors (0 = run until all finish)")
	fs.IntVar(&o.parallel, "parallel", 1, "runs to simulate at once (each run is single-threaded)")
	fs.BoolVar(&o.quiet, "quiet", false, "print only the table (no progress bar or timing)")
	fs.StringVar(&o.pdMode, "pd-mode", "conditional", "P/D fleets (--engines N/prefill,M/decode): conditional, always or never disaggregate")
	fs.Float64Var(&o.pdGbps, "pd-gbps", 400, "P/D fleets: the prefill->decode fabric link speed in Gb/s")
	fs.DurationVar(&o.pdSetup, "pd-setup", time.Millisecond, "P/D fleets: the fixed cost of one KV transfer")
	fs.IntVar(&o.maxLoRAs, "max-loras", sim.DefaultMaxLoRAs, "LoRA adapters one engine step may batch (vLLM's --max-loras), for workloads whose requests name adapters (--workload lora)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "kvroute sim: "+format+"\n", a...)
		return errUsage
	}
	if o.workloadName == "list" {
		printGenerators(stdout)
		return nil
	}
	if o.trace != "" && o.workloadName != "" {
		return usageErr("--trace and --workload are exclusive")
	}
	if o.fleetFile != "" && (flagSet(fs, "engines") || flagSet(fs, "profile")) {
		return usageErr("--fleet and --engines/--profile are exclusive (the fleet file names each group's count and profile)")
	}
	if o.routers > 1024 {
		return usageErr("--routers %d must be at most 1024", o.routers)
	}
	// sim.Config and workload.Options read zero as "the default": a zero
	// given on the command line would silently run something else. A
	// negative generator value is the flag's error too, not the
	// generator's field's ("arrivals.rate -5").
	for _, z := range []struct {
		name, hint string
		bad        bool
	}{
		{"requests", "at least 1 (default 1000)", o.requests <= 0},
		{"requests", fmt.Sprintf("at most %d", maxGenerated), o.requests > maxGenerated},
		{"rate", "positive (default 10)", !(o.rate > 0)},
		{"rate", fmt.Sprintf("at most %g (arrival times are whole nanoseconds)", float64(workload.MaxRate)), o.rate > workload.MaxRate},
		{"cv", "positive (default 2)", !(o.cv > 0)},
		{"scrape-interval", "positive, or negative for never", o.scrapeInterval == 0},
		{"stale-after", "positive (default 1s)", o.staleAfter == 0},
		{"kv-event-delay", "positive (e.g. 1ms)", o.kvEventDelay == 0},
		{"parallel", "at least 1", o.parallel < 1},
		{"max-loras", "at least 1 (default 1, vLLM's)", o.maxLoRAs < 1},
	} {
		if z.bad && flagSet(fs, z.name) {
			return usageErr("--%s %s: must be %s", z.name, fs.Lookup(z.name).Value, z.hint)
		}
	}
	if o.netLatency == 0 && flagSet(fs, "net-latency") {
		o.netLatency = -1 // none (sim.Config: 0 is the 1ms default, negative 0)
	}
	if o.queueWait == 0 && flagSet(fs, "queue-wait") {
		o.queueWait = -1 // no wait (sim.Config: 0 is the 5s default, negative no wait)
	}
	if o.workloadName == "" && (o.params != "" || o.requests != 0 || o.rate != 0 || o.arrivals != "" || o.cv != 0) {
		return usageErr("--params, --requests, --rate, --arrivals and --cv apply to --workload only (a trace has its own rate: --rate-scale)")
	}
	if len(o.policies) == 0 {
		o.policies = stringList{policy.NameKVAware, policy.NameRoundRobin, policy.NameLeastRequest}
	}
	params, err := simPolicyParams(o.policyParams)
	if err != nil {
		return usageErr("%v", err)
	}
	for i, p := range o.policies {
		if !slices.Contains(policy.Names(), p) {
			return usageErr("--policies: unknown policy %q (known: %s)", p, strings.Join(policy.Names(), ", "))
		}
		if _, err := policy.New(p, params[p], o.seed); err != nil {
			return usageErr("--policy-param: %v", err) // a known policy refuses only its parameters
		}
		if slices.Contains(o.policies[:i], p) {
			return usageErr("--policies names %s twice (its rows would be identical)", p)
		}
	}
	for p := range params {
		if !slices.Contains(o.policies, p) {
			return usageErr("--policy-param names policy %q, which is not in --policies", p)
		}
	}
	scales := []float64{o.rateScale}
	if o.sweep != "" {
		if scales, err = sim.ParseSweep(o.sweep); err != nil {
			return usageErr("--sweep: %v", err)
		}
	} else if !(o.rateScale > 0) || math.IsInf(o.rateScale, 1) {
		return usageErr("--rate-scale %g must be positive and finite", o.rateScale)
	}
	var hf *engine.Profile
	defaultProfile := o.profile
	switch p, ok, err := o.hf.profile(); {
	case err != nil:
		return usageErr("%s", hfUsage(err))
	case ok:
		hf, defaultProfile = &p, p.Name
	}
	var fleet sim.Fleet
	if o.fleetFile != "" {
		fleet, err = sim.LoadFleetFile(o.fleetFile)
	} else {
		fleet, err = sim.ParseFleet(o.engines, defaultProfile)
	}
	fleetFlag := "engines" // the flag a bad fleet is named by
	if o.fleetFile != "" {
		fleetFlag = "fleet"
	}
	if err != nil {
		return usageErr("--%s: %v", fleetFlag, err)
	}
	for i := range fleet {
		g := &fleet[i]
		if hf != nil && (g.Profile == "hf" || g.Profile == hf.Name) {
			g.Profile, g.Spec = hf.Name, hf
			continue
		}
		if _, err := engine.LookupProfile(g.Profile); err != nil {
			name := fleetFlag
			if o.fleetFile == "" && g.Profile == o.profile && flagSet(fs, "profile") {
				name = "profile"
			}
			return usageErr("--%s: %s", name, strings.TrimPrefix(err.Error(), "engine: "))
		}
	}
	if o.routers < 1 {
		return usageErr("--routers %d must be at least 1", o.routers)
	}
	if o.routerText && o.kvEvents {
		return usageErr("--router-text and --kv-events are exclusive (the precise index needs token hashes)")
	}
	if o.drain < 0 {
		return usageErr("--drain %v must not be negative", o.drain)
	}
	if o.routerBlock < 1 {
		return usageErr("--router-block-tokens %d must be at least 1", o.routerBlock)
	}
	switch {
	case o.limit < 0:
		return usageErr("--limit %d must not be negative (0 = all)", o.limit)
	case o.duration < 0:
		return usageErr("--duration %v must not be negative (0 = all)", o.duration)
	case o.staleAfter < 0:
		return usageErr("--stale-after %v must not be negative", o.staleAfter)
	case o.sloTTFT < 0 || o.sloTPOT < 0:
		return usageErr("--slo-ttft %v and --slo-tpot %v must not be negative (0 = none)", o.sloTTFT, o.sloTPOT)
	case o.kvEventDelay < 0:
		return usageErr("--kv-event-delay %v must not be negative", o.kvEventDelay)
	case !(o.pdGbps > 0):
		return usageErr("--pd-gbps %g must be positive", o.pdGbps)
	case o.pdGbps < sim.MinLinkGbps:
		return usageErr("--pd-gbps %g must be at least %g (a slower link's KV handoffs would take hours)", o.pdGbps, sim.MinLinkGbps)
	case o.pdSetup < 0:
		return usageErr("--pd-setup %v must not be negative", o.pdSetup)
	}
	switch disagg.Mode(o.pdMode) {
	case disagg.ModeConditional, disagg.ModeAlways, disagg.ModeNever:
	default:
		return usageErr("--pd-mode %q must be conditional, always or never", o.pdMode)
	}
	if o.workloadName != "" {
		if _, err := generatorFlags(o.workloadName, o.arrivals, flagSet(fs, "cv"), o.params); err != nil {
			return usageErr("%v", err)
		}
	}
	w, err := loadSimWorkload(&o)
	switch {
	case err != nil && o.workloadName != "":
		return usageErr("%v", err) // the generator's flags: name, --params, --requests, --rate, ...
	case err != nil:
		return err
	}
	if o.out != "" {
		// Before the runs, not after them: an unwritable --out would lose them.
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return fmt.Errorf("sim: --out: %w", err)
		}
	}
	if len(w.Requests) == 0 {
		return fmt.Errorf("sim: the workload has no requests")
	}
	// A rate scale that stretches the arrivals past the simulator's clock
	// is a bad flag value (exit status 2), not a failed run.
	scaleFlag := "rate-scale"
	if o.sweep != "" {
		scaleFlag = "sweep"
	}
	first := w.Requests[0].Arrival // the workload is in arrival order
	for _, sc := range scales {
		if gap := float64(w.Span()-first) / sc; gap > float64(workload.MaxSpan-first) {
			return usageErr("--%s: rate scale %g would stretch the arrivals (%v) beyond the %.0f years of the simulator's clock",
				scaleFlag, sc, w.Span()-first, workload.MaxSpan.Hours()/(365*24))
		}
	}

	base := sim.Config{
		Fleet:             fleet,
		Seed:              o.seed,
		ScrapeInterval:    o.scrapeInterval,
		StaleAfter:        o.staleAfter,
		KVEvents:          o.kvEvents,
		KVEventDelay:      o.kvEventDelay,
		NetLatency:        o.netLatency,
		Routers:           o.routers,
		RouterBlockTokens: o.routerBlock,
		RouterText:        o.routerText,
		Drain:             o.drain,
		QueueWait:         o.queueWait,
		MaxLoRAs:          o.maxLoRAs,
		SLO:               sim.SLO{TTFT: o.sloTTFT, TPOT: o.sloTPOT},
		PD: sim.PDConfig{Mode: disagg.Mode(o.pdMode),
			Links: disagg.UniformLinks(disagg.Link{Name: "fabric", Gbps: o.pdGbps, Setup: o.pdSetup})},
	}
	// The fleet and the P/D fabric as every run checks them: a P/D fleet of
	// two models or a --pd-gbps below the simulator's floor is a bad flag
	// value (exit status 2), not a failed run.
	check := base
	check.RateScale = scales[0]
	if err := check.Validate(); err != nil {
		return usageErr("%v", err)
	}
	// The oracle bound depends only on the workload and the block size:
	// compute it once for every run.
	prof, _ := engine.LookupProfile(fleet[0].Profile)
	if fleet[0].Spec != nil {
		prof = *fleet[0].Spec
	}
	oracle := sim.OracleHitRate(w.Requests, prof.BlockSize)
	base.OracleHitRate = &oracle
	if base.TTFTBounds, err = sim.TTFTBounds(fleet, w.Requests); err != nil {
		return err
	}
	type job struct {
		policy string
		scale  float64
	}
	var jobs []job
	for _, sc := range scales {
		for _, p := range o.policies {
			jobs = append(jobs, job{p, sc})
		}
	}
	progOut := stderr
	if o.quiet {
		progOut = io.Discard
	}
	bar := report.NewProgress(progOut, len(jobs)*len(w.Requests), "sim")
	results := make([]*sim.Result, len(jobs))
	walls := make([]time.Duration, len(jobs))
	var g errgroup.Group
	g.SetLimit(o.parallel)
	start := time.Now()
	for i, j := range jobs {
		g.Go(func() error {
			cfg := base
			cfg.Policy, cfg.PolicyParams, cfg.RateScale = j.policy, params[j.policy], j.scale
			last := 0
			cfg.Progress = func(n, _ int) { bar.Add(n - last); last = n }
			t0 := time.Now()
			res, err := sim.Run(ctx, cfg, w.Requests)
			results[i], walls[i] = res, time.Since(t0)
			return err
		})
	}
	err = g.Wait()
	bar.Finish()
	wall := time.Since(start)
	var interrupted error // Ctrl-C: the runs that finished are still reported
	if err != nil {
		if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
			return err
		}
		var fj []job
		var fr []*sim.Result
		var fw []time.Duration
		for i, res := range results {
			if res != nil {
				fj, fr, fw = append(fj, jobs[i]), append(fr, res), append(fw, walls[i])
			}
		}
		if len(fr) == 0 {
			return err
		}
		fmt.Fprintf(stderr, "interrupted: the report covers the %d of %d runs that finished\n", len(fr), len(jobs))
		jobs, results, walls, interrupted = fj, fr, fw, err
	}

	rep := &report.Report{
		Title:    "kvroute sim: " + w.Name,
		Source:   "sim",
		Workload: w.Name,
		SLO:      report.SLO{TTFT: o.sloTTFT, TPOT: o.sloTPOT},
		Params: map[string]string{
			"engines":         fleet.String(),
			"requests":        strconv.Itoa(len(w.Requests)),
			"seed":            strconv.FormatUint(o.seed, 10),
			"scrape_interval": o.scrapeInterval.String(),
			"stale_after":     o.staleAfter.String(),
			"kv_events":       strconv.FormatBool(o.kvEvents),
			"kv_event_delay":  o.kvEventDelay.String(),
			"net_latency":     max(o.netLatency, 0).String(),
			"routers":         strconv.Itoa(o.routers),
			"router_block":    strconv.Itoa(o.routerBlock),
			"router_text":     strconv.FormatBool(o.routerText),
			"drain":           o.drain.String(),
			"queue_wait":      max(o.queueWait, 0).String(),
		},
	}
	if slices.ContainsFunc(w.Requests, func(r workload.Request) bool { return r.Adapter != "" }) {
		rep.Params["max_loras"] = strconv.Itoa(o.maxLoRAs)
	}
	sweep := len(scales) > 1
	if !sweep {
		rep.Params["rate_scale"] = strconv.FormatFloat(scales[0], 'g', -1, 64)
	}
	heaviest := slices.Max(scales)
	took := map[string]bool{} // policies whose heaviest-load utilisation is in
	for i, res := range results {
		load := 0.0
		if sweep {
			load = jobs[i].scale
		}
		rep.Rows = append(rep.Rows, res.Row(load))
		// Utilisation of the heaviest load point only (a --sweep list need
		// not be in ascending order; a repeated scale gives its first run).
		if !sweep || jobs[i].scale == heaviest && !took[jobs[i].policy] {
			took[jobs[i].policy] = true
			rep.Utilisation = append(rep.Utilisation, res.Utilisation(res.Policy)...)
		}
	}
	// The bound covers each run's completed requests (the population of its
	// TTFT percentiles): the same for every run when they all complete.
	bound := results[0].TTFTBound
	sameBound := true
	for _, res := range results {
		sameBound = sameBound && res.TTFTBound == bound
	}
	if bound.N > 0 && sameBound {
		for _, q := range []struct {
			name string
			d    time.Duration
		}{{"p50", bound.P50}, {"p90", bound.P90}, {"p99", bound.P99}} {
			rep.Params["ttft_bound_"+q.name+"_ms"] = strconv.FormatFloat(float64(q.d)/1e6, 'f', 3, 64)
		}
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	switch {
	case sameBound && bound.N > 0:
		fmt.Fprintf(stdout, "ttft lower bound (no queueing, perfect infinite shared cache; oracle hit %.1f%%): p50 %s  p90 %s  p99 %s\n",
			100*oracle, report.FormatDuration(bound.P50), report.FormatDuration(bound.P90), report.FormatDuration(bound.P99))
	case !sameBound:
		fmt.Fprintf(stdout, "ttft lower bound over each run's completed requests (no queueing, perfect infinite shared cache; workload oracle hit %.1f%%):\n", 100*oracle)
		for i, res := range results {
			b := res.TTFTBound
			name := res.Policy
			if sweep {
				name += fmt.Sprintf(" x%g", jobs[i].scale)
			}
			fmt.Fprintf(stdout, "  %s: p50 %s  p90 %s  p99 %s\n", name, report.FormatDuration(b.P50), report.FormatDuration(b.P90), report.FormatDuration(b.P99))
		}
	}
	if !o.quiet {
		// The name column fits the longest run name (P/D runs are named
		// pd-conditional:POLICY).
		nw := 20
		for _, res := range results {
			nw = max(nw, len(res.Policy))
		}
		// A load column as the report's table has one: in a sweep only
		// (a single run's load is 0 in report.json and report.csv, and its
		// rate scale is in the parameters).
		load := func(i int) string {
			if !sweep {
				return ""
			}
			return fmt.Sprintf(" %6g", jobs[i].scale)
		}
		loadHead := ""
		if sweep {
			loadHead = fmt.Sprintf(" %6s", "load")
		}
		// held: the router's queue (overload: queue), shown when a run held any.
		heldCol := slices.ContainsFunc(results, func(r *sim.Result) bool { return r.TTFTBreakdown().Held > 0 })
		fmt.Fprintln(stdout, "\nTTFT breakdown, mean over completed requests (network = router<->engine round trip):")
		heldHead := ""
		if heldCol {
			heldHead = fmt.Sprintf(" %9s", "held")
		}
		fmt.Fprintf(stdout, "%-*s%s%s %9s %9s %9s %9s %11s\n", nw, "name", loadHead, heldHead, "network", "queue", "prefill", "transfer", "first step")
		for i, res := range results {
			b := res.TTFTBreakdown()
			held := ""
			if heldCol {
				held = fmt.Sprintf(" %9s", report.FormatDuration(b.Held))
			}
			fmt.Fprintf(stdout, "%-*s%s%s %9s %9s %9s %9s %11s\n", nw, res.Policy, load(i), held, report.FormatDuration(b.Network),
				report.FormatDuration(b.Queue), report.FormatDuration(b.Prefill), report.FormatDuration(b.Transfer),
				report.FormatDuration(b.FirstDecode))
		}
		for i, res := range results {
			fl := res.FabricLoad(time.Second)
			if fl.Transfers == 0 {
				continue
			}
			if i == 0 || results[i-1].FabricLoad(time.Second).Transfers == 0 {
				fmt.Fprintln(stdout, "\nKV fabric (P/D handoffs; per decode node over one-second windows):")
				fmt.Fprintf(stdout, "%-*s%s %9s %11s %12s %12s %12s %9s %9s %9s\n", nw, "name", loadHead, "handoffs", "total/s",
					"node mean/s", "node p99/s", "node max/s", "time p50", "time p99", "queue p99")
			}
			fmt.Fprintf(stdout, "%-*s%s %9d %11s %12s %12s %12s %9s %9s %9s\n", nw, res.Policy, load(i), fl.Transfers,
				simBytes(fl.Total), simBytes(fl.PerDecodeMean), simBytes(fl.PerDecodeP99), simBytes(fl.PerDecodeMax),
				report.FormatDuration(fl.TimeP50), report.FormatDuration(fl.TimeP99), report.FormatDuration(fl.QueueP99))
		}
		writeSimFailures(stderr, results)
		var simWall time.Duration
		for _, d := range walls {
			simWall += d
		}
		n := len(jobs) * len(w.Requests)
		fmt.Fprintf(stderr, "simulated %d requests in %d runs in %.2fs wall (%.0f simulated requests per second per core; GOMAXPROCS %d)\n",
			n, len(jobs), wall.Seconds(), float64(n)/simWall.Seconds(), runtime.GOMAXPROCS(0))
	}
	if o.out != "" {
		// requests.csv names a run as the report's rows do (a P/D run is
		// pd-MODE:POLICY), with its load in a sweep.
		if err := writeSimOut(o.out, rep, simRunNames(len(jobs), func(i int) string {
			if sweep {
				return fmt.Sprintf("%s@%g", results[i].Policy, jobs[i].scale)
			}
			return results[i].Policy
		}), results); err != nil {
			return err
		}
		if !o.quiet {
			fmt.Fprintf(stderr, "wrote %s\n", o.out)
		}
	}
	return interrupted
}

// writeSimFailures prints the first failure of each kind over the runs,
// with its reason, as bench does: the table's "errors ...: http_400=38"
// alone does not say that the prompts were longer than the engines'
// context.
func writeSimFailures(w io.Writer, results []*sim.Result) {
	first := map[string]string{}
	for _, res := range results {
		for i := range res.Records {
			rec := &res.Records[i]
			if rec.Status == http.StatusOK || rec.Status == http.StatusTooManyRequests {
				continue
			}
			kind := "http_" + strconv.Itoa(rec.Status)
			if _, ok := first[kind]; !ok {
				first[kind] = fmt.Sprintf("%s (request %s)", rec.Error, rec.ID)
			}
		}
	}
	if len(first) == 0 {
		return
	}
	fmt.Fprintln(w, "first failure of each kind:")
	for _, kind := range slices.Sorted(maps.Keys(first)) {
		fmt.Fprintf(w, "  %s: %s\n", kind, first[kind])
	}
}

// simBytes renders a byte rate in decimal units (GB = 1e9 bytes).
func simBytes(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fGB", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fMB", v/1e6)
	default:
		return fmt.Sprintf("%.0fKB", v/1e3)
	}
}

func simRunNames(n int, f func(int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// parsePolicyParams reads POLICY.NAME=VALUE flags. Values are numbers,
// booleans, or strings (durations such as 250ms are strings the policy
// parses).
func simPolicyParams(list []string) (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		pol, name, ok2 := strings.Cut(k, ".")
		if !ok || !ok2 || pol == "" || name == "" {
			return nil, fmt.Errorf("--policy-param %q: want POLICY.NAME=VALUE", kv)
		}
		var val any = v
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			val = f
		} else if b, err := strconv.ParseBool(v); err == nil {
			val = b
		}
		if out[pol] == nil {
			out[pol] = map[string]any{}
		}
		out[pol][name] = val
	}
	return out, nil
}

// loadSimWorkload reads the trace, runs the generator or decodes the
// embedded default trace, then applies --duration and --limit.
func loadSimWorkload(o *simOptions) (*workload.Workload, error) {
	var w *workload.Workload
	var err error
	switch {
	case o.trace != "":
		if w, err = workload.ReadTraceFile(o.trace); err != nil {
			return nil, fmt.Errorf("sim: --trace: %w", err)
		}
	case o.workloadName != "":
		var params map[string]float64
		if params, err = workload.ParseParams(o.params); err != nil {
			return nil, err
		}
		w, err = workload.Generate(o.workloadName, workload.Options{
			Seed:     o.seed,
			Requests: o.requests,
			Arrivals: workload.Arrivals{Kind: o.arrivals, Rate: o.rate, CV: o.cv},
			Params:   params,
		})
	default:
		w, err = sim.DefaultWorkload()
	}
	if err != nil {
		return nil, err
	}
	w.Limit(o.duration, o.limit)
	return w, nil
}

// writeSimOut writes the report files and the per-request records.
func writeSimOut(dir string, rep *report.Report, names []string, results []*sim.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if _, err := rep.WriteDir(dir); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "requests.csv"))
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := sim.WriteRecordsCSV(f, names, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

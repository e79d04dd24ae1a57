package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

func init() {
	register(command{name: "bench", summary: "load-test an OpenAI-compatible endpoint with a workload (open loop)", run: runBench})
}

const benchDescription = `Replay a workload against an OpenAI-compatible server (kvroute serve, kvroute
engine, vLLM, SGLang, ...) open-loop: each request is sent at its arrival time
whatever happened to the earlier ones, so queueing in the server shows. Every
request streams (stream_options.include_usage); bench measures TTFT,
inter-token latency, TPOT, end-to-end latency, and reads the cached prompt
tokens from usage.prompt_tokens_details.cached_tokens. It prints the same
table as 'kvroute sim'; --out DIR also writes report.json, report.csv,
report.txt, report.html (charts, works offline), SVG charts and requests.csv
(one line per request; a sweep writes requests_xSCALE.csv per run). A
request's session goes in the X-Session-Id header and its tenant in the
"user" field; the X-Kvroute-Endpoint response header (kvroute serve with
debug.enabled) names the engine, for the imbalance column and per-engine
charts.

The workload is --trace FILE (Mooncake JSONL, replayed from its first
request: timestamps count from it; --rate R rescales it to R requests per
second on average, --rate-scale X speeds it up X times) or
--workload NAME (a generator: ` + "%s" + `;
--rate is its mean arrival rate, --params its parameters, see
'kvroute bench --workload list'). --duration keeps the requests that arrive
within it; --max-requests caps how many are sent. --sweep runs the workload
once per rate scale, one table row each (p99 TTFT and goodput against load in
the HTML report). To compare routing policies, run bench once per policy with
--name POLICY --out DIR and pass the earlier runs' DIR/report.json to --merge.

oracle%% bounds hit%%: the hit rate an infinite cache shared by every engine
would have had on the requests hit%% counts (completed, with cached tokens
reported), starting cold. In a sweep it remembers the earlier runs' prompts,
as the server's caches do; a server warm from before the run can beat it,
and bench then says so.

Prompts are synthetic: equal trace blocks become equal text (one short English
word per token; kvroute engine's built-in tokenizer reads each word as one
token), so the trace's prefix sharing is what the server sees. --api
completions --prompt tokens sends token ids instead.

Failures (refused connections, unknown hosts, HTTP errors, timeouts, errors
in the middle of a stream) are counted per request by kind and never stop the
run; the first failure of each kind is printed with what the server said.
429 responses count as rejections. Ctrl-C stops sending and reports the
requests that ended before it; those it cuts short in flight are not errors
but counted apart as interrupted (under the table, in report.html, in
report.json's rows and in requests.csv's error column). Exit status: 0 when
the run finished or was interrupted (whatever the errors), 2 on a bad flag, 1
on another bad configuration (an unreadable trace or --merge file) or an
unwritable --out (checked before the run).`

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	desc := fmt.Sprintf(benchDescription, strings.Join(workload.GeneratorNames(), ", "))
	fs := newFlagSet("bench", "--url URL --model NAME (--trace FILE | --workload NAME) [flags]", desc, stdout, stderr)
	var (
		url, model, trace, wlName, params, arrivals, api, prompt, out, name string
		rate, rateScale, cv                                                 float64
		duration, timeout, sloTTFT, sloTPOT                                 time.Duration
		requests, maxRequests, maxInFlight                                  int
		seed                                                                uint64
		ignoreEOS, quiet                                                    bool
		headers, merge                                                      stringList
		sweep                                                               string
	)
	fs.StringVar(&url, "url", "", "server base `URL`, e.g. http://127.0.0.1:8000, or an OpenAI client's base URL ending in /v1: the API path goes after it (required)")
	fs.StringVar(&model, "model", "", "model `name` sent in every request, but for those of a LoRA adapter (--workload lora), which name the adapter (required)")
	fs.StringVar(&trace, "trace", "", "Mooncake JSONL trace `file` to replay")
	fs.StringVar(&wlName, "workload", "", "generator `name` to run instead of a trace ('list' prints them)")
	fs.StringVar(&params, "params", "", "generator parameters `k=v,...`")
	fs.IntVar(&requests, "requests", 0, "generator: number of requests (default: enough for --duration at --rate times --rate-scale or a sweep's largest, a storm's burst on top, else 1000)")
	fs.Float64Var(&rate, "rate", 0, "mean requests per second `R`: the generator's rate (default 10), or a trace's rescaled rate")
	fs.Float64Var(&rateScale, "rate-scale", 1, "multiply the arrival rate by `X` (after --rate)")
	fs.StringVar(&arrivals, "arrivals", "", "generator: arrival process poisson, gamma or constant (default poisson)")
	fs.Float64Var(&cv, "cv", 0, "generator: coefficient of variation of gamma arrivals (default 2; with --arrivals gamma only)")
	fs.Uint64Var(&seed, "seed", 1, "generator seed")
	fs.DurationVar(&duration, "duration", 0, "send only requests arriving within this `duration` of the first (0 = all)")
	fs.IntVar(&maxRequests, "max-requests", 0, "send at most `N` requests (0 = no limit)")
	fs.IntVar(&maxInFlight, "max-in-flight", 1024, "cap on concurrent requests; beyond it requests wait for a slot")
	fs.DurationVar(&timeout, "timeout", 10*time.Minute, "per-request timeout, send to end of stream")
	fs.StringVar(&api, "api", bench.APIChat, "chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.StringVar(&prompt, "prompt", bench.PromptText, "prompt form: text, or tokens (with --api completions)")
	fs.BoolVar(&ignoreEOS, "ignore-eos", true, `send "ignore_eos": true so every request generates its full output length (vLLM extension; --ignore-eos=false lets the server stop at EOS)`)
	fs.Var(&headers, "header", "extra request header `'Name: value'` (repeatable; Host sets the requests' host); $OPENAI_API_KEY, if set, is sent as a bearer token")
	fs.DurationVar(&sloTTFT, "slo-ttft", 2*time.Second, "goodput SLO: TTFT limit (0 = none)")
	fs.DurationVar(&sloTPOT, "slo-tpot", 100*time.Millisecond, "goodput SLO: TPOT limit (0 = none)")
	fs.StringVar(&out, "out", "", "write report.json, report.csv, report.txt, report.html, SVG charts and requests.csv to `dir`")
	fs.StringVar(&name, "name", "bench", "row name in the report (e.g. the router's policy)")
	fs.StringVar(&sweep, "sweep", "", "run once per rate scale: `FROM:TO:STEP` or a list X,Y,... (overrides --rate-scale; the server's caches carry over between runs)")
	fs.Var(&merge, "merge", "report.json `file` of an earlier run whose rows go before this run's, for a side-by-side table (repeatable)")
	fs.BoolVar(&quiet, "quiet", false, "print only the table (no progress bar or summary line)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "kvroute bench: "+format+"\n", a...)
		return errUsage
	}
	if wlName == "list" {
		printGenerators(stdout)
		return nil
	}
	switch {
	case url == "":
		return usageErr("--url is required")
	case model == "":
		return usageErr("--model is required")
	case (trace == "") == (wlName == ""):
		return usageErr("give exactly one of --trace and --workload")
	case trace != "" && (params != "" || requests != 0 || arrivals != "" || cv != 0):
		return usageErr("--params, --requests, --arrivals and --cv apply to --workload only")
	case !(rateScale > 0):
		return usageErr("--rate-scale %g must be positive", rateScale)
	case rate < 0 || math.IsNaN(rate) || rate == 0 && flagSet(fs, "rate"): // 0 would be the generator's default
		return usageErr("--rate %g must be positive", rate)
	case wlName != "" && rate > workload.MaxRate: // a generator's limit (a trace is rescaled)
		return usageErr("--rate %g must be at most %g (arrival times are whole nanoseconds)", rate, float64(workload.MaxRate))
	case requests < 0 || requests == 0 && flagSet(fs, "requests"):
		return usageErr("--requests %d must be at least 1", requests)
	case requests > maxGenerated:
		return usageErr("--requests %d must be at most %d", requests, maxGenerated)
	case cv < 0 || math.IsNaN(cv) || cv == 0 && flagSet(fs, "cv"):
		return usageErr("--cv %g must be positive", cv)
	case api != bench.APIChat && api != bench.APICompletions:
		return usageErr("--api %q is not one of %s, %s", api, bench.APIChat, bench.APICompletions)
	case prompt != bench.PromptText && prompt != bench.PromptTokens:
		return usageErr("--prompt %q is not one of %s, %s", prompt, bench.PromptText, bench.PromptTokens)
	case prompt == bench.PromptTokens && api != bench.APICompletions:
		return usageErr("--prompt tokens needs --api completions (chat messages are text)")
	case sloTTFT < 0 || sloTPOT < 0:
		return usageErr("--slo-ttft %v and --slo-tpot %v must not be negative (0 = none)", sloTTFT, sloTPOT)
	case duration < 0:
		return usageErr("--duration %v must not be negative (0 = all)", duration)
	case maxRequests < 0:
		return usageErr("--max-requests %d must not be negative (0 = no limit)", maxRequests)
	case maxInFlight < 1:
		return usageErr("--max-in-flight %d must be at least 1", maxInFlight)
	case timeout <= 0:
		return usageErr("--timeout %v must be positive", timeout)
	}
	hdr := http.Header{}
	key := os.Getenv("OPENAI_API_KEY")
	if key != "" {
		hdr.Set("Authorization", "Bearer "+key)
	}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return usageErr("--header %q: want 'Name: value'", h)
		}
		hdr.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	// The key, unless a --header replaced it, is checked here, not as a
	// --header the user never gave, and not printed.
	if key != "" && hdr.Get("Authorization") == "Bearer "+key &&
		strings.ContainsFunc(key, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		return usageErr("$OPENAI_API_KEY holds a control character (a line break from a key file?): it cannot be sent in a header")
	}
	// --duration and --max-requests are applied to each run's workload
	// (Workload.Limit: the duration counts from the first arrival), not
	// as Config.Duration, which counts from 0 and dropped the requests of
	// a generator whose first one comes later (a storm's burst).
	cfg := bench.Config{URL: url, Model: model, API: api, Prompt: prompt, MaxInFlight: maxInFlight,
		Timeout: timeout, IgnoreEOS: ignoreEOS, Header: hdr}
	if err := cfg.Validate(); err != nil {
		if strings.HasPrefix(err.Error(), "bench: url") || strings.HasPrefix(err.Error(), "bench: header") {
			return usageErr("--%s", strings.TrimPrefix(err.Error(), "bench: "))
		}
		fmt.Fprintf(stderr, "kvroute %v\n", err)
		return errUsage
	}

	scales := []float64{rateScale}
	if sweep != "" {
		var err error
		if scales, err = sim.ParseSweep(sweep); err != nil {
			return usageErr("--sweep: %v", err)
		}
	}

	// The workload.
	var w *workload.Workload
	var err error
	if trace != "" {
		if w, err = workload.ReadTraceFile(trace); err != nil {
			return fmt.Errorf("bench: --trace: %w", err)
		}
		if err := benchTrace(w, rate); err != nil {
			return usageErr("%v", err)
		}
	} else {
		p, err := generatorFlags(wlName, arrivals, flagSet(fs, "cv"), params)
		if err != nil {
			return usageErr("%v", err)
		}
		n := requests
		if n == 0 && duration > 0 {
			n = requestsFor(wlName, p, rate, slices.Max(scales), duration)
			if n > maxGenerated {
				at := fmt.Sprintf("--rate %g", rate)
				if rate == 0 {
					at = "the default rate 10"
				}
				if x := slices.Max(scales); x != 1 {
					at += fmt.Sprintf(" x%g", x)
				}
				return usageErr("--duration %v at %s needs more than %d requests, a generator's most: give --requests, or a shorter --duration",
					duration, at, maxGenerated)
			}
		}
		w, err = workload.Generate(wlName, workload.Options{Seed: seed, Requests: n,
			Arrivals: workload.Arrivals{Kind: arrivals, Rate: rate, CV: cv}, Params: p})
		if err != nil {
			return usageErr("%v", err)
		}
	}
	var merged []*report.Report
	for _, f := range merge {
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("bench: --merge: %w", err)
		}
		r, err := report.ReadJSON(fh)
		fh.Close()
		if err != nil {
			return fmt.Errorf("bench: --merge %s: %w", f, err)
		}
		if len(r.Rows) == 0 {
			return usageErr("--merge %s: the report has no rows (not a kvroute report.json?)", f)
		}
		// The table shows the first report's SLO over every row: goodput
		// computed under another SLO would not compare.
		if r.SLO != (report.SLO{TTFT: sloTTFT, TPOT: sloTPOT}) {
			return usageErr("--merge %s: its goodput SLO is %s, this run's %s; give the same --slo-ttft and --slo-tpot",
				f, r.SLO, report.SLO{TTFT: sloTTFT, TPOT: sloTPOT})
		}
		merged = append(merged, r)
	}
	if out != "" {
		// Before the run, not after it: an unwritable --out would lose it.
		if err := os.MkdirAll(out, 0o755); err != nil {
			return fmt.Errorf("bench: --out: %w", err)
		}
	}

	slo := report.SLO{TTFT: sloTTFT, TPOT: sloTPOT}
	rep := &report.Report{
		Title:    "kvroute bench: " + w.Name,
		Source:   "bench",
		Workload: w.Name,
		SLO:      slo,
		Params: map[string]string{
			"url":           url,
			"model":         model,
			"api":           api,
			"prompt":        prompt,
			"max_in_flight": strconv.Itoa(maxInFlight),
			"timeout":       timeout.String(),
			"oracle_block":  "16",
		},
	}
	if wlName != "" {
		rep.Params["seed"] = strconv.FormatUint(seed, 10)
		if params != "" {
			rep.Params["params"] = params
		}
	}
	if rate > 0 {
		rep.Params["rate"] = strconv.FormatFloat(rate, 'g', -1, 64)
	}
	progOut := stderr
	if quiet {
		progOut = io.Discard
	}
	var csvs []requestsCSV          // one per run
	oracle := bench.NewOracle(16)   // one server: its caches carry over from run to run
	warm := false                   // a row's hit% is above its oracle%
	interrupted := 0                // requests cut short by Ctrl-C
	examples := map[string]string{} // error kind -> the first failure's message, over every run
	for k, scale := range scales {
		if ctx.Err() != nil {
			break
		}
		run := &workload.Workload{Name: w.Name, Requests: slices.Clone(w.Requests)}
		if err := run.ScaleRate(scale); err != nil {
			return usageErr("%v", err)
		}
		run.Limit(duration, maxRequests)
		if len(run.Requests) == 0 {
			return fmt.Errorf("bench: the workload has no requests")
		}
		label := "bench"
		load := 0.0
		if len(scales) > 1 {
			label = fmt.Sprintf("bench x%g", scale)
			load = scale
		}
		cfg.Progress = report.NewProgress(progOut, len(run.Requests), label)
		res, err := bench.Run(ctx, cfg, run.Requests)
		cfg.Progress.Finish()
		if err != nil {
			return err
		}
		// The interrupted requests were sent (the server may have cached
		// their prompts): requests.csv and the oracle count them.
		sent := append(slices.Clip(res.Samples), res.Interrupted...)
		file := "requests.csv"
		if len(scales) > 1 {
			file = fmt.Sprintf("requests_x%g.csv", scale)
			if slices.ContainsFunc(csvs, func(c requestsCSV) bool { return c.file == file }) {
				file = fmt.Sprintf("requests_x%g_run%d.csv", scale, k+1) // a scale that comes again
			}
		}
		csvs = append(csvs, requestsCSV{file, sent})
		interrupted += len(res.Interrupted)
		for kind, msg := range res.ErrorExamples {
			if _, ok := examples[kind]; !ok {
				examples[kind] = msg
			}
		}
		// The bound on this run's hit%: over the requests hit% counts, with
		// what the earlier runs of a sweep sent (the server's caches carry
		// over) already in the oracle's cache.
		row := res.Summary(report.SummaryOptions{Name: name, Load: load, SLO: slo,
			OracleHitRate: oracle.HitRate(run.Requests, sent)})
		row.Interrupted = len(res.Interrupted)
		if row.HitRate > row.OracleHitRate+1e-9 && row.OracleHitRate >= 0 {
			warm = true
		}
		rep.Rows = append(rep.Rows, row)
		if k == len(scales)-1 {
			if occ := report.Occupancy(res.Samples, 200); len(occ) > 0 {
				rep.Utilisation = []report.Utilisation{{Run: fmt.Sprintf("%s x%g", name, scale), Metric: "in-flight requests", Engines: occ}}
			}
		}
		if !quiet {
			fmt.Fprintf(stderr, "rate x%g: sent %d requests in %v (%d delayed by --max-in-flight)\n",
				scale, len(sent), res.Elapsed.Round(time.Millisecond), res.Delayed)
		}
	}
	if len(scales) == 1 {
		rep.Params["rate_scale"] = strconv.FormatFloat(scales[0], 'g', -1, 64)
	}
	if ctx.Err() != nil {
		// In the report itself too (its table's parameters, report.json):
		// the stderr line below is not there with --quiet, and a run cut
		// short between two requests has no interrupted row count.
		rep.Params["interrupted"] = "true"
	}
	if ctx.Err() != nil && !quiet {
		msg := "interrupted: the report covers the requests that ended before it"
		if interrupted > 0 {
			were := "were"
			if interrupted == 1 {
				were = "was"
			}
			msg += fmt.Sprintf("; %d in flight %s cut short (not counted as errors)", interrupted, were)
		}
		fmt.Fprintln(stderr, msg)
	}
	if len(merged) > 0 {
		rep = report.Merge(append(merged, rep)...)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if warm && !quiet {
		fmt.Fprintln(stderr, "note: hit% above oracle%: the server held some of these prompts before the run (an earlier run against it?);\n"+
			"      oracle% assumes it started cold (POST /reset_prefix_cache empties a vLLM or kvroute engine's cache)")
	}
	if len(examples) > 0 && !quiet {
		fmt.Fprintln(stderr, "first failure of each kind:")
		for _, kind := range slices.Sorted(maps.Keys(examples)) {
			fmt.Fprintf(stderr, "  %s: %s\n", kind, examples[kind])
		}
	}
	if out != "" {
		if _, err := rep.WriteDir(out); err != nil {
			return err
		}
		for _, c := range csvs {
			if err := writeFileWith(filepath.Join(out, c.file), func(w io.Writer) error { return report.WriteSamplesCSV(w, c.samples) }); err != nil {
				return err
			}
		}
		if !quiet {
			fmt.Fprintf(stderr, "wrote %s\n", out)
		}
	}
	return nil
}

// requestsCSV is one run's requests.csv: its file name and samples.
type requestsCSV struct {
	file    string
	samples []report.Sample
}

// benchTrace readies a trace for the run. Its clock starts at its first
// request: a slice cut from a longer trace, or one with absolute timestamps,
// would otherwise idle until its first timestamp, and its rate would be
// counted over a span that starts at 0. With rate > 0 it is then rescaled
// to rate requests per second on average.
func benchTrace(w *workload.Workload, rate float64) error {
	if len(w.Requests) > 0 {
		first := w.Requests[0].Arrival // ReadTrace sorts by arrival
		for i := range w.Requests {
			w.Requests[i].Arrival -= first
		}
	}
	if rate > 0 {
		if w.Span() <= 0 || len(w.Requests) < 2 {
			return fmt.Errorf("--rate %g: the trace's requests all arrive at the same instant, so it has no rate to rescale", rate)
		}
		own := float64(len(w.Requests)-1) / w.Span().Seconds()
		if err := w.ScaleRate(rate / own); err != nil {
			return fmt.Errorf("--rate %g: the trace's own rate is %g requests/s: %w", rate, own, err)
		}
	}
	return nil
}

// maxGenerated is the most requests workload.Generate makes.
const maxGenerated = 100_000_000

// requestsFor returns how many requests generator name must make for its
// traffic at rate (0 = the generators' default) sped up scale times
// (--rate-scale, a sweep's largest) to last duration: the expected arrivals
// with a margin, plus the storm's burst, which comes on top of its traffic
// at rate but counts towards its requests (and took them first: the
// background traffic stopped early, or never started).
func requestsFor(name string, params map[string]float64, rate, scale float64, duration time.Duration) int {
	if rate == 0 {
		rate = 10
	}
	rate *= scale
	n := int(min(rate*duration.Seconds()*1.5, maxGenerated)) + 10 // bounded: no int overflow
	if name == "storm" {
		burst, ok := params["burst"]
		for _, g := range workload.Generators() {
			for _, p := range g.Params {
				if !ok && g.Name == name && p.Name == "burst" {
					burst = p.Default
				}
			}
		}
		n += int(min(burst, 1e8)) // Generate refuses more than 1e8 requests
	}
	return n
}

// writeFileWith creates path and fills it with f.
func writeFileWith(path string, f func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := f(fh); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Close(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// printGenerators lists the workload generators and their parameters.
// generatorFlags checks the generator flags bench and sim share before
// workload.Generate sees them, so that a bad value is named as the flag
// given (--workload, --arrivals, --params), not as the workload package's
// field ("arrivals.kind"), and returns the parsed --params. --arrivals
// trace, a trace's own timestamps, is refused: a generator has none, and
// ran it as poisson. cv reports whether --cv was given: it shapes gamma
// arrivals only, and was ignored with any other.
func generatorFlags(name, arrivals string, cv bool, params string) (map[string]float64, error) {
	i := slices.IndexFunc(workload.Generators(), func(g workload.Generator) bool { return g.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("--workload: unknown generator %q (have %s)", name, strings.Join(workload.GeneratorNames(), ", "))
	}
	gen := workload.Generators()[i]
	switch arrivals {
	case "", workload.Poisson, workload.Gamma, workload.Constant:
	default:
		return nil, fmt.Errorf("--arrivals %q is not one of %s, %s, %s", arrivals, workload.Poisson, workload.Gamma, workload.Constant)
	}
	if cv && arrivals != workload.Gamma {
		return nil, fmt.Errorf("--cv applies to --arrivals %s only (the arrivals are %s)", workload.Gamma, cmp.Or(arrivals, workload.Poisson))
	}
	p, err := workload.ParseParams(params)
	if err != nil {
		return nil, fmt.Errorf("--params: %s", strings.TrimPrefix(err.Error(), "workload: "))
	}
	known := make([]string, len(gen.Params))
	for i, gp := range gen.Params {
		known[i] = gp.Name
	}
	keys := slices.Sorted(maps.Keys(p))
	for _, k := range keys {
		if !slices.Contains(known, k) {
			return nil, fmt.Errorf("--params: generator %s has no parameter %q (have %s)", name, k, strings.Join(known, ", "))
		}
	}
	return p, nil
}

func printGenerators(w io.Writer) {
	for _, g := range workload.Generators() {
		fmt.Fprintf(w, "%s: %s\n", g.Name, g.Summary)
		for _, p := range g.Params {
			fmt.Fprintf(w, "    %-12s %-8s %s [%s..%s]\n", p.Name, strconv.FormatFloat(p.Default, 'g', -1, 64), p.Doc,
				strconv.FormatFloat(p.Min, 'f', -1, 64), strconv.FormatFloat(p.Max, 'f', -1, 64))
		}
	}
}

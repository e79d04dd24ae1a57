package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// simArgs is a small, fast kvroute sim run on toy engines.
var simArgs = []string{"sim", "--workload", "chat", "--requests", "200", "--rate", "40", "--engines", "2xtiny",
	"--params", "system_len=96,user_len=40,reply_len=24,max_len=700", "--quiet"}

func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := append(append([]string{}, simArgs...), "--policies", "kv-aware,round_robin", "--out", dir)
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	for _, want := range []string{"kv-aware", "round_robin", "ttft99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	for _, f := range []string{"report.json", "report.csv", "report.html", "requests.csv", "ttft_cdf.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("--out: %v", err)
		}
	}
	rep := readReportJSON(t, filepath.Join(dir, "report.json"))
	if len(rep.Rows) != 2 || rep.Source != "sim" || rep.Rows[0].Requests != 200 {
		t.Fatalf("report.json: %d rows, source %q, first row %d requests; want 2 rows of 200 from sim", len(rep.Rows), rep.Source, rep.Rows[0].Requests)
	}
	// --help names every file --out writes (but the charts, "SVG charts").
	var help bytes.Buffer
	if err := run(context.Background(), []string{"sim", "--help"}, &help, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".svg") && strings.Count(help.String(), e.Name()) < 2 { // description and --out
			t.Errorf("--out wrote %s, which --help does not name in both the description and the flag", e.Name())
		}
	}
	csv, err := os.ReadFile(filepath.Join(dir, "requests.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(csv, []byte("\n")); n != 1+2*200 {
		t.Errorf("requests.csv: %d lines, want %d", n, 1+2*200)
	}
}

func TestSimCommandSweepIsDeterministic(t *testing.T) {
	var a, b, errb bytes.Buffer
	args := append(append([]string{}, simArgs...), "--policies", "round_robin", "--sweep", "0.5:1:0.5", "--parallel", "2")
	if err := run(context.Background(), args, &a, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	if err := run(context.Background(), args, &b, &errb); err != nil {
		t.Fatalf("run: %v", err)
	}
	if a.String() != b.String() {
		t.Fatalf("two runs differ:\n%s\n%s", a.String(), b.String())
	}
	if n := strings.Count(a.String(), "round_robin"); n != 2 {
		t.Errorf("sweep rows: got %d, want 2:\n%s", n, a.String())
	}
}

func TestSimCommandFleetFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte("engines:\n  - {count: 1, profile: tiny}\n  - {count: 1, profile: tiny, speed: 0.5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	// simArgs' --engines would be ignored: --fleet is the fleet.
	var out0, errb0 bytes.Buffer
	if err := run(context.Background(), append(append([]string{}, simArgs...), "--fleet", path), &out0, &errb0); !errors.Is(err, errUsage) {
		t.Errorf("--fleet with --engines: got %v, want a usage error", err)
	}
	args := []string{"sim", "--workload", "chat", "--requests", "200", "--rate", "40", "--quiet",
		"--params", "system_len=96,user_len=40,reply_len=24,max_len=700", "--policies", "least_request", "--fleet", path, "--out", t.TempDir()}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	if !strings.Contains(out.String(), "least_request") {
		t.Errorf("table lacks the policy row:\n%s", out.String())
	}
}

func TestSimCommandUsageErrors(t *testing.T) {
	for _, extra := range [][]string{
		{"--policies", "nope"},
		{"--trace", "x.jsonl"},
		{"--sweep", "2:1:1"},
		{"--sweep", "1:1:Inf"},  // was: exit 1, "rate scale -9.223372036854776e+09 must be positive"
		{"--rate-scale", "Inf"}, // was: exit 1, "rate scale +Inf must be positive"
		{"--engines", "0xtiny"},
		{"--engines", "2xnope"},
		{"--policy-param", "kv-aware"},
		{"--policy-param", "llm-d.queue_weight=1"},
		{"--routers", "0"},
		{"--engines", "2xtiny/prefill"}, // nothing could decode: every request would fail
		{"--limit", "-1"},               // was: all 12,031 requests
		{"--duration", "-1s"},           // was: all
		{"--stale-after", "-1s"},        // was: accepted
		{"--pd-gbps", "0"},              // was: the default 400 Gb/s
		{"--pd-mode", "sometimes"},      // was: ignored without prefill engines
		{"--slo-ttft", "-1s"},           // was: exit 1 after loading the workload
		{"--policies", "kv-aware,round_robin,kv-aware"},
		{"--workload", "nope"}, // was: exit 1, unlike an unknown policy
		{"--params", "nope=1"}, // likewise
		{"--tp", "4"},          // without --hf-config it would be ignored
		{"--gpu", "a100"},      // likewise
		{"--dtype", "fp8"},     // likewise
	} {
		var out, errb bytes.Buffer
		args := append(append([]string{}, simArgs...), extra...)
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) {
			t.Errorf("%v: got %v, want a usage error", extra, err)
		}
	}
	// Generator flags without --workload: the trace would ignore them.
	for _, extra := range [][]string{{"--rate", "50"}, {"--requests", "10"}, {"--params", "turns=2"}} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), append([]string{"sim", "--quiet", "--limit", "10"}, extra...), &out, &errb); !errors.Is(err, errUsage) {
			t.Errorf("%v without --workload: got %v, want a usage error", extra, err)
		}
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"sim", "--trace", filepath.Join(t.TempDir(), "missing.jsonl"), "--quiet"}, &out, &errb); err == nil {
		t.Error("missing trace: got nil error")
	}
}

// TestSimCommandNamesTheFlag: a bad generator value is the flag's usage
// error, named as typed ("--rate -5"), not the generator's field
// ("arrivals.rate -5 must be > 0", "requests -5 out of range"), and
// --parallel 0 is refused rather than quietly run as 1.
func TestSimCommandNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "-5"}, "kvroute sim: --rate -5: must be positive"},
		{[]string{"--rate", "0"}, "kvroute sim: --rate 0: must be positive"},
		{[]string{"--requests", "-5"}, "kvroute sim: --requests -5: must be at least 1"},
		{[]string{"--cv", "-1", "--arrivals", "gamma"}, "kvroute sim: --cv -1: must be positive"},
		{[]string{"--cv", "3"}, "kvroute sim: --cv applies to --arrivals gamma only (the arrivals are poisson)"}, // was: ignored
		{[]string{"--parallel", "0"}, "kvroute sim: --parallel 0: must be at least 1"},
		{[]string{"--rate", "inf"}, "kvroute sim: --rate +Inf: must be at most 1e+06"},      // was: arrivals.rate +Inf must be > 0
		{[]string{"--rate", "2e6"}, "kvroute sim: --rate 2e+06: must be at most 1e+06"},     // was: arrivals.rate 2e+06 requests/s is above ...
		{[]string{"--requests", "200000000"}, "kvroute sim: --requests 200000000: must be"}, // was: requests 200000000 out of range
	} {
		var out, errb bytes.Buffer
		args := append([]string{"sim", "--workload", "chat", "--quiet"}, tc.args...)
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: got %v, stderr %q; want a usage error with %q", tc.args, err, errb.String(), tc.want)
		}
	}
}

// TestSimCommandHFConfigPD: a model from a config.json runs as a P/D fleet
// (groups named hf), and the run prints the KV fabric it used.
func TestSimCommandHFConfigPD(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,
		"num_hidden_layers":32,"num_key_value_heads":8,"vocab_size":128256,"torch_dtype":"bfloat16","max_position_embeddings":131072}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := []string{"sim", "--workload", "rag", "--requests", "60", "--rate", "4", "--hf-config", cfg, "--engines", "1xhf/prefill,1xhf/decode",
		"--policies", "kv-aware", "--pd-mode", "always"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	for _, want := range []string{"pd-always:kv-aware", "KV fabric", "node p99/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestSimCommandPrintsTTFTBound: kvroute sim --quiet prints the TTFT lower
// bound's percentiles under the table (the workload's bounds plus the
// network round trip, nearest-rank) and records them in report.json; no
// policy's percentile is below the bound's.
func TestSimCommandPrintsTTFTBound(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := append(append([]string{}, simArgs...), "--policies", "kv-aware,round_robin", "--out", dir)
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}

	// The same workload and fleet, bounded here.
	w, err := loadSimWorkload(&simOptions{workloadName: "chat", requests: 200, rate: 40, seed: 1,
		params: "system_len=96,user_len=40,reply_len=24,max_len=700"})
	if err != nil {
		t.Fatal(err)
	}
	bounds, err := sim.TTFTBounds(sim.Fleet{{Count: 2, Profile: "tiny"}}, w.Requests)
	if err != nil {
		t.Fatal(err)
	}
	for i := range bounds {
		bounds[i] += 2 * sim.DefaultNetLatency
	}
	want := map[string]time.Duration{"p50": report.Percentile(bounds, 0.5), "p90": report.Percentile(bounds, 0.9),
		"p99": report.Percentile(bounds, 0.99)}
	line := ""
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "ttft lower bound") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no ttft lower bound line:\n%s", out.String())
	}
	for _, q := range []string{"p50", "p90", "p99"} {
		if s := q + " " + report.FormatDuration(want[q]); !strings.Contains(line, s) {
			t.Errorf("bound line lacks %q: %s", s, line)
		}
	}

	rep := readReportJSON(t, filepath.Join(dir, "report.json"))
	p99, err := strconv.ParseFloat(rep.Params["ttft_bound_p99_ms"], 64)
	if err != nil || math.Abs(p99-float64(want["p99"])/1e6) > 0.001 {
		t.Errorf("report.json ttft_bound_p99_ms %q (%v), want %v", rep.Params["ttft_bound_p99_ms"], err, want["p99"])
	}
	for _, row := range rep.Rows {
		if row.Completed == row.Requests && (row.TTFT.P50 < want["p50"] || row.TTFT.P99 < want["p99"]) {
			t.Errorf("%s: ttft p50 %v, p99 %v below the bound's %v, %v", row.Name, row.TTFT.P50, row.TTFT.P99, want["p50"], want["p99"])
		}
	}

	var help bytes.Buffer
	if err := run(context.Background(), []string{"sim", "--help"}, &help, &help); err != nil && !errors.Is(err, errUsage) && !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(help.String(), "TTFT lower bound") {
		t.Errorf("--help does not explain the TTFT lower bound:\n%s", help.String())
	}
}

// readReportJSON reads a report.json that a command wrote.
func readReportJSON(t *testing.T, path string) *report.Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestSimCommandPDCounts: --engines N/prefill,M/decode, the form --pd-mode's
// help names, runs a P/D fleet of --profile's engines.
func TestSimCommandPDCounts(t *testing.T) {
	var out, errb bytes.Buffer
	args := append(append([]string{}, simArgs...), "--engines", "1/prefill,1/decode", "--profile", "tiny", "--policies", "kv-aware", "--pd-mode", "always")
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	if !strings.Contains(out.String(), "pd-always:kv-aware") {
		t.Errorf("output lacks the P/D row:\n%s", out.String())
	}
}

// TestSimCommandRequestsCSVRunNames: requests.csv names each run as the
// report's rows do; a P/D run was "kv-aware" there and
// "pd-always:kv-aware" in report.csv and report.json.
func TestSimCommandRequestsCSVRunNames(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"sim", "--limit", "20", "--quiet", "--engines", "1/prefill,1/decode", "--policies", "kv-aware,round_robin",
		"--pd-mode", "always", "--out", dir}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	f, err := os.Open(filepath.Join(dir, "requests.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, l := range lines[1:] {
		runs[l[0]]++
	}
	want := map[string]int{"pd-always:kv-aware": 20, "pd-always:round_robin": 20}
	if !maps.Equal(runs, want) {
		t.Errorf("requests.csv runs %v, want the report's row names %v", runs, want)
	}
}

// TestSimCommandOutBeforeRun: an unwritable --out fails before the
// simulations, not after them.
func TestSimCommandOutBeforeRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := append(append([]string{}, simArgs...), "--out", filepath.Join(file, "out"))
	if err := run(context.Background(), args, &out, &errb); err == nil || !strings.Contains(err.Error(), "--out") {
		t.Errorf("got %v, want an --out error", err)
	}
	if out.Len() > 0 {
		t.Errorf("stdout %q: want no table (no run)", out.String())
	}
}

// TestSimCommandBreakdownAligned: the TTFT breakdown and KV fabric tables
// keep their columns under the header for long run names (a P/D run is
// named pd-conditional:POLICY, longer than the name column was).
func TestSimCommandBreakdownAligned(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"sim", "--workload", "chat", "--requests", "60", "--rate", "20", "--engines", "1/prefill,1/decode", "--profile", "tiny",
		"--params", "system_len=96,user_len=40,reply_len=24,max_len=700", "--policies", "sglang-cache-aware", "--pd-mode", "always"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	// fieldEnd is the offset where the line's n-th field (from 0) ends.
	fieldEnd := func(line string, n int) int {
		end, in := -1, false
		for i, r := range line + " " {
			switch {
			case r != ' ' && !in:
				in = true
			case r == ' ' && in:
				in = false
				if n--; n < 0 {
					return i
				}
				end = i
			}
		}
		return end
	}
	lines := strings.Split(out.String(), "\n")
	tables := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "name ") || i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "pd-always:") {
			continue
		}
		tables++
		if h, r := fieldEnd(l, 1), fieldEnd(lines[i+1], 1); h != r {
			t.Errorf("the load column ends at %d in the header, %d in the row:\n%s\n%s", h, r, l, lines[i+1])
		}
	}
	if tables != 3 { // the report, the TTFT breakdown and the KV fabric
		t.Errorf("found %d tables with a pd-always row, want 3:\n%s", tables, out.String())
	}
}

// TestSimCommandSweepUtilisationHeaviest: the utilisation charts of a sweep
// are the heaviest load point's, whatever the order of the --sweep list.
func TestSimCommandSweepUtilisationHeaviest(t *testing.T) {
	util := func(sweep string) string {
		dir := t.TempDir()
		var out, errb bytes.Buffer
		args := append(append([]string{}, simArgs...), "--policies", "round_robin", "--sweep", sweep, "--out", dir)
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("run: %v\nstderr: %s", err, errb.String())
		}
		rep := readReportJSON(t, filepath.Join(dir, "report.json"))
		b, err := json.Marshal(rep.Utilisation)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if up, down, light := util("0.5,2"), util("2,0.5"), util("0.5"); up != down || up == light {
		t.Errorf("utilisation of --sweep 2,0.5 differs from --sweep 0.5,2's (the x2 point), or equals x0.5's:\n0.5,2: %.200s\n2,0.5: %.200s", up, down)
	}
}

// countCtx is a context whose Err reports cancellation from its limit-th
// call on (0 = never); calls counts them. sim.Run polls Err between events,
// so a limit stops a run at a deterministic point.
type countCtx struct {
	context.Context
	calls, limit int
}

func (c *countCtx) Err() error {
	c.calls++
	if c.limit > 0 && c.calls >= c.limit {
		return context.Canceled
	}
	return nil
}

// TestSimCommandInterruptedReportsFinishedRuns: Ctrl-C during the second
// policy's run still prints (and writes) the first policy's row, and returns
// the cancellation.
func TestSimCommandInterruptedReportsFinishedRuns(t *testing.T) {
	// How many polls the first run takes on its own.
	first := &countCtx{Context: context.Background()}
	var out, errb bytes.Buffer
	if err := run(first, append(append([]string{}, simArgs...), "--policies", "kv-aware"), &out, &errb); err != nil {
		t.Fatalf("run: %v", err)
	}
	ctx := &countCtx{Context: context.Background(), limit: first.calls + 1}
	dir := t.TempDir()
	out.Reset()
	errb.Reset()
	err := run(ctx, append(append([]string{}, simArgs...), "--policies", "kv-aware,round_robin", "--out", dir), &out, &errb)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run: got %v, want the cancellation", err)
	}
	if !strings.Contains(out.String(), "kv-aware") || strings.Contains(out.String(), "round_robin") {
		t.Errorf("table: want the finished kv-aware row only:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "1 of 2 runs") {
		t.Errorf("stderr %q does not say the report is partial", errb.String())
	}
	if rep := readReportJSON(t, filepath.Join(dir, "report.json")); len(rep.Rows) != 1 {
		t.Errorf("report.json: %d rows, want 1", len(rep.Rows))
	}
}

// TestSimCommandExplicitZeros: sim.Config and the generators read zero as
// "the default", so --rate 0 ran at 10/s and --requests 0 ran 1000 requests
// without a word; a zero given on the command line is now a usage error,
// except --net-latency 0, which means no latency (it was the 1ms default).
func TestSimCommandExplicitZeros(t *testing.T) {
	for _, extra := range [][]string{
		{"--rate", "0"},
		{"--requests", "0"},
		{"--arrivals", "gamma", "--cv", "0"},
		{"--scrape-interval", "0"},
		{"--stale-after", "0"},
		{"--kv-event-delay", "0"},
	} {
		var out, errb bytes.Buffer
		args := append(append([]string{}, simArgs...), extra...)
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.Contains(errb.String(), extra[len(extra)-2]+" 0") {
			t.Errorf("%v: got %v (%q), want a usage error naming the flag", extra, err, errb.String())
		}
	}
	table := func(lat string) string {
		var out, errb bytes.Buffer
		args := append(append([]string{}, simArgs...), "--net-latency", lat, "--policies", "round_robin", "--requests", "60")
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("--net-latency %s: %v: %s", lat, err, errb.String())
		}
		return out.String()
	}
	if zero, none := table("0"), table("-1ms"); zero != none {
		t.Errorf("--net-latency 0 differs from a negative latency (none):\n%s\nvs\n%s", zero, none)
	}
}

// TestSimCommandPDFleetOfTwoModels: a P/D fleet whose engines run two
// models, and a fabric below the simulator's floor, are bad flag values
// (exit status 2 naming the problem), refused before any run; the first
// ran (a decode engine using another model's KV), the second failed every
// run with exit status 1.
func TestSimCommandPDFleetOfTwoModels(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--engines", "1xllama-3.1-8b-h100/prefill,1xqwen2.5-7b-h100/decode"}, "a P/D fleet runs one model"},
		{[]string{"--engines", "1/prefill,1/decode", "--pd-gbps", "0.001"}, "--pd-gbps 0.001 must be at least 0.01"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"sim", "--limit", "3", "--quiet", "--policies", "kv-aware"}, c.args...)
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: got %v (%q), want a usage error saying %q", c.args, err, errb.String(), c.want)
		}
	}
}

// TestSimCommandRateScalePastTheClock: a rate scale that would stretch
// the arrivals past the simulator's clock is a bad flag value (exit status
// 2 naming the flag); it failed the runs with exit status 1.
func TestSimCommandRateScalePastTheClock(t *testing.T) {
	for _, c := range []struct{ flag, value string }{{"--rate-scale", "1e-300"}, {"--sweep", "1,1e-300"}} {
		var out, errb bytes.Buffer
		args := []string{"sim", "--limit", "20", "--quiet", "--policies", "kv-aware", c.flag, c.value}
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.Contains(errb.String(), c.flag+": rate scale 1e-300") {
			t.Errorf("%s %s: got %v (%q), want a usage error naming the flag", c.flag, c.value, err, errb.String())
		}
	}
}

// TestSimCommandQueueWaitZeroIsNoWait: --queue-wait 0 holds nothing, as a
// negative wait; it ran with the 5s default (sim.Config's zero value).
func TestSimCommandQueueWaitZeroIsNoWait(t *testing.T) {
	table := func(wait string) string {
		var out, errb bytes.Buffer
		args := []string{"sim", "--limit", "300", "--engines", "1", "--rate-scale", "20", "--policies", "kv-aware",
			"--policy-param", "kv-aware.overload=queue", "--queue-wait", wait}
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("--queue-wait %s: %v: %s", wait, err, errb.String())
		}
		return out.String()
	}
	zero, none, def := table("0"), table("-1ms"), table("5s")
	if zero != none {
		t.Errorf("--queue-wait 0 differs from a negative wait (none):\n%s\nvs\n%s", zero, none)
	}
	if none == def || !strings.Contains(def, " held ") {
		t.Fatalf("the scenario holds no request with the default wait, so it tests nothing:\n%s", def)
	}
}

// TestSimCommandBoundPerRunWhenSomeFail: when runs complete different
// requests (a drain), each run's TTFT bound covers its own completed
// requests, printed per run; one line for all was below some rows' TTFT p99.
func TestSimCommandBoundPerRunWhenSomeFail(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"sim", "--limit", "30", "--engines", "2", "--drain", "1ns", "--quiet", "--policies", "kv-aware,round_robin"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	s := out.String()
	if !strings.Contains(s, "ttft lower bound over each run's completed requests") ||
		!strings.Contains(s, "\n  kv-aware: p50 ") || !strings.Contains(s, "\n  round_robin: p50 ") {
		t.Errorf("want one bound line per run:\n%s", s)
	}
}

// TestSimCommandPrintsFailures: failed requests are explained, as bench
// explains them: the table's "errors kv-aware: http_400=38" alone did not
// say that the prompts were longer than the engines' context.
func TestSimCommandPrintsFailures(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"sim", "--engines", "2xtiny", "--workload", "chat", "--requests", "50", "--policies", "kv-aware"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "http_400=") {
		t.Fatalf("the run had no refused request; the test needs one:\n%s", out.String())
	}
	if s := errb.String(); !strings.Contains(s, "first failure of each kind:\n  http_400: engine: add: ") || !strings.Contains(s, "exceed the max model length 1024") {
		t.Errorf("stderr does not explain the failures:\n%s", s)
	}
}

// TestWorkloadList: `sim --workload list` and `bench --workload list` print
// every generator with its parameters (sim's --params help points there).
func TestWorkloadList(t *testing.T) {
	for _, cmd := range []string{"sim", "bench"} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), []string{cmd, "--workload", "list"}, &out, &errb); err != nil {
			t.Fatalf("%s --workload list: %v\n%s", cmd, err, errb.String())
		}
		for _, g := range workload.Generators() {
			if !strings.Contains(out.String(), g.Name+": ") {
				t.Errorf("%s --workload list lacks %q:\n%s", cmd, g.Name, out.String())
			}
			for _, p := range g.Params {
				if !strings.Contains(out.String(), "    "+p.Name+" ") {
					t.Errorf("%s --workload list lacks %s's parameter %q", cmd, g.Name, p.Name)
				}
				if r := fmt.Sprintf("[%s..%s]", strconv.FormatFloat(p.Min, 'f', -1, 64), strconv.FormatFloat(p.Max, 'f', -1, 64)); !strings.Contains(out.String(), r) {
					t.Errorf("%s --workload list lacks %s's range %s", cmd, p.Name, r)
				}
			}
		}
	}
}

// TestSimCommandLoadColumns: every table sim prints gives a run the load
// report.json (and report.csv) give it. The TTFT breakdown and KV fabric
// tables printed the rate scale as the load of a run that was not a sweep
// ("load 2" for --rate-scale 2), where the report says 0 and its table has
// no load column.
func TestSimCommandLoadColumns(t *testing.T) {
	for _, extra := range [][]string{{"--rate-scale", "2"}, {"--sweep", "1,2"}} {
		t.Run(strings.Join(extra, " "), func(t *testing.T) {
			dir := t.TempDir()
			var out, errb bytes.Buffer
			args := []string{"sim", "--workload", "chat", "--requests", "60", "--rate", "20", "--engines", "1/prefill,1/decode", "--profile", "tiny",
				"--params", "system_len=96,user_len=40,reply_len=24,max_len=700", "--policies", "round_robin", "--pd-mode", "always", "--out", dir}
			if err := run(context.Background(), append(args, extra...), &out, &errb); err != nil {
				t.Fatalf("run: %v\nstderr: %s", err, errb.String())
			}
			rep := readReportJSON(t, filepath.Join(dir, "report.json"))
			lines := strings.Split(out.String(), "\n")
			tables := 0
			for i, l := range lines {
				head := strings.Fields(l)
				if len(head) == 0 || head[0] != "name" {
					continue
				}
				tables++
				col := slices.Index(head, "load")
				for j, row := range lines[i+1:] {
					if strings.TrimSpace(row) == "" || j >= len(rep.Rows) {
						break
					}
					f := strings.Fields(row)
					switch {
					case col < 0 && rep.Rows[j].Load != 0:
						t.Errorf("table %q has no load column, report.json's row %d has load %g", l, j, rep.Rows[j].Load)
					case col >= 0 && (col >= len(f) || f[col] != strconv.FormatFloat(rep.Rows[j].Load, 'g', -1, 64)):
						t.Errorf("table %q row %q: load column differs from report.json's load %g", l, row, rep.Rows[j].Load)
					}
				}
			}
			if tables != 3 { // the report, the TTFT breakdown and the KV fabric
				t.Errorf("found %d tables, want 3:\n%s", tables, out.String())
			}
		})
	}
}

// TestWorkloadAndFleetFlagsNamed: a bad --workload, --arrivals, --params,
// --policies, --policy-param, --engines, --profile or --fleet is a usage
// error naming the flag, as the other flags' are, not the package's field
// ("workload: arrivals.kind", "engine: unknown profile"); --arrivals trace,
// which a generator ran as poisson without a word, is refused.
func TestWorkloadAndFleetFlagsNamed(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	gen := []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "bogus"}, `--workload: unknown generator "bogus" (have chat, lora, rag, storm, sysprompt, tenants)`},
		{[]string{"--arrivals", "trace"}, `--arrivals "trace" is not one of poisson, gamma, constant`},
		{[]string{"--arrivals", "x"}, `--arrivals "x" is not one of poisson, gamma, constant`},
		{[]string{"--params", "x"}, `--params: param "x" is not key=value`},
		{[]string{"--params", "bogus=1"}, `--params: generator chat has no parameter "bogus" (have turns,`},
	}
	for _, tc := range gen {
		for _, cmd := range [][]string{
			{"sim", "--workload", "chat", "--quiet", "--requests", "10"},
			{"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--workload", "chat", "--quiet", "--requests", "10"},
		} {
			var out, errb bytes.Buffer
			args := append(append([]string{}, cmd...), tc.args...)
			want := "kvroute " + cmd[0] + ": " + tc.want
			if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.HasPrefix(errb.String(), want) {
				t.Errorf("%v: got %v, stderr %q; want a usage error starting %q", args, err, errb.String(), want)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policies", "bogus"}, `--policies: unknown policy "bogus" (known: `},
		{[]string{"--policies", "kv-aware", "--policy-param", "kv-aware.bogus=1"}, `--policy-param: policy kv-aware: unknown param "bogus"`},
		{[]string{"--engines", "0"}, `--engines: `},
		{[]string{"--engines", "2xbogus"}, `--engines: unknown profile "bogus" (known: `},
		{[]string{"--profile", "bogus"}, `--profile: unknown profile "bogus" (known: `},
		{[]string{"--fleet", missing}, `--fleet: `},
		{[]string{"--gpu", "a100"}, `--gpu applies to --hf-config`}, // was: "--hf-config: --gpu applies to --hf-config"
		{[]string{"--profile", "tiny", "--hf-config", "../../engine/testdata/hf/llama-3.1-8b.json"}, "give --profile or --hf-config, not both"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"sim", "--workload", "chat", "--quiet", "--requests", "10"}, tc.args...)
		want := "kvroute sim: " + tc.want
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.HasPrefix(errb.String(), want) {
			t.Errorf("%v: got %v, stderr %q; want a usage error starting %q", tc.args, err, errb.String(), want)
		}
	}
}

// TestSimCommandMaxLoRAs: --max-loras reaches the engines (a lora
// workload's table differs between 1 and 4 adapters a step), is in the
// report's parameters for a workload with adapters only, and 0 is a usage
// error.
func TestSimCommandMaxLoRAs(t *testing.T) {
	lora := []string{"sim", "--workload", "lora", "--requests", "150", "--rate", "60", "--engines", "2xtiny",
		"--params", "system_len=96,user_len=40,output_len=24", "--policies", "round_robin", "--quiet"}
	table := func(args []string, maxLoRAs string) (string, *report.Report) {
		dir := t.TempDir()
		var out, errb bytes.Buffer
		args = append(append([]string{}, args...), "--max-loras", maxLoRAs, "--out", dir)
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%v: %v: %s", args, err, errb.String())
		}
		return out.String(), readReportJSON(t, filepath.Join(dir, "report.json"))
	}
	one, rep := table(lora, "1")
	four, _ := table(lora, "4")
	if one == four {
		t.Errorf("--max-loras 1 and 4 give the same table:\n%s", one)
	}
	if got := rep.Params["max_loras"]; got != "1" {
		t.Errorf("report params max_loras %q, want 1", got)
	}
	if _, rep := table(simArgs, "1"); rep.Params["max_loras"] != "" {
		t.Errorf("a workload without adapters: report params max_loras %q, want none", rep.Params["max_loras"])
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), append(append([]string{}, lora...), "--max-loras", "0"), &out, &errb); !errors.Is(err, errUsage) ||
		!strings.Contains(errb.String(), "--max-loras 0") {
		t.Errorf("--max-loras 0: got %v (%q), want a usage error naming the flag", err, errb.String())
	}
}

// Command ttft-tables regenerates README's "What it does to TTFT" tables. It
// runs `kvroute sim` once per row and seed (the commands README quotes, with
// every policy), reads each run's report.json and prints the two markdown
// tables of the first seed, then, for each row, the mean margin of kv-aware
// against the best baseline over all the seeds with its standard error, the
// most any router could gain there (1 - the TTFT lower bound / the best
// baseline), the rows where that is under the project's 30% goal, and the
// runs where kv-aware's throughput is more than 1% below the best
// baseline's.
//
//	go build -o /tmp/kvroute ./cmd/kvroute
//	go run ./scripts/ttft-tables --bin /tmp/kvroute --seeds 1-16
//
// Runs are deterministic for their seed; --jobs runs several at once (each is
// single-threaded).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/report"
)

// policies are the table's columns, kv-aware first.
var policies = []string{"kv-aware", "round_robin", "least_request", "llm-d", "dynamo", "sglang-cache-aware", "preble-e2", "kubeai-chwbl"}

// row is one line of a table: its label and the sim flags that produce it.
type row struct {
	label string
	args  []string
}

func gen(workload string, rate, requests int) row {
	return row{
		label: fmt.Sprintf("%s %d/s", workload, rate),
		args:  []string{"--workload", workload, "--rate", strconv.Itoa(rate), "--requests", strconv.Itoa(requests)},
	}
}

// steady: 20,000 requests per generator at two rates, near where the
// cache-blind policies saturate. bursts: 2,000 requests on a cold fleet, and
// the first 3,000 requests of the embedded Mooncake trace at its rate and at
// four times it.
var (
	steady = []row{
		gen("chat", 100, 20000), gen("chat", 140, 20000),
		gen("rag", 150, 20000), gen("rag", 180, 20000),
		gen("storm", 300, 20000), gen("storm", 400, 20000),
		gen("sysprompt", 100, 20000), gen("sysprompt", 130, 20000),
		gen("tenants", 150, 20000), gen("tenants", 200, 20000),
	}
	bursts = []row{
		gen("chat", 550, 2000), gen("rag", 420, 2000), gen("storm", 320, 2000),
		gen("sysprompt", 1000, 2000), gen("tenants", 650, 2000),
		{label: "trace x1", args: []string{"--limit", "3000"}},
		{label: "trace x4", args: []string{"--limit", "3000", "--rate-scale", "4"}},
	}
)

func main() {
	bin := flag.String("bin", "kvroute", "the kvroute binary to run")
	seedList := flag.String("seeds", "1", "comma-separated seeds and ranges of seeds (1,2,5-8); the tables show the first")
	jobs := flag.Int("jobs", runtime.GOMAXPROCS(0), "sim runs at once")
	only := flag.String("only", "", "run only the rows whose label contains this")
	flag.Parse()
	seeds, err := parseSeeds(*seedList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ttft-tables:", err)
		os.Exit(2)
	}
	if err := run(os.Stdout, *bin, seeds, max(1, *jobs), *only); err != nil {
		fmt.Fprintln(os.Stderr, "ttft-tables:", err)
		os.Exit(1)
	}
}

// parseSeeds reads --seeds: seeds and ranges of seeds, comma-separated
// ("1,2,5-8").
func parseSeeds(s string) ([]uint64, error) {
	var seeds []uint64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 64)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 64)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("--seeds: %q is not a seed or a range of seeds (5-8)", f)
		}
		if b-a >= 10000 {
			return nil, fmt.Errorf("--seeds: %q is over 10,000 seeds", f)
		}
		for v := a; ; v++ {
			seeds = append(seeds, v)
			if v == b {
				break
			}
		}
	}
	return seeds, nil
}

// result is one row of one seed: the p99 TTFT and throughput per policy
// (in policies' order) and the run's TTFT lower bound (p99).
type result struct {
	p99   []float64 // seconds
	rps   []float64
	e2e   [][2]float64 // end-to-end p50 and p99, seconds
	bound float64      // seconds
}

func run(w io.Writer, bin string, seeds []uint64, jobs int, only string) error {
	tmp, err := os.MkdirTemp("", "ttft-tables-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	type task struct {
		table, i int
		seed     uint64
	}
	tables := [][]row{steady, bursts}
	results := make([][][]*result, len(tables)) // [table][row][seed]
	var tasks []task
	for t, rows := range tables {
		results[t] = make([][]*result, len(rows))
		for i, r := range rows {
			results[t][i] = make([]*result, len(seeds))
			if !strings.Contains(r.label, only) {
				continue
			}
			for si := range seeds {
				tasks = append(tasks, task{t, i, uint64(si)})
			}
		}
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	work := make(chan task)
	for range jobs {
		wg.Go(func() {
			for tk := range work {
				r := tables[tk.table][tk.i]
				seed := seeds[tk.seed]
				out := filepath.Join(tmp, fmt.Sprintf("%d-%d-%d", tk.table, tk.i, seed))
				res, err := simulate(bin, r, seed, out)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s seed %d: %w", r.label, seed, err))
				} else {
					results[tk.table][tk.i][tk.seed] = res
					fmt.Fprintf(os.Stderr, "done: %s seed %d\n", r.label, seed)
				}
				mu.Unlock()
			}
		})
	}
	for _, tk := range tasks {
		work <- tk
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	header := "| workload (rate) | " + strings.Join(policies, " | ") + " | kv-aware vs best baseline | lower bound |\n" +
		"|---" + strings.Repeat("|---", len(policies)+2) + "|\n"
	for t, rows := range tables {
		fmt.Fprintf(w, "\nseed %d:\n\n%s", seeds[0], header)
		for i, r := range rows {
			if res := results[t][i][0]; res != nil {
				fmt.Fprintln(w, tableRow(r.label, res))
			}
		}
	}
	fmt.Fprintf(w, "\nmean margin of kv-aware against the best baseline over seeds %v, with its standard error\n"+
		"over the seeds (points), and the most any router could gain (1 - lower bound / best baseline, mean over the seeds):\n", seeds)
	var outOfReach []string
	for t, rows := range tables {
		for i, r := range rows {
			s, ok := summarize(results[t][i])
			if !ok {
				continue
			}
			se := "   -"
			if len(s.each) > 1 {
				se = fmt.Sprintf("%4.1f", s.se*100)
			}
			fmt.Fprintf(w, "%-16s %5s ± %s  most %3.0f%%  (%s)\n", r.label, percent(s.mean), se, s.room*100, strings.Join(s.each, " "))
			if s.room < goal {
				outOfReach = append(outOfReach, fmt.Sprintf("%s (%.0f%%)", r.label, s.room*100))
			}
		}
	}
	if len(outOfReach) > 0 {
		fmt.Fprintf(w, "\nrows where no router could be %.0f%% below the best baseline: %s\n", goal*100, strings.Join(outOfReach, ", "))
	}
	fmt.Fprintln(w, "\nthroughput of kv-aware more than 1% below the best baseline's:")
	for t, rows := range tables {
		for i, r := range rows {
			for si, res := range results[t][i] {
				if res == nil {
					continue
				}
				if best, bi := res.bestRPS(); res.rps[0] < 0.99*best {
					fmt.Fprintf(w, "%s seed %d: %.1f vs %s's %.1f req/s (e2e p50/p99 %.2f/%.2f s vs %.2f/%.2f s)\n", r.label, seeds[si],
						res.rps[0], policies[bi], best, res.e2e[0][0], res.e2e[0][1], res.e2e[bi][0], res.e2e[bi][1])
				}
			}
		}
	}
	return nil
}

// goal is the margin the project aims for: kv-aware's p99 TTFT 30% below the
// best baseline's on every row.
const goal = 0.30

// summary is one row over the seeds: kv-aware's mean margin against the best
// baseline, its standard error, each seed's margin, and the mean of the most
// any router could gain (1 - bound / best).
type summary struct {
	mean, se, room float64
	each           []string
}

// summarize reports a row's results over the seeds (ok false when none ran).
func summarize(res []*result) (s summary, ok bool) {
	var ms []float64
	for _, r := range res {
		if r == nil {
			continue
		}
		m := r.margin()
		ms = append(ms, m)
		s.mean += m
		s.room += 1 - r.bound/r.best()
		s.each = append(s.each, percent(m))
	}
	n := float64(len(ms))
	if n == 0 {
		return s, false
	}
	s.mean /= n
	s.room /= n
	if n > 1 {
		var ss float64
		for _, m := range ms {
			ss += (m - s.mean) * (m - s.mean)
		}
		s.se = math.Sqrt(ss/(n-1)) / math.Sqrt(n)
	}
	return s, true
}

// simulate runs one row with one seed and reads its report.
func simulate(bin string, r row, seed uint64, out string) (*result, error) {
	args := append([]string{"sim"}, r.args...)
	args = append(args, "--seed", strconv.FormatUint(seed, 10), "--policies", strings.Join(policies, ","), "--quiet", "--out", out)
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, stderr.String())
	}
	f, err := os.Open(filepath.Join(out, "report.json"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rep, err := report.ReadJSON(f)
	if err != nil {
		return nil, err
	}
	return fromReport(rep)
}

// fromReport picks the table's figures out of a sim report.
func fromReport(rep *report.Report) (*result, error) {
	res := &result{p99: make([]float64, len(policies)), rps: make([]float64, len(policies)), e2e: make([][2]float64, len(policies))}
	for i, p := range policies {
		found := false
		for _, r := range rep.Rows {
			if r.Name == p {
				res.p99[i], res.rps[i], found = r.TTFT.P99.Seconds(), r.ThroughputRPS, true
				res.e2e[i] = [2]float64{r.E2E.P50.Seconds(), r.E2E.P99.Seconds()}
			}
		}
		if !found {
			return nil, fmt.Errorf("report has no row for %s", p)
		}
	}
	ms, err := strconv.ParseFloat(rep.Params["ttft_bound_p99_ms"], 64)
	if err != nil {
		return nil, fmt.Errorf("report's ttft_bound_p99_ms: %w", err)
	}
	res.bound = ms / 1000
	return res, nil
}

// best returns the lowest baseline p99.
func (r *result) best() float64 {
	b := math.Inf(1)
	for _, v := range r.p99[1:] {
		b = min(b, v)
	}
	return b
}

// margin is kv-aware's p99 against the best baseline's, as a fraction
// (negative: kv-aware is lower).
func (r *result) margin() float64 { return r.p99[0]/r.best() - 1 }

// bestRPS returns the highest baseline throughput and its policy's index.
func (r *result) bestRPS() (float64, int) {
	best, bi := 0.0, 0
	for i, v := range r.rps[1:] {
		if v > best {
			best, bi = v, i+1
		}
	}
	return best, bi
}

func tableRow(label string, r *result) string {
	cells := []string{label}
	for _, v := range r.p99 {
		cells = append(cells, seconds(v))
	}
	m := percent(r.margin())
	if r.margin() > 0 {
		m += " (worse)"
	}
	cells = append(cells, m, seconds(r.bound))
	return "| " + strings.Join(cells, " | ") + " |"
}

// seconds formats a latency as README's tables do: milliseconds with one
// decimal under a second, else seconds with two decimals (no decimals from
// 100 s).
func seconds(s float64) string {
	switch {
	case s < 0.9995:
		return strconv.FormatFloat(s*1000, 'f', 1, 64)
	case s < 99.995:
		return strconv.FormatFloat(s, 'f', 2, 64) + " s"
	default:
		return strconv.FormatFloat(s, 'f', 0, 64) + " s"
	}
}

// percent formats a margin as a signed whole percentage ("0%" when it
// rounds to nothing but is not above it).
func percent(m float64) string {
	p := math.Round(m * 100)
	switch {
	case p == 0 && m > 0:
		return "+0%"
	case p == 0:
		return "0%"
	default:
		return fmt.Sprintf("%+.0f%%", p)
	}
}

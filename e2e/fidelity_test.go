package e2e

// Fidelity: issue 6 asks that one workload, run both ways, agree within 15%:
// `kvroute sim` (package sim, virtual clock) and `kvroute bench` (package
// bench, real HTTP) against a fleet of `kvroute engine`s (package emulator)
// behind `kvroute serve` (package proxy), with the same engine profile and
// speed. TestFidelity is the scaled-down check run by default;
// KVROUTE_FIDELITY=1 runs the full-scale one (more requests, longer).
//
// How the two runs are made comparable:
//
//   - Speed: both models divide every step time by the same factor
//     (emulator.Config.Speed sets engine.Config.Speed, sim.Group.Speed does
//     the same in the simulator), so no rescaling of the results is needed:
//     both report times in wall (sped-up) seconds. The arrival rate is the
//     same real-time rate in both.
//   - Prompts: completions with text prompts, so the emulator's built-in
//     tokenizer reads exactly PromptLen tokens (no chat template) and the
//     proxy's character blocks see exactly the text that sim's RouterText
//     mode hashes (workload.Request.PromptText).
//   - Sessions are cleared on both sides (the generators' user ids would
//     otherwise reach the proxy as X-Session-Id), so routing depends only on
//     the prompt and the engines' signals.
//   - Signals: the proxy scrapes every engine each fidelityScrape, the
//     simulator does the same with Config.ScrapeInterval; NetLatency models
//     loopback plus the proxy's forwarding (a fraction of a millisecond).
//
// What cannot agree exactly, and why the tolerances hold: the emulated
// engines run on a shared CPU (timer slack and goroutine scheduling add
// tens of microseconds per step, which is why decode steps are kept above a
// millisecond by the speed chosen), and routing decisions depend on the
// order of near-simultaneous arrivals and on scrape phases, which differ
// between the runs; hit rate and latency quantiles over a few hundred
// requests average that out.

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// fidelityModel is the model the fidelity fleet serves.
const fidelityModel = "fidelity"

// fidelityStall is the shortest gap in the test process's scheduling that
// counts as a stall (see fidelityStalls).
const fidelityStall = 10 * time.Millisecond

// fidelityScrape is the proxy's and the simulator's scrape interval.
const fidelityScrape = 100 * time.Millisecond

// fidelitySetup is one fidelity experiment: the fleet, the workload and the
// tolerances.
type fidelitySetup struct {
	engines   int
	profile   string
	speed     float64
	blocks    int // KV blocks per engine (0 = the profile's)
	policy    string
	generator string
	params    map[string]float64
	requests  int
	rate      float64 // requests per second, real time
	seed      uint64
	// tol is the relative tolerance of TTFT p50, TPOT p50 and hit rate;
	// tolP99 that of TTFT p99.
	tol, tolP99 float64
}

// fidelityWorkload generates the setup's workload, sessions cleared.
func fidelityWorkload(t testing.TB, s fidelitySetup) []workload.Request {
	t.Helper()
	w, err := workload.Generate(s.generator, workload.Options{Seed: s.seed, Requests: s.requests,
		Arrivals: workload.Arrivals{Kind: workload.Poisson, Rate: s.rate}, Params: s.params})
	if err != nil {
		t.Fatal(err)
	}
	reqs := w.Requests
	for i := range reqs {
		reqs[i].Session = ""
	}
	return reqs
}

// fidelitySim runs the workload through the simulator.
func fidelitySim(t testing.TB, s fidelitySetup, reqs []workload.Request, net time.Duration) (report.Row, *sim.Result) {
	t.Helper()
	res, err := sim.Run(context.Background(), sim.Config{
		Model:          fidelityModel,
		Fleet:          sim.Fleet{{Count: s.engines, Profile: s.profile, NumGPUBlocks: s.blocks, Speed: s.speed}},
		Policy:         s.policy,
		Seed:           s.seed,
		ScrapeInterval: fidelityScrape,
		RouterText:     true,
		NetLatency:     net,
	}, reqs)
	if err != nil {
		t.Fatalf("sim.Run: %v", err)
	}
	row := res.Row(0)
	row.Name = "sim"
	return row, res
}

// fidelityFleet starts the emulated engines on loopback and returns their
// endpoints; they stop when the test ends.
func fidelityFleet(t testing.TB, s fidelitySetup) []config.Endpoint {
	t.Helper()
	prof, err := engine.LookupProfile(s.profile)
	if err != nil {
		t.Fatal(err)
	}
	var eps []config.Endpoint
	for i := range s.engines {
		srv, err := emulator.New(emulator.Config{Model: fidelityModel, Speed: s.speed,
			Engine: engine.Config{Profile: prof, NumGPUBlocks: s.blocks}, Logger: logger()})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: srv.Handler()}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = hs.Serve(ln) }()
		go func() {
			defer wg.Done()
			if err := srv.Run(ctx); err != nil {
				t.Errorf("engine %d: Run: %v", i, err)
			}
		}()
		t.Cleanup(func() {
			cancel()
			hs.Close()
			wg.Wait()
		})
		eps = append(eps, config.Endpoint{ID: fmt.Sprintf("engine-%d", i), URL: "http://" + ln.Addr().String()})
	}
	return eps
}

// fidelityRouter serves the proxy in front of eps on loopback and returns
// its base URL; it stops when the test ends.
func fidelityRouter(t testing.TB, s fidelitySetup, eps []config.Endpoint) string {
	t.Helper()
	cfg := config.Config{
		Models: []config.Model{{Name: fidelityModel, Endpoints: eps,
			Policy:  config.Policy{Name: s.policy, Seed: s.seed},
			Signals: config.Signals{ScrapeInterval: fidelityScrape}}},
		Debug:    config.Debug{Enabled: true}, // X-Kvroute-Endpoint: per-engine counts in the row
		Timeouts: config.Timeouts{Shutdown: 2 * time.Second},
	}
	p, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	return serveProxy(t, p)
}

// fidelityBench runs the workload against a fresh emulated fleet behind the
// proxy.
func fidelityBench(t testing.TB, s fidelitySetup, url string, reqs []workload.Request) (report.Row, *bench.Result) {
	t.Helper()
	res, err := bench.Run(context.Background(), bench.Config{URL: url, Model: fidelityModel,
		API: bench.APICompletions, Prompt: bench.PromptText, IgnoreEOS: true, Timeout: time.Minute}, reqs)
	if err != nil {
		t.Fatalf("bench.Run: %v", err)
	}
	names := make([]string, s.engines)
	for i := range names {
		names[i] = fmt.Sprintf("engine-%d", i)
	}
	return res.Summary(report.SummaryOptions{Name: "bench", OracleHitRate: -1, Engines: names}), res
}

// fidelityStalls watches the test process for scheduling stalls: a
// goroutine wakes every millisecond and records every gap longer than the
// threshold. On the shared 2-core machine other jobs (compiles, benchmarks)
// stall the whole process now and then, for tens to hundreds of
// milliseconds: every request in flight then gains that much latency and
// the client sends late, which neither model is about.
type fidelityStalls struct {
	threshold time.Duration
	stop      chan struct{}
	done      chan struct{}
	mu        sync.Mutex     // guards wins
	wins      [][2]time.Time // stalled intervals
}

func fidelityWatch(threshold time.Duration) *fidelityStalls {
	w := &fidelityStalls{threshold: threshold, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-w.stop:
				return
			case <-tk.C:
				now := time.Now() // not the tick's time, which is when it was due rather than when we ran
				if now.Sub(last) > w.threshold {
					w.mu.Lock()
					w.wins = append(w.wins, [2]time.Time{last, now})
					w.mu.Unlock()
				}
				last = now
			}
		}
	}()
	return w
}

// Stop ends the watch and waits for its goroutine.
func (w *fidelityStalls) Stop() {
	close(w.stop)
	<-w.done
}

// overlaps reports whether [from, to] overlaps a stall.
func (w *fidelityStalls) overlaps(from, to time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, win := range w.wins {
		if win[0].Before(to) && from.Before(win[1]) {
			return true
		}
	}
	return false
}

// total is the number and summed length of the stalls.
func (w *fidelityStalls) total() (int, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, win := range w.wins {
		d += win[1].Sub(win[0])
	}
	return len(w.wins), d
}

// fidelityCalm returns the ids of the requests whose life overlapped no
// stall: from their scheduled send to the later of their last token in the
// bench run and in the simulation. Taking the longer of the two keeps the
// selection symmetric: a request slow on one side only is not dropped more
// readily than a request slow on the other.
func fidelityCalm(w *fidelityStalls, res *bench.Result, simRes *sim.Result, reqs []workload.Request) map[string]bool {
	sched := make(map[string]time.Duration, len(reqs))
	for i := range reqs {
		sched[reqs[i].ID] = reqs[i].Arrival
	}
	simEnd := make(map[string]time.Duration, len(simRes.Records))
	for _, r := range simRes.Records {
		simEnd[r.ID] = r.Arrival + r.E2E
	}
	calm := make(map[string]bool, len(res.Samples))
	for _, sm := range res.Samples {
		from := res.Start.Add(min(sched[sm.ID], sm.Arrival))
		to := res.Start.Add(max(sm.Arrival+sm.E2E, simEnd[sm.ID]))
		if !w.overlaps(from, to) {
			calm[sm.ID] = true
		}
	}
	return calm
}

// fidelityFilter keeps the samples of the calm requests.
func fidelityFilter(samples []report.Sample, calm map[string]bool) []report.Sample {
	var out []report.Sample
	for _, sm := range samples {
		if calm[sm.ID] {
			out = append(out, sm)
		}
	}
	return out
}

// fidelityCalibrate measures the one parameter of the simulator that
// depends on the machine rather than the model: the latency the HTTP path
// adds (client -> proxy -> engine and the first chunk back: four loopback
// hops, the proxy's parsing and prefix hashing, the emulator's
// tokenization). It sends n requests with unique prompts of promptLen tokens
// one at a time to the idle fleet (nothing queues, nothing is cached),
// runs the same requests through the simulator with no network latency, and
// returns half the median difference in TTFT: the one-way latency to give
// sim.Config.NetLatency, which the simulator pays twice before the first
// token. The requests also open the HTTP connections, so the measured run
// does not pay for TCP set-up either.
func fidelityCalibrate(t testing.TB, s fidelitySetup, url string, promptLen, n int) time.Duration {
	t.Helper()
	cal := make([]workload.Request, n)
	for i := range cal {
		cal[i] = workload.Request{ID: fmt.Sprintf("cal%d", i), Arrival: time.Duration(i) * 100 * time.Millisecond,
			PromptLen: promptLen, OutputLen: 2,
			Segments: []workload.Segment{{Key: 0xca1_0000 + uint64(i), Len: promptLen}}}
	}
	// One at a time: bench sends each at its arrival; 100 ms apart is more
	// than a cold prefill of the workload's prompts at speed 1. The median
	// ignores the few that a busy machine stalls.
	res, err := bench.Run(context.Background(), bench.Config{URL: url, Model: fidelityModel,
		API: bench.APICompletions, IgnoreEOS: true, Timeout: 10 * time.Second}, cal)
	if err != nil {
		t.Fatalf("calibration: %v", err)
	}
	_, simRes := fidelitySim(t, s, cal, -1)
	simTTFT := make(map[string]time.Duration, n)
	for _, r := range simRes.Records {
		simTTFT[r.ID] = r.TTFT
	}
	var over []time.Duration
	for _, sm := range res.Samples {
		if !sm.OK() {
			t.Fatalf("calibration request %s failed: %s", sm.ID, sm.Err)
		}
		over = append(over, sm.TTFT-simTTFT[sm.ID])
	}
	slices.Sort(over)
	med := over[len(over)/2]
	t.Logf("calibration: HTTP path adds %v to TTFT (median of %d; all %v): sim NetLatency %v", med, n, over,
		max(med/2, 0))
	return max(med/2, 0)
}

// fidelityTable renders rows as the report table kvroute sim and bench print.
func fidelityTable(title string, rows ...report.Row) string {
	var b strings.Builder
	rep := &report.Report{Title: title, Rows: rows}
	if err := rep.WriteTable(&b); err != nil {
		return fmt.Sprintf("table: %v", err)
	}
	return b.String()
}

// fidelityMetric is one compared figure.
type fidelityMetric struct {
	name          string
	simV, benchV  float64
	tol           float64
	unit          string
	absoluteFloor float64 // differences below it always pass (measurement resolution)
}

// relDiff is |a-b| relative to the simulator's value.
func (m fidelityMetric) relDiff() float64 {
	if m.simV == 0 {
		if m.benchV == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Abs(m.benchV-m.simV) / math.Abs(m.simV)
}

func (m fidelityMetric) ok() bool {
	return math.Abs(m.benchV-m.simV) <= m.absoluteFloor || m.relDiff() <= m.tol
}

// fidelityCompare lists the figures issue 6 compares.
func fidelityCompare(s fidelitySetup, simRow, benchRow report.Row) []fidelityMetric {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return []fidelityMetric{
		{name: "TTFT p50", simV: ms(simRow.TTFT.P50), benchV: ms(benchRow.TTFT.P50), tol: s.tol, unit: "ms"},
		{name: "TTFT p99", simV: ms(simRow.TTFT.P99), benchV: ms(benchRow.TTFT.P99), tol: s.tolP99, unit: "ms"},
		{name: "TPOT p50", simV: ms(simRow.TPOT.P50), benchV: ms(benchRow.TPOT.P50), tol: s.tol, unit: "ms"},
		{name: "hit rate", simV: simRow.HitRate, benchV: benchRow.HitRate, tol: s.tol, absoluteFloor: 0.01},
	}
}

// runFidelity runs s both ways and checks the agreement.
func runFidelity(t *testing.T, s fidelitySetup) {
	reqs := fidelityWorkload(t, s)
	url := fidelityRouter(t, s, fidelityFleet(t, s))
	lens := make([]int, len(reqs))
	for i := range reqs {
		lens[i] = reqs[i].PromptLen
	}
	slices.Sort(lens)
	netLatency := fidelityCalibrate(t, s, url, lens[len(lens)/2], 15)
	// Let the scrapes after the calibration land: the engines are idle
	// again, as the simulator's are at its start.
	time.Sleep(2 * fidelityScrape)
	watch := fidelityWatch(fidelityStall)
	benchRow, benchRes := fidelityBench(t, s, url, reqs)
	watch.Stop()
	samples := benchRes.Samples
	simRow, simRes := fidelitySim(t, s, reqs, netLatency)
	title := fmt.Sprintf("fidelity: %d x %s (%d blocks) at speed %g, %s, %d requests at %g/s, policy %s, sim net latency %v",
		s.engines, s.profile, s.blocks, s.speed, s.generator, len(reqs), s.rate, s.policy, netLatency)
	// Compare on the requests that no stall of the test process touched,
	// the same ones on both sides.
	calm := fidelityCalm(watch, benchRes, simRes, reqs)
	nStalls, stalled := watch.total()
	simCalm := report.Summarize(fidelityFilter(simRes.Samples(), calm), report.SummaryOptions{Name: "sim-calm",
		OracleHitRate: simRow.OracleHitRate})
	benchCalm := report.Summarize(fidelityFilter(samples, calm), report.SummaryOptions{Name: "bench-calm",
		OracleHitRate: -1})
	table := fidelityTable(title, simRow, benchRow, simCalm, benchCalm)
	t.Logf("\n%s", table)
	t.Logf("stalls of the test process over %v: %d, %v in all; %d of %d requests overlapped none (the -calm rows)",
		fidelityStall, nStalls, stalled.Round(time.Millisecond), len(calm), len(reqs))
	if len(calm) < len(reqs)*3/4 {
		t.Skipf("the machine is too busy to measure: %d of %d requests were stalled by other work", len(reqs)-len(calm),
			len(reqs))
	}

	if n := benchRow.ErrorCount() + benchRow.Rejected; n > 0 {
		t.Errorf("bench: %d of %d requests failed or were rejected: %v", n, benchRow.Requests, benchRow.Errors)
	}
	if simRow.Completed != len(reqs) {
		t.Errorf("sim: %d of %d requests completed", simRow.Completed, len(reqs))
	}
	failed := false
	race := fidelityRace()
	for _, m := range fidelityCompare(s, simCalm, benchCalm) {
		t.Logf("%-9s sim %9.4f  bench %9.4f %-2s  diff %+6.1f%% (tolerance %.0f%%)", m.name, m.simV, m.benchV,
			m.unit, 100*(m.benchV-m.simV)/m.simV, 100*m.tol)
		if race && m.unit == "ms" {
			continue // the race detector slows the real stack, not the model: log only
		}
		if !m.ok() {
			failed = true
			t.Errorf("%s: bench %.4f%s, sim %.4f%s: off by %.1f%%, want within %.0f%%", m.name, m.benchV, m.unit,
				m.simV, m.unit, 100*m.relDiff(), 100*m.tol)
		}
	}
	if failed {
		t.Errorf("rows:\n%s\n%s", table, fidelitySlowest(simRes, samples, 8))
	}
}

// fidelityRace reports whether the test binary was built with -race, whose
// slowdown of the real HTTP stack (several times more CPU per request on a
// 2-core machine) is not part of either model.
func fidelityRace() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, st := range bi.Settings {
		if st.Key == "-race" {
			return st.Value == "true"
		}
	}
	return false
}

// fidelitySlowest lists the n requests with the longest measured TTFT next
// to their simulated breakdown, to show where the models differ.
func fidelitySlowest(res *sim.Result, samples []report.Sample, n int) string {
	recs := make(map[string]*sim.Record, len(res.Records))
	for i := range res.Records {
		recs[res.Records[i].ID] = &res.Records[i]
	}
	ss := slices.Clone(samples)
	slices.SortFunc(ss, func(a, b report.Sample) int { return cmp.Compare(b.TTFT, a.TTFT) })
	var b strings.Builder
	fmt.Fprintf(&b, "slowest TTFT (bench vs sim: engine, arrival, ttft, cached/prompt; sim queue+prefill+first step)\n")
	for _, sm := range ss[:min(n, len(ss))] {
		r := recs[sm.ID]
		if r == nil {
			fmt.Fprintf(&b, "  %s: not in the simulation\n", sm.ID)
			continue
		}
		fmt.Fprintf(&b, "  %s bench %s @%v ttft %v %d/%d | sim %s @%v ttft %v %d/%d (%v+%v+%v)\n", sm.ID,
			sm.Engine, sm.Arrival.Round(time.Millisecond), sm.TTFT.Round(10*time.Microsecond), sm.CachedTokens,
			sm.PromptTokens, r.Engine, r.Arrival.Round(time.Millisecond), r.TTFT.Round(10*time.Microsecond),
			r.CachedTokens, r.PromptTokens, r.Queue.Round(10*time.Microsecond),
			r.Prefill.Round(10*time.Microsecond), r.FirstDecode.Round(10*time.Microsecond))
	}
	return b.String()
}

// fidelityBase is the shared shape of both scales: four 8B engines behind
// kv-aware, 32 long system prompts shared by many requests, with a KV cache
// too small for all of them, so the hit rate depends on routing and
// eviction (it is well below the oracle bound).
//
// Speed 1: the wall time is set by the arrivals (requests / rate) at a
// moderate load, not by the engines, so a faster model would not shorten
// the test; it would only shrink the modelled times (a 1.6 ms TTFT at
// speed 5) towards the fixed HTTP overhead (~2 ms) and the machine's
// scheduling noise, which the simulator models only as NetLatency.
func fidelityBase() fidelitySetup {
	return fidelitySetup{
		engines:   4,
		profile:   "llama-3.1-8b-h100",
		speed:     1,
		blocks:    1536, // 24k tokens per engine: at most 12 of the 32 system prompts
		policy:    policy.Default,
		generator: "sysprompt",
		params:    map[string]float64{"prompts": 32, "system_len": 2000, "user_len": 1000, "output_len": 64},
		seed:      1,
		tol:       0.15,
		tolP99:    0.15,
	}
}

// TestFidelity is the scaled-down check: about 20 s of real traffic. Under
// -race only the hit rate and the absence of errors are checked.
func TestFidelity(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time test; skipped with -short")
	}
	s := fidelityBase()
	s.requests, s.rate = 300, 15
	// The p99 of 300 requests is the third-slowest: on this shared 2-core
	// machine one scheduling stall of the test process (the calibration
	// sees 15-60 ms outliers in about one idle request in fifteen) lands on
	// the few requests in flight and moves it by 20%, while p50 and TPOT
	// stay within 5%. 25% still fails a model that misses a real effect
	// (say the queueing behind a cold prefill, 60 ms here); the full-scale
	// run, whose p99 is the twentieth-slowest, keeps 15%.
	s.tolP99 = 0.25
	runFidelity(t, s)
}

// TestFidelityFull is the full-scale check, run by hand with
// KVROUTE_FIDELITY=1 (about two minutes); KVROUTE_FIDELITY_SPEED=S runs the
// engines S times faster (default 1).
func TestFidelityFull(t *testing.T) {
	if os.Getenv("KVROUTE_FIDELITY") == "" {
		t.Skip("set KVROUTE_FIDELITY=1 to run the full-scale fidelity check")
	}
	s := fidelityBase()
	s.requests, s.rate = 2000, 20
	if v := os.Getenv("KVROUTE_FIDELITY_SPEED"); v != "" {
		if _, err := fmt.Sscan(v, &s.speed); err != nil || !(s.speed > 0) {
			t.Fatalf("KVROUTE_FIDELITY_SPEED=%q: want a positive number", v)
		}
	}
	runFidelity(t, s)
}

package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/ui"
)

// Defaults of Config.
const (
	DefaultEngines = 4
	DefaultProfile = "llama-3.1-70b-h100-tp4"
	DefaultBlocks  = 700
	// MaxBlocks bounds Config.Blocks: 262144 blocks (4M tokens) per
	// engine, far past where the demo's caches stop thrashing, keep 64
	// engines' models within about 0.5 GB.
	MaxBlocks       = 1 << 18
	DefaultSpeed    = 1.5
	DefaultRate     = 12
	DefaultDuration = 60 * time.Second
	DefaultModel    = "llama-3.1-70b"
	DefaultListen   = "127.0.0.1:0"
	DefaultCompare  = "round_robin"
)

// Config configures a demo run. Zero fields take the documented defaults.
type Config struct {
	// Engines is the number of emulated engines; default 4.
	Engines int
	// Profile is the engines' model profile (engine.ProfileNames); default
	// llama-3.1-70b-h100-tp4.
	Profile string
	// Blocks is each engine's KV cache size in 16-token blocks, small on
	// purpose so that spreading shared prefixes over every engine thrashes
	// the caches; default 700 (11,200 tokens), at most MaxBlocks.
	Blocks int
	// Speed runs the engines this many times faster than real time, from
	// emulator.MinSpeed (0.001) to 1000; default 1.5.
	Speed float64
	// Workload is mixed (default) or a generator name (WorkloadNames).
	Workload string
	// Rate is the mean arrival rate in requests per second; default 12.
	Rate float64
	// Duration is the whole run, split evenly over the policies (Policy
	// first, then Compare); default 60s.
	Duration time.Duration
	// Policy is the routing policy shown first; default kv-aware.
	Policy string
	// Compare are the policies replayed after Policy with the same workload
	// on cold caches; default [round_robin]. Empty after defaults only when
	// NoCompare is set.
	Compare []string
	// NoCompare runs Policy alone.
	NoCompare bool
	// Listen is the dashboard and router address; default 127.0.0.1:0.
	Listen string
	// AdminToken guards the policy switch (PUT /admin/policy and the
	// dashboard's switch); default a random token, printed at start.
	AdminToken string
	// Out is the directory the report files go to; default a new
	// temporary directory, removed again when no report is written (the
	// run failed to start or no policy finished).
	Out string
	// Seed makes the workload reproducible; default 1.
	Seed uint64
	// Linger keeps the dashboard up after the last policy until ctx is done.
	Linger bool
	// Stdout receives the URL, the live summary line and the final table;
	// nil = discard.
	Stdout io.Writer
	// Logger receives component logs; nil discards them.
	Logger *slog.Logger
	// OnReady, if set, is called once the dashboard serves, with its URL.
	OnReady func(url string)
}

// Result is what a finished (or interrupted) run produced.
type Result struct {
	// URL is the dashboard's address.
	URL string
	// Report holds one row per policy that ran to its end.
	Report *report.Report
	// Dir is the report directory and Files the files written there. A
	// temporary directory (Config.Out empty) that got no files is removed,
	// and Dir is then empty.
	Dir   string
	Files []string
}

func (c *Config) applyDefaults() {
	if c.Engines == 0 {
		c.Engines = DefaultEngines
	}
	if c.Profile == "" {
		c.Profile = DefaultProfile
	}
	if c.Blocks == 0 {
		c.Blocks = DefaultBlocks
	}
	if c.Speed == 0 {
		c.Speed = DefaultSpeed
	}
	if c.Workload == "" {
		c.Workload = WorkloadMixed
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Policy == "" {
		c.Policy = policy.Default
	}
	if c.Compare == nil && !c.NoCompare {
		c.Compare = []string{DefaultCompare}
	}
	if c.NoCompare {
		c.Compare = nil
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports a bad field after defaults; errors name the field.
func (c *Config) Validate() error {
	var errs []error
	if c.Engines < 1 || c.Engines > 64 {
		errs = append(errs, fmt.Errorf("engines: %d is not in 1..64", c.Engines))
	}
	if _, err := engine.LookupProfile(c.Profile); err != nil {
		errs = append(errs, fmt.Errorf("profile: %w", err))
	}
	if c.Blocks < 64 {
		errs = append(errs, fmt.Errorf("blocks: %d is below 64", c.Blocks))
	} else if c.Blocks > MaxBlocks { // 2e9 ended in the runtime's "fatal error: out of memory"
		errs = append(errs, fmt.Errorf("blocks: %d is above %d", c.Blocks, MaxBlocks))
	}
	if !(c.Speed >= emulator.MinSpeed && c.Speed <= 1000) { // NaN too
		errs = append(errs, fmt.Errorf("speed: %g is not in [%g, 1000]", c.Speed, emulator.MinSpeed))
	}
	if !slices.Contains(WorkloadNames(), c.Workload) {
		errs = append(errs, fmt.Errorf("workload: %q is not one of %s", c.Workload, strings.Join(WorkloadNames(), ", ")))
	}
	if !(c.Rate > 0 && c.Rate <= 1000) { // NaN too
		errs = append(errs, fmt.Errorf("rate: %g is not in (0, 1000]", c.Rate))
	}
	if c.Duration < time.Second {
		errs = append(errs, fmt.Errorf("duration: %v is shorter than 1s", c.Duration))
	}
	for _, p := range c.policies() {
		if _, err := policy.New(p, nil, 1); err != nil {
			errs = append(errs, fmt.Errorf("policy %q: %w", p, err))
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		errs = append(errs, errors.New("admin token: needs at least 16 characters"))
	}
	return errors.Join(errs...)
}

// policies are the phases' policies in order.
func (c *Config) policies() []string {
	return append([]string{c.Policy}, c.Compare...)
}

// phase is one policy's run: a fresh router (proxy, signal scrapers,
// health checks) in front of the shared engines.
type phase struct {
	policy string
	proxy  *proxy.Proxy
	reg    *prometheus.Registry
}

// demo is a running demo: the engines, the current phase and the
// dashboard. Its methods are safe for concurrent use.
type demo struct {
	cfg   Config
	fleet *fleet
	base  string // the router's base URL
	cur   atomic.Pointer[phase]
	dash  *ui.Dashboard

	mu       sync.Mutex // protects the fields below
	state    ui.RunState
	phaseEnd time.Time
	release  func() // stops the lingering last phase's scrapers and health checks
}

// Models and Router make the current phase's router the dashboard's source.
func (d *demo) Models() []string {
	if p := d.cur.Load(); p != nil {
		return p.proxy.Models()
	}
	return nil
}

func (d *demo) Router(model string) *router.Router {
	if p := d.cur.Load(); p != nil {
		return p.proxy.Router(model)
	}
	return nil
}

// Gather gathers the current phase's router metrics.
func (d *demo) Gather() ([]*dto.MetricFamily, error) {
	if p := d.cur.Load(); p != nil {
		return p.reg.Gather()
	}
	return nil, nil
}

// runState is the dashboard's view of the run.
func (d *demo) runState() ui.RunState {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.state
	s.Rows = slices.Clone(s.Rows)
	if !d.phaseEnd.IsZero() {
		s.Remaining = max(0, time.Until(d.phaseEnd))
	}
	return s
}

// ServeHTTP serves the dashboard under /ui and everything else with the
// current phase's router.
func (d *demo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/" && r.Method == http.MethodGet {
		http.Redirect(w, r, "/ui/", http.StatusFound)
		return
	}
	if r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/") {
		d.dash.ServeHTTP(w, r)
		return
	}
	p := d.cur.Load()
	if p == nil {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	p.proxy.ServeHTTP(w, r)
}

// Run runs the demo until every policy has replayed the workload (or,
// with Linger, until ctx is done) and returns the comparison. Cancelling
// ctx stops everything cleanly; Run then returns the policies finished so
// far and a nil error.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	if cfg.AdminToken == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		cfg.AdminToken = hex.EncodeToString(b[:])
	}
	out := cfg.Out
	madeOut := out == "" // a temporary directory, removed if no report goes there
	if madeOut {
		dir, err := os.MkdirTemp("", "kvroute-demo-")
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		out = dir
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	// The temporary directory goes again when nothing was written to it (a
	// failed start, or no policy finished): os.Remove leaves a directory
	// that is not empty.
	defer func() {
		if madeOut && (res == nil || len(res.Files) == 0) && os.Remove(out) == nil && res != nil {
			res.Dir = ""
		}
	}()
	prof, err := engine.LookupProfile(cfg.Profile)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	fl, err := newFleet(cfg.Engines, DefaultModel, prof, cfg.Blocks, cfg.Speed)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fl.closeListeners()
		return nil, fmt.Errorf("demo: listen: %w", err)
	}
	d := &demo{cfg: cfg, fleet: fl, base: "http://" + ln.Addr().String()}
	d.state = ui.RunState{Title: "kvroute demo", Phases: len(cfg.policies()), Workload: cfg.Workload}
	d.dash, err = ui.New(ui.Options{
		Source:       d,
		Gatherer:     prometheus.GathererFunc(d.Gather),
		AdminEnabled: true,
		Run:          d.runState,
		Logger:       cfg.Logger,
	})
	if err != nil {
		fl.closeListeners()
		_ = ln.Close()
		return nil, fmt.Errorf("demo: %w", err)
	}
	url := d.base + "/ui/"
	res = &Result{URL: url, Dir: out, Report: &report.Report{}}
	hs := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}

	// Every goroutine belongs to g: the engines, the dashboard's server and
	// the phases. The phases end the run: cancel stops the other two.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return fl.run(gctx) })
	g.Go(func() error {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("demo: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, stop := context.WithTimeout(context.Background(), 3*time.Second)
		defer stop()
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		return nil
	})
	g.Go(func() error {
		defer cancel()
		w := cfg.Stdout
		fmt.Fprintf(w, "kvroute demo: %d emulated engines (%s, %d KV blocks each, speed x%g), workload %s at %g req/s\n",
			cfg.Engines, cfg.Profile, cfg.Blocks, cfg.Speed, cfg.Workload, cfg.Rate)
		fmt.Fprintf(w, "dashboard:   %s\n", url)
		fmt.Fprintf(w, "router:      %s/v1 (OpenAI API, model %q)\n", strings.TrimSuffix(url, "/ui/"), DefaultModel)
		fmt.Fprintf(w, "admin token: %s (the dashboard asks for it to switch the policy)\n", cfg.AdminToken)
		if cfg.OnReady != nil {
			cfg.OnReady(url)
		}
		err := d.runPhases(gctx, res.Report)
		if ctx.Err() != nil {
			fmt.Fprintf(w, "\ninterrupted: %d of %d policies finished; stopping the router and the engines\n",
				len(res.Report.Rows), len(cfg.policies()))
		}
		if len(res.Report.Rows) > 0 {
			fmt.Fprintln(w)
			if terr := res.Report.WriteTable(w); terr != nil {
				err = errors.Join(err, terr)
			}
			files, werr := res.Report.WriteDir(out)
			res.Files = files
			if werr != nil {
				err = errors.Join(err, fmt.Errorf("demo: write report: %w", werr))
			} else {
				fmt.Fprintf(w, "\nreport files in %s: %s\n", out, strings.Join(baseNames(files), ", "))
			}
		}
		if err == nil && cfg.Linger && gctx.Err() == nil {
			fmt.Fprintf(w, "dashboard still up at %s (Ctrl-C to stop)\n", url)
			<-gctx.Done()
		}
		return err
	})
	err = g.Wait()
	d.mu.Lock()
	if d.release != nil {
		d.release()
		d.release = nil
	}
	d.mu.Unlock()
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil // interrupted: what finished is in res
	}
	return res, err
}

func baseNames(files []string) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = filepath.Base(f)
	}
	return out
}

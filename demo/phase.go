package demo

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/signals"
	"github.com/kvroute/kvroute/workload"
)

// runPhases replays the workload once per policy, each on cold caches
// behind a fresh router, and appends one row per finished phase to rep.
func (d *demo) runPhases(ctx context.Context, rep *report.Report) error {
	cfg := d.cfg
	pols := cfg.policies()
	phaseDur := cfg.Duration / time.Duration(len(pols))
	wl, err := buildWorkload(cfg.Workload, phaseDur, cfg.Rate, cfg.Seed)
	if err != nil {
		return err
	}
	stats := wl.Stats(16)
	rep.Title = fmt.Sprintf("kvroute demo: %d engines (%s, %d KV blocks), %s workload", cfg.Engines, cfg.Profile, cfg.Blocks, cfg.Workload)
	rep.Source = "bench"
	rep.Workload = cfg.Workload
	rep.Params = map[string]string{
		"engines": fmt.Sprint(cfg.Engines), "profile": cfg.Profile, "blocks": fmt.Sprint(cfg.Blocks),
		"speed": fmt.Sprint(cfg.Speed), "rate": fmt.Sprint(cfg.Rate), "phase": phaseDur.String(),
		"requests": fmt.Sprint(len(wl.Requests)), "seed": fmt.Sprint(cfg.Seed),
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for i, pol := range pols {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if i > 0 {
			if err := d.fleet.resetCaches(ctx, client); err != nil {
				return err
			}
		}
		// With Linger the last phase's router keeps its scrapers and health
		// checks until the dashboard goes away: the fleet it shows stays
		// live instead of going stale the moment the run ends.
		last := i == len(pols)-1
		row, release, err := d.runPhase(ctx, i, pol, phaseDur, wl, stats.OracleHitRate, last && cfg.Linger)
		if err != nil {
			return err
		}
		if release != nil {
			d.mu.Lock()
			d.release = release
			d.mu.Unlock()
		}
		rep.Rows = append(rep.Rows, row)
		d.mu.Lock()
		d.state.Rows = append(d.state.Rows, row)
		d.state.Done = i == len(pols)-1
		d.mu.Unlock()
	}
	return nil
}

// newPhase builds a router with policy pol over the fleet.
func (d *demo) newPhase(pol string) (*phase, error) {
	m := config.Model{Name: DefaultModel, Policy: config.Policy{Name: pol, Seed: d.cfg.Seed}}
	for _, e := range d.fleet.engines {
		m.Endpoints = append(m.Endpoints, config.Endpoint{ID: e.id, URL: e.url})
	}
	cfg := config.Config{
		Models: []config.Model{m},
		Admin:  config.Admin{Token: d.cfg.AdminToken},
		Debug:  config.Debug{Enabled: true}, // X-Kvroute-Endpoint names the engine in the report
		// Checks every 2 s with a generous timeout: on a busy laptop the
		// engines answer late, and the demo is about routing, not failover.
		HealthCheck: config.HealthCheck{Interval: 2 * time.Second, Timeout: 2 * time.Second},
	}
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New, Logger: d.cfg.Logger, Registerer: reg, Gatherer: reg})
	if err != nil {
		return nil, fmt.Errorf("demo: router: %w", err)
	}
	return &phase{policy: pol, proxy: p, reg: reg}, nil
}

// runPhase runs one policy: the router with its scrape loops and health
// checks, the workload through it, and the live summary line. With keep,
// the scrape loops and health checks outlive the phase: release (non-nil
// when the phase succeeded) stops them.
func (d *demo) runPhase(ctx context.Context, i int, pol string, dur time.Duration, wl *workload.Workload, oracle float64, keep bool) (_ report.Row, release func(), _ error) {
	ph, err := d.newPhase(pol)
	if err != nil {
		return report.Row{}, nil, err
	}
	rt := ph.proxy.Router(DefaultModel)
	mgr, err := signals.NewManager(signals.ManagerConfig{
		Scrape: signals.ScrapeConfig{Interval: 200 * time.Millisecond},
		Logger: d.cfg.Logger,
	})
	if err != nil {
		return report.Row{}, nil, fmt.Errorf("demo: signals: %w", err)
	}
	var targets []signals.Target
	ids := make([]string, 0, len(d.fleet.engines))
	for _, e := range d.fleet.engines {
		targets = append(targets, signals.Target{Endpoint: e.id, MetricsURL: e.url + "/metrics", View: rt.View(e.id)})
		ids = append(ids, e.id)
	}
	if err := mgr.Sync(targets); err != nil {
		mgr.Close()
		return report.Row{}, nil, fmt.Errorf("demo: signals: %w", err)
	}

	// The live line, the dashboard's tiles and the final row are computed
	// the same way from the same samples (the client's measurements): the
	// last line and the tiles at the end show the row's figures.
	opts := report.SummaryOptions{Name: pol, OracleHitRate: oracle, Engines: ids}
	coll := report.NewCollector()
	current := func() report.Row { return coll.Summary(opts) }

	start := time.Now()
	d.cur.Store(ph)
	d.dash.Mark(start, pol)
	d.mu.Lock()
	d.state.Phase, d.state.Policy, d.phaseEnd = i+1, pol, start.Add(dur)
	d.state.Current = current
	d.mu.Unlock()

	hctx, stopHealth := context.WithCancel(ctx)
	var hwg sync.WaitGroup
	hwg.Add(1)
	go func() {
		defer hwg.Done()
		_ = ph.proxy.RunHealthChecks(hctx)
	}()
	release = func() {
		stopHealth()
		hwg.Wait()
		mgr.Close()
	}
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.live(pctx, i, pol, start, dur, current)
	}()
	res, err := bench.Run(ctx, bench.Config{
		URL:   d.base,
		Model: DefaultModel,
		// Completions: the prompt text is the router's canonical prompt, so
		// shared prefixes are shared prefixes of the prefix index.
		API:       bench.APICompletions,
		Duration:  dur,
		IgnoreEOS: true,
		Timeout:   time.Minute,
		Collector: coll,
		Logger:    d.cfg.Logger,
	}, wl.Requests)
	stop()
	wg.Wait()
	d.dash.Sample(time.Now())
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	} else if err != nil {
		err = fmt.Errorf("demo: bench: %w", err)
	}
	if err != nil || !keep {
		release()
		release = nil
	}
	if err != nil {
		return report.Row{}, nil, err
	}
	fmt.Fprintln(d.cfg.Stdout)
	return res.Summary(opts), release, nil
}

// live redraws the one-line summary every second (in place on a terminal,
// every five seconds as a new line otherwise) and takes the chart points.
// The line's figures are the phase's report row so far (row): the requests
// finished, and their TTFT percentiles and prefix hit rate as the client
// measured them, computed as the final table computes them, so that its
// last figures are the table's. (Only the dashboard's charts estimate TTFT
// from the router's histogram buckets, and say so.)
func (d *demo) live(ctx context.Context, i int, pol string, start time.Time, dur time.Duration, row func() report.Row) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	w := d.cfg.Stdout
	term := report.IsTerminal(w)
	n := len(d.cfg.policies())
	line := func(now time.Time) string { return liveLine(i+1, n, pol, now.Sub(start), dur, row()) }
	for k := 1; ; k++ {
		select {
		case <-ctx.Done():
			// The phase's final figures, from a fresh point (the last one
			// may be a second old); not on a terminal a line goes out only
			// every five seconds, so without it a phase shorter than that
			// would print nothing.
			now := time.Now()
			d.dash.SampleNow(now)
			if term {
				fmt.Fprintf(w, "\r%s\033[K", line(now))
			} else {
				fmt.Fprintln(w, line(now))
			}
			return
		case now := <-tick.C:
			d.dash.Sample(now)
			if !term && k%5 != 0 {
				continue
			}
			if term {
				fmt.Fprintf(w, "\r%s\033[K", line(now))
			} else {
				fmt.Fprintln(w, line(now))
			}
		}
	}
}

// liveLine is phase i of n's summary line, el into a phase of length dur,
// with the phase's row so far.
func liveLine(i, n int, pol string, el, dur time.Duration, r report.Row) string {
	// Past its time the phase waits for its last answers: the clock stops
	// at the phase's length and the overtime shows apart, in a field of
	// its own so that the columns stay where they were.
	over := ""
	if el > dur {
		if o := (el - dur).Round(time.Second); o > 0 {
			over = fmt.Sprintf(" +%.0fs", o.Seconds())
		}
		el = dur
	}
	return fmt.Sprintf("[%d/%d %-14s %3.0fs/%.0fs%-5s] %5d requests  TTFT p50 %s  p99 %s  prefix hit rate %s",
		i, n, pol, el.Seconds(), dur.Seconds(), over, r.Requests,
		fmtDur(r.TTFT.P50), fmtDur(r.TTFT.P99), fmtRate(r.HitRate))
}

func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "    -"
	}
	return fmt.Sprintf("%5s", report.FormatDuration(d))
}

func fmtRate(r float64) string {
	if r < 0 {
		return "    -"
	}
	return fmt.Sprintf("%5.1f%%", 100*r)
}

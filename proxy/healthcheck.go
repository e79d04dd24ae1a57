package proxy

import (
	"context"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RunHealthChecks probes every endpoint with GET health_check.path every
// health_check.interval until ctx is done, then returns nil once every
// probe loop has stopped. An endpoint is marked unhealthy after
// unhealthy_threshold consecutive failed checks (any status but 2xx, or no
// answer within health_check.timeout) and healthy again after
// healthy_threshold consecutive successes. Probes of different endpoints
// are spread over the interval; each probe's first check comes within
// firstProbeSpread of its start, so that /readyz does not wait up to an
// interval for it. The ranks of a data-parallel endpoint
// share one probe of their URL, whose result applies to every rank (vLLM's
// /health answers for the whole server). A Reload that removes an endpoint
// stops its probe (and waits for it); one that adds an endpoint starts
// one. While it runs, /readyz counts only the endpoints whose probe has
// passed a check (see serveReadyz). With health_check.disabled it returns
// at once.
func (p *Proxy) RunHealthChecks(ctx context.Context) error {
	if p.cfg.HealthCheck.Disabled {
		return nil
	}
	h := &p.health
	h.mu.Lock()
	if h.ctx != nil {
		h.mu.Unlock()
		return nil // already running
	}
	h.gated = true
	h.ctx = ctx
	h.client = &http.Client{Transport: p.transport, Timeout: p.cfg.HealthCheck.Timeout}
	h.probes = make(map[probeKey]*runningProbe)
	h.mu.Unlock()
	p.reloadMu.Lock() // a reload between two pools' starts would find one started, not the other
	for _, name := range p.names {
		h.start(p, p.pools[name])
	}
	p.reloadMu.Unlock()
	<-ctx.Done()
	h.mu.Lock()
	h.ctx, h.probes, h.gated = nil, nil, false
	h.mu.Unlock()
	h.wg.Wait()
	return nil
}

// healthState is the running health probes, which a Reload changes.
type healthState struct {
	mu     sync.Mutex      // guards ctx, client, probes and gated
	ctx    context.Context // RunHealthChecks' context; nil when not running
	client *http.Client
	probes map[probeKey]*runningProbe
	// gated: readiness waits for the probes (passedBy), from the start of
	// Serve (expect) or of RunHealthChecks until RunHealthChecks returns.
	gated bool
	wg    sync.WaitGroup // every probe loop
}

// expect gates readiness on the probes before RunHealthChecks has started
// them: Serve calls it before it accepts connections, so that a /readyz
// that comes first is not answered from endpoints nothing has checked.
func (h *healthState) expect(p *Proxy) {
	if p.cfg.HealthCheck.Disabled {
		return
	}
	h.mu.Lock()
	h.gated = true
	h.mu.Unlock()
}

// passedBy returns the endpoints of model whose probe has passed a check
// since it started, and whether readiness is gated on them (false: the
// probes do not run, and every endpoint counts).
func (h *healthState) passedBy(model string) (passed map[string]bool, gated bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.gated {
		return nil, false
	}
	passed = make(map[string]bool)
	for k, rp := range h.probes {
		if k.model == model && rp.passed.Load() {
			for _, id := range rp.ids {
				passed[id] = true
			}
		}
	}
	return passed, true
}

// probeKey names a probe: a model's URL, the endpoints it covers and
// their role. An endpoint whose role changes under its ID is another
// engine to the router (kvroute.Endpoint.SameEngine), which starts it
// healthy: its probe starts anew too, or a probe that had seen it fail
// would never report it again.
type probeKey struct{ model, url, ids, role string }

// runningProbe is a probe loop, cancelled by cancel; done is closed when
// it has returned.
type runningProbe struct {
	cancel context.CancelFunc
	done   chan struct{}
	ids    []string    // the endpoints it checks
	passed atomic.Bool // a check has passed (set by the loop)
}

// wanted returns the probes of pool pl's endpoint set s, by key.
func (h *healthState) wanted(p *Proxy, pl *pool, s *endpointSet) map[probeKey]*probe {
	out := make(map[probeKey]*probe)
	eps := s.eps
	for i := 0; i < len(eps); i++ {
		e := &eps[i]
		t := &probe{p: p, pool: pl, ids: []string{e.ID}, url: strings.TrimRight(e.URL, "/") + p.cfg.HealthCheck.Path, healthy: true}
		// KVEndpoints lists a data-parallel endpoint's ranks in order.
		for e.IsDataParallel() && i+1 < len(eps) && eps[i+1].IsDataParallel() && eps[i+1].DataParallelRank > 0 &&
			eps[i+1].URL == e.URL {
			i++
			t.ids = append(t.ids, eps[i].ID)
		}
		out[probeKey{model: pl.model, url: t.url, ids: strings.Join(t.ids, "\x00"), role: e.Role.String()}] = t
	}
	return out
}

// stopOld stops the probes of pool pl that its next endpoint set does not
// have, and waits for them.
func (h *healthState) stopOld(p *Proxy, pl *pool, next *endpointSet) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil {
		return
	}
	want := h.wanted(p, pl, next)
	for k, rp := range h.probes {
		if _, ok := want[k]; k.model != pl.model || ok {
			continue
		}
		rp.cancel()
		<-rp.done
		delete(h.probes, k)
	}
}

// start starts the probes of pool pl's current endpoints that are not
// running. A new probe starts healthy, as its endpoints do in the router:
// a probe's key (URL and endpoint IDs) changes only with its engine, which
// the router then takes as a new endpoint too (router.SetEndpoints).
func (h *healthState) start(p *Proxy, pl *pool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil {
		return
	}
	for k, t := range h.wanted(p, pl, pl.set.Load()) {
		if h.probes[k] != nil {
			continue
		}
		t.client = h.client
		ctx, cancel := context.WithCancel(h.ctx)
		rp := &runningProbe{cancel: cancel, done: make(chan struct{}), ids: t.ids}
		t.passed = &rp.passed
		h.probes[k] = rp
		h.wg.Go(func() {
			defer close(rp.done)
			t.loop(ctx)
		})
	}
}

// running returns the keys of the running probes of a model (tests).
func (h *healthState) running(model string) []probeKey {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []probeKey
	for k := range h.probes {
		if k.model == model {
			out = append(out, k)
		}
	}
	return out
}

// probe is the active health state of one endpoint (or of the ranks of a
// data-parallel one); it belongs to its loop.
type probe struct {
	p       *Proxy
	pool    *pool
	ids     []string // the endpoints whose URL is probed
	url     string
	client  *http.Client
	healthy bool
	streak  int          // consecutive results contradicting healthy
	passed  *atomic.Bool // its runningProbe's: set at the first check passed
}

// firstProbeSpread bounds the delay of a probe's first check, spread
// over it as the later checks are over the interval.
const firstProbeSpread = time.Second

func (t *probe) loop(ctx context.Context) {
	interval := t.p.cfg.HealthCheck.Interval
	h := fnv.New64a()
	_, _ = h.Write([]byte(t.pool.model + "\x00" + t.ids[0]))
	phase := time.Duration(h.Sum64() % uint64(interval)) // of the later checks
	first := time.Duration(h.Sum64() % uint64(min(interval, firstProbeSpread)))
	timer := time.NewTimer(first)
	defer timer.Stop()
	next := max(phase+interval-first, interval) // from the first check to the second
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		ok := t.check(ctx)
		if ctx.Err() != nil {
			return // stopped mid-check (a reload, shutdown): not the engine's failure
		}
		t.observe(ok)
		if ok && !t.passed.Load() {
			t.passed.Store(true)
		}
		timer.Reset(next)
		next = interval
	}
}

func (t *probe) check(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return false
	}
	req.Header.Set("User-Agent", "kvroute-health")
	resp, err := t.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			t.p.log.Debug("health check failed", "model", t.pool.model, "endpoint", t.ids[0], "error", err)
		}
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// observe applies one check result and tells the router on a change.
func (t *probe) observe(ok bool) {
	if ok == t.healthy {
		t.streak = 0
		return
	}
	t.streak++
	threshold := t.p.cfg.HealthCheck.UnhealthyThreshold
	if ok {
		threshold = t.p.cfg.HealthCheck.HealthyThreshold
	}
	if t.streak < threshold {
		return
	}
	t.healthy, t.streak = ok, 0
	now := t.p.now()
	for _, id := range t.ids {
		t.pool.router.SetActiveHealth(now, id, ok)
		if ok {
			t.p.log.Info("endpoint passes health checks again", "model", t.pool.model, "endpoint", id)
		} else {
			t.p.metrics.ejections.WithLabelValues(t.pool.model, id, "active").Inc()
			t.p.log.Warn("endpoint fails health checks", "model", t.pool.model, "endpoint", id, "url", t.url)
		}
	}
}

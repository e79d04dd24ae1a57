package proxy

import (
	"context"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// RunHealthChecks probes every endpoint with GET health_check.path every
// health_check.interval until ctx is done, then returns nil once every
// probe loop has stopped. An endpoint is marked unhealthy after
// unhealthy_threshold consecutive failed checks (any status but 2xx, or no
// answer within health_check.timeout) and healthy again after
// healthy_threshold consecutive successes. Probes of different endpoints
// are spread over the interval. The ranks of a data-parallel endpoint
// share one probe of their URL, whose result applies to every rank (vLLM's
// /health answers for the whole server). With health_check.disabled it
// returns at once.
func (p *Proxy) RunHealthChecks(ctx context.Context) error {
	if p.cfg.HealthCheck.Disabled {
		return nil
	}
	client := &http.Client{Transport: p.transport, Timeout: p.cfg.HealthCheck.Timeout}
	var wg sync.WaitGroup
	for _, name := range p.names {
		pl := p.pools[name]
		for i := 0; i < len(pl.eps); i++ {
			e := &pl.eps[i]
			t := &probe{p: p, pool: pl, ids: []string{e.ID}, url: strings.TrimRight(e.URL, "/") + p.cfg.HealthCheck.Path,
				client: client, healthy: true}
			// KVEndpoints lists a data-parallel endpoint's ranks in order.
			for e.IsDataParallel() && i+1 < len(pl.eps) && pl.eps[i+1].IsDataParallel() && pl.eps[i+1].DataParallelRank > 0 &&
				pl.eps[i+1].URL == e.URL {
				i++
				t.ids = append(t.ids, pl.eps[i].ID)
			}
			wg.Go(func() { t.loop(ctx) })
		}
	}
	wg.Wait()
	return nil
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
	streak  int // consecutive results contradicting healthy
}

func (t *probe) loop(ctx context.Context) {
	interval := t.p.cfg.HealthCheck.Interval
	h := fnv.New64a()
	_, _ = h.Write([]byte(t.pool.model + "\x00" + t.ids[0]))
	timer := time.NewTimer(time.Duration(h.Sum64() % uint64(interval)))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		t.observe(t.check(ctx))
		timer.Reset(interval)
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

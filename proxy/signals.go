package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/signals"
)

// This file runs the engine signals of every model: one scrape loop per
// endpoint feeding the endpoint's signals.View in its router, and one
// KV-event subscriber per endpoint with kv_events feeding the model's
// precise index. signals.Manager owns the loops; RunSignals owns the
// managers, which a Reload syncs with the pools' new endpoints.

// scrapeGroup is the endpoints of one model sharing scrape settings: one
// signals.Manager each (a Manager has one ScrapeConfig and names its
// endpoints by ID, unique only within a model).
type scrapeGroup struct {
	model             string
	interval, timeout time.Duration
}

// signalTargets returns the signals targets of every model, grouped by
// scrape settings. Endpoints with neither scraping nor KV events are left
// out: their Views stay router-local.
func (p *Proxy) signalTargets() map[scrapeGroup][]signals.Target {
	groups := make(map[scrapeGroup][]signals.Target)
	for _, name := range p.names {
		pl := p.pools[name]
		m := pl.set.Load().model
		for i := range m.Endpoints {
			e := &m.Endpoints[i]
			t := signals.Target{
				Endpoint:   e.ID,
				MetricsURL: m.MetricsURL(i),
				Flavor:     signals.Flavor(e.Signals.Flavor),
			}
			if e.DataParallelSize > 1 {
				// One scrape for the engine, split among its ranks;
				// each rank's own KV events.
				t.FirstRank = e.DataParallelStartRank
				for i := range e.DataParallelSize {
					id := e.RankID(i)
					t.Ranks = append(t.Ranks, signals.RankTarget{Endpoint: id, View: pl.router.View(id),
						KVEvents: pl.kvEventsTarget(e, e.DataParallelStartRank+i), OnAbsent: p.onAbsent(pl, id)})
				}
				if t.MetricsURL == "" && t.Ranks[0].KVEvents == nil {
					continue
				}
			} else {
				t.View, t.KVEvents = pl.router.View(e.ID), pl.kvEventsTarget(e, 0)
				if t.MetricsURL == "" && t.KVEvents == nil {
					continue
				}
			}
			g := scrapeGroup{model: name, interval: e.Signals.ScrapeInterval, timeout: e.Signals.ScrapeTimeout}
			groups[g] = append(groups[g], t)
		}
	}
	return groups
}

// onAbsent is rank id's signals.RankTarget.OnAbsent: the scrape of its
// server tells the router whether the server has the rank (an absent rank
// is out of rotation until its series come back; the scraper logs each
// change), and each time it leaves the rotation counts as an ejection of
// kind "absent". Every call returns the same function's closure, so that
// a Reload's Sync keeps the running scrape loops (signals.Manager compares
// the functions' code).
func (p *Proxy) onAbsent(pl *pool, id string) func(time.Time, bool) {
	return func(now time.Time, absent bool) {
		if pl.router.SetAbsent(now, id, absent) && absent {
			pm := p.metrics.pools[pl.model]
			pm.series.RLock()
			if l := pl.label(id); l != "" {
				p.metrics.ejections.WithLabelValues(pl.model, l, "absent").Inc()
			}
			pm.series.RUnlock()
		}
	}
}

// kvEventsTarget is the KV-event subscription of endpoint e's
// data-parallel rank rank (0 for an endpoint that is not data-parallel), or
// nil without events: the configured addresses, offset for the rank as
// vLLM offsets them.
func (pl *pool) kvEventsTarget(e *config.Endpoint, rank int) *signals.KVEventsTarget {
	ev := e.KVEvents
	if ev.Address == "" || pl.kvSink == nil {
		return nil
	}
	addr, replay, err := rankAddresses(ev, rank)
	if err != nil {
		return nil // config.Validate refused it
	}
	return &signals.KVEventsTarget{Address: addr, ReplayAddress: replay, Topic: ev.Topic, Listen: ev.Listen, Sink: pl.kvSink,
		DataParallel: e.DataParallelSize > 1, DataParallelRank: rank, MaxReplayBatches: ev.ReplayBufferSteps}
}

// rankAddresses returns rank rank's KV-event addresses.
func rankAddresses(ev config.KVEvents, rank int) (addr, replay string, err error) {
	if addr, err = config.DataParallelAddress(ev.Address, rank); err != nil {
		return "", "", err
	}
	if replay, err = config.DataParallelAddress(ev.ReplayAddress, rank); err != nil {
		return "", "", err
	}
	return addr, replay, nil
}

// checkKVEvents validates every kv_events section as the subscriber will
// (every rank's, for a data-parallel endpoint), so that a bad address
// fails New rather than the running proxy.
func checkKVEvents(path string, m *config.Model) error {
	for i, e := range m.Endpoints {
		ev := e.KVEvents
		if ev.Address == "" {
			continue
		}
		for r := range max(e.DataParallelSize, 1) {
			addr, replay, err := rankAddresses(ev, e.DataParallelStartRank+r)
			if err != nil {
				return fmt.Errorf("proxy: %s.endpoints[%d].kv_events: %w", path, i, err)
			}
			sc := signals.SubscriberConfig{Endpoint: e.ID, Address: addr, ReplayAddress: replay, Topic: ev.Topic,
				Listen: ev.Listen, Sink: nopSink{}, MaxReplayBatches: ev.ReplayBufferSteps}
			if err := sc.Validate(); err != nil {
				return fmt.Errorf("proxy: %s.endpoints[%d].kv_events: %w", path, i, err)
			}
		}
	}
	return nil
}

// RunSignals scrapes every endpoint's metrics into its router's View and
// subscribes to the KV-cache events of every endpoint with kv_events until
// ctx is done, then stops every loop and returns once they have exited.
// Serve runs it; call it yourself only when serving the Proxy as a plain
// http.Handler. Per model: signals.scrape_interval, scrape_timeout, flavor
// and metrics_path, with per-endpoint overrides; signals.disabled turns
// scraping off. A Reload starts and stops the loops of the endpoints it
// adds and removes.
func (p *Proxy) RunSignals(ctx context.Context) error {
	s := &p.sig
	p.reloadMu.Lock()
	s.mu.Lock()
	if s.client != nil {
		s.mu.Unlock()
		p.reloadMu.Unlock()
		return errors.New("proxy: signals: already running")
	}
	s.client = &http.Client{Transport: p.transport}
	s.managers, s.synced = make(map[scrapeGroup]*signals.Manager), nil
	err := s.syncLocked(p)
	n := len(s.managers)
	s.mu.Unlock()
	p.reloadMu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, mg := range s.managers {
			mg.Close()
		}
		s.managers, s.synced, s.client = nil, nil, nil
		s.mu.Unlock()
	}()
	if err != nil {
		return err
	}
	if n > 0 {
		p.log.Info("engine signals running", "scrape_groups", n)
	}
	<-ctx.Done()
	return nil
}

// signalState is the running signal managers, one per scrape group.
type signalState struct {
	mu       sync.Mutex   // guards client, managers and synced
	client   *http.Client // nil when RunSignals is not running
	managers map[scrapeGroup]*signals.Manager
	synced   map[scrapeGroup]map[string]bool // the targets each manager was last synced with, by Endpoint
}

// sync makes the running loops those of the pools' endpoints now: a
// Reload calls it after changing them. It does nothing when RunSignals
// is not running.
func (s *signalState) sync(p *Proxy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		return nil
	}
	return s.syncLocked(p)
}

// syncLocked syncs every scrape group's manager with its targets, making
// the managers of new groups and closing those of groups left empty
// (their KV-event entries removed first). Called with s.mu held.
func (s *signalState) syncLocked(p *Proxy) error {
	groups := p.signalTargets()
	var errs []error
	// First every target leaving its manager stops (an endpoint that moves
	// to another scrape group too): its KV-event subscription releases a
	// socket it listens on, and its index entries are removed, before the
	// new group's subscription starts.
	for g, mg := range s.managers {
		targets, ok := groups[g]
		if !ok {
			if err := mg.Sync(nil); err != nil {
				errs = append(errs, err)
			}
			mg.Close()
			delete(s.managers, g)
			delete(s.synced, g)
			continue
		}
		var kept []signals.Target
		for _, t := range targets {
			if s.synced[g][t.Endpoint] {
				kept = append(kept, t)
			}
		}
		if len(kept) < len(s.synced[g]) {
			if err := mg.Sync(kept); err != nil {
				errs = append(errs, fmt.Errorf("proxy: signals of model %q: %w", g.model, err))
			}
		}
	}
	if s.synced == nil {
		s.synced = make(map[scrapeGroup]map[string]bool)
	}
	for g, targets := range groups {
		mg := s.managers[g]
		if mg == nil {
			var err error
			mg, err = signals.NewManager(signals.ManagerConfig{
				Scrape: signals.ScrapeConfig{Interval: g.interval, Timeout: g.timeout, Client: s.client},
				Logger: p.log.With("model", g.model),
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("proxy: signals of model %q: %w", g.model, err))
				continue
			}
			s.managers[g] = mg
		}
		if err := mg.Sync(targets); err != nil {
			errs = append(errs, fmt.Errorf("proxy: signals of model %q: %w", g.model, err))
		}
		ids := make(map[string]bool, len(targets))
		for _, t := range targets {
			ids[t.Endpoint] = true
		}
		s.synced[g] = ids
	}
	return errors.Join(errs...)
}

// status returns the signals status of every running endpoint of a model
// (the ranks of a data-parallel engine, not the engine).
func (s *signalState) status(model string) []signals.EndpointStatus {
	s.mu.Lock()
	var mgs []*signals.Manager
	for g, mg := range s.managers {
		if g.model == model {
			mgs = append(mgs, mg)
		}
	}
	s.mu.Unlock()
	var out []signals.EndpointStatus
	for _, mg := range mgs {
		out = append(out, mg.Status()...)
	}
	return out
}

// kvEvents returns the KV-event subscribers' status of a model by endpoint.
func (s *signalState) kvEvents(model string) map[string]signals.SubscriberStatus {
	var out map[string]signals.SubscriberStatus
	for _, st := range s.status(model) {
		if st.KVEvents != nil {
			if out == nil {
				out = make(map[string]signals.SubscriberStatus)
			}
			out[st.Endpoint] = *st.KVEvents
		}
	}
	return out
}

// nopSink lets checkKVEvents validate a subscriber config.
type nopSink struct{}

func (nopSink) Store(string, kvindex.Stored) (int, error) { return 0, nil }
func (nopSink) Evict(string, []uint64, kvroute.Tier)      {}
func (nopSink) Clear(string)                              {}
func (nopSink) Remove(string)                             {}

// signalCollector exports every endpoint's signals with model and endpoint
// labels, read from the routers (and the running KV-event subscribers) at
// collection time.
type signalCollector struct{ p *Proxy }

var (
	// routerSignals are the signals package's per-endpoint metrics, labelled
	// by model and endpoint.
	routerSignals = signals.NewEndpointMetrics("model", "endpoint")
	sigCapacity   = prometheus.NewDesc("kvroute_endpoint_kv_capacity_tokens", "KV-cache capacity in tokens (block size x GPU blocks, or config).",
		[]string{"model", "endpoint"}, nil)
	sigEntries = prometheus.NewDesc("kvroute_precise_index_entries", "(block, endpoint) entries in the model's precise prefix index.", []string{"model"}, nil)
)

func (c signalCollector) Describe(ch chan<- *prometheus.Desc) {
	routerSignals.Describe(ch)
	ch <- sigCapacity
	ch <- sigEntries
}

// Collect exports each routed endpoint's signals as the router sees them
// (its View and Load, which carry the router's own counts and configured
// capacity) with its scrape loop's and KV-event subscriber's state.
func (c signalCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	now := p.now()
	for _, name := range p.names {
		pl := p.pools[name]
		loops := make(map[string]signals.EndpointStatus)
		for _, st := range p.sig.status(name) {
			loops[st.Endpoint] = st
		}
		for _, st := range pl.router.Status(now) {
			es := signals.EndpointStatus{Endpoint: st.ID, View: st.Signals, Load: st.Load}
			if l, ok := loops[st.ID]; ok {
				es.ScrapeDuration, es.KVEvents = l.ScrapeDuration, l.KVEvents
			}
			routerSignals.Collect(ch, now, &es, name, st.ID)
			ch <- prometheus.MustNewConstMetric(sigCapacity, prometheus.GaugeValue, float64(st.Load.KVCapacityTokens), name, st.ID)
		}
		if pl.precise != nil && pl.precise.index != nil {
			ch <- prometheus.MustNewConstMetric(sigEntries, prometheus.GaugeValue, float64(pl.precise.index.Stats().Entries), name)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

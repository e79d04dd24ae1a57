package signals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
)

// ManagerConfig configures a Manager; the zero value is usable.
type ManagerConfig struct {
	Scrape ScrapeConfig
	// Registerer receives the per-endpoint metrics (kvroute_endpoint_*); nil
	// registers nothing.
	Registerer prometheus.Registerer
	// Logger receives the loops' warnings; nil discards.
	Logger *slog.Logger
}

// Manager runs one scrape loop and, where configured, one KV-event
// subscriber per endpoint. Sync adds and removes endpoints; Close stops
// everything and waits. A Manager is safe for concurrent use.
//
// Lock order: Manager.mu, then a View's or Subscriber's own lock.
type Manager struct {
	cfg ManagerConfig
	ctx context.Context
	end context.CancelFunc
	col *collector

	mu      sync.Mutex // guards targets and closed
	targets map[string]*managed
	closed  bool
}

type managed struct {
	target  Target
	scraper *Scraper
	sub     *Subscriber
	// scrapeLoop and subLoop run scraper and sub (nil when there is none).
	scrapeLoop, subLoop *loop
}

// NewManager returns a Manager with no endpoints and registers its
// metrics.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Scrape.Logger == nil {
		cfg.Scrape.Logger = cfg.Logger
	}
	cfg.Scrape.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, ctx: ctx, end: cancel, targets: make(map[string]*managed)}
	m.col = &collector{m: m}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(m.col); err != nil {
			cancel()
			return nil, fmt.Errorf("signals manager: register metrics: %w", err)
		}
	}
	return m, nil
}

// Sync makes the running endpoints those of targets: new ones start,
// missing ones stop (and their KV-event entries are removed from their
// Sink), changed ones restart. A changed endpoint whose KVEvents are the
// same keeps its subscriber (and its entries); one whose KVEvents changed
// gets a new subscriber, and its entries are removed from the old Sink
// first: the new subscription (maybe of another engine) rebuilds them from
// scratch. A changed endpoint that keeps its View but scrapes another
// MetricsURL (or, for a data-parallel rank, another FirstRank) has the
// View's scraped signals reset (View.ResetSignals). It validates every
// target first and changes nothing when one is invalid.
//
// A data-parallel target (Target.Ranks) runs as one scrape loop under its
// Endpoint, splitting each page among its ranks, and one entry per rank
// under the rank's Endpoint with the rank's KV-event subscriber: Status
// reports the ranks, not the engine.
func (m *Manager) Sync(targets []Target) error {
	want := make(map[string]Target, len(targets))
	add := func(t Target) error {
		if t.Endpoint == "" {
			return errors.New("signals manager: target with empty Endpoint")
		}
		if _, dup := want[t.Endpoint]; dup {
			return fmt.Errorf("signals manager: endpoint %q listed twice", t.Endpoint)
		}
		if t.View == nil && len(t.Ranks) == 0 {
			return fmt.Errorf("signals manager: endpoint %q: View is nil", t.Endpoint)
		}
		want[t.Endpoint] = t
		return nil
	}
	for _, t := range targets {
		if len(t.Ranks) == 0 {
			t.group = ""
			if err := add(t); err != nil {
				return err
			}
			continue
		}
		// The engine's scrape, and each rank with its KV events.
		g := Target{Endpoint: t.Endpoint, MetricsURL: t.MetricsURL, Flavor: t.Flavor, Ranks: make([]RankTarget, len(t.Ranks)),
			FirstRank: t.FirstRank}
		for r, rt := range t.Ranks {
			g.Ranks[r] = RankTarget{Endpoint: rt.Endpoint, View: rt.View, OnAbsent: rt.OnAbsent}
			if err := add(Target{Endpoint: rt.Endpoint, View: rt.View, KVEvents: rt.KVEvents, group: t.Endpoint}); err != nil {
				return err
			}
		}
		if g.MetricsURL == "" {
			continue // no scraping: the ranks' Views stay router-local
		}
		if err := add(g); err != nil {
			return err
		}
	}
	built := make(map[string]*managed)
	prev := make(map[string]Target) // the changed targets' old versions
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("signals manager: closed")
	}
	for name, t := range want {
		cur := m.targets[name]
		if cur != nil && sameTarget(cur.target, t) {
			continue
		}
		mg, err := m.build(t, cur)
		if err != nil {
			return err
		}
		built[name] = mg
		if cur != nil {
			prev[name] = cur.target
		}
	}
	// Stop removed and changed endpoints, then start the new ones.
	for name, cur := range m.targets {
		_, keep := want[name]
		mg := built[name]
		if keep && mg == nil {
			continue
		}
		cur.scrapeLoop.stop()
		if mg == nil || mg.sub != cur.sub {
			cur.subLoop.stop()
			if ev := cur.target.KVEvents; ev != nil {
				// Its entries came from a subscription that ends here:
				// a new one catches up with its engine's history from
				// scratch, and re-applying batches already applied
				// would count every block held twice (as a second
				// copy, kept after its removal).
				ev.Sink.Remove(name)
			}
		}
		delete(m.targets, name)
	}
	for name, mg := range built {
		if old, ok := prev[name]; ok {
			resetMovedViews(old, mg.target)
		}
		if mg.scraper != nil {
			mg.scrapeLoop = startLoop(m.ctx, mg.scraper.Run)
		}
		if mg.sub != nil && mg.subLoop == nil {
			mg.subLoop = startLoop(m.ctx, mg.sub.Run)
		}
		m.targets[name] = mg
	}
	return nil
}

// resetMovedViews resets the Views that t, the new version of target old,
// keeps but fills from another source: another MetricsURL, or, for a rank,
// another place in its server's numbering (FirstRank). The old source's
// last observation would otherwise pass for the new one's until its first
// scrape, and its prefix-cache counters would be taken for the same
// engine's (the hit rate computed across both). Called after old's loop
// stopped, before t's starts.
func resetMovedViews(old, t Target) {
	if old.MetricsURL == t.MetricsURL && old.FirstRank == t.FirstRank {
		return
	}
	if t.View != nil && t.View == old.View && old.MetricsURL != "" {
		t.View.ResetSignals()
	}
	for r, rt := range t.Ranks {
		if r < len(old.Ranks) && old.Ranks[r].View == rt.View && old.MetricsURL != "" {
			rt.View.ResetSignals()
		}
	}
}

func sameTarget(a, b Target) bool {
	return a.Endpoint == b.Endpoint && a.MetricsURL == b.MetricsURL && a.Flavor == b.Flavor && a.View == b.View &&
		reflect.ValueOf(a.OnMetrics).Pointer() == reflect.ValueOf(b.OnMetrics).Pointer() &&
		sameKVEvents(a.KVEvents, b.KVEvents) && a.group == b.group && a.FirstRank == b.FirstRank &&
		slices.EqualFunc(a.Ranks, b.Ranks, func(x, y RankTarget) bool {
			return x.Endpoint == y.Endpoint && x.View == y.View &&
				reflect.ValueOf(x.OnAbsent).Pointer() == reflect.ValueOf(y.OnAbsent).Pointer()
		})
}

// sameKVEvents reports whether two KV-event targets are the same
// subscription into the same Sink.
func sameKVEvents(a, b *KVEventsTarget) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Address == b.Address && a.ReplayAddress == b.ReplayAddress && a.Topic == b.Topic && a.Listen == b.Listen &&
		a.DataParallel == b.DataParallel && a.DataParallelRank == b.DataParallelRank && a.MaxReplayBatches == b.MaxReplayBatches &&
		sameSink(a.Sink, b.Sink)
}

// sameSink compares two Sinks with ==: pointers by identity, never by
// content (reflect.DeepEqual would walk an index that is large and written
// concurrently). Sinks of a type == cannot compare are never the same.
func sameSink(a, b Sink) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// build returns the loops of t; cur, when not nil, is the endpoint's
// running state, whose subscriber t keeps when its KVEvents are the same.
func (m *Manager) build(t Target, cur *managed) (*managed, error) {
	mg := &managed{target: t}
	if t.MetricsURL != "" {
		s, err := NewScraper(m.cfg.Scrape, t)
		if err != nil {
			return nil, fmt.Errorf("signals manager: %w", err)
		}
		mg.scraper = s
	}
	if cur != nil && cur.sub != nil && sameKVEvents(cur.target.KVEvents, t.KVEvents) {
		mg.sub, mg.subLoop = cur.sub, cur.subLoop
	} else if ev := t.KVEvents; ev != nil {
		sub, err := NewSubscriber(SubscriberConfig{Endpoint: t.Endpoint, Address: ev.Address, ReplayAddress: ev.ReplayAddress,
			Topic: ev.Topic, Listen: ev.Listen, Sink: ev.Sink, Logger: m.cfg.Logger,
			DataParallel: ev.DataParallel, DataParallelRank: ev.DataParallelRank, MaxReplayBatches: ev.MaxReplayBatches})
		if err != nil {
			return nil, fmt.Errorf("signals manager: endpoint %q: %w", t.Endpoint, err)
		}
		mg.sub = sub
	}
	return mg, nil
}

// Close stops every loop, waits for them and unregisters the metrics. The
// Sinks keep their entries.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.end()
	for _, mg := range m.targets {
		mg.scrapeLoop.stop()
		mg.subLoop.stop()
	}
	m.mu.Unlock()
	if m.cfg.Registerer != nil {
		m.cfg.Registerer.Unregister(m.col)
	}
}

// EndpointStatus is one endpoint's signals for reporting (/metrics, UI).
type EndpointStatus struct {
	Endpoint string
	View     ViewStatus
	// Load is the View's load at the time of the call.
	Load kvroute.Load
	// Flavor is the detected (or configured) metrics flavour.
	Flavor Flavor
	// ScrapeDuration is how long the last scrape took.
	ScrapeDuration time.Duration
	// KVEvents is the subscriber's status (nil without KV events).
	KVEvents *SubscriberStatus
}

// Status returns every endpoint's status, sorted by endpoint.
func (m *Manager) Status() []EndpointStatus {
	now := time.Now()
	m.mu.Lock()
	out := make([]EndpointStatus, 0, len(m.targets))
	for name, mg := range m.targets {
		if len(mg.target.Ranks) > 0 {
			continue // a data-parallel engine's scrape: its ranks are reported
		}
		st := EndpointStatus{Endpoint: name, View: mg.target.View.Snapshot(), Load: mg.target.View.Load(now), Flavor: mg.target.Flavor}
		sc := mg.scraper
		if g := m.targets[mg.target.group]; mg.target.group != "" && g != nil {
			sc, st.Flavor = g.scraper, g.target.Flavor
		}
		if sc != nil {
			st.ScrapeDuration = sc.LastDuration()
			if f := sc.DetectedFlavor(); f != "" {
				st.Flavor = f
			}
		}
		if mg.sub != nil {
			s := mg.sub.Status()
			st.KVEvents = &s
		}
		out = append(out, st)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b EndpointStatus) int {
		switch {
		case a.Endpoint < b.Endpoint:
			return -1
		case a.Endpoint > b.Endpoint:
			return 1
		}
		return 0
	})
	return out
}

// collector exports the Manager's per-endpoint state at scrape time, so
// removed endpoints disappear without bookkeeping: the EndpointMetrics
// labelled "endpoint", and the requests the router holds open to it.
type collector struct{ m *Manager }

var (
	managerMetrics = NewEndpointMetrics("endpoint")
	descInFlight   = prometheus.NewDesc("kvroute_endpoint_inflight", "Requests the router holds open to the endpoint.",
		[]string{"endpoint"}, nil)
)

// A KVEventCounter is one counter of a KV-event subscriber's
// SubscriberStatus as a Prometheus counter: its name, its HELP text and
// its value.
type KVEventCounter struct {
	Name, Help string
	Value      func(*SubscriberStatus) uint64
}

// KVEventCounters returns the SubscriberStatus counters EndpointMetrics
// exports per endpoint, with their names and HELP texts.
func KVEventCounters() []KVEventCounter { return slices.Clone(kvEventCounters) }

var kvEventCounters = []KVEventCounter{
	{"kvroute_endpoint_kv_event_batches_total", "KV-event batches applied.",
		func(st *SubscriberStatus) uint64 { return st.Batches }},
	{"kvroute_endpoint_kv_event_stored_blocks_total", "Blocks the endpoint's BlockStored events added to the index.",
		func(st *SubscriberStatus) uint64 { return st.StoredBlocks }},
	{"kvroute_endpoint_kv_event_gaps_total", "KV-event sequence gaps (missed batches): filled from the engine's replay socket " +
		"(replays) when kv_events.replay_address is set, else the endpoint's index entries are dropped (resyncs).",
		func(st *SubscriberStatus) uint64 { return st.Gaps }},
	{"kvroute_endpoint_kv_event_replays_total", "Successful replays from the engine's replay socket (kv_events.replay_address): " +
		"a gap filled, the history caught up on subscribing, or the batches missed across a reconnection.",
		func(st *SubscriberStatus) uint64 { return st.Replays }},
	{"kvroute_endpoint_kv_event_resyncs_total", "Times the endpoint's index entries were dropped to resynchronise.",
		func(st *SubscriberStatus) uint64 { return st.Resyncs }},
	{"kvroute_endpoint_kv_event_restarts_total", "KV-event sequence restarts (engine restarts).",
		func(st *SubscriberStatus) uint64 { return st.Restarts }},
	{"kvroute_endpoint_kv_event_reconnects_total", "New KV-event connections after the first, each checked for an engine restart.",
		func(st *SubscriberStatus) uint64 { return st.Reconnects }},
	{"kvroute_endpoint_kv_event_orphans_total", "BlockStored events dropped because the index did not know their parent block " +
		"(or, without token ids, the blocks they name): the router missed the events that stored it (published before it " +
		"subscribed, or lost in a gap), and the endpoint's blocks after it are not matched. Set the endpoint's " +
		"kv_events.replay_address (vLLM's replay_endpoint) so that missed events are replayed.",
		func(st *SubscriberStatus) uint64 { return st.Orphans }},
	{"kvroute_endpoint_kv_event_decode_errors_total", "KV-event batches that could not be decoded (each drops the endpoint's " +
		"index entries): the engine publishes an encoding the router does not read.",
		func(st *SubscriberStatus) uint64 { return st.DecodeErrors }},
	{"kvroute_endpoint_kv_event_store_errors_total", "BlockStored events the index rejected for another reason than an " +
		"unknown parent, such as a block size other than the model's precise.block_size.",
		func(st *SubscriberStatus) uint64 { return st.StoreErrors }},
	{"kvroute_endpoint_kv_event_skipped_total", "KV events ignored: of another KV-cache group than the one indexed " +
		"(hybrid models), or of an unknown type.",
		func(st *SubscriberStatus) uint64 { return st.Skipped }},
	{"kvroute_endpoint_kv_event_rank_mismatches_total", "KV-event batches not applied because they named another " +
		"data_parallel_rank than the endpoint's: check its data_parallel_size and the engine's KV-event ports.",
		func(st *SubscriberStatus) uint64 { return st.RankMismatches }},
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	managerMetrics.Describe(ch)
	ch <- descInFlight
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, st := range c.m.Status() {
		managerMetrics.Collect(ch, now, &st, st.Endpoint)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.Load.InFlight), st.Endpoint)
	}
}

package signals

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"
)

// ScrapeConfig configures metric scraping; the zero value is usable.
type ScrapeConfig struct {
	// Interval between two scrapes of one endpoint; default 100ms.
	Interval time.Duration
	// Timeout of one scrape; default 1s. Scrapes of one endpoint never
	// overlap: one slower than Interval delays the next (missed ticks are
	// dropped), and the signals age meanwhile.
	Timeout time.Duration
	// MaxBodyBytes caps a /metrics body; a larger one is a failed scrape.
	// Default 4 MiB.
	MaxBodyBytes int64
	// Client sends the scrapes; nil uses a client of its own with keep-alive
	// connections.
	Client *http.Client
	// Logger receives scrape failures (once per failure streak); nil
	// discards.
	Logger *slog.Logger
	// LoRAListInterval is how often a llama.cpp server's GET
	// /lora-adapters is read again (its adapters' ids and scales: see
	// LlamaAdapters); default 10s. It is read at the server's first
	// llama.cpp scrape and after a failed scrape too (the server may have
	// restarted with other adapters).
	LoRAListInterval time.Duration
}

// DefaultLoRAListInterval is the default ScrapeConfig.LoRAListInterval.
const DefaultLoRAListInterval = 10 * time.Second

// DefaultScrapeInterval is the default ScrapeConfig.Interval.
const DefaultScrapeInterval = 100 * time.Millisecond

func (c *ScrapeConfig) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = DefaultScrapeInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LoRAListInterval <= 0 {
		c.LoRAListInterval = DefaultLoRAListInterval
	}
}

// Target is one endpoint to watch.
type Target struct {
	// Endpoint is the endpoint's ID (metric label, Sink name). Required.
	Endpoint string
	// MetricsURL is the engine's metrics URL, e.g. http://10.0.0.7:8000/metrics;
	// "" means no scraping (the View then stays router-local).
	MetricsURL string
	// Flavor of the engine's metrics; "" or auto detects it.
	Flavor Flavor
	// View receives the observations. Required, unless Ranks is set.
	View *View
	// OnMetrics, if set, is called after each successful scrape (e.g. to
	// size the approximate index from NumGPUBlocks). It must not block.
	// Not called for a target with Ranks.
	OnMetrics func(now time.Time, m Metrics)
	// KVEvents, if set, subscribes to the engine's KV-cache events. Unused
	// with Ranks (each rank has its own).
	KVEvents *KVEventsTarget
	// Ranks, when set, makes the target a data-parallel engine: one
	// server (MetricsURL) in front of len(Ranks) engine cores, each routed
	// as an endpoint of its own. Its metrics are scraped once per interval
	// and split by their engine label (ParseMetricsRanks, vLLM only):
	// Ranks[i]'s View observes the series labelled engine="<FirstRank+i>";
	// a failed scrape is every rank's failure. View, OnMetrics and KVEvents
	// are then unused.
	Ranks []RankTarget
	// FirstRank is the data-parallel rank of Ranks[0]: 0, or the server's
	// vLLM --data-parallel-start-rank.
	FirstRank int

	// group, on a rank's own target inside a Manager, is the Endpoint of
	// its data-parallel engine's target (see Manager.Sync).
	group string
}

// RankTarget is one rank of a data-parallel Target.
type RankTarget struct {
	// Endpoint is the rank's endpoint ID (metric label, Sink name).
	// Required, unique among every target's and rank's.
	Endpoint string
	// View receives the rank's observations. Required.
	View *View
	// KVEvents, if set, subscribes to the rank's own KV-cache events (vLLM:
	// the engine's addresses with the tcp port plus the rank).
	KVEvents *KVEventsTarget
	// OnAbsent, if set, is told whether the server still has this rank
	// (the router takes an absent rank out of rotation: vLLM answers
	// requests pinned to it with 400 "data_parallel_rank ... is out of
	// range"). A rank is absent when a scrape read the page as vLLM
	// metrics, the page labels series by engine, some of them with one of
	// the target's ranks, and none with this one: data_parallel_size
	// larger than the server's, or ranks scaled down. It is present again
	// when a later page has its series, and on a page without engine
	// labels (a server without data parallelism: its series count for
	// every rank). A failed scrape (connection refused, bad page, not
	// vLLM's) tells nothing: the rank's signals only age. Called from the
	// scrape loop at its first page that tells, then at each change (so a
	// new loop restates what an earlier one said); it must not block.
	OnAbsent func(now time.Time, absent bool)
}

// KVEventsTarget is where an endpoint publishes KV-cache events and where
// they go.
type KVEventsTarget struct {
	// Address and ReplayAddress as in SubscriberConfig.
	Address, ReplayAddress string
	// Topic as in SubscriberConfig ("" = all).
	Topic string
	// Listen as in SubscriberConfig: bind Address, the engine connects.
	Listen bool
	// Sink receives the blocks (the model's precise index). Required.
	Sink Sink
	// DataParallel and DataParallelRank as in SubscriberConfig: the
	// subscription of one rank of a data-parallel engine, whose batches
	// naming another rank are not applied.
	DataParallel     bool
	DataParallelRank int
	// MaxReplayBatches as in SubscriberConfig (0: its default).
	MaxReplayBatches int
}

// Scraper is one endpoint's scrape loop, modelled on Prometheus' scrape
// loop: the first scrape waits an offset derived from the endpoint's name
// (so endpoints spread over the interval), then one scrape per interval,
// each bounded by the timeout and the body cap. A failed scrape is recorded
// in the View (ObserveError) so the signals age and turn stale.
type Scraper struct {
	cfg    ScrapeConfig
	target Target

	// Reused from one scrape to the next; only the loop goroutine uses them.
	buf    bytes.Buffer   // the body
	parser *metricsParser // parses the body

	lastDuration atomic.Int64 // nanoseconds of the last scrape
	flavor       atomic.Pointer[Flavor]
	failing      bool       // in a failure streak; only the loop goroutine uses it
	slots        slotsState // a llama.cpp server's /slots (slotscrape.go)
	lora         loraState  // a llama.cpp server's /lora-adapters (lorascrape.go)

	// A data-parallel target's scrape, split by rank (Target.Ranks); only
	// the loop goroutine uses them.
	rankMetrics []Metrics
	rankErrs    []error
	rankFailing []bool       // per rank: in a failure streak of its own series
	rankState   []rankState  // per rank: whether the server has it
	seen        engineLabels // the last page's engine labels
	mismatch    bool         // the last page that told had none of the ranks' labels
}

// rankState is whether a data-parallel server has a rank, as its scrapes
// last told.
type rankState uint8

const (
	rankUnknown rankState = iota // no page told yet
	rankPresent
	rankAbsent
)

// maxEngineValues bounds the distinct engine label values kept of a page
// (for the log).
const maxEngineValues = 64

// engineLabels is what parseRanks saw of a page's engine labels.
type engineLabels struct {
	read    bool     // the page read as vLLM metrics: the fields below are its
	present []bool   // per rank of the target: a series labelled with it
	values  []string // the distinct engine label values, at most maxEngineValues
	more    bool     // values left out
}

func (l *engineLabels) reset(ranks int) {
	l.read, l.more = false, false
	clear(l.values) // they point into the previous page's families
	l.values = l.values[:0]
	if cap(l.present) < ranks {
		l.present = make([]bool, ranks)
	}
	l.present = l.present[:ranks]
	clear(l.present)
}

// note records a series labelled engine=v, the target's rank index i (-1:
// not one of its ranks). A nil l records nothing.
func (l *engineLabels) note(v string, i int) {
	if l == nil {
		return
	}
	if i >= 0 {
		l.present[i] = true
	}
	if slices.Contains(l.values, v) {
		return
	}
	if len(l.values) == maxEngineValues {
		l.more = true
		return
	}
	l.values = append(l.values, v)
}

// String lists the values sorted as numbers where they are ("0,1,10").
func (l *engineLabels) String() string {
	vs := slices.Clone(l.values)
	slices.SortFunc(vs, func(a, b string) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
	s := strings.Join(vs, ",")
	if l.more {
		s += ",..."
	}
	return s
}

// NewScraper returns the scrape loop for t.
func NewScraper(cfg ScrapeConfig, t Target) (*Scraper, error) {
	cfg.setDefaults()
	if t.Endpoint == "" {
		return nil, errors.New("scraper: Target.Endpoint is empty")
	}
	if t.View == nil && len(t.Ranks) == 0 {
		return nil, fmt.Errorf("scraper %s: Target.View is nil", t.Endpoint)
	}
	for r, rt := range t.Ranks {
		if rt.View == nil {
			return nil, fmt.Errorf("scraper %s: Target.Ranks[%d].View is nil", t.Endpoint, r)
		}
	}
	if t.MetricsURL == "" {
		return nil, fmt.Errorf("scraper %s: Target.MetricsURL is empty", t.Endpoint)
	}
	if _, err := http.NewRequest(http.MethodGet, t.MetricsURL, nil); err != nil {
		return nil, fmt.Errorf("scraper %s: MetricsURL: %w", t.Endpoint, err)
	}
	if _, err := ParseFlavor(string(t.Flavor)); err != nil {
		return nil, fmt.Errorf("scraper %s: %w", t.Endpoint, err)
	}
	s := &Scraper{cfg: cfg, target: t, parser: newMetricsParser()}
	if n := len(t.Ranks); n > 0 {
		s.rankMetrics, s.rankErrs, s.rankFailing = make([]Metrics, n), make([]error, n), make([]bool, n)
		s.rankState = make([]rankState, n)
	}
	return s, nil
}

// Offset returns how long after start the first scrape of endpoint happens:
// a hash of its name modulo interval.
func Offset(endpoint string, interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	return time.Duration(xxh3.HashString(endpoint) % uint64(interval))
}

// Run scrapes until ctx is done and returns nil then.
func (s *Scraper) Run(ctx context.Context) error {
	first := time.NewTimer(Offset(s.target.Endpoint, s.cfg.Interval))
	select {
	case <-ctx.Done():
		first.Stop()
		return nil
	case <-first.C:
	}
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		s.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// ScrapeOnce scrapes once and records the result in the View. It reuses
// the Scraper's buffers: it must not run concurrently with itself or Run.
func (s *Scraper) ScrapeOnce(ctx context.Context) {
	if len(s.target.Ranks) > 0 {
		s.scrapeRanks(ctx)
		return
	}
	start := time.Now()
	m, err := s.fetch(ctx)
	alone := false
	if err != nil {
		if sm, ok := s.slotsAlone(ctx, err); ok {
			m, err, alone = sm, nil, true
		}
	}
	s.lastDuration.Store(int64(time.Since(start)))
	if ctx.Err() != nil {
		return // shutting down: not the engine's fault
	}
	if err != nil {
		s.target.View.ObserveError(time.Now(), err)
		if !s.failing {
			s.cfg.Logger.Warn("scrape failed", "endpoint", s.target.Endpoint, "url", s.target.MetricsURL, "err", err)
		}
		s.failing = true
		return
	}
	if s.failing {
		s.cfg.Logger.Info("scrape recovered", "endpoint", s.target.Endpoint)
		s.slots.propsStale = true // the server may have restarted
		s.lora.stale = true
	}
	s.failing = false
	if !alone && s.slots.alone {
		s.slots.alone = false
		s.cfg.Logger.Info("llama.cpp /metrics read again", "endpoint", s.target.Endpoint)
	}
	if !alone && m.Flavor == FlavorLlamaCPP {
		s.addSlots(ctx, &m)
		if ctx.Err() != nil {
			return
		}
	}
	if m.Flavor == FlavorLlamaCPP {
		s.addLoRAList(ctx, &m)
		if ctx.Err() != nil {
			return
		}
	}
	f := m.Flavor
	s.flavor.Store(&f)
	// The engine's state is sampled at some point during the request; the
	// send time errs towards counting racing dispatches twice rather than
	// not at all (see the package doc).
	s.target.View.Observe(start, m)
	if s.target.OnMetrics != nil {
		s.target.OnMetrics(start, m)
	}
}

// acceptHeader asks for the text format, as Prometheus does for 0.0.4.
const acceptHeader = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"

// scrapeRanks is ScrapeOnce for a data-parallel target: one fetch, each
// rank observing its own series.
func (s *Scraper) scrapeRanks(ctx context.Context) {
	start := time.Now()
	ct, err := s.fetchBody(ctx)
	s.lastDuration.Store(int64(time.Since(start)))
	if ctx.Err() != nil {
		return
	}
	s.seen.reset(len(s.target.Ranks))
	if err == nil {
		s.parser.parseRanks(s.buf.Bytes(), ct, s.target.Flavor, s.target.FirstRank, s.rankMetrics, s.rankErrs, &s.seen)
	}
	now := time.Now()
	s.updatePresence(now)
	for r, rt := range s.target.Ranks {
		rerr := err
		if rerr == nil {
			rerr = s.rankErrs[r]
		}
		if rerr != nil {
			rt.View.ObserveError(now, rerr)
			if !s.rankFailing[r] && s.rankState[r] != rankAbsent { // an absent rank's ERROR said it
				s.cfg.Logger.Warn("scrape failed", "endpoint", rt.Endpoint, "url", s.target.MetricsURL, "err", rerr)
			}
			s.rankFailing[r] = true
			continue
		}
		if s.rankFailing[r] {
			s.cfg.Logger.Info("scrape recovered", "endpoint", rt.Endpoint)
		}
		s.rankFailing[r] = false
		m := s.rankMetrics[r]
		f := m.Flavor
		s.flavor.Store(&f)
		rt.View.Observe(start, m)
	}
}

// updatePresence tells each rank whether the page just parsed has it (see
// RankTarget.OnAbsent), logging each change: an ERROR naming the page's
// engine labels and the configured ranks when a rank goes absent.
func (s *Scraper) updatePresence(now time.Time) {
	if !s.seen.read {
		return // the scrape failed: it tells nothing
	}
	labelled, some := len(s.seen.values) > 0, slices.Contains(s.seen.present, true)
	if labelled && !some {
		// Labels, but none of the ranks': the configuration's ranks are
		// not the server's numbering (data_parallel_start_rank?). Taking
		// every rank out would stop a server that may well serve; their
		// signals stay stale, as a rank without queue metrics.
		if !s.mismatch {
			s.cfg.Logger.Error("data-parallel server's metrics label none of the configured ranks: their signals stay stale",
				"endpoint", s.target.Endpoint, "url", s.target.MetricsURL, "engines", s.seen.String(), "configured_ranks", s.rankRange())
		}
		s.mismatch = true
	} else {
		s.mismatch = false
	}
	for r, rt := range s.target.Ranks {
		st := rankPresent
		if labelled && some && !s.seen.present[r] {
			st = rankAbsent
		}
		old := s.rankState[r]
		if st == old {
			continue
		}
		s.rankState[r] = st
		switch {
		case st == rankAbsent:
			s.cfg.Logger.Error("data-parallel rank absent from the server's metrics: out of rotation until its series come back",
				"endpoint", rt.Endpoint, "url", s.target.MetricsURL, "rank", s.target.FirstRank+r,
				"engines", s.seen.String(), "configured_ranks", s.rankRange())
		case old == rankAbsent:
			s.cfg.Logger.Info("data-parallel rank back in the server's metrics: in rotation again",
				"endpoint", rt.Endpoint, "url", s.target.MetricsURL, "rank", s.target.FirstRank+r, "engines", s.seen.String())
		}
		if rt.OnAbsent != nil {
			rt.OnAbsent(now, st == rankAbsent)
		}
	}
}

// rankRange is the target's ranks for the log: "0-3".
func (s *Scraper) rankRange() string {
	first := s.target.FirstRank
	if len(s.target.Ranks) == 1 {
		return strconv.Itoa(first)
	}
	return strconv.Itoa(first) + "-" + strconv.Itoa(first+len(s.target.Ranks)-1)
}

func (s *Scraper) fetch(ctx context.Context) (Metrics, error) {
	ct, err := s.fetchBody(ctx)
	if err != nil {
		return Metrics{}, err
	}
	return s.parser.parse(s.buf.Bytes(), ct, s.target.Flavor)
}

// fetchBody GETs the metrics into s.buf and returns their content type.
func (s *Scraper) fetchBody(ctx context.Context) (string, error) {
	ct, err := s.get(ctx, s.target.MetricsURL, acceptHeader, &s.buf)
	if err != nil {
		return "", fmt.Errorf("scrape: %w", err)
	}
	return ct, nil
}

// jsonAccept is the Accept header of the JSON endpoints a scraper reads
// (llama.cpp's /slots and /props).
const jsonAccept = "application/json"

// get GETs url into buf within the scrape timeout and the body cap, and
// returns the answer's content type. An answer other than 200 is a
// *statusError.
func (s *Scraper) get(ctx context.Context, url, accept string, buf *bytes.Buffer) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "kvroute")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", &statusError{code: resp.StatusCode, status: resp.Status, head: head}
	}
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes+1))
	if err != nil {
		return "", fmt.Errorf("read body: %w", err)
	}
	if n > s.cfg.MaxBodyBytes {
		return "", fmt.Errorf("body exceeds %d bytes", s.cfg.MaxBodyBytes)
	}
	return resp.Header.Get("Content-Type"), nil
}

// statusError is an answer other than 200, with the first bytes of its
// body.
type statusError struct {
	code   int
	status string
	head   []byte
}

func (e *statusError) Error() string { return "status " + e.status }

// LastDuration is how long the last scrape took.
func (s *Scraper) LastDuration() time.Duration { return time.Duration(s.lastDuration.Load()) }

// DetectedFlavor is the flavour of the last successful scrape ("" = none).
func (s *Scraper) DetectedFlavor() Flavor {
	if f := s.flavor.Load(); f != nil {
		return *f
	}
	return ""
}

// loop is one running goroutine and how to stop it.
type loop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startLoop(parent context.Context, run func(ctx context.Context) error) *loop {
	ctx, cancel := context.WithCancel(parent)
	l := &loop{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		_ = run(ctx)
	}()
	return l
}

// stop cancels the loop and waits for it to return.
func (l *loop) stop() {
	if l == nil {
		return
	}
	l.cancel()
	<-l.done
}

package signals

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
)

// ViewConfig configures a View. The zero value is usable.
type ViewConfig struct {
	// StaleAfter is the age beyond which scraped signals are stale and Load
	// falls back on router-local counts; default 1s.
	StaleAfter time.Duration
	// MaxConsecutiveErrors marks the signals stale, whatever their age, once
	// this many scrapes in a row have failed; default 3.
	MaxConsecutiveErrors int
	// HitRateWindow is the span of recent scrapes over which the prefix-cache
	// hit rate is computed; default 10s.
	HitRateWindow time.Duration
	// KVCapacityTokens is the endpoint's KV capacity in tokens when known from
	// configuration; 0 means learn it from the scraped metrics.
	KVCapacityTokens int
}

func (c *ViewConfig) setDefaults() {
	if c.StaleAfter <= 0 {
		c.StaleAfter = time.Second
	}
	if c.MaxConsecutiveErrors <= 0 {
		c.MaxConsecutiveErrors = 3
	}
	if c.HitRateWindow <= 0 {
		c.HitRateWindow = 10 * time.Second
	}
}

// maxLog bounds the dispatch log kept between two observations. Beyond it
// the oldest transitions are folded away (see doc.go).
const maxLog = 1 << 14

// maxHitSamples bounds the scrapes kept for the hit-rate window.
const maxHitSamples = 256

// Ticket identifies one dispatched request to its View. It is a small value:
// keep it with the request and hand it back to FirstToken and Done. The zero
// Ticket is ignored by both.
type Ticket struct {
	seq          uint64
	slot         int32     // the request's entry in View.flights
	At           time.Time // when the request was dispatched
	PromptTokens int
}

// Valid reports whether t came from Dispatch.
func (t Ticket) Valid() bool { return t.seq != 0 }

// ViewStatus is a View's state for /metrics, logs and the dashboard.
type ViewStatus struct {
	// Last is the last successfully parsed scrape (zero before the first).
	Last       Metrics   `json:"last"`
	ObservedAt time.Time `json:"observed_at,omitzero"`
	// Scrapes counts successful observations, Errors failed ones;
	// ConsecutiveErrors counts failures since the last success.
	Scrapes           uint64 `json:"scrapes"`
	Errors            uint64 `json:"errors"`
	ConsecutiveErrors int    `json:"consecutive_errors"`
	// LastError is the last failure's message ("" = none) and LastErrorAt
	// its time.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// OutOfOrder counts observations dropped because a newer one had
	// already arrived.
	OutOfOrder uint64 `json:"out_of_order"`
	// InFlight and InFlightTokens are the router's open requests and the
	// prompt tokens of those still waiting for a first token.
	InFlight       int `json:"in_flight"`
	InFlightTokens int `json:"in_flight_tokens"`
}

// View is one endpoint's stale-signal model: the last scraped engine
// metrics, corrected by what the router itself dispatched since (see the
// package documentation for the timeline). It never reads the clock: every
// method takes now. A View is safe for concurrent use.
type View struct {
	cfg ViewConfig

	// gen changes with the state (each mutation adds one, under mu,
	// before it changes anything): see Gen.
	gen atomic.Uint64

	mu sync.Mutex // protects every field below

	// Last observation.
	last       Metrics
	observedAt time.Time
	scrapes    uint64
	outOfOrder uint64

	// Failures.
	errors      uint64
	consecutive int
	lastErr     string
	lastErrAt   time.Time

	// lora is last's LoRA adapters as Loads carry them (nil: none
	// reported).
	lora *kvroute.LoRALoad

	// Router-local state: requests in flight.
	seq uint64
	// flights holds the requests in flight, each in the slot its Ticket
	// names; a slot whose seq is not its ticket's (0 when free) is ended.
	// free lists the free slots. Dispatch reuses them, so a steady load
	// allocates nothing.
	flights   []flight
	free      []int32
	prefill   int // in flight without a first token
	prefillTk int // their prompt tokens
	decode    int // in flight with a first token
	decodeTk  int // their prompt tokens

	// Transitions after observedAt, in time order, and their sums.
	log []transition
	dW  int // change in engine waiting since observedAt
	dR  int // change in engine running
	dKV int // change in KV tokens in use

	// Prefix-cache counters of recent scrapes, oldest first.
	hits []hitSample
}

type flight struct {
	seq     uint64 // the ticket's; 0 when the slot is free
	tokens  int
	firstAt time.Time // zero until FirstToken
}

// transition is one change to the engine's state the router caused or saw.
type transition struct {
	at         time.Time
	dW, dR, dK int32
}

type hitSample struct {
	at            time.Time
	queries, hits float64
}

// NewView returns a View that has observed nothing yet: its Load is stale
// and built from router-local counts until the first Observe.
func NewView(cfg ViewConfig) *View {
	cfg.setDefaults()
	return &View{cfg: cfg}
}

// Observe records a successful scrape whose sample was taken at now (pass
// the time the scrape request was sent). Dispatch, FirstToken and Done
// events at or before now are taken to be visible in m; later ones stay on
// top of it. An observation older than the current one is counted and
// dropped.
func (v *View) Observe(now time.Time, m Metrics) {
	v.mu.Lock()
	v.gen.Add(1)
	defer v.mu.Unlock()
	if !v.observedAt.IsZero() && now.Before(v.observedAt) {
		v.outOfOrder++
		return
	}
	v.last = m
	v.lora = nil
	if m.Has(HasLoRA) {
		// Built once per observation: every Load until the next shares it.
		v.lora = &kvroute.LoRALoad{Running: slices.Clone(m.LoRARunning), Waiting: slices.Clone(m.LoRAWaiting), Max: m.MaxLoRA}
	}
	v.observedAt = now
	v.scrapes++
	v.consecutive = 0

	// Keep only transitions after the new observation.
	i := 0
	for i < len(v.log) && !v.log[i].at.After(now) {
		i++
	}
	if i > 0 {
		n := copy(v.log, v.log[i:])
		clear(v.log[n:])
		v.log = v.log[:n]
		v.dW, v.dR, v.dKV = 0, 0, 0
		for _, t := range v.log {
			v.dW += int(t.dW)
			v.dR += int(t.dR)
			v.dKV += int(t.dK)
		}
	}

	v.addHitSample(now, m)
}

func (v *View) addHitSample(now time.Time, m Metrics) {
	if !m.Has(HasPrefixCounters) {
		v.hits = v.hits[:0]
		return
	}
	if n := len(v.hits); n > 0 {
		prev := v.hits[n-1]
		if m.PrefixQueries < prev.queries || m.PrefixHits < prev.hits {
			// Counter reset: the engine restarted.
			v.hits = v.hits[:0]
		}
	}
	// Drop samples that fell out of the window, keeping one at or before
	// its start so the window is fully covered.
	cut := 0
	for cut+1 < len(v.hits) && now.Sub(v.hits[cut+1].at) >= v.cfg.HitRateWindow {
		cut++
	}
	if len(v.hits)-cut >= maxHitSamples {
		cut = len(v.hits) - maxHitSamples + 1
	}
	if cut > 0 {
		n := copy(v.hits, v.hits[cut:])
		v.hits = v.hits[:n]
	}
	v.hits = append(v.hits, hitSample{at: now, queries: m.PrefixQueries, hits: m.PrefixHits})
}

// ResetSignals forgets the scraped signals: the last observation, the
// failures since it and the hit-rate window, for a View whose metrics now
// come from elsewhere (Manager.Sync calls it when a target's MetricsURL
// changes). Until the next Observe its Load is stale, from router-local
// counts, and the next hit rate is not computed across two sources'
// counters. The requests in flight, and the counts of scrapes and errors,
// stay.
func (v *View) ResetSignals() {
	v.mu.Lock()
	v.gen.Add(1)
	defer v.mu.Unlock()
	v.last, v.lora, v.observedAt, v.consecutive = Metrics{}, nil, time.Time{}, 0
	v.hits = v.hits[:0]
}

// Flavor is the metrics flavour of the last observation: the engine's
// kind as its last scrape told it ("" before any, and after
// ResetSignals).
func (v *View) Flavor() Flavor {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.last.Flavor
}

// LlamaAdapters is the LoRA adapters of a llama.cpp server as its last
// observation listed them (Metrics.LlamaAdapters): nil before any, for
// another engine, and after ResetSignals. A failed scrape keeps them.
func (v *View) LlamaAdapters() *LlamaAdapters {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.last.LlamaAdapters
}

// ObserveError records a failed scrape at now. The last good signals keep
// aging; after MaxConsecutiveErrors failures in a row they are reported
// stale even if young.
func (v *View) ObserveError(now time.Time, err error) {
	v.mu.Lock()
	v.gen.Add(1)
	defer v.mu.Unlock()
	v.errors++
	v.consecutive++
	v.lastErrAt = now
	if err != nil {
		v.lastErr = err.Error()
	} else {
		v.lastErr = "unknown error"
	}
}

// Dispatch records that the router sent a request with promptTokens prompt
// tokens to the endpoint at now, and returns its ticket.
func (v *View) Dispatch(now time.Time, promptTokens int) Ticket {
	promptTokens = max(promptTokens, 0)
	v.mu.Lock()
	v.gen.Add(1)
	defer v.mu.Unlock()
	v.seq++
	f := flight{seq: v.seq, tokens: promptTokens}
	var slot int32
	if n := len(v.free); n > 0 {
		slot = v.free[n-1]
		v.free = v.free[:n-1]
		v.flights[slot] = f
	} else {
		slot = int32(len(v.flights))
		v.flights = append(v.flights, f)
	}
	v.prefill++
	v.prefillTk += promptTokens
	v.record(now, 1, 0, promptTokens)
	return Ticket{seq: v.seq, slot: slot, At: now, PromptTokens: promptTokens}
}

// flight returns the entry of t's request, nil when it has ended or t is
// the zero Ticket. (A ticket of another View is not told apart: one whose
// slot and sequence match a request of this View is taken for it, as when
// tickets were looked up by sequence alone. The router keeps each ticket
// with its endpoint.) Called with v.mu held.
func (v *View) flight(t Ticket) *flight {
	if t.seq == 0 || uint32(t.slot) >= uint32(len(v.flights)) {
		return nil
	}
	if f := &v.flights[t.slot]; f.seq == t.seq {
		return f
	}
	return nil
}

// FirstToken records that the request of t produced its first token at now:
// the engine moved it from its queue (or prefill) to its decode batch.
// Repeated calls and calls after Done are ignored.
func (v *View) FirstToken(now time.Time, t Ticket) {
	v.mu.Lock()
	v.gen.Add(1)
	defer v.mu.Unlock()
	f := v.flight(t)
	if f == nil || !f.firstAt.IsZero() {
		return
	}
	f.firstAt = now
	v.prefill--
	v.prefillTk -= f.tokens
	v.decode++
	v.decodeTk += f.tokens
	v.record(now, -1, 1, 0)
}

// Done records that the request of t ended at now (finished, failed or
// cancelled). Repeated calls are ignored.
func (v *View) Done(now time.Time, t Ticket) {
	v.mu.Lock()
	v.gen.Add(1)
	defer v.mu.Unlock()
	f := v.flight(t)
	if f == nil {
		return
	}
	first, tokens := f.firstAt, f.tokens
	*f = flight{}
	v.free = append(v.free, t.slot)
	if first.IsZero() {
		v.prefill--
		v.prefillTk -= tokens
		v.record(now, -1, 0, -tokens)
	} else {
		v.decode--
		v.decodeTk -= tokens
		v.record(now, 0, -1, -tokens)
	}
}

// record appends a transition at now if it happened after the current
// observation (earlier ones are in the engine's own numbers already).
func (v *View) record(now time.Time, dW, dR, dK int) {
	if !v.observedAt.IsZero() && !now.After(v.observedAt) {
		return
	}
	if len(v.log) >= maxLog {
		// Fold the older half into one transition at the time of the last
		// folded one: an observation between them is then treated as
		// seeing none of them, which over-counts rather than under-counts.
		half := len(v.log) / 2
		var f transition
		for _, t := range v.log[:half] {
			f.dW += t.dW
			f.dR += t.dR
			f.dK += t.dK
		}
		f.at = v.log[half-1].at
		v.log[0] = f
		n := copy(v.log[1:], v.log[half:])
		clear(v.log[1+n:])
		v.log = v.log[:1+n]
	}
	v.log = append(v.log, transition{at: now, dW: int32(dW), dR: int32(dR), dK: int32(clampInt32(dK))})
	v.dW += dW
	v.dR += dR
	v.dKV += dK
}

func clampInt32(x int) int {
	return max(math.MinInt32, min(math.MaxInt32, x))
}

// Gen returns a number that changes whenever the View's state does
// (Observe, ObserveError, Dispatch, FirstToken, Done). Read before
// LoadUntil, it tells a caller when that Load is out of date: a Load is
// the Load of every time in [now, until] while Gen has not changed.
func (v *View) Gen() uint64 { return v.gen.Load() }

// Load returns the endpoint's load as the router should see it at now.
func (v *View) Load(now time.Time) kvroute.Load {
	l, _ := v.LoadUntil(now)
	return l
}

// foreverTime is LoadUntil's until for a Load that changes only with the
// View's state.
var foreverTime = time.Unix(1<<62, 0)

// LoadUntil is Load, with the last time at which it is still the View's
// Load if the View does not change (see Gen): the state's load depends on
// now only through its staleness, which sets in StaleAfter after the last
// observation and then stays until the next.
func (v *View) LoadUntil(now time.Time) (kvroute.Load, time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	until := foreverTime
	l := kvroute.Load{
		InFlight:       v.prefill + v.decode,
		InFlightTokens: v.prefillTk,
		DecodeTokens:   v.decodeTk,
		ObservedAt:     v.observedAt,
		PrefixHitRate:  v.hitRate(),
	}
	capTokens := v.cfg.KVCapacityTokens
	if capTokens == 0 {
		capTokens = v.last.KVCapacityTokens
	}
	l.KVCapacityTokens = capTokens

	l.Stale = v.observedAt.IsZero() || now.Sub(v.observedAt) > v.cfg.StaleAfter ||
		v.consecutive >= v.cfg.MaxConsecutiveErrors
	if !l.Stale {
		until = v.observedAt.Add(v.cfg.StaleAfter)
	}
	if !l.Stale {
		l.LoRA = v.lora
	}
	if l.Stale {
		// Router-local counts only: requests waiting for a first token are
		// queued or in prefill, the others decoding. The hit rate of
		// scrapes that stopped is not the engine's recent one: unknown.
		l.Waiting = v.prefill
		l.Running = v.decode
		l.PrefixHitRate = -1
	} else {
		l.Waiting = max(0, roundInt(v.last.Waiting)+v.dW)
		l.Running = max(0, roundInt(v.last.Running)+v.dR)
	}
	if !l.Stale && v.last.Has(HasKVTokens) && capTokens > 0 {
		// The tokens the engine's running requests hold (llama.cpp's
		// busy slots), moved by the router's transitions, over the
		// capacity: a configured one rules over the scraped one (the sum
		// of the slots' n_ctx, too large with --kv-unified).
		l.KVUsage = clamp01(float64(v.last.KVTokens+v.dKV) / float64(capTokens))
	} else if !l.Stale && v.last.Has(HasKVUsage) {
		// The engine's figure, moved by the router's transitions since
		// it was sampled. Once stale it is dropped like the queue
		// counts: a figure of unknown age would keep a node that was
		// full when its scrapes stopped looking full for ever.
		u := v.last.KVUsage
		if capTokens > 0 {
			u += float64(v.dKV) / float64(capTokens)
		}
		l.KVUsage = clamp01(u)
	} else if capTokens > 0 {
		l.KVUsage = clamp01(float64(v.prefillTk+v.decodeTk) / float64(capTokens))
	}
	return l, until
}

// hitRate returns the token hit rate over the window, the lifetime ratio
// when no tokens were queried in the window, an engine-computed rate when
// only that is known, or -1.
func (v *View) hitRate() float64 {
	if n := len(v.hits); n > 0 {
		first, last := v.hits[0], v.hits[n-1]
		if dq := last.queries - first.queries; dq > 0 {
			return clamp01((last.hits - first.hits) / dq)
		}
		if last.queries > 0 {
			return clamp01(last.hits / last.queries)
		}
	}
	if v.last.Has(HasCacheHitRate) {
		return v.last.CacheHitRate
	}
	return -1
}

func roundInt(f float64) int {
	if math.IsNaN(f) || f <= 0 {
		return 0
	}
	if f >= math.MaxInt32 {
		return math.MaxInt32
	}
	return int(math.Round(f))
}

// Snapshot returns the View's state for reporting.
func (v *View) Snapshot() ViewStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := ViewStatus{
		Last:              v.last,
		ObservedAt:        v.observedAt,
		Scrapes:           v.scrapes,
		Errors:            v.errors,
		ConsecutiveErrors: v.consecutive,
		LastError:         v.lastErr,
		LastErrorAt:       v.lastErrAt,
		OutOfOrder:        v.outOfOrder,
		InFlight:          v.prefill + v.decode,
		InFlightTokens:    v.prefillTk,
	}
	s.Last.LoRAAdapters = append([]string(nil), v.last.LoRAAdapters...)
	s.Last.LoRARunning = append([]string(nil), v.last.LoRARunning...)
	s.Last.LoRAWaiting = append([]string(nil), v.last.LoRAWaiting...)
	return s
}

package router

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/signals"
)

// Config configures a Router. Zero values take the documented defaults.
type Config struct {
	// Model is the model name this pool serves.
	Model string
	// Endpoints are the pool's endpoints; IDs must be unique, weights 0
	// (the default, 1) to kvroute.MaxWeight. Required unless AllowEmpty.
	// SetEndpoints changes them later.
	Endpoints []kvroute.Endpoint
	// AllowEmpty lets the pool have no endpoints, at New and SetEndpoints:
	// a pool whose endpoints are discovered (none may be ready yet, or all
	// may have gone). Route then answers every request with an
	// *UnavailableError (503, code "no_endpoints"). Default false: an empty
	// list is an error.
	AllowEmpty bool
	// Policy names the policy behind Picker, for decisions and logs.
	Policy string
	// Picker chooses endpoints. Required.
	Picker kvroute.Picker
	// BlockChars is the approximate prefix index's block size in characters,
	// used when a request carries no token block hashes. Default 128.
	BlockChars int
	// CharsPerToken converts characters to tokens when estimating how many
	// prompt tokens a character-block match covers. Default 4 (zero or
	// negative). Otherwise at least MinCharsPerToken: New rejects NaN,
	// infinities and smaller values (a character count divided by them
	// is no token count: NaN sized the approximate index to one block).
	CharsPerToken float64
	// StaleAfter marks engine signals older than this as stale. Default 1s.
	StaleAfter time.Duration
	// ApproxTTL is how long the approximate index trusts a routed prefix on an
	// endpoint without KV events. Default 10m.
	ApproxTTL time.Duration
	// EventGap is how long a routed prefix counts on an endpoint that publishes
	// KV events, covering the gap until the engine's own event. Default 5s.
	EventGap time.Duration
	// DefaultCapacityTokens sizes the approximate index per endpoint when
	// neither the endpoint's config nor its metrics give a KV capacity.
	// Default 400,000 tokens.
	DefaultCapacityTokens int
	// Precise is the precise index fed by KV events (a *kvindex.Index), or
	// nil. Endpoints named in PreciseEndpoints use it.
	Precise PreciseIndex
	// PreciseEndpoints lists the endpoint IDs whose KV events feed Precise.
	PreciseEndpoints []string
	// Health configures passive ejection.
	Health HealthConfig
	// DecisionLog is how many decisions Decisions can return. Default 256;
	// negative disables the log.
	DecisionLog int
}

// MinCharsPerToken is the smallest Config.CharsPerToken New accepts.
const MinCharsPerToken = 0.01

// PreciseIndex is the precise prefix index as the router uses it:
// *kvindex.Index implements it.
type PreciseIndex interface {
	// Match appends to dst, per endpoint, the number of leading blocks of
	// hashes it holds and their tier.
	Match(hashes []uint64, dst []kvindex.Hit) []kvindex.Hit
}

// HealthConfig configures passive health: consecutive failures (connect
// errors, 5xx) eject an endpoint for an exponentially growing time.
type HealthConfig struct {
	// FailThreshold is the number of consecutive failures that eject an
	// endpoint. Default 3.
	FailThreshold int
	// BaseEjection is the first ejection's length; each further ejection
	// without an intervening success doubles it. Default 1s.
	BaseEjection time.Duration
	// MaxEjection caps the ejection length. Default 30s.
	MaxEjection time.Duration
}

func (c *Config) applyDefaults() {
	if c.BlockChars <= 0 {
		c.BlockChars = 128
	}
	if c.CharsPerToken <= 0 {
		c.CharsPerToken = 4
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = time.Second
	}
	if c.ApproxTTL <= 0 {
		c.ApproxTTL = 10 * time.Minute
	}
	if c.EventGap <= 0 {
		c.EventGap = 5 * time.Second
	}
	if c.DefaultCapacityTokens <= 0 {
		c.DefaultCapacityTokens = 400_000
	}
	if c.Health.FailThreshold <= 0 {
		c.Health.FailThreshold = 3
	}
	if c.Health.BaseEjection <= 0 {
		c.Health.BaseEjection = time.Second
	}
	if c.Health.MaxEjection <= 0 {
		c.Health.MaxEjection = 30 * time.Second
	}
	if c.Health.MaxEjection < c.Health.BaseEjection {
		c.Health.MaxEjection = c.Health.BaseEjection
	}
	if c.DecisionLog == 0 {
		c.DecisionLog = 256
	}
}

// Router routes one model's requests over its pool. It is safe for
// concurrent use.
type Router struct {
	cfg Config

	mu     sync.Mutex // protects everything below and serialises the Picker
	picker kvroute.Picker
	policy string
	eps    []*endpoint
	byID   map[string]*endpoint
	approx *kvindex.Approx // endpoints without KV events
	gap    *kvindex.Approx // endpoints with KV events: routed but not yet reported
	log    decisionLog
	cands  []kvroute.Candidate // reused by Route (traded with the decision log's)
	hits   []kvindex.Hit       // reused by Route (the precise index's)
	// slotHits is reused by Route for the approximate indexes' hits,
	// which name endpoints by slot number: bySlot and byGapSlot map those
	// of approx and gap to indexes in eps (-1: none).
	slotHits          []kvindex.SlotHit
	bySlot, byGapSlot []int32
	// matches is Route's scratch: each endpoint's prefix match, by index
	// in eps (matchPrefixes).
	matches []prefixMatch
	// unlisted is Route's scratch: the indexes in eps of the endpoints
	// whose llama.cpp server does not list the request's adapter (see
	// endpoint.unlisted), for the decision log's explanation.
	unlisted []int32
	hashes   []uint64 // reused by Route for character-block hashes: HashText(prompt)
	prompt   []byte   // a copy of the prompt of the last character-block hashes (see Route)
	salt     string   // that prompt's CacheSalt
	adapter  string   // and its Adapter
	// explainer is picker when it defers its explanations.
	explainer DeferredExplainer
	// anyPrecise: some endpoint publishes KV events, so gap may hold
	// entries (Route records into gap only for those endpoints).
	anyPrecise bool
	// idCache finds the endpoint a precise index hit names without
	// hashing the name (see endpointOf); byID is the fallback. (The
	// approximate indexes' hits name endpoints by slot: bySlot.)
	idCache [1 << idCacheBits]*endpoint
	// drained is signalled (never blocking) when a flight gets its first
	// token or ends (see Drained).
	drained chan struct{}
}

const idCacheBits = 8

type endpoint struct {
	// The fields Route reads for every endpoint at every decision come
	// first, next to each other: the first four of the struct's six cache
	// lines. Behind ep they were spread over five.

	view    *signals.View
	precise bool

	// Health, protected by Router.mu.
	activeOK     bool
	absent       bool // out of rotation: see SetAbsent
	ejectedUntil time.Time

	capBlocks int          // capacity last given to the approximate index
	capTokens int          // the KV capacity capBlocks was computed from
	capUnit   int          // and the block unit: BlockSize, negated in character mode (see sizeApprox)
	slot      kvindex.Slot // its room in the approximate index

	// The view's last Load, protected by Router.mu: see currentLoad. Its
	// KVCapacityTokens falls back to the endpoint's configured one.
	loadValid        bool
	loadGen          uint64
	loadFrom, loadTo time.Time
	load             kvroute.Load

	ep  kvroute.Endpoint
	idx int // in Router.eps
	// engine is shared by the copies SetEndpoints makes of an endpoint
	// updated in place: one engine, however many copies flights hold.
	engine *engineLife

	// More health, protected by Router.mu.
	consecFails int
	ejections   int // consecutive ejections without a success: the back-off exponent
	totalEjects int

	gapSlot kvindex.Slot // its room in gap
	writes  writeLog     // with KV events: what its dispatches wrote there (Evicts, Horizon)

	// The view's LlamaAdapters as of its Gen llamaGen (llamaValid: read
	// once), protected by Router.mu: see unlisted.
	llamaValid bool
	llamaGen   uint64
	llama      *signals.LlamaAdapters
}

// recordRoom returns the blocks the router's record of e's cache has left
// at now: the approximate index's room, or, with KV events, the write
// log's (its writes older than ttl dropped). Called with Router.mu held.
func (e *endpoint) recordRoom(now time.Time, ttl time.Duration) int {
	if e.precise {
		e.writes.trim(now, e.capBlocks, ttl)
		return e.writes.room(e.capBlocks)
	}
	return e.slot.Room()
}

// recordOldest returns the time of the least recent entry of that record
// (the zero Time when it holds none).
func (e *endpoint) recordOldest() time.Time {
	if e.precise {
		return e.writes.oldest()
	}
	return e.slot.Oldest()
}

// currentLoad returns the endpoint's Load at now. A decision reads all the
// endpoints' loads but changes at most one (its dispatch), and scrapes
// come a few times a second: the Load is computed again only when the
// view changed since (signals.View.Gen) or now is outside the times it
// holds for (LoadUntil). Called with Router.mu held. The Load returned is
// e.load: a decision copies it once, into its candidate (a Load is 96
// bytes, returned by value it was copied twice).
// The time is c.now (c: see nowCmp).
func (e *endpoint) currentLoad(c *nowCmp) *kvroute.Load {
	if g := e.view.Gen(); !e.loadValid || g != e.loadGen || c.before(e.loadFrom) || c.after(e.loadTo) {
		now := c.now
		e.load, e.loadTo = e.view.LoadUntil(now)
		if e.load.KVCapacityTokens == 0 {
			e.load.KVCapacityTokens = e.ep.KVCapacityTokens
		}
		e.loadGen, e.loadFrom, e.loadValid = g, now, true
	}
	return &e.load
}

// nowCmp answers now.Before(t) and now.After(t) for one decision's now,
// keeping the answer for the last t of each. Route asks three for every
// endpoint (its ejection's end, and the times its Load holds between),
// and they are mostly the same few times: the zero time of an endpoint
// never ejected, the decision at which a scrape refreshed every Load, the
// end of the signals' freshness after that scrape. time.Time's
// comparisons are not inlined: the calls were about 4% of a decision
// (BenchmarkDecisionKVAware64, pprof). Equal Times (==: the same wall
// and monotonic readings and Location) compare the same, so the answers
// are the comparisons'.
type nowCmp struct {
	now    time.Time
	bt, at time.Time // the last times before and after were asked about
	bv, av bool      // and their answers
}

// newNowCmp returns a nowCmp for now that knows its answers for the zero
// Time.
func newNowCmp(now time.Time) nowCmp {
	var zero time.Time
	return nowCmp{now: now, bv: now.Before(zero), av: now.After(zero)}
}

// before returns c.now.Before(t).
func (c *nowCmp) before(t time.Time) bool {
	if t == c.bt {
		return c.bv
	}
	c.bt, c.bv = t, c.now.Before(t)
	return c.bv
}

// after returns c.now.After(t).
func (c *nowCmp) after(t time.Time) bool {
	if t == c.at {
		return c.av
	}
	c.at, c.av = t, c.now.After(t)
	return c.av
}

// New returns a Router for cfg.
func New(cfg Config) (*Router, error) {
	if x := cfg.CharsPerToken; math.IsNaN(x) || math.IsInf(x, 0) || x > 0 && x < MinCharsPerToken {
		return nil, fmt.Errorf("router: config: chars per token %v is not a finite number of at least %v (or 0 for the default 4)", x, MinCharsPerToken)
	}
	cfg.applyDefaults()
	if cfg.Picker == nil {
		return nil, errors.New("router: config: picker is required")
	}
	list, err := checkEndpoints(cfg.Model, cfg.Endpoints, cfg.AllowEmpty)
	if err != nil {
		return nil, fmt.Errorf("router: config: %w", err)
	}
	r := &Router{
		cfg:     cfg,
		picker:  cfg.Picker,
		policy:  cfg.Policy,
		drained: make(chan struct{}, 1),
		byID:    make(map[string]*endpoint, len(list)),
		// Route calls Match and Record under mu, and nothing else reaches
		// the approximate indexes: they may skip their lock-free readers'
		// guarantees.
		approx: kvindex.NewApprox(kvindex.ApproxConfig{TTL: cfg.ApproxTTL, Serialized: true}),
		gap:    kvindex.NewApprox(kvindex.ApproxConfig{TTL: cfg.EventGap, Serialized: true}),
		log:    newDecisionLog(cfg.DecisionLog),
	}
	precise := preciseSet(cfg.PreciseEndpoints)
	eps := make([]*endpoint, len(list))
	for i := range list {
		eps[i] = r.newEndpoint(list[i], precise[list[i].ID])
	}
	r.install(eps)
	r.takePicker(cfg.Policy, cfg.Picker)
	return r, nil
}

// checkEndpoints returns eps with their defaults (ID: the URL; Weight: 1)
// after checking that there is at least one (unless allowEmpty), that
// IDs are unique and that weights are 0 (the default) to
// kvroute.MaxWeight.
func checkEndpoints(model string, eps []kvroute.Endpoint, allowEmpty bool) ([]kvroute.Endpoint, error) {
	if len(eps) == 0 && !allowEmpty {
		return nil, fmt.Errorf("model %q has no endpoints", model)
	}
	out := make([]kvroute.Endpoint, len(eps))
	seen := make(map[string]bool, len(eps))
	for i, ep := range eps {
		if ep.ID == "" {
			ep.ID = ep.URL
		}
		if ep.ID == "" {
			return nil, fmt.Errorf("endpoints[%d]: id or url is required", i)
		}
		if seen[ep.ID] {
			return nil, fmt.Errorf("endpoints[%d]: duplicate id %q", i, ep.ID)
		}
		seen[ep.ID] = true
		switch {
		case ep.Weight < 0 || ep.Weight > kvroute.MaxWeight:
			return nil, fmt.Errorf("endpoints[%d] (%q): weight %d is not in 1..%d (0: the default, 1)", i, ep.ID, ep.Weight, kvroute.MaxWeight)
		case ep.Weight == 0:
			ep.Weight = 1
		}
		if !slices.IsSorted(ep.Adapters) { // ServesAdapter searches it
			ep.Adapters = slices.Sorted(slices.Values(ep.Adapters))
		}
		out[i] = ep
	}
	return out, nil
}

func preciseSet(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// engineLife is what the copies of one endpoint share. Protected by
// Router.mu.
type engineLife struct {
	// removed: SetEndpoints took the engine out of the pool (removed, or
	// its ID given to another engine).
	removed bool
}

// newEndpoint returns the state of an endpoint new to the pool: healthy,
// no signals yet, nothing in the approximate indexes. Called with r.mu
// held (or before r is shared).
func (r *Router) newEndpoint(ep kvroute.Endpoint, precise bool) *endpoint {
	return &endpoint{
		ep:       ep,
		engine:   new(engineLife),
		view:     signals.NewView(signals.ViewConfig{StaleAfter: r.cfg.StaleAfter}),
		precise:  precise && r.cfg.Precise != nil,
		activeOK: true,
		slot:     r.approx.Slot(ep.ID),
		gapSlot:  r.gap.Slot(ep.ID),
	}
}

// install makes eps the pool, in this order: it numbers them and rebuilds
// every table that maps IDs, slots and positions to endpoints. Called with
// r.mu held (or before r is shared).
func (r *Router) install(eps []*endpoint) {
	r.eps = eps
	r.byID = make(map[string]*endpoint, len(eps))
	r.bySlot, r.byGapSlot = r.bySlot[:0], r.byGapSlot[:0]
	r.anyPrecise = false
	clear(r.idCache[:]) // it may name endpoints gone or replaced
	for i, e := range eps {
		e.idx = i
		r.byID[e.ep.ID] = e
		r.bySlot = setSlot(r.bySlot, e.slot, i)
		r.byGapSlot = setSlot(r.byGapSlot, e.gapSlot, i)
		r.anyPrecise = r.anyPrecise || e.precise
	}
	// Route sets every field of every candidate, Endpoint included (the
	// decision log hands back candidates of decisions made over an
	// earlier pool).
	r.cands = make([]kvroute.Candidate, len(eps))
	r.matches = make([]prefixMatch, len(eps))
}

// EndpointForgetter is implemented by pickers that keep state per
// endpoint ID beyond the flights they hear of (policy.SGLang's radix tree
// of what each worker holds). SetEndpoints calls ForgetEndpoint, under the
// router's lock, for each endpoint it removes or replaces by another
// engine under the same ID. Flights still in progress on it may still end
// with Learner and Releaser calls naming it.
type EndpointForgetter interface {
	ForgetEndpoint(id string)
}

// SetEndpoints makes eps the pool's endpoints, in this order, while the
// router runs: what New does with Config.Endpoints (IDs default to URLs,
// weights to 1; at least one endpoint unless Config.AllowEmpty; IDs
// unique; weights 0 to kvroute.MaxWeight) and
// Config.PreciseEndpoints (precise: the IDs whose KV events feed
// Config.Precise). On an error nothing changes.
//
// An endpoint is known by its ID. One whose ID stays and whose engine is
// the same (same URL, same data-parallel size and rank, same role) keeps
// everything: health and ejection, its signals.View and the dispatches in
// flight it counts, its approximate-index entries, the picker's learned
// state. Its weight, labels and KV capacity are updated in place (for the
// decisions made from then on); when whether its KV events feed the
// precise index changes, its approximate-index entries are dropped. An ID
// whose URL, data-parallel place or role changed names another engine:
// it is removed and added (a prefill engine turned decode has learned
// nothing as a decode engine). A removed endpoint is never chosen again and its
// approximate-index entries are dropped (its precise-index entries are its
// KV-event subscription's to remove); flights already routed to it end
// normally: FirstToken and Done count them on its own View and tell the
// picker as usual. An added endpoint starts as at New: healthy, no signals,
// nothing cached, present (SetAbsent). One that stays keeps whether it is
// absent (its scrape loop, which tells, keeps running or restates it).
// Pickers that keep state per endpoint ID forget removed
// endpoints through EndpointForgetter; the rest see the new pool at their
// next Pick (the candidates are the pool, in order).
func (r *Router) SetEndpoints(now time.Time, eps []kvroute.Endpoint, precise []string) error {
	list, err := checkEndpoints(r.cfg.Model, eps, r.cfg.AllowEmpty)
	if err != nil {
		return fmt.Errorf("router: set endpoints: %w", err)
	}
	isPrecise := preciseSet(precise)
	r.mu.Lock()
	defer r.mu.Unlock()
	// Which endpoints stay: the rest are removed before any is added, so
	// that an engine replaced under its ID gets a fresh index slot.
	stays := make(map[string]*endpoint, len(list))
	for i := range list {
		if old := r.byID[list[i].ID]; old != nil && old.ep.SameEngine(&list[i]) {
			stays[old.ep.ID] = old
		}
	}
	forget, _ := r.picker.(EndpointForgetter)
	added := false
	for _, e := range r.eps {
		if stays[e.ep.ID] == e {
			continue
		}
		e.engine.removed = true
		r.approx.Remove(e.ep.ID)
		r.gap.Remove(e.ep.ID)
		if forget != nil {
			forget.ForgetEndpoint(e.ep.ID)
		}
	}
	next := make([]*endpoint, len(list))
	for i, ep := range list {
		p := isPrecise[ep.ID] && r.cfg.Precise != nil
		old := stays[ep.ID]
		switch {
		case old == nil:
			next[i], added = r.newEndpoint(ep, p), true
		case sameEndpoint(&old.ep, &ep) && old.precise == p:
			next[i] = old
		default:
			// Updated in place, as a copy: flights in progress read the
			// old one's Endpoint without the lock.
			e := new(endpoint)
			*e = *old
			e.ep, e.loadValid = ep, false
			if e.precise != p {
				e.precise = p
				r.approx.Clear(ep.ID)
				r.gap.Clear(ep.ID)
				e.writes.reset()
			}
			next[i] = e
		}
	}
	r.install(next)
	if added {
		r.wake() // a request held for room may fit on a new endpoint
	}
	return nil
}

// sameEndpoint reports whether a and b are equal in every field.
func sameEndpoint(a, b *kvroute.Endpoint) bool {
	return a.ID == b.ID && a.SameEngine(b) && a.Weight == b.Weight &&
		a.KVCapacityTokens == b.KVCapacityTokens && maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Adapters, b.Adapters)
}

// Model returns the model name.
func (r *Router) Model() string { return r.cfg.Model }

// Endpoints returns the pool's endpoints in configuration order.
func (r *Router) Endpoints() []kvroute.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]kvroute.Endpoint, len(r.eps))
	for i, e := range r.eps {
		out[i] = e.ep
	}
	return out
}

// AppendSameServer appends to dst the IDs of the pool's endpoints other
// than e at e's URL (the other data-parallel ranks of its server): a
// server that refused a connection to one refuses them all, so a retry
// excludes them too.
func (r *Router) AppendSameServer(dst []string, e *kvroute.Endpoint) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.eps {
		if o.ep.URL == e.URL && o.ep.ID != e.ID {
			dst = append(dst, o.ep.ID)
		}
	}
	return dst
}

// ForgetDispatches drops what the router recorded of its own dispatches to
// endpoint while waiting for the engine's KV events (Config.EventGap): the
// engine's event history was reset (it restarted, or a gap could not be
// filled and the precise index dropped its entries), so those prompts may
// be gone from its cache with no event to say so. Without it the router
// went on claiming them for up to EventGap. What they wrote into its cache
// (the room and turnover its candidates report) is forgotten too.
func (r *Router) ForgetDispatches(endpoint string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gap.Clear(endpoint)
	if e := r.byID[endpoint]; e != nil {
		e.writes.reset()
	}
}

// View returns the signals view of an endpoint, or nil if it is not in
// the pool. Scrape loops feed it; Route reads it.
func (r *Router) View(endpointID string) *signals.View {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.byID[endpointID]; e != nil {
		return e.view
	}
	return nil
}

// Policy returns the current policy name.
func (r *Router) Policy() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.policy
}

// SetPicker switches the policy at runtime. Requests already routed are
// unaffected.
func (r *Router) SetPicker(policy string, p kvroute.Picker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.takePicker(policy, p)
}

// takePicker makes p the picker. A DeferredExplainer is told to defer its
// explanations to the decision log. Called with r.mu held (or before r is
// shared).
func (r *Router) takePicker(policy string, p kvroute.Picker) {
	r.policy, r.picker = policy, p
	r.explainer, _ = p.(DeferredExplainer)
	if r.explainer != nil {
		r.explainer.DeferExplanations()
	}
}

// Flight is one routed attempt of a request, from Route to Done.
type Flight struct {
	// Decision is the picker's decision. Its Scores are nil: the full
	// explanation is kept in the decision log (Router.Decisions).
	Decision kvroute.Decision
	// Endpoint is the chosen endpoint.
	Endpoint *kvroute.Endpoint

	req          *kvroute.Request
	e            *endpoint
	ticket       signals.Ticket
	queue        int
	cachedTokens int
	first        bool // FirstToken was recorded (guarded by the router's mu)
	done         bool
}

// FirstTokenObserver is implemented by pickers that want to hear when a
// routed request produced its first token: from then on its prompt is no
// longer prefill work queued on the endpoint (policy.KVAware counts the
// uncached tokens still queued per endpoint this way). The router calls it
// at most once per flight, before Done, under its lock.
type FirstTokenObserver interface {
	FirstToken(now time.Time, req *kvroute.Request, endpoint string)
}

// CachedTokens returns how many prompt tokens the router expected the
// chosen endpoint to have cached.
func (f *Flight) CachedTokens() int { return f.cachedTokens }

// Route picks an endpoint for req, never one whose ID is in exclude (the
// endpoints already tried for this request), and records the dispatch. It
// fills req.BlockHashes from req.Prompt when the caller left them nil.
//
// Errors are *kvroute.Error: 503 when no endpoint is healthy or the pool
// has none (Config.AllowEmpty), 429 when the policy sheds the request. The
// picker is never called without a healthy candidate.
func (r *Router) Route(now time.Time, req *kvroute.Request, exclude []string) (*Flight, error) {
	// The one allocation of a decision is made before the lock: during a
	// GC cycle an allocation may be made to help mark, and under the lock
	// every other request would wait for it. (Route allocates nothing else
	// at steady state.)
	f := new(Flight)
	r.mu.Lock()
	defer r.mu.Unlock()

	charMode := false
	if req.BlockHashes == nil && req.Prompt != "" {
		// The blocks this prompt shares with the last one (a system prompt,
		// the conversation so far) keep their hashes. The last one is kept
		// as a copy: a request's prompt may live in storage its caller
		// recycles once the request is done (the proxy's parse buffers),
		// and the next prompt may then be written over it.
		// Of the copy, the bytes the two share are already there.
		var shared int
		if req.CacheSalt != r.salt || req.Adapter != r.adapter {
			// The last prompt's hashes are another salt's or adapter's
			// chain.
			r.prompt, r.salt, r.adapter = r.prompt[:0], req.CacheSalt, req.Adapter
		}
		r.hashes, shared = kvindex.HashTextSharedKeyed(req.Prompt, req.Adapter, req.CacheSalt, unsafe.String(unsafe.SliceData(r.prompt), len(r.prompt)), r.cfg.BlockChars, r.hashes)
		same := shared * r.cfg.BlockChars
		r.prompt = append(r.prompt[:same], req.Prompt[same:]...)
		req.BlockHashes = r.hashes
		req.BlockSize = r.cfg.BlockChars
		charMode = true
		defer func() { req.BlockHashes = nil }() // r.hashes is reused by the next call
	}
	r.matchPrefixes(now, req)

	healthy := 0
	r.unlisted = r.unlisted[:0]
	cands := r.cands
	// Most endpoints hold the same number of blocks (none, or a shared
	// system prompt): their tokens are converted once.
	tokBlocks, tokens := 0, 0
	clock := newNowCmp(now)
	unit := req.BlockSize // sizeApprox's
	if charMode {
		unit = -unit
	}
	for i, e := range r.eps {
		c := &cands[i]
		m := r.matches[i]
		c.Endpoint = &e.ep
		// An endpoint that does not serve the request's LoRA adapter is
		// never a candidate for it: one the config does not give it, or
		// whose llama.cpp server does not list it.
		serves := e.ep.ServesAdapter(req.Adapter)
		if serves && req.Adapter != "" && e.unlisted(req.Adapter) {
			serves = false
			r.unlisted = append(r.unlisted, int32(i))
		}
		c.Healthy = serves && e.healthy(&clock) && !contains(exclude, e.ep.ID)
		if c.Healthy {
			healthy++
		}
		l := e.currentLoad(&clock)
		c.Load = *l
		c.CachedBlocks, c.Tier, c.Precise = m.cached, m.tier, m.prec
		if m.cached != tokBlocks {
			tokBlocks, tokens = m.cached, r.blocksToTokens(req, m.cached, charMode)
		}
		c.CachedTokens = tokens
		if l.KVCapacityTokens != e.capTokens || unit != e.capUnit || e.capBlocks == 0 {
			r.sizeApprox(e, l.KVCapacityTokens, req, charMode) // not as last time (sizeApprox checks too)
		}
		// What the endpoint does not hold of the prompt would be written
		// there: past its room, other prompts' blocks are evicted.
		c.Evicts = len(req.BlockHashes) > 0 && e.recordRoom(now, r.cfg.ApproxTTL) < len(req.BlockHashes)-m.cached
		c.Horizon = 0
		if c.Evicts {
			if o := e.recordOldest(); !o.IsZero() {
				c.Horizon = now.Sub(o)
			}
		}
	}
	if healthy == 0 {
		return nil, r.unavailable(now, req, exclude)
	}

	d := r.picker.Pick(now, req, cands)
	if d.Policy == "" {
		d.Policy = r.policy
	}
	if d.Index >= 0 && d.Index < len(r.eps) {
		d.Endpoint = r.eps[d.Index].ep.ID
	}
	rcy, _ := r.picker.(ScoreRecycler)
	// The log keeps cands (read below, not written: the log's now) and
	// gives back the ones of the decision it drops for the next Route.
	r.cands = r.log.take(now, req, d, cands, r.unlisted, rcy, r.explainer)
	if d.Index < 0 || d.Index >= len(r.eps) || !cands[d.Index].Healthy {
		if d.Shed {
			return nil, &ShedError{Err: kvroute.Error{Status: http.StatusTooManyRequests, Type: kvroute.TypeOverloaded, Code: "overloaded",
				Message: fmt.Sprintf("model %q is overloaded: every endpoint is over its load cap (%s)", r.cfg.Model, d.Reason)},
				Decision: d}
		}
		if d.Index >= 0 {
			if rel, ok := r.picker.(kvroute.Releaser); ok && d.Index < len(r.eps) {
				// Not dispatched: a picker that counts what it placed per
				// request must not charge the endpoint until a sweep.
				rel.Release(now, req, r.eps[d.Index].ep.ID)
			}
			return nil, &kvroute.Error{Status: http.StatusInternalServerError, Type: kvroute.TypeInternal, Code: "bad_decision",
				Message: fmt.Sprintf("policy %s chose an ineligible endpoint (index %d)", d.Policy, d.Index)}
		}
		return nil, r.unavailable(now, req, exclude)
	}
	e := r.eps[d.Index]
	c := &cands[d.Index]
	d.Scores = nil // the full explanation lives in the decision log (Decisions)
	*f = Flight{
		Decision:     d,
		Endpoint:     &e.ep,
		req:          req,
		e:            e,
		queue:        c.Load.Queue(),
		cachedTokens: c.CachedTokens,
	}
	f.ticket = e.view.Dispatch(now, req.PromptTokens)
	if len(req.BlockHashes) > 0 {
		if e.precise {
			r.gap.Record(now, e.ep.ID, req.BlockHashes)
			e.writes.add(now, len(req.BlockHashes)-c.CachedBlocks, e.capBlocks, r.cfg.ApproxTTL)
		} else {
			r.approx.Record(now, e.ep.ID, req.BlockHashes)
		}
	}
	return f, nil
}

// prefixMatch is one endpoint's prefix match for the request being
// routed: the leading blocks it holds, their tier, and whether the precise
// index said so.
type prefixMatch struct {
	cached int
	tier   kvroute.Tier
	prec   bool
}

// setSlot records in bySlot that slot s is endpoint i's.
func setSlot(bySlot []int32, s kvindex.Slot, i int) []int32 {
	for len(bySlot) <= s.Index() {
		bySlot = append(bySlot, -1)
	}
	bySlot[s.Index()] = int32(i)
	return bySlot
}

// matchPrefixes fills r.matches for req.
func (r *Router) matchPrefixes(now time.Time, req *kvroute.Request) {
	clear(r.matches)
	if len(req.BlockHashes) == 0 {
		return
	}
	r.slotHits = r.approx.MatchSlots(now, req.BlockHashes, r.slotHits[:0])
	r.takeSlotHits(r.bySlot)
	if r.anyPrecise {
		r.slotHits = r.gap.MatchSlots(now, req.BlockHashes, r.slotHits[:0])
		r.takeSlotHits(r.byGapSlot)
	}
	if r.cfg.Precise == nil {
		return
	}
	r.hits = r.cfg.Precise.Match(req.BlockHashes, r.hits[:0])
	for _, h := range r.hits {
		e := r.endpointOf(h.Endpoint)
		if e == nil || !e.precise {
			continue
		}
		m := &r.matches[e.idx]
		m.prec = true
		if h.Blocks >= m.cached {
			m.cached, m.tier = h.Blocks, h.Tier
		}
	}
}

// takeSlotHits records r.slotHits, an approximate index's, in r.matches;
// bySlot maps the index's slots to endpoints.
func (r *Router) takeSlotHits(bySlot []int32) {
	for _, h := range r.slotHits {
		if int(h.Slot) >= len(bySlot) || bySlot[h.Slot] < 0 {
			continue
		}
		if m := &r.matches[bySlot[h.Slot]]; int(h.Blocks) > m.cached {
			m.cached, m.tier = int(h.Blocks), kvroute.TierGPU
		}
	}
}

// endpointOf returns the endpoint with ID id, nil when there is none. The
// prefix indexes name endpoints in their hits with the very strings the
// router gave them (the endpoints' IDs), so a small cache indexed by the
// string's address finds the endpoint without hashing the name; an ID
// comparison (an address comparison when it hits) guards it, and the map
// is the fallback. Called with r.mu held.
func (r *Router) endpointOf(id string) *endpoint {
	a := uint64(uintptr(unsafe.Pointer(unsafe.StringData(id))))
	slot := &r.idCache[(a*0x9e3779b97f4a7c15)>>(64-idCacheBits)]
	if e := *slot; e != nil && e.ep.ID == id {
		return e
	}
	e := r.byID[id]
	if e != nil {
		*slot = e
	}
	return e
}

// blocksToTokens converts a leading-block match to prompt tokens.
func (r *Router) blocksToTokens(req *kvroute.Request, blocks int, charMode bool) int {
	if blocks <= 0 || req.BlockSize <= 0 {
		return 0
	}
	var t int
	if charMode {
		chars := blocks * req.BlockSize
		if req.PromptTokens > 0 && len(req.Prompt) > 0 {
			t = int(math.Round(float64(chars) * float64(req.PromptTokens) / float64(len(req.Prompt))))
		} else {
			t = int(float64(chars) / r.cfg.CharsPerToken)
		}
	} else {
		t = blocks * req.BlockSize
	}
	if req.PromptTokens > 0 && t > req.PromptTokens {
		t = req.PromptTokens
	}
	return t
}

// sizeApprox keeps the approximate index's per-endpoint capacity in step
// with the endpoint's KV capacity, in the request's block unit; once a
// request came with token blocks, in those: a prompt precise mode could
// not tokenize (routed on character blocks, of another size) does not
// resize the index its token-block prompts fill, which trimmed them to
// the capacity in character blocks at each such request.
func (r *Router) sizeApprox(e *endpoint, capTokens int, req *kvroute.Request, charMode bool) {
	unit := req.BlockSize
	if charMode {
		unit = -unit
		if e.capUnit > 0 {
			unit = e.capUnit
		}
	}
	if capTokens == e.capTokens && unit == e.capUnit && e.capBlocks != 0 {
		return // as last time
	}
	if unit == 0 {
		return // no blocks to size in (the request has no hashes)
	}
	e.capTokens, e.capUnit = capTokens, unit
	if capTokens <= 0 {
		capTokens = r.cfg.DefaultCapacityTokens
	}
	blockTokens := float64(unit)
	if unit < 0 {
		blockTokens = float64(-unit) / r.cfg.CharsPerToken
	}
	if blockTokens <= 0 {
		return
	}
	blocks := int(float64(capTokens) / blockTokens)
	if blocks < 1 {
		blocks = 1
	}
	if blocks != e.capBlocks {
		e.capBlocks = blocks
		r.approx.SetCapacity(e.ep.ID, blocks)
		r.gap.SetCapacity(e.ep.ID, blocks)
	}
}

// unavailable builds the 503 for a pool with no healthy endpoint for req
// (of those that serve its LoRA adapter, if any); its RetryAfter is the
// time until the first ejection of those ends (at least 1s). A request
// for an adapter is told so, code no_adapter_endpoint.
func (r *Router) unavailable(now time.Time, req *kvroute.Request, exclude []string) error {
	if len(r.eps) == 0 {
		return &UnavailableError{Err: kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
			Code: "no_endpoints", Message: fmt.Sprintf("model %q has no endpoints (none discovered ready yet)", r.cfg.Model)},
			RetryAfter: emptyRetryAfter}
	}
	if req.Adapter != "" {
		return r.adapterUnavailable(now, req.Adapter, exclude)
	}
	wait := time.Duration(0)
	for _, e := range r.eps {
		if e.ejectedUntil.After(now) {
			if d := e.ejectedUntil.Sub(now); wait == 0 || d < wait {
				wait = d
			}
		}
	}
	secs := int(math.Ceil(wait.Seconds()))
	if secs < 1 {
		secs = 1
	}
	msg := fmt.Sprintf("no healthy endpoint for model %q", r.cfg.Model)
	if len(exclude) > 0 {
		msg = fmt.Sprintf("no healthy endpoint left for model %q after trying %d", r.cfg.Model, len(exclude))
	}
	return &UnavailableError{Err: kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
		Code: "no_healthy_endpoint", Message: msg}, RetryAfter: secs}
}

// adapterUnavailable is unavailable for a request for LoRA adapter
// adapter: no endpoint that serves it is healthy (or untried), or none in
// the pool serves it (a discovered pool may have none yet). When every
// endpoint that the config gives the adapter is a llama.cpp server whose
// list does not have it (endpoint.unlisted), no endpoint can run it and
// the answer is the 404 of adapterNotListed, not a 503. In a P/D pool
// (an endpoint with a prefill or decode role) a request ends on an
// endpoint that decodes, so the message counts those: an adapter that
// only prefill endpoints serve has no decode endpoint, whatever their
// health (the disagg.Planner runs a request whole on a decode endpoint
// when no prefill endpoint can take it, never the other way round).
func (r *Router) adapterUnavailable(now time.Time, adapter string, exclude []string) error {
	pd := false
	for _, e := range r.eps {
		pd = pd || e.ep.Role != kvroute.RoleBoth
	}
	serving, prefillOnly, wait := 0, 0, time.Duration(0)
	var unlisted []llamaList
	for _, e := range r.eps {
		if !e.ep.ServesAdapter(adapter) {
			continue
		}
		if pd && !e.ep.Role.CanDecode() {
			prefillOnly++
			continue
		}
		if t := e.view.LlamaAdapters(); lacks(t, adapter) {
			unlisted = append(unlisted, llamaList{e.ep.ID, t})
			continue
		}
		serving++
		if e.ejectedUntil.After(now) {
			if d := e.ejectedUntil.Sub(now); wait == 0 || d < wait {
				wait = d
			}
		}
	}
	secs := max(int(math.Ceil(wait.Seconds())), 1)
	what := "endpoint"
	if pd {
		what = "decode endpoint"
	}
	var msg string
	switch tried := 0; {
	case serving == 0 && len(unlisted) > 0:
		return adapterNotListed(r.cfg.Model, adapter, unlisted)
	case serving == 0 && prefillOnly > 0:
		msg, secs = fmt.Sprintf("no decode endpoint of model %q serves adapter %q (only %d prefill %s)", r.cfg.Model, adapter,
			prefillOnly, plural(prefillOnly, "endpoint does", "endpoints do")), emptyRetryAfter
	case serving == 0:
		msg, secs = fmt.Sprintf("no endpoint of model %q serves adapter %q", r.cfg.Model, adapter), emptyRetryAfter
	default:
		for _, id := range exclude {
			if e := r.byID[id]; e != nil && e.ep.ServesAdapter(adapter) && (!pd || e.ep.Role.CanDecode()) && !e.unlisted(adapter) {
				tried++
			}
		}
		msg = fmt.Sprintf("no healthy %s of model %q serves adapter %q (%d serve it)", what, r.cfg.Model, adapter, serving)
		if tried > 0 {
			msg = fmt.Sprintf("no healthy %s of model %q serving adapter %q left after trying %d (%d serve it)", what, r.cfg.Model, adapter, tried, serving)
		}
		if n := len(unlisted); n > 0 {
			msg += fmt.Sprintf("; the llama.cpp %s of %d more %s not list it", plural(n, "server", "servers"), n, plural(n, "endpoint does", "endpoints do"))
		}
	}
	return &UnavailableError{Err: kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
		Code: "no_adapter_endpoint", Message: msg}, RetryAfter: secs}
}

// unlisted reports whether endpoint e's engine is a llama.cpp server whose
// LoRA adapters, as its last GET /lora-adapters listed them
// (signals.View.LlamaAdapters), have none named adapter: it cannot run
// it, and is no candidate for it. An engine whose list is not known (no
// scrape read it yet, another engine) is not: the proxy finds out when it
// names the adapter to it. Called for requests for an adapter only, with
// Router.mu held. The list is read again (under the view's lock) only
// when the view changed since (signals.View.Gen), as currentLoad reads the
// Load: a decision for an adapter took every view's lock for it, 3% of
// the decision (BenchmarkDecisionKVAware64/adapters, pprof).
func (e *endpoint) unlisted(adapter string) bool {
	if g := e.view.Gen(); !e.llamaValid || g != e.llamaGen {
		e.llama, e.llamaGen, e.llamaValid = e.view.LlamaAdapters(), g, true
	}
	return lacks(e.llama, adapter)
}

// lacks reports whether t, a llama.cpp server's adapters (nil: not known),
// is known and has none named adapter.
func lacks(t *signals.LlamaAdapters, adapter string) bool {
	if t == nil {
		return false
	}
	_, ok := t.Lookup(adapter)
	return !ok
}

// llamaList is an endpoint's llama.cpp server's adapters.
type llamaList struct {
	endpoint string
	t        *signals.LlamaAdapters
}

// adapterNotListed is the 404 model_not_found of a request for LoRA
// adapter adapter of model when the endpoints of lists, every one that
// would serve it, are llama.cpp servers that do not list it (lacks),
// naming what each lists. Its Param is left to the caller, which knows
// the field the client named the adapter in.
func adapterNotListed(model, adapter string, lists []llamaList) error {
	var b strings.Builder
	for i, l := range lists {
		if i > 0 {
			b.WriteString("; ")
		}
		listed := "none"
		if l.t.Len() > 0 {
			listed = strings.Join(l.t.Names(), ", ")
		}
		fmt.Fprintf(&b, "%s lists %s", l.endpoint, listed)
	}
	return &kvroute.Error{Status: http.StatusNotFound, Type: kvroute.TypeNotFound, Code: "model_not_found", Message: fmt.Sprintf(
		"The model `%s` has no LoRA adapter `%s` on any of its endpoints: their llama.cpp servers do not list it (GET /lora-adapters: an adapter is named by its file name without .gguf, its path or its task_name): %s.",
		model, adapter, b.String())}
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// emptyRetryAfter is the Retry-After, in seconds, of a pool without
// endpoints: an engine that a discovery will find takes seconds to start.
const emptyRetryAfter = 5

// UnavailableError is returned by Route when no endpoint can take the
// request; RetryAfter is the suggested Retry-After in seconds.
type UnavailableError struct {
	Err        kvroute.Error
	RetryAfter int
}

func (e *UnavailableError) Error() string { return e.Err.Error() }

// Unwrap exposes the *kvroute.Error so errors.As and kvroute.StatusOf work.
func (e *UnavailableError) Unwrap() error { return &e.Err }

// ShedError is returned by Route when the policy sheds the request because
// every candidate is over its load cap. Decision is the policy's decision;
// the caller decides from it (policy.OverloadAction) whether to answer 429
// at once or to hold the request for a bounded wait and route it again.
type ShedError struct {
	Err      kvroute.Error
	Decision kvroute.Decision
}

func (e *ShedError) Error() string { return e.Err.Error() }

// Unwrap exposes the *kvroute.Error (status 429).
func (e *ShedError) Unwrap() error { return &e.Err }

// FirstToken records that the flight's endpoint produced its first token:
// its prompt is no longer queued prefill work.
func (r *Router) FirstToken(now time.Time, f *Flight) {
	if f == nil || f.e == nil {
		return
	}
	f.e.view.FirstToken(now, f.ticket)
	r.mu.Lock()
	defer r.mu.Unlock()
	if f.first || f.done {
		return
	}
	f.first = true
	if o, ok := r.picker.(FirstTokenObserver); ok {
		o.FirstToken(now, f.req, f.e.ep.ID)
	}
	r.wake()
}

// Drained returns a channel that receives after a flight gets its first
// token or ends (the load the router counts on its endpoint went down),
// and after an endpoint joins the candidates (SetEndpoints adds one,
// SetAbsent makes a rank present again, SetActiveHealth passes one
// again): a request the policy shed may fit now (the proxy's queue routes
// the head of its line again at once). It is buffered one deep and never
// blocks a sender, so one receive may stand for several events, or for
// one that happened before the receiver began to wait; load that drains
// in the engines' signals alone, and the end of a passive ejection, are
// not signalled.
func (r *Router) Drained() <-chan struct{} { return r.drained }

// wake signals Drained.
func (r *Router) wake() {
	select {
	case r.drained <- struct{}{}:
	default:
	}
}

// Done ends a flight: the router no longer holds it in flight. o reports the
// outcome to learning pickers; its Endpoint and QueueDepth are filled here.
// Done is idempotent per flight.
func (r *Router) Done(now time.Time, f *Flight, o kvroute.Outcome) {
	if f == nil || f.e == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if f.done {
		return
	}
	f.done = true
	f.e.view.Done(now, f.ticket)
	o.Endpoint = f.e.ep.ID
	o.QueueDepth = f.queue
	if l, ok := r.picker.(kvroute.Learner); ok {
		// A flight on an engine that SetEndpoints removed since (its ID
		// gone, or naming another engine now) teaches nothing of the
		// endpoint the ID names (it was forgotten).
		if !f.e.engine.removed {
			l.Observe(now, o)
		}
	}
	if rel, ok := r.picker.(kvroute.Releaser); ok {
		rel.Release(now, f.req, f.e.ep.ID)
	}
	r.wake()
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/signals"
	"github.com/kvroute/kvroute/workload"
)

// Config configures one simulation run: a fleet, a policy, the router's
// signal paths and the load scale. Zero values take the documented defaults.
type Config struct {
	// Model is the model name the router serves; default "sim".
	Model string
	// Fleet is the engines. Required.
	Fleet Fleet
	// Policy names the routing policy (policy.Names); default policy.Default.
	Policy string
	// PolicyParams are the policy's parameters (nil = defaults).
	PolicyParams map[string]any
	// Picker, when set, is used instead of building Policy (tests, custom
	// policies); Policy then only names it in the report. With prefill or
	// decode engines it places the prefill stage, as Policy would.
	Picker kvroute.Picker
	// Seed seeds the policy and the scrape phases; the same seed, config and
	// workload give the same result.
	Seed uint64
	// RateScale multiplies the workload's arrival rate (the arrivals'
	// offsets from the first one are divided by it, as workload.ScaleRate
	// does); default 1.
	RateScale float64
	// ScrapeInterval is how often the router scrapes each engine's metrics;
	// default 100ms. Each engine's scrapes have their own phase, spread over
	// the interval. Negative disables scraping: the router then sees only its
	// own in-flight accounting.
	ScrapeInterval time.Duration
	// StaleAfter marks scraped signals older than this as stale; default the
	// router's (1s).
	StaleAfter time.Duration
	// KVEvents feeds a precise prefix index from the engines' KV events
	// (BlockStored/BlockRemoved), delivered KVEventDelay after the step that
	// emitted them. Off by default: the router then uses its approximate
	// index only.
	KVEvents bool
	// KVEventDelay is the KV-event delivery delay; default 50ms.
	KVEventDelay time.Duration
	// RouterBlockTokens is the router's prefix block size in tokens; default
	// DefaultRouterBlockTokens, which matches kvroute serve's default
	// character blocks (128 characters at 4 characters per token). With
	// KVEvents it is the engines' block size, which the precise index needs.
	RouterBlockTokens int
	// RouterText routes on the prompt text instead of token block hashes,
	// exactly as kvroute serve does without a tokenizer: the router hashes
	// the synthetic text (workload.Request.PromptText) in BlockChars blocks
	// and estimates the prompt's tokens as characters/4. It is slower (the
	// text is built for every request) and meant for like-for-like
	// comparisons with kvroute bench against kvroute serve. It cannot be
	// combined with KVEvents (the precise index needs token hashes).
	RouterText bool
	// NetLatency is the one-way latency between the router and an engine,
	// paid by requests, tokens and scrapes; default 1ms, negative means 0.
	NetLatency time.Duration
	// Routers is the number of router replicas (independent kvroute serve
	// processes behind a load balancer that alternates between them); each
	// has its own signal views, prefix indexes and policy state and scrapes
	// every engine itself, so each sees only its own dispatches between
	// scrapes. Default 1.
	Routers int
	// SLO sets the goodput limits.
	SLO SLO
	// TimelineStep is the width of the utilisation timeline's buckets;
	// default: the workload's span / 100, at least 1s.
	TimelineStep time.Duration
	// Drain bounds the run: it stops this long (virtual time) after the last
	// arrival, and requests still open then are reported as failed (504).
	// It keeps overloaded sweep points cheap. Default 0: run until every
	// request has finished.
	Drain time.Duration
	// OracleHitRate, when set, is the oracle bound to report, computed
	// beforehand with the package function OracleHitRate (it depends only on
	// the workload and the engines' block size, so a caller running several
	// policies computes it once). Nil computes it for the run, at the first
	// engine's block size.
	OracleHitRate *float64
	// TTFTBounds, when set, are the requests' TTFT lower bounds on the
	// fleet's engines, one per request in workload order, computed
	// beforehand with the package function TTFTBounds (they depend only on
	// the workload and the fleet, so a caller running several policies
	// computes them once). Nil computes them for the run. Run adds the
	// network round trip (Record.TTFTBound, Result.TTFTBound).
	TTFTBounds []time.Duration
	// QueueWait is how long a router replica holds a request the policy
	// sheds with the "queue" action (kv-aware's overload: queue) before it
	// is rejected with 429, as kvroute serve's retry.queue_wait does (see
	// hold.go); default 5s, as there. Negative: no wait (the shed is a 429
	// at once).
	QueueWait time.Duration
	// PD configures prefill/decode disaggregation for fleets with prefill
	// or decode engines (Group.Role); see PDConfig.
	PD PDConfig
	// MaxLoRAs is every engine's vLLM --max-loras: the distinct LoRA
	// adapters (workload.Request.Adapter) one step's batch may hold
	// (engine.Config.MaxLoRAs); default 1, vLLM's. An engine serves every
	// adapter unless its group lists some (Group.Adapters). It matters
	// only to a workload with adapters: then the
	// engines run with LoRA enabled, and their scraped metrics carry
	// vllm:lora_requests_info (running and waiting adapters, max_lora).
	MaxLoRAs int
	// Progress, when set, is called with the number of requests finished
	// (completed or rejected) so far and the total, every 1% of the run
	// and at the end.
	Progress func(done, total int)
}

// SLO is a service-level objective: a request counts toward goodput when its
// TTFT and TPOT are within the limits (a zero limit is not checked).
type SLO struct {
	TTFT time.Duration
	TPOT time.Duration
}

// Defaults.
const (
	DefaultModel          = "sim"
	DefaultScrapeInterval = 100 * time.Millisecond
	DefaultKVEventDelay   = 50 * time.Millisecond
	DefaultNetLatency     = time.Millisecond
	DefaultQueueWait      = 5 * time.Second
	// DefaultRouterBlockTokens is 128 characters at 4 characters per token.
	DefaultRouterBlockTokens = 32
	// DefaultMaxLoRAs is vLLM's --max-loras default.
	DefaultMaxLoRAs = 1
)

func (c *Config) applyDefaults() {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Policy == "" && c.Picker == nil {
		c.Policy = policy.Default
	}
	if c.QueueWait == 0 {
		c.QueueWait = DefaultQueueWait
	}
	if c.Routers == 0 {
		c.Routers = 1
	}
	if c.RateScale == 0 {
		c.RateScale = 1
	}
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = DefaultMaxLoRAs
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.KVEventDelay == 0 {
		c.KVEventDelay = DefaultKVEventDelay
	}
	if c.NetLatency == 0 {
		c.NetLatency = DefaultNetLatency
	} else if c.NetLatency < 0 {
		c.NetLatency = 0
	}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	if err := c.Fleet.Validate(); err != nil {
		return fmt.Errorf("sim: config: %w", err)
	}
	if !(c.RateScale > 0) || math.IsInf(c.RateScale, 0) {
		return fmt.Errorf("sim: config: rate scale %g must be positive", c.RateScale)
	}
	if c.KVEventDelay < 0 {
		return fmt.Errorf("sim: config: kv event delay %v must not be negative", c.KVEventDelay)
	}
	if c.SLO.TTFT < 0 || c.SLO.TPOT < 0 {
		return fmt.Errorf("sim: config: SLO limits must not be negative")
	}
	if c.RouterText && c.KVEvents {
		return errors.New("sim: config: router text mode cannot use KV events (the precise index needs token hashes)")
	}
	if c.Routers < 1 || c.Routers > 1024 {
		return fmt.Errorf("sim: config: routers %d must be in 1..1024", c.Routers)
	}
	if c.RouterBlockTokens < 0 {
		return fmt.Errorf("sim: config: router block tokens %d must not be negative", c.RouterBlockTokens)
	}
	if c.Drain < 0 {
		return fmt.Errorf("sim: config: drain %v must not be negative", c.Drain)
	}
	if c.MaxLoRAs < 0 {
		return fmt.Errorf("sim: config: max loras %d must not be negative (0: 1)", c.MaxLoRAs)
	}
	if c.TimelineStep < 0 {
		return fmt.Errorf("sim: config: timeline step %v must not be negative", c.TimelineStep)
	}
	return c.pdValidate()
}

// epoch is the wall time the virtual clock starts at: the router's pure core
// takes time.Time, the engines time since their start.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates reqs (a workload, sorted or not by arrival) through the
// fleet and the router and returns per-request records and a summary. It
// checks ctx between events and returns ctx's error when it is cancelled.
func Run(ctx context.Context, cfg Config, reqs []workload.Request) (*Result, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := newSimulation(cfg, reqs)
	if err != nil {
		return nil, err
	}
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	return s.result(), nil
}

// simEngine is one simulated engine and its driver state.
type simEngine struct {
	id      string
	role    kvroute.Role
	profile engine.Profile
	eng     *engine.Engine

	busy    bool              // an evStep is on the agenda
	inStep  bool              // res holds a step in progress, delivered at its end
	res     engine.StepResult // the step in progress (reused: engine.StepInto)
	pre     engine.Stats      // the engine when the step in progress started: what a scrape sees until it ends
	kvQueue fifo[[]engine.KVEvent]
	scrapes []fifo[scrape] // per router replica: scrapes in transit to it
	// early, per router replica: evObserve events on the agenda whose
	// scrape was recorded ahead of them (scrape) and that have nothing left
	// to do.
	early []int

	stepStart time.Duration // start of the step in progress
	stepEnd   time.Duration // its end
	busyTime  time.Duration
	steps     int
	routed    int

	// With LoRA adapters: whether the engine has ended a step, and its
	// running and waiting adapters (sorted) when it last started a step or
	// went idle, what its vllm:lora_requests_info says (metricsOf).
	loraStepped              bool
	loraRunning, loraWaiting []string
	maxLoRAs                 int // Config.MaxLoRAs
}

// scrape is a metrics snapshot on its way to the router. The request for it
// was sent at sent; the engine answered one network latency later.
type scrape struct {
	sent time.Duration
	m    signals.Metrics
}

// reqState is a request's life in the simulation.
type reqState struct {
	arrival time.Duration // scaled arrival time, on the simulation's clock (less simulation.offset)
	rt      int32         // the router replica that routed it
	eng     int32         // engine index, -1 before routing or when rejected
	ehashes []uint64      // block hashes at the fleet's engine block size
	tokens  []uint32      // the prompt, in token mode (KV events), until delivered
	rreq    kvroute.Request
	ereq    engine.Request
	flight  *router.Flight

	delivered   time.Duration // reached the engine
	queue       time.Duration // engine: arrival to first scheduled
	prefill     time.Duration // engine: first scheduled to first token
	preemptions int
	firstAt     time.Duration // first token produced on the engine (end of its step)
	firstStart  time.Duration // start of the step that produced the first token
	ttft, e2e   time.Duration // as the router saw them
	cached      int
	outTokens   int
	status      int           // 200 ok, 4xx/5xx rejected or failed
	errMsg      string        // when status != 200
	finished    bool          // completed or rejected: counted exactly once
	onEngine    bool          // added to its engine and not finished there
	pd          *pdState      // disaggregated requests only (pd.go)
	held        *held         // its place in its router replica's line, while held (hold.go)
	heldFor     time.Duration // how long it was held before routing
}

type simulation struct {
	cfg     Config
	now     time.Duration
	q       agenda
	rts     []*router.Router // one per router replica
	lines   []heldLine       // per router replica, its held requests (hold.go); nil without QueueWait
	precise []*kvindex.Index // per replica, with KV events
	arrived int              // arrivals so far: the next one goes to replica arrived % len(rts)
	engines []*simEngine
	byEP    map[string]int32 // endpoint ID -> engine index
	reqs    []workload.Request
	order   []int32 // request indices by arrival
	next    int     // next arrival in order
	st      []reqState
	oracle  float64         // the oracle hit rate (Config.OracleHitRate, or OracleHitRate's)
	offset  time.Duration   // the workload time the clock starts at (clockOffset); reqState.arrival is after it
	bounds  []time.Duration // per request: the TTFT lower bound on the engines (TTFTBounds)

	blockSize  int  // the fleet's engine block size in tokens (the first engine's)
	routerBS   int  // the router's block size in tokens
	tokenMode  bool // materialise prompts as tokens (the precise index needs them)
	lora       bool // a request names a LoRA adapter: the engines run with LoRA enabled
	routerStep int  // routerBS / blockSize when it divides evenly, else 0
	finished   int
	pending    int           // events on the agenda that are not periodic
	stopAt     time.Duration // the run stops after this time (Config.Drain; MaxInt64 without)
	// everyScrape turns idle fast-forwarding off (idleScrapes): tests run
	// it as the reference.
	everyScrape bool
	progEvery   int
	timeline    *timeline
	planners    []*disagg.Planner // per replica, for P/D fleets (pd.go)
	fabric      *disagg.Fabric    // the KV transfers that happen, for P/D fleets
	transfers   []Transfer        // every KV transfer, in the order they were planned
	err         error             // the first event that could not be scheduled ends the run with it
	salts       []uint64          // applyEvents' scratch
}

func newSimulation(cfg Config, reqs []workload.Request) (*simulation, error) {
	s := &simulation{
		cfg:  cfg,
		reqs: reqs,
		st:   make([]reqState, len(reqs)),
		byEP: make(map[string]int32),
	}
	// Engines.
	var eps []kvroute.Endpoint
	var preciseIDs []string
	for gi := range cfg.Fleet {
		g := &cfg.Fleet[gi]
		prof, err := g.profile()
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		ecfg := engine.Config{
			Profile:             prof,
			NumGPUBlocks:        g.NumGPUBlocks,
			MaxNumSeqs:          g.MaxNumSeqs,
			MaxNumBatchedTokens: g.MaxNumBatchedTokens,
			Speed:               g.Speed,
			NoEvents:            !cfg.KVEvents,
			MaxLoRAs:            cfg.MaxLoRAs,
		}
		for range g.Count {
			e, err := engine.New(ecfg)
			if err != nil {
				return nil, fmt.Errorf("sim: engine %d (%s): %w", len(s.engines), g.name(), err)
			}
			id := "e" + strconv.Itoa(len(s.engines))
			role, _ := kvroute.ParseRole(g.Role) // Validate checked it
			se := &simEngine{id: id, role: role, profile: e.Profile(), eng: e, maxLoRAs: cfg.MaxLoRAs}
			s.byEP[id] = int32(len(s.engines))
			s.engines = append(s.engines, se)
			eps = append(eps, kvroute.Endpoint{ID: id, URL: "sim://" + id, Weight: max(g.Weight, 1), Role: role,
				KVCapacityTokens: se.profile.KVCapacityTokens(), Adapters: slices.Clone(g.Adapters)})
			preciseIDs = append(preciseIDs, id)
		}
	}
	s.blockSize = s.engines[0].profile.BlockSize
	if s.bounds = cfg.TTFTBounds; s.bounds == nil {
		var err error
		if s.bounds, err = TTFTBounds(cfg.Fleet, reqs); err != nil {
			return nil, err
		}
	} else if len(s.bounds) != len(reqs) {
		return nil, fmt.Errorf("sim: config: %d TTFT bounds for %d requests", len(s.bounds), len(reqs))
	}
	if cfg.OracleHitRate != nil {
		s.oracle = *cfg.OracleHitRate
	} else {
		s.oracle = OracleHitRate(reqs, s.blockSize)
	}
	s.tokenMode = cfg.KVEvents
	s.routerBS = cfg.RouterBlockTokens
	if s.routerBS == 0 {
		s.routerBS = DefaultRouterBlockTokens
	}
	if s.tokenMode {
		// The precise index matches the router's hashes against the engines'
		// stored blocks: both must use the engines' block size.
		s.routerBS = s.blockSize
		for _, e := range s.engines {
			if e.profile.BlockSize != s.blockSize {
				return nil, fmt.Errorf("sim: config: KV events need one block size across the fleet (%s has %d, %s %d)",
					s.engines[0].id, s.blockSize, e.id, e.profile.BlockSize)
			}
		}
	}
	if s.routerBS%s.blockSize == 0 {
		s.routerStep = s.routerBS / s.blockSize
	}
	// Routers: one per replica, each with its own signal views, prefix
	// indexes and policy state, as independent kvroute serve processes are.
	if cfg.Picker != nil && cfg.Routers > 1 {
		return nil, errors.New("sim: config: a custom Picker cannot be shared by several router replicas")
	}
	if cfg.pdOn() {
		s.fabric = disagg.NewFabric(cfg.pdLinks())
	}
	for k := range cfg.Routers {
		picker := cfg.Picker
		if cfg.pdOn() {
			pl, err := s.newPlanner(k, s.engines[0].profile)
			if err != nil {
				return nil, fmt.Errorf("sim: %w", err)
			}
			s.planners = append(s.planners, pl)
			picker = pl
		}
		if picker == nil {
			p, err := policy.New(cfg.Policy, cfg.PolicyParams, cfg.Seed+uint64(k))
			if err != nil {
				return nil, fmt.Errorf("sim: %w", err)
			}
			picker = p
		}
		rcfg := router.Config{
			Model:       cfg.Model,
			Endpoints:   eps,
			Policy:      cfg.Policy,
			Picker:      picker,
			StaleAfter:  cfg.StaleAfter,
			DecisionLog: -1,
		}
		if cfg.KVEvents {
			x := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: s.blockSize})
			s.precise = append(s.precise, x)
			rcfg.Precise = x
			rcfg.PreciseEndpoints = preciseIDs
		}
		rt, err := router.New(rcfg)
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		s.rts = append(s.rts, rt)
	}
	if cfg.QueueWait > 0 {
		s.lines = make([]heldLine, cfg.Routers)
	}
	for _, e := range s.engines {
		e.scrapes = make([]fifo[scrape], cfg.Routers)
		e.early = make([]int, cfg.Routers)
	}
	// Arrival order: by scaled arrival, ties by workload order.
	s.order = make([]int32, len(reqs))
	first := time.Duration(0) // the arrival the scaling keeps
	for i := range reqs {
		if a := reqs[i].Arrival; i == 0 || a < first {
			first = a
		}
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		s.order[i] = int32(i)
		s.st[i].eng = -1
		gap := float64(reqs[i].Arrival-first) / cfg.RateScale
		if gap > float64(workload.MaxSpan-first) {
			return nil, fmt.Errorf("sim: rate scale %g would put request %q's arrival (%v) beyond the %.0f years of the simulator's clock",
				cfg.RateScale, reqs[i].ID, reqs[i].Arrival, workload.MaxSpan.Hours()/(365*24))
		}
		s.st[i].arrival = first + time.Duration(gap)
		s.lora = s.lora || reqs[i].Adapter != ""
	}
	slices.SortStableFunc(s.order, func(a, b int32) int { return cmp.Compare(s.st[a].arrival, s.st[b].arrival) })
	if len(s.order) > 0 {
		s.offset = clockOffset(s.st[s.order[0]].arrival, cfg.ScrapeInterval)
		for i := range s.st {
			s.st[i].arrival -= s.offset
		}
	}
	span := time.Duration(0)
	if n := len(s.order); n > 0 {
		span = s.st[s.order[n-1]].arrival
	}
	s.timeline = newTimeline(cfg.TimelineStep, span, len(s.engines))
	s.progEvery = max(len(reqs)/100, 1)
	return s, nil
}

// leadIn is how long before a late first arrival the clock starts
// (clockOffset).
const leadIn = time.Minute

// clockOffset returns the workload time the virtual clock starts at: 0, or,
// when the first request arrives later than leadIn (a trace with absolute
// timestamps, e.g. a production log in Unix milliseconds), between leadIn
// and leadIn plus one scrape interval before it, on a whole number of
// scrape intervals. From 0 the idle engines would be scraped and sampled
// every interval until the first request: billions of events that change
// nothing. A run then depends on where its workload starts only through
// the scrape phases, as before.
func clockOffset(first, scrapeInterval time.Duration) time.Duration {
	if first <= leadIn {
		return 0
	}
	step := max(scrapeInterval, 1)
	return (first - leadIn) / step * step
}

// schedule puts an event on the agenda. Events that move requests forward
// are counted in pending; the periodic ones (scrapes, samples) are not, so
// that a run in which nothing but them is left can stop.
func (s *simulation) schedule(at time.Duration, kind eventKind, eng, arg int32) {
	if at < s.now || at > workload.MaxSpan {
		// A duration too long for the clock wrapped around (a link of a
		// few bits per second, an engine model at a crawl): the run has no
		// meaningful result.
		s.fail(fmt.Errorf("sim: an event at %.3g hours of virtual time is beyond the %.0f years of the simulator's clock (or overflowed it)",
			float64(at)/float64(time.Hour), workload.MaxSpan.Hours()/(365*24)))
		return
	}
	if !periodic(kind) {
		s.pending++
	}
	s.q.push(at, kind, eng, arg)
}

// fail ends the run with err (the first one wins).
func (s *simulation) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

func periodic(k eventKind) bool { return k == evScrape || k == evObserve || k == evSample }

// wall converts virtual time to the router's clock.
func wall(d time.Duration) time.Time { return epoch.Add(d) }

func (s *simulation) run(ctx context.Context) error {
	total := len(s.reqs)
	if total == 0 {
		return nil
	}
	s.schedule(s.st[s.order[0]].arrival, evArrival, -1, s.order[0])
	s.next = 1
	for i := range s.engines {
		s.schedule(0, evSample, int32(i), -1)
	}
	if s.cfg.ScrapeInterval > 0 {
		for i := range s.engines {
			for k := range s.rts {
				s.schedule(s.scrapePhase(i, k), evScrape, int32(i), int32(k))
			}
		}
	}
	s.stopAt = time.Duration(math.MaxInt64)
	if s.cfg.Drain > 0 {
		s.stopAt = s.st[s.order[total-1]].arrival + s.cfg.Drain
	}
	stopAt := s.stopAt
	unfinished := "never completed: the engine could not schedule it"
	for n := 0; s.q.Len() > 0 && s.finished < total && s.pending > 0; n++ {
		if n&4095 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
		}
		if at, _ := s.q.peek(); at > stopAt {
			s.now = stopAt
			unfinished = fmt.Sprintf("not finished %v after the last arrival (Config.Drain)", s.cfg.Drain)
			break
		}
		if s.err != nil {
			return s.err
		}
		s.handle(s.q.pop())
	}
	if s.err != nil {
		return s.err
	}
	// Requests still open now are past the drain limit, or stuck on an
	// engine that cannot schedule them: report them as failed.
	for i := range s.st {
		if !s.st[i].finished {
			st := &s.st[i]
			st.status, st.errMsg = http.StatusGatewayTimeout, unfinished
			s.finish(int32(i))
		}
	}
	return nil
}

// handle advances the clock to ev and runs it.
func (s *simulation) handle(ev event) {
	s.now = ev.at
	if !periodic(ev.kind) {
		s.pending--
	}
	switch ev.kind {
	case evArrival:
		s.arrive(ev.arg)
	case evDeliver:
		s.deliver(ev.eng, ev.arg)
	case evStep:
		s.step(ev.eng)
	case evScrape:
		s.scrape(ev.eng, ev.arg)
	case evObserve:
		s.observe(ev.eng, ev.arg)
	case evFirstToken:
		s.firstToken(ev.arg)
	case evDone:
		s.done(ev.arg)
	case evKVEvents:
		s.applyKV(ev.eng)
	case evSample:
		s.sample(ev.eng)
	case evPDPrefilled:
		s.pdPrefilled(ev.arg)
	case evPDTransferred:
		s.pdTransferred(ev.arg)
	case evHoldRetry:
		s.holdRetry(ev.eng, ev.arg)
	case evHoldTimeout:
		s.holdTimeout(ev.arg)
	}
}

// parseEngineID parses the decimal request index the simulator gives the
// engine as the request ID.
func parseEngineID(id string) (int32, bool) {
	if id == "" || len(id) > 9 {
		return 0, false
	}
	var n int32
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int32(c-'0')
	}
	return n, true
}

// scrapePhase spreads the first scrapes of engine i by replica k over the
// interval, by a hash of the seed, i and k.
func (s *simulation) scrapePhase(i, k int) time.Duration {
	h := splitmix(s.cfg.Seed ^ uint64(i)*0x9e3779b97f4a7c15 ^ uint64(k)<<48)
	return time.Duration(h % uint64(s.cfg.ScrapeInterval))
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// arrive routes request i.
func (s *simulation) arrive(i int32) {
	if s.next < len(s.order) {
		j := s.order[s.next]
		s.next++
		s.schedule(s.st[j].arrival, evArrival, -1, j)
	}
	r := &s.reqs[i]
	st := &s.st[i]
	full := r.PromptLen / s.blockSize
	if s.tokenMode {
		// The live path: the engine hashes the tokens itself and reports
		// them in its KV events; the router hashes them with kvindex.
		// An adapter's blocks are keyed with its name, as the engine
		// keys them (HashTokensKeyed is HashTokens for the base model).
		st.tokens = r.PromptTokens()
		st.ehashes = kvindex.HashTokensKeyed(st.tokens, r.Adapter, "", s.blockSize, make([]uint64, 0, full))
	} else {
		st.ehashes = r.BlockHashes(s.blockSize, make([]uint64, 0, full))
	}
	var rh []uint64
	switch {
	case s.cfg.RouterText:
		// The router hashes the text itself (below).
	case s.routerStep == 1:
		rh = st.ehashes
	case s.routerStep > 1:
		// The chained hash of engine block k*step-1 names the prompt's first
		// k*step*blockSize tokens exactly: it is the router block's key.
		rh = make([]uint64, 0, len(st.ehashes)/s.routerStep)
		for k := s.routerStep - 1; k < len(st.ehashes); k += s.routerStep {
			rh = append(rh, st.ehashes[k])
		}
	default:
		rh = r.BlockHashes(s.routerBS, nil)
	}
	st.rreq = kvroute.Request{
		ID:           r.ID,
		Model:        s.cfg.Model,
		Adapter:      r.Adapter,
		Tenant:       r.Tenant,
		SessionKey:   r.Session,
		PromptTokens: r.PromptLen,
		MaxTokens:    r.OutputLen,
		Stream:       true,
		BlockSize:    s.routerBS,
		BlockHashes:  rh,
		Arrival:      wall(s.now),
	}
	if s.cfg.RouterText {
		// kvroute serve without a tokenizer: hash the text, estimate tokens
		// (openai.RequestInfo.PromptTokens).
		st.rreq.Prompt = r.PromptText()
		st.rreq.PromptTokens = (len(st.rreq.Prompt) + 3) / 4
		st.rreq.BlockSize = 0
	}
	st.rt = int32(s.arrived % len(s.rts))
	s.arrived++
	if s.lines != nil && s.lines[st.rt].line.Len() > 0 {
		s.hold(i, nil) // others are held: it waits its turn
		return
	}
	f, err := s.rts[st.rt].Route(wall(s.now), &st.rreq, nil)
	if err != nil {
		if se, ok := s.queueable(err); ok {
			s.hold(i, se)
			return
		}
		s.reject(i, err)
		return
	}
	s.routed(i, f)
}

// routed sends request i, which routing placed (flight f), on its way.
func (s *simulation) routed(i int32, f *router.Flight) {
	st := &s.st[i]
	if s.planners != nil && s.pdArrive(i, f) {
		return
	}
	st.flight = f
	ei := s.byEP[f.Endpoint.ID]
	st.eng = ei
	s.engines[ei].routed++
	s.schedule(s.now+s.cfg.NetLatency, evDeliver, ei, i)
}

// deliver adds request i to engine ei and wakes the engine if idle.
func (s *simulation) deliver(ei, i int32) {
	e := s.engines[ei]
	r := &s.reqs[i]
	st := &s.st[i]
	st.delivered = s.now
	st.ereq = engine.Request{
		// The engine knows requests by their index, so that workload IDs
		// need not be unique.
		ID:        strconv.Itoa(int(i)),
		PromptLen: r.PromptLen,
		MaxTokens: r.OutputLen,
		IgnoreEOS: true,
		LoRA:      r.Adapter,
	}
	switch {
	case s.tokenMode:
		st.ereq.Prompt = st.tokens
	case e.profile.BlockSize == s.blockSize:
		st.ereq.BlockHashes = st.ehashes
	default:
		st.ereq.BlockHashes = r.BlockHashes(e.profile.BlockSize, nil)
	}
	if st.pd != nil {
		s.pdPrepare(i)
	}
	err := e.eng.Add(s.now, &st.ereq)
	st.tokens, st.ereq.Prompt = nil, nil // the engine copied them
	if err != nil {
		st.status, st.errMsg = http.StatusBadRequest, err.Error()
		s.schedule(s.now+s.cfg.NetLatency, evDone, ei, i)
		return
	}
	st.onEngine = true
	if !e.busy {
		e.busy = true
		s.schedule(s.now, evStep, ei, -1)
	}
}

// step ends engine ei's step in progress (delivering its outputs and KV
// events) and starts the next one if the engine has work.
func (s *simulation) step(ei int32) {
	e := s.engines[ei]
	ended := e.inStep
	if e.inStep {
		e.inStep = false
		for k := range e.res.Outputs {
			s.output(ei, &e.res.Outputs[k])
		}
		if s.precise != nil && len(e.res.Events) > 0 {
			e.kvQueue.push(copyEvents(e.res.Events))
			s.schedule(s.now+s.cfg.KVEventDelay, evKVEvents, ei, -1)
		}
	}
	if s.lora {
		recordLoRAs(e, ended)
	}
	if !e.eng.HasWork() {
		e.busy = false
		return
	}
	e.pre = e.eng.Stats()
	e.res.Summarize = true // output takes only first and last tokens
	e.eng.StepInto(s.now, &e.res)
	d := e.res.Duration
	if d <= 0 {
		if len(e.res.Outputs) == 0 && e.res.Summarized == 0 && len(e.res.Events) == 0 {
			// Nothing can be scheduled (e.g. the waiting requests do not
			// fit): no progress is possible until new work arrives.
			e.busy = false
			return
		}
		d = time.Nanosecond
	}
	e.inStep = true
	e.stepStart, e.stepEnd = s.now, s.now+d
	e.busyTime += d
	e.steps++
	s.schedule(s.now+d, evStep, ei, -1)
	if s.err == nil {
		s.timeline.addBusy(int(ei), s.now, d)
	}
}

// copyEvents copies a step's KV events out of the engine's reused result:
// the block-hash slices may be overwritten by the next step; token slices
// alias engine memory that is never modified.
func copyEvents(evs []engine.KVEvent) []engine.KVEvent {
	n := 0
	for i := range evs {
		n += len(evs[i].BlockHashes)
	}
	hashes := make([]uint64, 0, n)
	out := make([]engine.KVEvent, len(evs))
	for i, ev := range evs {
		if ev.ParentHash != nil {
			p := *ev.ParentHash
			ev.ParentHash = &p
		}
		start := len(hashes)
		hashes = append(hashes, ev.BlockHashes...)
		ev.BlockHashes = hashes[start:len(hashes):len(hashes)]
		out[i] = ev
	}
	return out
}

// output handles one engine output at the end of its step (s.now): a
// request's first token or its finish (step summarises the others).
func (s *simulation) output(ei int32, o *engine.Output) {
	e := s.engines[ei]
	if !o.First && !o.Finished {
		return
	}
	i, ok := parseEngineID(o.ID)
	if !ok || int(i) >= len(s.st) || !s.st[i].onEngine {
		return
	}
	st := &s.st[i]
	if st.pd != nil && s.pdOutput(ei, i, o) {
		return
	}
	if o.First && st.firstAt == 0 {
		st.firstAt = s.now
		st.firstStart = e.stepStart
		st.cached = o.CachedTokens
		s.schedule(s.now+s.cfg.NetLatency, evFirstToken, ei, i)
	}
	if o.Finished {
		st.onEngine = false
		st.outTokens = o.Index + 1
		st.queue = o.QueueTime
		st.prefill = o.PrefillTime
		st.preemptions = o.Preemptions
		if o.FinishReason == engine.FinishAbort {
			st.status, st.errMsg = http.StatusInternalServerError, "aborted by the engine"
		} else {
			st.status = http.StatusOK
		}
		s.schedule(s.now+s.cfg.NetLatency, evDone, ei, i)
	}
}

func (s *simulation) firstToken(i int32) {
	st := &s.st[i]
	st.ttft = s.now - st.arrival
	s.rts[st.rt].FirstToken(wall(s.now), st.flight)
	s.drained(st.rt)
}

func (s *simulation) done(i int32) {
	st := &s.st[i]
	r := &s.reqs[i]
	failed := st.status != http.StatusOK
	if !failed {
		st.e2e = s.now - st.arrival
	}
	if st.flight == nil {
		s.finish(i)
		return
	}
	s.rts[st.rt].Done(wall(s.now), st.flight, kvroute.Outcome{
		PromptTokens: r.PromptLen,
		CachedTokens: st.cached,
		TTFT:         st.ttft,
		Failed:       failed,
		Decode:       st.pd != nil, // the decode leg (the prefill's ended in pdPrefilled)
	})
	s.drained(st.rt)
	s.finish(i)
}

// finish counts request i as finished (completed or rejected) exactly once.
func (s *simulation) finish(i int32) {
	st := &s.st[i]
	if st.finished {
		panic("sim: request " + s.reqs[i].ID + " finished twice") // a simulator bug, not bad input
	}
	st.finished = true
	if st.pd != nil {
		// The router's P/D planner forgets the plan's transfer (pdPrefilled).
		s.planners[st.rt].Finish(st.pd.plan.Ticket)
	}
	// Drop the prompt's hashes: nothing reads them once the request is done.
	st.ehashes, st.rreq.BlockHashes, st.ereq.BlockHashes, st.rreq.Prompt = nil, nil, nil, ""
	s.finished++
	if s.cfg.Progress != nil && (s.finished%s.progEvery == 0 || s.finished == len(s.reqs)) {
		s.cfg.Progress(s.finished, len(s.reqs))
	}
}

// scrape takes a snapshot of engine ei's metrics for router replica k; it
// reaches the router after the network latency. While the fleet is idle
// (idleScrapes) it records, at once, every scrape up to the next event
// that can change an engine or a router view: they would all read the
// same metrics, and nothing reads the view before that event. The scrapes
// still in flight to the replica (a network latency longer than the
// scrape interval) land before them, and are recorded first, in order;
// their evObserve events then do nothing (simEngine.early).
func (s *simulation) scrape(ei, k int32) {
	e := s.engines[ei]
	m := metricsOf(e)
	if n := s.idleScrapes(ei, k); n > 1 {
		v := s.rts[k].View(e.id)
		for e.scrapes[k].len() > 0 {
			sc := e.scrapes[k].pop()
			v.Observe(wall(sc.sent), sc.m)
			e.early[k]++
		}
		v.ObserveRepeat(wall(s.now-s.cfg.NetLatency), s.cfg.ScrapeInterval, n, m)
		s.schedule(s.now+time.Duration(n)*s.cfg.ScrapeInterval, evScrape, ei, k)
		return
	}
	e.scrapes[k].push(scrape{sent: s.now - s.cfg.NetLatency, m: m})
	s.schedule(s.now+s.cfg.NetLatency, evObserve, ei, k)
	s.schedule(s.now+s.cfg.ScrapeInterval, evScrape, ei, k)
}

// idleScrapes returns how many scrapes of engine ei by replica k, from
// this one (s.now) on every ScrapeInterval, reach the router before
// anything can change the engine or the replica's view of it: with no
// event on the agenda but the periodic ones and the next arrival (every
// request so far has finished; a stuck one has no events), the engines
// and the router are frozen until that arrival, so those scrapes all read
// the same metrics and their observations (each NetLatency after it, as
// scrape schedules them) can be recorded now, in order, as long as each
// lands strictly before the arrival (an observation at the same instant
// comes after it, as it was scheduled after it) and by the end of the run
// (Config.Drain). The scrapes of the replica still in flight from before
// (NetLatency past ScrapeInterval) land before this one, sent earlier with
// the same latency, so before the arrival too: scrape records them first.
// 0 when the fleet is not idle.
func (s *simulation) idleScrapes(ei, k int32) int {
	if s.everyScrape || s.pending != 1 || s.arrived >= s.next {
		return 0
	}
	end := s.st[s.order[s.next-1]].arrival // exclusive
	if s.stopAt < end {
		end = s.stopAt + 1
	}
	land := s.now + max(s.cfg.NetLatency, 0)
	if land >= end {
		return 0
	}
	return int((end-1-land)/s.cfg.ScrapeInterval) + 1
}

func (s *simulation) observe(ei, k int32) {
	e := s.engines[ei]
	if e.early[k] > 0 {
		// scrape recorded it already: the fleet was idle.
		e.early[k]--
		return
	}
	sc := e.scrapes[k].pop()
	// Like the live scraper, pass the time the scrape request was sent: the
	// View then keeps every dispatch after it on top of the engine's numbers.
	s.rts[k].View(e.id).Observe(wall(sc.sent), sc.m)
}

// sample records engine ei's state in the utilisation timeline, four times
// per bucket.
func (s *simulation) sample(ei int32) {
	st := s.engines[ei].eng.Stats()
	s.timeline.sample(int(ei), s.now, st.KVUsage, st.Waiting+st.Running)
	s.schedule(s.now+s.timeline.step/4, evSample, ei, -1)
}

// applyKV delivers engine ei's oldest batch of KV events to every replica's
// precise index.
func (s *simulation) applyKV(ei int32) {
	e := s.engines[ei]
	batch := e.kvQueue.pop()
	for _, x := range s.precise {
		applyEvents(x, e.id, batch, &s.salts)
	}
}

// result assembles the Result after a run.
func (s *simulation) result() *Result {
	res := &Result{
		Policy:       s.cfg.Policy,
		Fleet:        s.cfg.Fleet.String(),
		RateScale:    s.cfg.RateScale,
		Seed:         s.cfg.Seed,
		Records:      make([]Record, len(s.reqs)),
		Makespan:     s.now,
		Events:       int(s.q.seq),
		TimelineStep: s.timeline.step,
		Transfers:    s.transfers,
		slo:          s.cfg.SLO,
	}
	for i := range res.Transfers { // on the workload's clock, like the records
		t := &res.Transfers[i]
		t.Ready, t.Wire, t.End = t.Ready+s.offset, t.Wire+s.offset, t.End+s.offset
	}
	if res.Policy == "" {
		res.Policy = "custom"
	}
	if s.planners != nil {
		res.Policy = "pd-" + string(s.planners[0].Config().Mode) + ":" + res.Policy
	}
	res.OracleHitRate = s.oracle
	for i := range s.reqs {
		r := &s.reqs[i]
		st := &s.st[i]
		rec := Record{
			ID:           r.ID,
			Adapter:      r.Adapter,
			Arrival:      st.arrival + s.offset,
			Status:       st.status,
			Error:        st.errMsg,
			PromptTokens: r.PromptLen,
			CachedTokens: st.cached,
		}
		if st.eng >= 0 {
			rec.Engine = s.engines[st.eng].id
		}
		if rec.OK() {
			rec.OutputTokens = st.outTokens
			rec.TTFT = st.ttft
			rec.Held = st.heldFor
			rec.E2E = st.e2e
			rec.Network = 2 * s.cfg.NetLatency
			rec.FirstDecode = st.firstAt - st.firstStart
			rec.Queue = st.queue
			rec.Prefill = max(st.prefill-rec.FirstDecode, 0)
			if rec.OutputTokens >= 2 {
				rec.TPOT = (rec.E2E - rec.TTFT) / time.Duration(rec.OutputTokens-1)
			}
			rec.Preemptions = st.preemptions
		}
		s.pdRecord(int32(i), &rec)
		res.Records[i] = rec
	}
	for ei, e := range s.engines {
		er := EngineResult{ID: e.id, Profile: e.profile.Name, Role: e.role.String(), Requests: e.routed, Steps: e.steps, Busy: e.busyTime}
		if e.inStep && e.stepEnd > s.now {
			// A run stopped by its drain (Config.Drain) ends during the
			// step: the busy time is the part before the end.
			er.Busy -= e.stepEnd - s.now
		}
		if s.now > 0 {
			er.Utilisation = float64(er.Busy) / float64(s.now)
		}
		er.Preemptions, er.PrefixHitRate = engineTotals(e)
		res.Engines = append(res.Engines, er)
		busy := make([]float64, len(s.timeline.busy))
		kv := make([]float64, len(s.timeline.busy))
		q := make([]float64, len(s.timeline.busy))
		for b := range s.timeline.busy {
			busy[b] = float64(s.timeline.busy[b][ei]) / float64(s.timeline.step)
			if n := s.timeline.samples[b][ei]; n > 0 {
				kv[b] = s.timeline.kv[b][ei] / float64(n)
				q[b] = s.timeline.queue[b][ei] / float64(n)
			}
		}
		res.Busy = append(res.Busy, busy)
		res.KVUsage = append(res.KVUsage, kv)
		res.Queue = append(res.Queue, q)
	}
	s.boundResult(res)
	res.CompletedOracleHitRate = s.completedOracle(res)
	return res
}

// completedOracle is the oracle hit rate over the completed requests' prompts,
// the population the row's hit rate is measured on: when some requests fail
// or are shed (a drain, an overloaded fleet) the workload's oracle is not a
// bound on the hit rate of the others (they may be the ones that hit).
func (s *simulation) completedOracle(res *Result) float64 {
	ok := 0
	for i := range res.Records {
		if res.Records[i].OK() {
			ok++
		}
	}
	if ok == len(res.Records) {
		return res.OracleHitRate
	}
	var prompt, hit int64
	for i, h := range oracleHits(s.reqs, s.blockSize) {
		if res.Records[i].OK() {
			prompt += int64(s.reqs[i].PromptLen)
			hit += int64(h)
		}
	}
	if prompt == 0 {
		return 0
	}
	return float64(hit) / float64(prompt)
}

// fifo is a queue that reuses its backing array: once drained, or, when
// it is never empty (scrapes in flight with a network latency longer than
// the scrape interval), when the array is full and at least half of it has
// been popped.
type fifo[T any] struct {
	items []T
	head  int
}

// push appends v, moving the queued items to the front of the array
// rather than growing it when at least half of it has been popped (the
// copy is paid for by those pops).
func (f *fifo[T]) push(v T) {
	if len(f.items) == cap(f.items) && f.head > 0 && f.head >= len(f.items)/2 {
		n := copy(f.items, f.items[f.head:])
		clear(f.items[n:])
		f.items, f.head = f.items[:n], 0
	}
	f.items = append(f.items, v)
}

// len returns the number of items queued.
func (f *fifo[T]) len() int { return len(f.items) - f.head }

// pop removes and returns the oldest item; the queue must not be empty.
func (f *fifo[T]) pop() T {
	v := f.items[f.head]
	var zero T
	f.items[f.head] = zero
	f.head++
	if f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	}
	return v
}

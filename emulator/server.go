package emulator

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/tokenizer"
)

// ErrStopped is the error of requests that were live when the engine loop
// stopped, and of requests that arrive after it.
var ErrStopped = errors.New("emulator: engine stopped")

// Server is one emulated engine. Create it with New, serve Handler, and
// drive it with Run. It is safe for concurrent use.
type Server struct {
	cfg     Config
	prof    engine.Profile // effective profile (overrides applied)
	eng     *engine.Engine // owned by the loop goroutine (Run)
	sampler engine.Sampler // the engine's output tokens, for handlers
	codec   *textCodec     // nil: the built-in tokenizer
	// plainWords is set when generated tokens render through the built-in
	// tokenizer's word tables (renderTokens), into text JSON need not
	// escape (builtinWords checks it).
	plainWords bool
	// tokCache is the built-in tokenizer's cache (nil with another
	// tokenizer, whose codec has its own).
	tokCache *tokenizer.Cache
	metrics  *metrics
	// loras are the adapters served (nil without LoRAConfig.Enable);
	// loraInfo is vllm:lora_requests_info (nil without it, or in a flavour
	// other than vLLM's), updated by the loop.
	loras    *loras
	loraID   func(string) int // s.loras.id, for the KV events (nil without LoRA)
	loraInfo *loraInfo
	slots    *slotTable  // llama.cpp's slots (flavour llamacpp), else nil
	llama    *llamaLoRAs // llama.cpp's LoRA adapters (flavour llamacpp), else nil
	pub      *publisher  // nil without KV events
	leases   leaseTable
	client   *http.Client // side-channel calls to prefill engines
	mux      *http.ServeMux
	start    time.Time
	// dp is set on the front engine core of a data-parallel server (NewDP):
	// its generation handlers hand each request to the rank dp picks.
	dp *DP

	inMu  sync.Mutex // protects inbox, stopped, quiet and quietUntil
	inbox []command
	// stopped is set when the loop has exited; later posts fail.
	stopped bool
	// quiet is set while the loop sleeps through a run of steps that ends
	// at quietUntil: a command that cannot be observed before then is queued
	// without waking the loop (deferrable). The stats snapshot is as old as
	// the run's start (see syncStats).
	quiet      bool
	quietUntil time.Duration
	minStep    time.Duration // the engine's MinStepTime
	wake       chan struct{} // cap 1: the inbox holds a command for the loop now
	posted     atomic.Bool   // the inbox may be non-empty (set under inMu)
	// runtimeTimer makes the loop sleep on a runtime timer rather than
	// the wakeTimer's timerfd: a test whose clock is synctest's (a
	// timerfd keeps real time). Set before Run.
	runtimeTimer bool
	// timerSleeps counts the loop's timed sleeps (each is a wake-up);
	// caughtUp the steps catchUp computed (engine.DecodeSteps).
	timerSleeps, caughtUp atomic.Int64
	done                  chan struct{} // closed when the loop exits
	// life ends with done: a P/D decode leg's pull outlives its client
	// (awaitPull), not the engine.
	life    context.Context
	endLife context.CancelFunc

	runMu   sync.Mutex         // protects started, closed and cancel
	started bool               // Run was called
	closed  bool               // Close was called
	cancel  context.CancelFunc // stops Run
	exited  chan struct{}      // closed when a started Run returns
}

// commandKind says what a command asks the engine loop to do.
type commandKind uint8

const (
	cmdAdd commandKind = iota
	cmdAbort
	cmdRelease
	cmdReset
	cmdSync   // publish the stats snapshot now (a /metrics scrape during a quiet run)
	cmdLoaded // a P/D decode leg's KV arrived (ok) or failed to (engine.LoadedKV)
)

type command struct {
	kind commandKind
	req  *engine.Request // cmdAdd
	st   *stream         // cmdAdd
	id   string          // cmdAbort, cmdRelease, cmdLoaded
	ok   bool            // cmdLoaded
	done chan bool       // cmdReset: the result; cmdSync: closed when published
	at   time.Duration   // when it was posted (Server.now)
}

// New validates cfg, fills its defaults and builds the engine model. With
// KV events (cfg.KVEvents) it binds their sockets before it returns, as
// vLLM binds its publisher's before its API server serves: a subscriber
// that connects once the engine serves gets every batch from the first
// request on. An endpoint that cannot be bound is a *BindError. Close
// releases the sockets, whether or not Run ran.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	err := cfg.validate()
	if err != nil {
		return nil, err
	}
	for _, ep := range []*string{&cfg.KVEvents.Endpoint, &cfg.KVEvents.ReplayEndpoint} {
		if *ep, err = offsetEndpoint(*ep, cfg.DataParallelRank); err != nil {
			return nil, err
		}
	}
	ec := cfg.Engine
	ec.Speed = cfg.Speed
	codec, err := newTextCodec(cfg.Tokenizer, ec.Profile.Model.Vocab)
	if err != nil {
		return nil, err
	}
	if codec != nil {
		if eos, ok := eosOf(cfg.Tokenizer); ok {
			ec.Profile.Model.EOSTokenID = eos // the model ends a turn with its tokenizer's EOS
		}
		if v, ok := cfg.Tokenizer.(tokenizer.Vocab); ok {
			ec.OutputVocab = v.VocabSize() // and generates no id the tokenizer lacks
		}
	}
	ec.NoEvents = cfg.KVEvents.Endpoint == ""
	// The engines of a P/D pair run with a KV connector (vLLM's
	// --kv-transfer-config), whose prefix-cache stats every request
	// records.
	ec.KVConnector = cfg.Role != kvroute.RoleBoth
	if cfg.PDProtocol == PDSGLang && cfg.Role == kvroute.RoleDecode && !cfg.DisaggregationDecodeEnableRadixCache {
		// SGLang's decode engine runs a chunk cache, no radix cache,
		// unless --disaggregation-decode-enable-radix-cache.
		ec.DisablePrefixCaching = true
	}
	if cfg.LoRA.Enable {
		ec.MaxLoRAs = cfg.LoRA.MaxLoRAs
	}
	eng, err := engine.New(ec)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	if cfg.EngineID == "" {
		cfg.EngineID = newUUID()
	}
	s := &Server{
		cfg: cfg, prof: eng.Profile(), eng: eng, sampler: eng.Sampler(), codec: codec,
		leases: leaseTable{m: map[string]*lease{}, legs: map[string]*lease{}},
		client: &http.Client{
			Timeout: cfg.BootstrapWait + 11*time.Minute, // the wait, then at most 10 minutes of transfer
			Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute},
		},
		start: time.Now(), wake: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{}),
	}
	s.life, s.endLife = context.WithCancel(context.Background())
	if codec == nil {
		s.tokCache = tokenizer.NewBuiltinCache(tokenizer.CacheConfig{MaxTokens: cacheTokens})
		if cfg.Tokenizer == tokenizer.Builtin() {
			_, s.plainWords = builtinWords()
		}
	}
	s.minStep = eng.MinStepTime()
	hashName := "xxh3"
	if ec.HashFunc != nil {
		hashName = ec.HashFunc.Name()
	}
	s.metrics, err = newRankMetrics(cfg.MetricsFlavor, cfg.Model, cfg.DataParallelRank, s.prof, hashName, !ec.DisablePrefixCaching, s.start)
	if err != nil {
		return nil, err
	}
	if cfg.LoRA.Enable {
		s.loras = newLoRAs(cfg.Model, cfg.LoRA.Modules)
		s.loraID = s.loras.id
		if cfg.MetricsFlavor == FlavorVLLM || cfg.MetricsFlavor == FlavorVLLMLegacy {
			s.loraInfo = newLoRAInfo(cfg.LoRA.MaxLoRAs)
			s.metrics.reg.MustRegister(s.loraInfo)
		}
	}
	st := eng.Stats()
	s.metrics.publish(&snapshot{st: st})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc(patCompletions, s.handleCompletions)
	s.mux.HandleFunc(patChat, s.handleChat)
	s.mux.HandleFunc("GET /metrics", s.handleMetrics)
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("POST /internal/kv/pull", s.handlePull)
	s.mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	s.mux.HandleFunc("POST /tokenize", s.handleTokenize)
	s.mux.HandleFunc("POST /detokenize", s.handleDetokenize)
	s.mux.HandleFunc("GET /version", s.handleVersion)
	if cfg.LoRA.RuntimeUpdating { // lora.go
		s.mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
		s.mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	}
	if cfg.MetricsFlavor == FlavorLlamaCpp { // slots.go
		s.slots = newSlotTable(s.prof.MaxNumSeqs, s.prof.MaxModelLen)
		s.mux.HandleFunc("GET /slots", s.handleSlots)
		s.mux.HandleFunc("GET /props", s.handleProps)
		s.llama = newLlamaLoRAs(s.loras) // llamalora.go
		s.mux.HandleFunc("GET /lora-adapters", s.handleLoRAAdapters)
		s.mux.HandleFunc("POST /lora-adapters", s.handleSetLoRAAdapters)
	}
	s.mux.HandleFunc("/", s.handleNotFound)
	if cfg.KVEvents.Endpoint != "" { // last: nothing fails after the bind
		s.pub = newPublisher(cfg.KVEvents, cfg.Logger)
		if err := s.pub.open(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.route) }

// The patterns of the generation endpoints.
const (
	patCompletions = "POST /v1/completions"
	patChat        = "POST /v1/chat/completions"
)

// route serves a request as s.mux does, without the mux's routing for the
// generation endpoints (every request's): a POST whose escaped path is
// exactly theirs is the one the mux gives their handler (a clean path, no
// redirect, no other pattern that could take it), with r.Pattern set as
// the mux sets it. Everything else goes through the mux.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		switch r.URL.EscapedPath() {
		case "/v1/chat/completions":
			r.Pattern = patChat
			s.handleChat(w, r)
			return
		case "/v1/completions":
			r.Pattern = patCompletions
			s.handleCompletions(w, r)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// SideChannelHandler serves only the P/D side channel (POST
// /internal/kv/pull), for a separate listener like vLLM's NIXL side-channel
// port or SGLang's bootstrap port. Handler serves it too.
func (s *Server) SideChannelHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/kv/pull", s.handlePull)
	mux.HandleFunc("/", s.handleNotFound)
	return mux
}

// Profile returns the effective engine profile (overrides applied).
func (s *Server) Profile() engine.Profile { return s.prof }

// EngineID returns the id put in kv_transfer_params.remote_engine_id.
func (s *Server) EngineID() string { return s.cfg.EngineID }

// SetAdvertise sets the side-channel address put in kv_transfer_params
// (remote_host, remote_port); call it before serving, once the listen
// address is known.
func (s *Server) SetAdvertise(host string, port int) {
	s.cfg.AdvertiseHost, s.cfg.AdvertisePort = host, port
}

// Run runs the engine loop (and the KV-event publisher) until ctx is
// cancelled or Close is called. It fails every live request before it
// returns, and returns nil on a normal stop. Run may be called once; after
// Close it returns ErrStopped at once.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.runMu.Lock()
	switch {
	case s.closed:
		s.runMu.Unlock()
		return ErrStopped
	case s.started:
		s.runMu.Unlock()
		return errors.New("emulator: Run called twice")
	}
	s.started, s.cancel = true, cancel
	s.runMu.Unlock()
	defer close(s.exited)

	var wg sync.WaitGroup
	if s.pub != nil {
		wg.Go(func() { s.pub.run(ctx) }) // it closes the sockets New bound
	}
	s.loop(ctx)
	s.shutdown()
	cancel()
	wg.Wait()
	s.client.CloseIdleConnections()
	return nil
}

// Close stops Run and waits for it to return. It is safe to call more than
// once, concurrently with Run, and without Run (it then releases the
// KV-event sockets New bound).
func (s *Server) Close() error {
	s.runMu.Lock()
	started, cancel := s.started, s.cancel
	s.closed = true
	s.runMu.Unlock()
	if !started {
		s.shutdown()
		if s.pub != nil {
			s.pub.close()
		}
		return nil
	}
	cancel()
	<-s.exited
	return nil
}

// shutdown marks the loop stopped, fails what was still queued and ends
// the KV leases (leaseTable.stopAll).
func (s *Server) shutdown() {
	s.inMu.Lock()
	if s.stopped {
		s.inMu.Unlock()
		return
	}
	s.stopped = true
	inbox := s.inbox
	s.inbox = nil
	s.inMu.Unlock()
	s.leases.stopAll()
	for _, c := range inbox {
		if c.kind == cmdAdd {
			c.st.fail(ErrStopped)
		}
	}
	close(s.done)
	s.endLife()
}

// post queues a command for the engine loop. It fails after the loop
// stopped.
func (s *Server) post(c command) error {
	s.inMu.Lock()
	if s.stopped {
		s.inMu.Unlock()
		return ErrStopped
	}
	c.at = s.now()
	s.inbox = append(s.inbox, c)
	s.posted.Store(true)
	later := s.quiet && deferrable(&c, s.quietUntil, s.minStep)
	s.inMu.Unlock()
	if !later {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// now is the engine's virtual time: real time since start. (The model runs
// Speed times faster through engine.Config.Speed, so its time is real time.)
func (s *Server) now() time.Duration { return time.Since(s.start) }

// Timing of the loop: it sleeps only when the step ends at least minSleep
// ahead, and keeps the model's clock when it falls behind by less than
// maxLag (a late timer), so timer slop does not accumulate.
const (
	minSleep   = 50 * time.Microsecond
	maxLag     = 2 * time.Millisecond
	statsEvery = time.Millisecond
)

// loopState is the engine loop's own state (owned by the loop goroutine).
type loopState struct {
	live    map[string]*stream
	order   []*stream // streams of the last step's unfinished outputs, in order
	spare   []*stream // the other buffer of order
	queue   []command // commands taken from the inbox, not yet applied
	res     engine.StepResult
	run     engine.DecodedRun // catchUp's
	evbuf   []byte
	vnow    time.Duration // the model's clock: the start of the next step
	acc     snapshot      // accumulators for the snapshot
	tpStart time.Duration // gen throughput window
	tpToks  int64
	lastPub time.Duration // when the stats snapshot was last published
	timer   *wakeTimer
	// lastReal is the clock's last reading at the top of the loop, unread
	// the steps since.
	lastReal time.Duration
	unread   int
	// notifying counts the live streams woken before they finish
	// (stream.every > 0); spaced those with every > 1; stops those of
	// requests with stop strings (stream.stop).
	notifying, spaced, stops int
	// iterLess and iterHeld are deliver's for the step it delivers: the
	// tokens of outputs of requests with stop strings left out of the
	// step's count or held, and the step's observation when one is held
	// (holdIter).
	iterLess int
	iterHeld *iterStep
	// fullDeliver makes deliver look up the stream of every output, as
	// it must while a handler is woken per chunk (the reference path for
	// TestCatchUpMatchesStepping).
	fullDeliver bool
	// inProgress is set when sleepThrough computed into res a step that
	// starts at vnow and had not ended when the loop woke: the loop
	// completes it (completeStep) before anything else.
	inProgress bool
	// ahead is set when catchUp computed and delivered the step in
	// progress when the loop woke: vnow is its end, still to come. The
	// loop sleeps through it (and the quiet run after it) before anything
	// else, as completeStep does.
	ahead bool
}

// loop is the engine goroutine: it owns s.eng.
//
// It steps the engine in real time: a step is computed when it starts
// (StepInto at the model's clock, which follows real time), its outputs are
// delivered when it ends. While nobody observes the coming steps (plain
// decode steps, engine.DecodeRun, whose tokens no handler is woken for and
// which publish no KV events) the loop does not wake at each step: it
// sleeps until the end of the run (a request finishing, a stream due a
// chunk) or until a command arrives, then computes the steps that started
// meanwhile, each at its own start time and after exactly the commands
// that arrived before that start (commands carry their arrival time). The
// engine is deterministic, so the outputs, their times and the metrics are
// those of stepping at every boundary; only the CPU cost of waking differs.
func (s *Server) loop(ctx context.Context) {
	ls := &loopState{live: make(map[string]*stream), timer: newWakeTimer(s.runtimeTimer)}
	defer ls.timer.close()
	defer func() {
		for _, st := range ls.live {
			st.fail(ErrStopped)
		}
		// Requests taken from the inbox but not applied yet (sleepThrough
		// keeps those that arrived after the step in progress started).
		for i := range ls.queue {
			if c := &ls.queue[i]; c.kind == cmdAdd {
				c.st.fail(ErrStopped)
			}
		}
	}()
	for {
		if ls.inProgress {
			ls.inProgress = false
			if !s.completeStep(ctx, ls, s.now()) {
				return
			}
			continue
		}
		if ls.ahead {
			ls.ahead = false
			if !s.sleepAhead(ctx, ls, s.now()) {
				return
			}
			continue
		}
		select { // the inbox is read next: a pending wake-up is stale
		case <-s.wake:
		default:
		}
		s.takeInbox(ls)
		// The clock is slow to read in some VMs (~0.5 us): while the model is
		// behind the last reading it cannot have to sleep, so a step at a
		// very high Speed reuses it (at most 16 times; commands need it).
		real := ls.lastReal
		if ls.vnow >= real || len(ls.queue) > 0 || ls.unread >= 16 {
			real = s.now()
			ls.lastReal, ls.unread = real, 0
		} else {
			ls.unread++
		}
		if real-ls.vnow > maxLag || len(ls.queue) > 0 && !s.eng.HasWork() {
			ls.vnow = max(ls.vnow, real)
		}
		flush := false // a reset's AllBlocksCleared event needs a step
		for i := range ls.queue {
			flush = s.apply(ls.vnow, &ls.queue[i], ls) || flush
			ls.queue[i] = command{}
		}
		ls.queue = ls.queue[:0]
		if !s.eng.HasWork() && !flush {
			s.publishStats(&ls.acc)
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		if until, ok := s.quietRun(ls, real, 2); ok {
			if !s.sleepThrough(ctx, ls, until) {
				return
			}
			continue
		}
		s.step(ls)
		s.startLoads(ls)
		s.countStops(ls)
		if !s.completeStep(ctx, ls, real) {
			return
		}
	}
}

// completeStep completes the step computed into ls.res, which starts at
// ls.vnow, with no command left to apply at its end. When nobody observes
// its outputs (no finish, no handler to wake) and a quiet run follows (of
// one step or more: the step and the run are slept through in one), it
// delivers them now and sleeps through both; the outputs only reach
// loop-owned state and the metrics (at most one step early). Otherwise it
// sleeps until the step's end and delivers them. It returns false when
// ctx is done.
func (s *Server) completeStep(ctx context.Context, ls *loopState, real time.Duration) bool {
	if ls.notifying == 0 && len(ls.queue) == 0 && !finishes(&ls.res) {
		start := ls.vnow
		ls.vnow += ls.res.Duration // the run starts when the step ends
		until, ok := s.quietRun(ls, real, 1)
		ls.vnow = start
		if ok {
			s.finishStep(ctx, ls, false, real)
			return s.sleepThrough(ctx, ls, until)
		}
	}
	return s.finishStep(ctx, ls, true, real)
}

// sleepAhead sleeps through the step catchUp computed and delivered ahead
// (loopState.ahead), which ends at ls.vnow: with the quiet run after it
// when one follows, as completeStep does, else until it ends. It returns
// false when ctx is done.
func (s *Server) sleepAhead(ctx context.Context, ls *loopState, real time.Duration) bool {
	if until, ok := s.quietRun(ls, real, 1); ok {
		return s.sleepThrough(ctx, ls, until)
	}
	return s.sleepUntil(ctx, ls, ls.vnow, real)
}

// step computes the step that starts at ls.vnow into ls.res, its decode
// tokens summarised (engine.StepResult.Summarize) when deliver takes none
// of them one by one: no handler is woken before its request finishes,
// and no request has stop strings.
func (s *Server) step(ls *loopState) {
	ls.res.Summarize = ls.notifying == 0 && ls.stops == 0 && !ls.fullDeliver
	s.eng.StepInto(ls.vnow, &ls.res)
}

// startLoads hands the P/D decode legs the step just computed admitted
// (engine.StepResult.Loads: their blocks are allocated) to their handlers,
// which move their KV now (Server.awaitPull), as vLLM's connector starts
// its transfer once the scheduler allocated the blocks. The engine's
// state is published first: /metrics read once a pull started sees the
// request waiting and its blocks held.
func (s *Server) startLoads(ls *loopState) {
	if len(ls.res.Loads) == 0 {
		return
	}
	s.publishStats(&ls.acc)
	for _, l := range ls.res.Loads {
		if st := ls.live[l.ID]; st != nil && st.loads != nil {
			select {
			case st.loads <- l:
			default: // (a request is admitted to load once)
			}
		}
	}
}

// countStops adds to ls.acc.stopGen the tokens that the step just computed
// into ls.res generated for requests with stop strings (every output but
// an abort's is a token), as the engine added them to its
// GenerationTokens: a snapshot has both or neither. catchUp computes no
// such request's steps (their handlers are woken at every token).
func (s *Server) countStops(ls *loopState) {
	if ls.stops == 0 {
		return
	}
	for i := range ls.res.Outputs {
		o := &ls.res.Outputs[i]
		if o.Finished && o.FinishReason == engine.FinishAbort {
			continue
		}
		if st := ls.live[o.ID]; st != nil && st.stop != nil {
			ls.acc.stopGen++
		}
	}
}

// finishes reports whether a request finished in the step.
func finishes(res *engine.StepResult) bool {
	for i := range res.Outputs {
		if res.Outputs[i].Finished {
			return true
		}
	}
	return false
}

// takeInbox moves the posted commands to ls.queue.
func (s *Server) takeInbox(ls *loopState) {
	if !s.posted.Load() {
		return // nothing posted: skip the lock (the loop looks once a step)
	}
	s.inMu.Lock()
	s.posted.Store(false)
	ls.queue = append(ls.queue, s.inbox...)
	clear(s.inbox)
	s.inbox = s.inbox[:0]
	s.inMu.Unlock()
}

// quietRun reports whether the loop may sleep through the coming steps,
// and until when: the end of the engine's plain decode run, shortened to
// the step at which a spaced stream is due its next chunk. Runs shorter
// than minSteps are left to the plain path (a run of one step alone saves
// no wake-up).
func (s *Server) quietRun(ls *loopState, now time.Duration, minSteps int) (time.Duration, bool) {
	if s.pub != nil || ls.notifying > ls.spaced {
		return 0, false // KV events to publish, or a handler woken at every step
	}
	// A run is looked at maxRun steps ahead at most (DecodeRun costs a few
	// ns a step; a longer run is slept through in parts). When even that
	// many of the shortest steps end too soon to sleep (a loop behind real
	// time, or a very high Speed), step as usual.
	const maxRun = 256
	if ls.vnow+maxRun*s.minStep < now+minSleep {
		return 0, false
	}
	limit := maxRun
	if ls.spaced > 0 {
		for _, st := range ls.live {
			if st.every > 1 {
				limit = min(limit, st.every-st.since)
			}
		}
	}
	n, d, _ := s.eng.DecodeRun(limit)
	if n < minSteps || n == 0 {
		return 0, false
	}
	return ls.vnow + d, true
}

// sleepThrough sleeps until the model time until or until a command is
// posted, then computes the steps that started meanwhile (see loop). A
// step still in progress when it woke whose outputs nobody observes is
// computed and delivered by catchUp with the steps before it when no
// command waits (ls.ahead), else left computed by StepInto
// (ls.inProgress); either way the loop sleeps through its end, together
// with the quiet run after it. It returns false when ctx is done.
func (s *Server) sleepThrough(ctx context.Context, ls *loopState, until time.Duration) bool {
	if d := until - s.now(); d >= minSleep {
		ls.timer.Reset(d)
		s.timerSleeps.Add(1)
		s.inMu.Lock()
		s.quiet, s.quietUntil = true, until
		s.inMu.Unlock()
		select {
		case <-ctx.Done():
			ls.timer.Stop()
			s.inMu.Lock()
			s.quiet = false
			s.inMu.Unlock()
			return false
		case <-ls.timer.C:
		case <-s.wake:
			ls.timer.Stop()
		}
	}
	// Leaving the quiet state and taking the inbox under one lock: a
	// command post queued without waking the loop is taken here.
	woke := s.now()
	s.inMu.Lock()
	s.quiet = false
	s.posted.Store(false)
	ls.queue = append(ls.queue, s.inbox...)
	clear(s.inbox)
	s.inbox = s.inbox[:0]
	s.inMu.Unlock()
	for ls.vnow < woke && s.eng.HasWork() {
		if s.catchUp(ls, woke) {
			ls.ahead = ls.vnow > woke // it computed the step in progress
			continue
		}
		// Commands that arrived before this step started join it, as they
		// would have had the loop been awake at its start.
		kept := ls.queue[:0]
		syncs := false
		for i := range ls.queue {
			if c := ls.queue[i]; c.at <= ls.vnow {
				s.apply(ls.vnow, &ls.queue[i], ls)
			} else {
				kept = append(kept, c)
				syncs = syncs || c.kind == cmdSync
			}
		}
		clear(ls.queue[len(kept):])
		ls.queue = kept
		var before engine.Stats
		if syncs {
			before = s.eng.Stats()
		}
		s.step(ls)
		if syncs && ls.vnow+ls.res.Duration > s.now() {
			// The step is in progress: answer the scrapes now with the
			// state before it, as the loop awake at every step would.
			snap := ls.acc
			snap.st = before
			s.metrics.publish(&snap)
			kept := ls.queue[:0]
			for _, c := range ls.queue {
				if c.kind == cmdSync {
					close(c.done)
				} else {
					kept = append(kept, c)
				}
			}
			clear(ls.queue[len(kept):])
			ls.queue = kept
		}
		// After the snapshot of the state before the step:
		s.startLoads(ls)
		s.countStops(ls)
		if ls.vnow+ls.res.Duration > woke && ls.notifying == 0 && !finishes(&ls.res) {
			ls.inProgress = true
			return true
		}
		if !s.finishStep(ctx, ls, true, woke) {
			return false
		}
	}
	return true
}

// catchUp computes at once (engine.DecodeStepsStarted) the plain decode
// steps that ended before woke while the loop slept, as far as nothing is
// due in them: no handler to wake per chunk (no stream notified per
// chunk), no command arrived before one of them started, no generation
// throughput due at their ends (finishStep's, once a second). A step in
// which requests finish ends the run; their handlers are woken as deliver
// wakes them. With no command queued, the step in progress at woke is
// computed too unless a request finishes in it: its outputs reach only
// loop-owned state and the metrics (one step early, as completeStep
// delivers a step it sleeps through), and ls.vnow is then its end, after
// woke. It records what finishStep and deliver would have for each step
// (the batch sizes and inter-token latencies in the same order, the
// finished requests' metrics) and reports whether it computed any.
//
// The stats snapshot, which finishStep publishes at the end of a step at
// most every statsEvery and before it wakes a finished request's handler,
// is published once, with the state at the end of the run (the state
// stepping publishes last when the run's last step is due one, as steps
// of a millisecond or more are). Which step's state a scrape reads while
// the loop catches up is a race either way; the snapshot is due again at
// the same step as after stepping.
func (s *Server) catchUp(ls *loopState, woke time.Duration) bool {
	if s.pub != nil || ls.notifying > 0 {
		return false
	}
	until := ls.tpStart + time.Second - 1
	before := time.Duration(math.MaxInt64)
	for i := range ls.queue {
		// A step that starts at or after at comes after the command; the
		// step in progress at at does not see it, and is caught up too.
		before = min(before, ls.queue[i].at)
	}
	if before <= ls.vnow {
		return false // the next step must see a command
	}
	if len(ls.queue) > 0 {
		until = min(until, woke) // the loop steps the one in progress at woke
	}
	run := &ls.run
	run.Summarize = true // no handler is woken before its request finishes
	n := s.eng.DecodeStepsStarted(ls.vnow, woke, until, before, math.MaxInt, run)
	if n == 0 {
		return false
	}
	s.caughtUp.Add(int64(n))
	due := false
	for _, d := range run.Durations {
		ls.vnow += d
		if ls.vnow-ls.lastPub >= statsEvery {
			ls.lastPub, due = ls.vnow, true
		}
	}
	finishing := len(run.Finished) > 0
	if finishing {
		s.publishStats(&ls.acc) // before the handlers are woken, as finishStep
	}
	r := run.Running
	s.metrics.mu.Lock()
	s.metrics.iteration.observeN(float64(r), n)
	// The inter-token latencies are recorded step by step in running
	// order, as deliver records them (a run of equal ones at once), and
	// the finished requests in that order within the last step.
	finish := func(i int) {
		o := &run.Finished[i]
		if st := ls.live[o.ID]; st != nil {
			st.count(o)
			s.finished(o, st, ls)
		}
	}
	for k, d := range run.Durations {
		var itls itlRun
		switch {
		case k == 0: // the first tokens' latencies (and the finishes, in a run of one step)
			runs := run.FirstITLs
			if n == 1 {
				for i := range run.Finished {
					for len(runs) > 0 && runs[0].Before <= i {
						itls.addN(s.metrics, runs[0].ITL, runs[0].N)
						runs = runs[1:]
					}
					itls.flush(s.metrics)
					finish(i)
				}
			}
			for _, rn := range runs {
				itls.addN(s.metrics, rn.ITL, rn.N)
			}
		case finishing && k == n-1:
			prev := -1 // the running position of the last finish
			for i, at := range run.FinishedAt {
				itls.addN(s.metrics, d, at-prev-1)
				itls.flush(s.metrics)
				finish(i)
				prev = at
			}
			itls.addN(s.metrics, d, r-prev-1)
		default:
			itls.addN(s.metrics, d, r)
		}
		itls.flush(s.metrics)
	}
	s.metrics.mu.Unlock()
	// The other streams are not touched (their memory is cold after a
	// sleep): deliver counts a stream's tokens from its next output's
	// Index. The running order (ls.order) is the same unless some
	// finished; deliver then finds the streams anew.
	if finishing {
		clear(ls.order)
		ls.order = ls.order[:0]
	}
	if due {
		s.publishStats(&ls.acc)
	}
	return true
}

// deferrable reports whether a command posted during a quiet run may wait
// until the run's end (until) without waking the loop: the loop then
// applies it at the step boundary it arrived before (sleepThrough applies
// commands by arrival time, so the model is the same), and nothing it
// causes can be observed before until. A request that wakes its handler
// only when it finishes cannot finish before its output tokens x the
// shortest step (minStep); the work it adds only delays the running
// requests' finishes (they still decode a token per step), and the loop,
// woken at until, sleeps to the true end of the step in progress. A lease
// release reports nothing and changes no running request. An abort
// shortens the coming steps (a finish may come sooner); a reset, a stats
// sync, a streaming request, a P/D leg (a decode leg's transfer starts
// when it is admitted) or a decode leg's KV arriving need the loop now.
func deferrable(c *command, until, minStep time.Duration) bool {
	switch c.kind {
	case cmdRelease:
		return true
	case cmdAdd:
		r := c.req
		if c.st.every > 0 || r.HoldKV || r.SkipPrefill || r.RemoteKV {
			return false
		}
		first := r.MaxTokens // tokens before it can finish
		if r.EOSAt > 0 && !r.IgnoreEOS {
			first = min(first, r.EOSAt)
		}
		return time.Duration(first)*minStep > until-c.at
	}
	return false
}

// syncStats brings the stats snapshot up to date when the loop is sleeping
// through a run of steps (it is fresh otherwise): the loop computes the
// steps started since and publishes. It gives up when ctx ends.
func (s *Server) syncStats(ctx context.Context) {
	s.inMu.Lock()
	quiet := s.quiet
	s.inMu.Unlock()
	if !quiet {
		return
	}
	done := make(chan bool)
	if s.post(command{kind: cmdSync, done: done}) != nil {
		return
	}
	select {
	case <-done:
	case <-s.done:
	case <-ctx.Done():
	}
}

// finishStep completes the step just computed into ls.res: it sleeps until
// the step's end unless that is past (or wait is false), then delivers its
// outputs, publishes its KV events and records its metrics. now is a recent
// reading of the clock: it is read again only if the step may end in the
// future.
func (s *Server) finishStep(ctx context.Context, ls *loopState, wait bool, now time.Duration) bool {
	res := &ls.res
	end := ls.vnow + res.Duration
	if wait && !s.sleepUntil(ctx, ls, end, now) {
		return false
	}
	ls.vnow = end
	// A request finishing this step wakes its handler in deliver: publish
	// the engine's state first, so that /metrics read after a response
	// is at least as new as the response (e.g. KV held by a P/D prefill).
	for i := range res.Outputs {
		if res.Outputs[i].Finished {
			s.publishStats(&ls.acc)
			break
		}
	}
	s.deliver(res, ls)
	if s.pub != nil && len(res.Events) > 0 {
		var err error
		ls.evbuf, err = encodeEventBatch(ls.evbuf[:0], s.cfg.KVEvents.Encoding, float64(time.Now().UnixNano())/1e9,
			s.cfg.DataParallelRank, res.Events, s.loraID)
		if err != nil {
			s.cfg.Logger.Error("kv events", "err", err)
		} else {
			s.pub.publish(bytes.Clone(ls.evbuf))
		}
	}
	if ls.vnow-ls.tpStart >= time.Second {
		st := s.eng.Stats()
		ls.acc.genThroughput = float64(st.GenerationTokens-ls.tpToks) / (ls.vnow - ls.tpStart).Seconds()
		ls.tpStart, ls.tpToks = ls.vnow, st.GenerationTokens
	}
	// Stats costs a walk over the live requests: publish at most every
	// statsEvery while busy (always when going idle, above).
	if ls.vnow-ls.lastPub >= statsEvery {
		s.publishStats(&ls.acc)
		ls.lastPub = ls.vnow
	}
	return true
}

// sleepUntil sleeps until the model time end unless it is less than
// minSleep ahead; now is a recent reading of the clock, read again only if
// end may be in the future. It returns false when ctx is done.
func (s *Server) sleepUntil(ctx context.Context, ls *loopState, end, now time.Duration) bool {
	if end-now >= minSleep {
		now = s.now()
	}
	for d := end - now; d >= minSleep; d = end - s.now() {
		// (Again after a stale signal of the timer, which is rare: see
		// wakeTimer.)
		ls.timer.Reset(d)
		s.timerSleeps.Add(1)
		select {
		case <-ctx.Done():
			ls.timer.Stop()
			return false
		case <-ls.timer.C:
		}
	}
	return true
}

func (s *Server) publishStats(acc *snapshot) {
	snap := *acc
	snap.st = s.eng.Stats()
	s.metrics.publish(&snap)
	if s.slots != nil {
		s.slots.update(s.eng)
	}
	if s.loraInfo != nil {
		s.loraInfo.update(s.eng, snap.st.Steps, time.Now())
	}
}

// apply runs one queued command in the loop. It reports whether the loop
// must step even without requests (to publish a reset's event).
func (s *Server) apply(now time.Duration, c *command, ls *loopState) bool {
	switch c.kind {
	case cmdAdd:
		if c.st.isAborted() {
			c.st.fail(context.Canceled)
			return false
		}
		if err := s.eng.Add(now, c.req); err != nil {
			c.st.fail(err)
			return false
		}
		ls.acc.requests++
		ls.live[c.req.ID] = c.st
		if c.st.stop != nil {
			c.st.mu.Lock()
			c.st.stop.m = s.metrics
			c.st.mu.Unlock()
			ls.stops++
		}
		if c.st.every > 0 {
			ls.notifying++
			if c.st.every > 1 {
				ls.spaced++
			}
		}
		ls.acc.maxContext = max(ls.acc.maxContext, c.req.PromptLen+c.st.maxTokens)
	case cmdAbort:
		s.eng.Abort(now, c.id)
		if st := ls.live[c.id]; st != nil && st.loads != nil {
			select {
			case <-st.loads:
				// Admitted to pull, but its handler left before it took
				// the load (awaitPull): no transfer started, so none
				// will end and free the blocks the engine keeps for it.
				s.eng.LoadedKV(c.id, false)
			default:
			}
		}
	case cmdRelease:
		s.eng.Release(c.id)
	case cmdReset:
		ok := s.eng.ResetPrefixCache()
		c.done <- ok
		return ok
	case cmdSync:
		s.publishStats(&ls.acc)
		close(c.done)
	case cmdLoaded:
		s.eng.LoadedKV(c.id, c.ok)
	}
	return false
}

// deliver hands a step's outputs to their streams, waking the handlers of
// finished requests, and of streaming ones when they are due a chunk.
// Tokens collect in the stream's loop-owned pend and are handed over under
// the stream's lock only when its handler is woken. The tokens a
// summarised step (Server.step) left out of its outputs only add their
// latencies, at their places among the outputs.
func (s *Server) deliver(res *engine.StepResult, ls *loopState) {
	s.metrics.mu.Lock()
	defer s.metrics.mu.Unlock()
	iterN, observed := stepTokens(res)
	ls.iterLess, ls.iterHeld = 0, nil
	// The engine reports its running requests in the same order step after
	// step: find each output's stream at the cursor in the previous step's
	// order (a string compare of the same string) before hashing its ID.
	prev, next := ls.order, ls.spare[:0]
	j := 0
	var itls itlRun
	runs := res.ITLs
	for i := range res.Outputs {
		for len(runs) > 0 && runs[0].Before <= i {
			itls.addN(s.metrics, runs[0].ITL, runs[0].N)
			runs = runs[1:]
		}
		o := &res.Outputs[i]
		if ls.notifying == 0 && !o.Finished && !ls.fullDeliver {
			// No handler is woken before its request finishes, and a
			// stream's token count comes from its next output's Index: an
			// unfinished output only adds its latency, and its stream
			// (cold memory in a busy fleet) is not touched. (Every request
			// in the engine has a live stream: apply adds both, and only
			// a finish removes it.)
			if o.First {
				s.metrics.onOutput(o, 0, o.FinishReason, 0) // generated counts only when finished
			} else {
				itls.add(s.metrics, o.ITL)
			}
			continue
		}
		var st *stream
		for k := j; k < len(prev) && k < j+4; k++ {
			if prev[k].id == o.ID {
				st, j = prev[k], k+1
				break
			}
		}
		if st == nil {
			if st = ls.live[o.ID]; st == nil {
				continue
			}
		}
		if !o.Finished {
			next = append(next, st)
		}
		st.count(o)
		if !o.Finished {
			if ss := st.stop; ss != nil {
				st.mu.Lock()
				ls.holdIter(o, st)
				if !o.First { // recorded with its finish, up to the match (stopState.itls)
					ss.itls = append(ss.itls, o.ITL)
				}
				st.mu.Unlock()
			}
			switch {
			case o.First:
				s.metrics.onOutput(o, st.gen, o.FinishReason, 0)
			case st.stop != nil:
			default:
				itls.add(s.metrics, o.ITL)
			}
			// vLLM's --stream-interval: the first token, then every
			// interval tokens (and the last, below).
			if st.every > 0 && (st.since >= st.every || !st.notified) {
				st.mu.Lock()
				st.toks = append(st.toks, st.pend...)
				st.generated, st.cachedTokens = st.gen, st.cached
				st.mu.Unlock()
				st.pend = st.pend[:0]
				st.since, st.notified = 0, true
				st.signal()
			}
			continue
		}
		itls.flush(s.metrics)
		s.finished(o, st, ls)
	}
	for _, r := range runs {
		itls.addN(s.metrics, r.ITL, r.N)
	}
	itls.flush(s.metrics)
	s.metrics.observeStep(iterN-ls.iterLess, observed, ls.iterHeld)
	ls.iterHeld = nil
	clear(prev)
	ls.order, ls.spare = next, prev[:0]
}

// holdIter decides how o, an output of a request with stop strings, counts
// in its step's vllm:iteration_tokens_total, as vLLM's front end counts it
// (it forgets the request at the output whose tokens complete a match, and
// ignores the outputs the engine computed before the abort arrived): left
// out when a stop string already matched; counted when the client left
// (its tokens all count, as in generation_tokens_total); else held, with
// the step's observation, until the handler searched o's token (settleStop
// decides it). The caller holds the metrics' lock and st.mu.
func (ls *loopState) holdIter(o *engine.Output, st *stream) {
	t := outputTokens(o)
	ss := st.stop
	switch {
	case t == 0 || st.aborted.Load():
	case ss.match != "":
		ls.iterLess += t
	default:
		ls.iterLess += t
		if ls.iterHeld == nil {
			ls.iterHeld = new(iterStep)
		}
		ls.iterHeld.open++
		ss.held = append(ss.held, iterOut{step: ls.iterHeld, index: o.Index, tokens: t})
	}
}

// itlRun batches a step's inter-token latencies, mostly one value: a run
// of equal ones is recorded at once (metrics.observeITLs), before any
// other latency, keeping the histogram's sum in order. The caller holds
// the metrics' lock.
type itlRun struct {
	d time.Duration
	n int
}

// add records one latency d (none when d <= 0).
func (r *itlRun) add(m *metrics, d time.Duration) {
	switch {
	case d <= 0:
	case d == r.d:
		r.n++
	default:
		m.observeITLs(r.d, r.n)
		r.d, r.n = d, 1
	}
}

// addN records n latencies d, as n adds.
func (r *itlRun) addN(m *metrics, d time.Duration, n int) {
	switch {
	case d <= 0 || n <= 0:
	case d == r.d:
		r.n += n
	default:
		m.observeITLs(r.d, r.n)
		r.d, r.n = d, n
	}
}

// flush records the run so far: before a latency recorded another way (a
// finished request's, onOutput), and at the end of a step.
func (r *itlRun) flush(m *metrics) {
	m.observeITLs(r.d, r.n)
	r.n = 0
}

// count records o in its stream st: the tokens generated so far, the
// tokens a streaming handler is due, the prompt's cached tokens.
func (st *stream) count(o *engine.Output) {
	// The request generated Index tokens before this output (an abort's:
	// before it was aborted). A stream's count is set from it, not counted
	// output by output: catchUp, and deliver while no handler is woken per
	// chunk, leave unfinished outputs to this.
	aborted := o.FinishReason == engine.FinishAbort
	gen := o.Index
	if !aborted {
		gen++
	}
	st.since += gen - st.gen
	st.gen = gen
	if !aborted {
		// A whole response's handler recomputes its tokens (every 0);
		// EOS has no text.
		if st.every > 0 && !(o.Finished && o.FinishReason == engine.FinishStop) {
			st.pend = append(st.pend, o.Token)
		}
	}
	if o.First {
		st.cached = o.CachedTokens
	}
}

// finished hands a request's last output o (counted: stream.count) to its
// stream and wakes its handler, with the metrics of a finished request (the
// step's inter-token latencies before it observed first); the request
// leaves the loop's live streams.
func (s *Server) finished(o *engine.Output, st *stream, ls *loopState) {
	aborted := o.FinishReason == engine.FinishAbort
	var blockIDs []int
	if st.holdKV && !aborted {
		blockIDs = s.eng.BlockIDs(o.ID)
	}
	reason := o.FinishReason
	st.mu.Lock()
	if len(st.toks) == 0 {
		st.toks, st.pend = st.pend, nil
	} else {
		st.toks = append(st.toks, st.pend...)
	}
	st.generated = st.gen
	st.finished = true
	st.finishReason = o.FinishReason
	generated, record := st.gen, true
	var itls []time.Duration // a request with stop strings' latencies, recorded with its finish
	if ss := st.stop; ss != nil {
		ls.holdIter(o, st)
		if !o.First && !aborted {
			ss.itls = append(ss.itls, o.ITL)
		}
		// Counted as vLLM's output processor counts it (stopState): up
		// to the match; with every token when the client is gone; else
		// by its handler, once it searched the last tokens.
		switch {
		case ss.match != "":
			reason, generated = engine.FinishStop, ss.counted
			itls = ss.takeITLs(ss.counted)
		case st.aborted.Load():
			s.metrics.stopCounted.Add(int64(st.gen - ss.counted))
			ss.counted = st.gen
			itls = ss.takeITLs(ss.counted)
		default:
			f := finishOf(o, st.gen, reason, st.maxTokens)
			ss.fin, record = &f, false
		}
		ls.stops--
	}
	st.promptTokens = o.PromptTokens
	st.cachedTokens = o.CachedTokens
	st.blockIDs = blockIDs
	st.mu.Unlock()
	if aborted && reason == engine.FinishAbort && s.metrics.dropAborts {
		record = false // the client left (metrics.dropAborts)
	}
	switch {
	case st.stop != nil && !o.First: // its latency is among the request's (stopState.itls)
		s.metrics.observeLatencies(itls)
		if record {
			f := finishOf(o, generated, reason, st.maxTokens)
			f.decodeUntil(itls, generated)
			s.metrics.addFinish(f)
		}
	case record:
		s.metrics.onOutput(o, generated, reason, st.maxTokens)
	default:
		s.metrics.onLatency(o, generated) // no finish, or its handler's to record
	}
	delete(ls.live, o.ID)
	if st.every > 0 {
		ls.notifying--
		if st.every > 1 {
			ls.spaced--
		}
	}
	if !aborted { // (an abort's phases are for vLLM's finish, above)
		ls.acc.promptSeconds += o.PrefillTime.Seconds()
		ls.acc.decodeSeconds += o.DecodeTime.Seconds()
	}
	if aborted && reason == engine.FinishAbort {
		ls.acc.aborted++
	}
	if blockIDs != nil {
		s.grantLease(st, o.PromptTokens, blockIDs)
	}
	st.signal()
}

package emulator

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kvroute/kvroute/engine"
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
	metrics *metrics
	pub     *publisher // nil without KV events
	leases  leaseTable
	client  *http.Client // side-channel calls to prefill engines
	mux     *http.ServeMux
	start   time.Time
	created int64 // unix seconds, for response "created" fields

	inMu  sync.Mutex // protects inbox and stopped
	inbox []command
	// stopped is set when the loop has exited; later posts fail.
	stopped bool
	wake    chan struct{} // cap 1: the inbox is not empty
	done    chan struct{} // closed when the loop exits

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
)

type command struct {
	kind commandKind
	req  *engine.Request // cmdAdd
	st   *stream         // cmdAdd
	id   string          // cmdAbort, cmdRelease
	done chan bool       // cmdReset: the result
}

// New validates cfg, fills its defaults and builds the engine model.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ec := cfg.Engine
	ec.Speed = cfg.Speed
	ec.NoEvents = cfg.KVEvents.Endpoint == ""
	eng, err := engine.New(ec)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	if cfg.EngineID == "" {
		cfg.EngineID = newUUID()
	}
	s := &Server{
		cfg: cfg, prof: eng.Profile(), eng: eng,
		leases: leaseTable{m: map[string]*lease{}},
		client: &http.Client{
			Timeout: cfg.BootstrapWait + 11*time.Minute, // the wait, then at most 10 minutes of transfer
			Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute},
		},
		start: time.Now(), wake: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{}),
	}
	s.created = s.start.Unix()
	hashName := "xxh3"
	if ec.HashFunc != nil {
		hashName = ec.HashFunc.Name()
	}
	s.metrics, err = newMetrics(cfg.MetricsFlavor, cfg.Model, s.prof, hashName, s.start)
	if err != nil {
		return nil, err
	}
	st := eng.Stats()
	s.metrics.snap.Store(&snapshot{st: st})
	if cfg.KVEvents.Endpoint != "" {
		s.pub = newPublisher(cfg.KVEvents, cfg.Logger)
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.mux.HandleFunc("GET /metrics", s.handleMetrics)
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("POST /internal/kv/pull", s.handlePull)
	s.mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	s.mux.HandleFunc("POST /tokenize", s.handleTokenize)
	s.mux.HandleFunc("GET /version", s.handleVersion)
	s.mux.HandleFunc("/", s.handleNotFound)
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
func (s *Server) Handler() http.Handler { return s.mux }

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
		pub, router, err := s.pub.open(ctx)
		if err != nil {
			s.shutdown()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.pub.run(ctx, pub, router)
		}()
	}
	s.loop(ctx)
	s.shutdown()
	cancel()
	wg.Wait()
	s.client.CloseIdleConnections()
	return nil
}

// Close stops Run and waits for it to return. It is safe to call more than
// once, concurrently with Run, and without Run.
func (s *Server) Close() error {
	s.runMu.Lock()
	started, cancel := s.started, s.cancel
	s.closed = true
	s.runMu.Unlock()
	if !started {
		s.shutdown()
		return nil
	}
	cancel()
	<-s.exited
	return nil
}

// shutdown marks the loop stopped and fails what was still queued.
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
	for _, c := range inbox {
		if c.kind == cmdAdd {
			c.st.fail(ErrStopped)
		}
	}
	close(s.done)
}

// post queues a command for the engine loop. It fails after the loop
// stopped.
func (s *Server) post(c command) error {
	s.inMu.Lock()
	if s.stopped {
		s.inMu.Unlock()
		return ErrStopped
	}
	s.inbox = append(s.inbox, c)
	s.inMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
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

// loop is the engine goroutine: it owns s.eng.
func (s *Server) loop(ctx context.Context) {
	live := make(map[string]*stream)
	defer func() {
		for _, st := range live {
			st.fail(ErrStopped)
		}
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var (
		res     engine.StepResult
		inbox   []command
		evbuf   []byte
		vnow    time.Duration // the model's clock
		acc     snapshot      // accumulators for the snapshot
		tpStart time.Duration // gen throughput window
		tpToks  int64
		lastPub time.Duration // when the stats snapshot was last published
	)
	for {
		s.inMu.Lock()
		inbox, s.inbox = s.inbox, inbox[:0]
		s.inMu.Unlock()
		if real := s.now(); real-vnow > maxLag || len(inbox) > 0 && !s.eng.HasWork() {
			vnow = max(vnow, real)
		}
		flush := false // a reset's AllBlocksCleared event needs a step
		for i := range inbox {
			flush = s.apply(vnow, &inbox[i], live, &acc) || flush
			inbox[i] = command{}
		}
		if !s.eng.HasWork() && !flush {
			s.publishStats(&acc)
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		s.eng.StepInto(vnow, &res)
		end := vnow + res.Duration
		if d := end - s.now(); d >= minSleep {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		vnow = end
		// A request finishing this step wakes its handler in deliver: publish
		// the engine's state first, so that /metrics read after a response
		// is at least as new as the response (e.g. KV held by a P/D prefill).
		for i := range res.Outputs {
			if res.Outputs[i].Finished {
				s.publishStats(&acc)
				break
			}
		}
		s.deliver(&res, live, &acc)
		if s.pub != nil && len(res.Events) > 0 {
			var err error
			evbuf, err = EncodeEventBatch(evbuf[:0], s.cfg.KVEvents.Encoding, float64(time.Now().UnixNano())/1e9, res.Events)
			if err != nil {
				s.cfg.Logger.Error("kv events", "err", err)
			} else {
				s.pub.publish(bytes.Clone(evbuf))
			}
		}
		s.metrics.mu.Lock()
		s.metrics.onStep(&res)
		s.metrics.mu.Unlock()
		if vnow-tpStart >= time.Second {
			st := s.eng.Stats()
			acc.genThroughput = float64(st.GenerationTokens-tpToks) / (vnow - tpStart).Seconds()
			tpStart, tpToks = vnow, st.GenerationTokens
		}
		// Stats costs a walk over the live requests: publish at most every
		// statsEvery while busy (always when going idle, above).
		if vnow-lastPub >= statsEvery {
			s.publishStats(&acc)
			lastPub = vnow
		}
	}
}

func (s *Server) publishStats(acc *snapshot) {
	snap := *acc
	snap.st = s.eng.Stats()
	s.metrics.snap.Store(&snap)
}

// apply runs one queued command in the loop. It reports whether the loop
// must step even without requests (to publish a reset's event).
func (s *Server) apply(now time.Duration, c *command, live map[string]*stream, acc *snapshot) bool {
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
		acc.requests++
		live[c.req.ID] = c.st
		s.metrics.mu.Lock()
		s.metrics.onAdd(c.st.maxTokens)
		s.metrics.mu.Unlock()
		acc.maxContext = max(acc.maxContext, c.req.PromptLen+c.st.maxTokens)
	case cmdAbort:
		s.eng.Abort(now, c.id)
	case cmdRelease:
		s.eng.Release(c.id)
	case cmdReset:
		ok := s.eng.ResetPrefixCache()
		c.done <- ok
		return ok
	}
	return false
}

// deliver hands a step's outputs to their streams, waking the handlers of
// streaming requests and of finished ones.
func (s *Server) deliver(res *engine.StepResult, live map[string]*stream, acc *snapshot) {
	s.metrics.mu.Lock()
	defer s.metrics.mu.Unlock()
	for i := range res.Outputs {
		o := &res.Outputs[i]
		st := live[o.ID]
		if st == nil {
			continue
		}
		aborted := o.FinishReason == engine.FinishAbort
		var blockIDs []int
		if o.Finished && st.holdKV && !aborted {
			blockIDs = s.eng.BlockIDs(o.ID)
		}
		st.mu.Lock()
		if !aborted {
			st.generated++
			if !(o.Finished && o.FinishReason == engine.FinishStop) { // EOS has no text
				st.toks = append(st.toks, o.Token)
			}
		}
		if o.First {
			st.cachedTokens = o.CachedTokens
		}
		gen := st.generated
		reason := o.FinishReason
		if o.Finished {
			st.finished = true
			st.finishReason = o.FinishReason
			if st.stopString != "" {
				reason = engine.FinishStop
			}
			st.promptTokens = o.PromptTokens
			st.cachedTokens = o.CachedTokens
			st.blockIDs = blockIDs
		}
		st.mu.Unlock()
		s.metrics.onOutput(o, gen, reason)
		if o.Finished {
			delete(live, o.ID)
			acc.promptSeconds += o.PrefillTime.Seconds()
			acc.decodeSeconds += o.DecodeTime.Seconds()
			if aborted && reason == engine.FinishAbort {
				acc.aborted++
			}
			if blockIDs != nil {
				s.grantLease(st, o.PromptTokens, blockIDs)
			}
			st.signal()
		} else if st.notifyEach {
			st.signal()
		}
	}
}

package signals

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/zmqaddr"
	"github.com/kvroute/kvroute/kvindex"
)

// Sink receives one endpoint's block events; *kvindex.Index is the one the
// router uses.
type Sink interface {
	Store(endpoint string, s kvindex.Stored) (int, error)
	Evict(endpoint string, engineHashes []uint64, tier kvroute.Tier)
	Clear(endpoint string)
	Remove(endpoint string)
}

var _ Sink = (*kvindex.Index)(nil)

// SubscriberConfig configures one endpoint's KV-event subscription.
type SubscriberConfig struct {
	// Endpoint is the endpoint's ID: the name its blocks have in the Sink.
	Endpoint string
	// Address is the engine's ZMQ PUB address, e.g. tcp://10.0.0.7:5557
	// (vLLM --kv-events-config endpoint, with the host filled in).
	Address string
	// ReplayAddress is the engine's ZMQ ROUTER replay address, e.g.
	// tcp://10.0.0.7:5558; "" means no replay: a gap drops the endpoint's
	// entries (resync) instead.
	ReplayAddress string
	// Topic is the ZMQ topic to subscribe to; "" subscribes to all.
	Topic string
	// Listen binds Address instead of dialling it, for engines that connect
	// to the router (vLLM connects its PUB socket when its endpoint names a
	// host, e.g. tcp://router:5557, and binds when it has a "*"). An Address
	// with a "*" host (tcp://*:5557) implies Listen.
	Listen bool
	// Sink receives the blocks. Required.
	Sink Sink
	// NoCatchUp disables replaying the engine's buffered history at start
	// and after an engine restart (as soon as the connection is made, or at
	// the first batch seen when it is not seq 0).
	NoCatchUp bool
	// ReplayTimeout bounds one replay exchange, and one dial (the
	// connection and its ZMTP handshake); with Listen, it bounds an
	// engine's side of the ZMTP handshake on each connection it makes (a
	// peer that connects and stays silent is dropped then, and never holds
	// up another's connection); default 2s.
	ReplayTimeout time.Duration
	// MaxFrameSize bounds the ZMTP frames an engine may send, and its
	// multipart messages (the sum of their frames, each but the last
	// counting 32 bytes more): a connection whose peer announces more is
	// dropped before anything is allocated for it. It also bounds the
	// bytes of the messages a session reads ahead of their handling (at
	// most 64 messages; a larger one alone). 0 means DefaultMaxFrameSize
	// (64 MiB); at least 1024 otherwise.
	MaxFrameSize int64
	// MaxReplayBatches and MaxReplayBytes bound one replay answer, its
	// batches and the bytes of their payloads: an answer that grows past
	// either without its end marker (a broken or hostile peer streaming
	// batches) is dropped and the replay fails, as one that times out
	// does, instead of holding memory without bound until ReplayTimeout.
	// vLLM's answer holds at most its replay buffer, buffer_steps batches
	// (default 10000): raise MaxReplayBatches to the engine's buffer_steps
	// when that is larger (the config's kv_events.replay_buffer_steps). 0 means DefaultMaxReplayBatches (10000) and
	// DefaultMaxReplayBytes (512 MiB).
	MaxReplayBatches int
	MaxReplayBytes   int64
	// IdleReconnect re-dials the engine after this long without a batch, in
	// case the connection died silently (an engine restart); default 10s.
	// Not used with Listen.
	IdleReconnect time.Duration
	// DialRetry is the pause after a failed dial or a failed connection;
	// each further failure in a row multiplies it by 1.6, up to
	// MaxDialRetry, and every pause is randomised by ±20%, so that the
	// subscribers of engines that went down together (a fleet restart) do
	// not re-dial them in lockstep (gRPC's connection back-off). A
	// connection made resets it; an idle re-dial (IdleReconnect) does not
	// wait. Default 500ms.
	DialRetry time.Duration
	// MaxDialRetry caps the pause between failed dials (before its ±20%):
	// an engine that comes back is connected to, and checked for a
	// restart, at most about this long after. Default 5s, and at least
	// DialRetry.
	MaxDialRetry time.Duration
	// Logger receives warnings (gaps, resyncs, decode errors; a failing
	// connection once per failure streak, the dials that keep failing
	// after it at debug level; a subscription without replay that starts
	// after batches it cannot recover); nil discards.
	Logger *slog.Logger
	// DataParallel makes the subscription that of one data-parallel rank,
	// DataParallelRank, of an engine (vLLM --data-parallel-size, each rank
	// publishing on its own port): a batch whose data_parallel_rank names
	// another rank is not applied (its blocks are in another rank's cache)
	// but counted in SubscriberStatus.RankMismatches, and logged the first
	// time. Batches without a rank (older vLLM, SGLang) are applied.
	// Without DataParallel the rank is not checked.
	DataParallel     bool
	DataParallelRank int
}

func (c *SubscriberConfig) setDefaults() {
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.IdleReconnect <= 0 {
		c.IdleReconnect = 10 * time.Second
	}
	if c.DialRetry <= 0 {
		c.DialRetry = 500 * time.Millisecond
	}
	if c.MaxDialRetry <= 0 {
		c.MaxDialRetry = 5 * time.Second
	}
	c.MaxDialRetry = max(c.MaxDialRetry, c.DialRetry)
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = DefaultMaxFrameSize
	}
	if c.MaxReplayBatches == 0 {
		c.MaxReplayBatches = DefaultMaxReplayBatches
	}
	if c.MaxReplayBytes == 0 {
		c.MaxReplayBytes = DefaultMaxReplayBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first invalid field.
func (c *SubscriberConfig) Validate() error {
	switch {
	case c.Endpoint == "":
		return errors.New("subscriber: Endpoint is empty")
	case c.Sink == nil:
		return errors.New("subscriber: Sink is nil")
	case c.MaxFrameSize != 0 && c.MaxFrameSize < 1024:
		return fmt.Errorf("subscriber: MaxFrameSize %d is below 1024", c.MaxFrameSize)
	case c.MaxReplayBatches < 0:
		return fmt.Errorf("subscriber: MaxReplayBatches %d is negative", c.MaxReplayBatches)
	case c.MaxReplayBytes < 0:
		return fmt.Errorf("subscriber: MaxReplayBytes %d is negative", c.MaxReplayBytes)
	}
	if err := zmqaddr.Check(c.Address, c.Listen || strings.Contains(c.Address, "*")); err != nil {
		return fmt.Errorf("subscriber: Address: %w", err)
	}
	if c.ReplayAddress != "" {
		if err := zmqaddr.Check(c.ReplayAddress, false); err != nil {
			return fmt.Errorf("subscriber: ReplayAddress: %w", err)
		}
	}
	return nil
}

// SubscriberStatus reports a subscriber's progress.
type SubscriberStatus struct {
	// Connected is true while the socket is dialled (or listening).
	Connected bool
	// LastSeq is the last batch sequence number applied (-1 = none).
	LastSeq     int64
	LastBatchAt time.Time
	// Batches, Events and StoredBlocks count what was applied.
	Batches, Events, StoredBlocks uint64
	// Gaps counts missing sequence ranges; Replays the gaps filled by replay;
	// Resyncs the times the endpoint's entries were dropped (gap without
	// replay, failed replay, undecodable batch); Restarts the sequence
	// restarts (engine restarted); Reconnects the new connections (sessions)
	// after the first, each checked for an engine restart.
	Gaps, Replays, Resyncs, Restarts, Reconnects uint64
	// DecodeErrors counts undecodable batches; Orphans BlockStored events
	// whose parent was unknown, or without token ids (CPU offloading) naming
	// blocks never stored with them; StoreErrors other rejected events;
	// Skipped events of other KV cache groups and unknown types.
	DecodeErrors, Orphans, StoreErrors, Skipped uint64
	// RankMismatches counts the batches not applied because they named
	// another data-parallel rank (SubscriberConfig.DataParallel).
	RankMismatches uint64
	LastError      string
}

// Subscriber follows one engine's KV-cache events (vLLM's ZMQ publisher)
// and applies them to a Sink, keeping track of sequence numbers: a gap is
// filled from the engine's replay socket when there is one, otherwise (or
// when the replay cannot fill it) the endpoint's entries are dropped so the
// index never holds blocks the engine may have evicted. A sequence that goes
// back (the engine restarted) also drops them.
//
// A sequence number alone does not reveal every restart: batches a restarted
// engine publishes before the subscriber reconnects are lost, so its first
// batch seen may carry a number at or above the one expected from the old
// engine. So the first batch on every new connection (a new dialled session,
// or, when listening, after the engine's connection ended) is checked: with
// a replay socket the subscriber replays from the last batch it applied and
// compares that batch's bytes (payloads carry the engine's timestamp): the
// same engine keeps the entries (and fills any gap), another one has them
// dropped and its history caught up from seq 0. Without a replay socket a
// new connection cannot be verified and drops the endpoint's entries
// (resync), except after an idle re-dial when the sequence continues
// exactly. A dialled connection that follows a failed one is checked as
// soon as it is made, before any batch: a restarted engine publishes
// nothing until it serves a request, and its old entries would draw
// requests to a cache that is gone meanwhile. Likewise every connection an
// engine makes to a listening socket (tcp:// or ipc://) is checked as soon
// as its handshake is done, before any of its batches, or, before the
// first batch, has the engine's history caught up. A listening socket stays
// bound for all of Run so that a restarted engine can always connect back.
// Run owns the sockets.
type Subscriber struct {
	cfg SubscriberConfig

	// replay fetches batches [from, ...) from the engine; nil = no replay.
	// A field so that tests can count calls; set by NewSubscriber.
	replay func(ctx context.Context, from uint64) ([]replayed, error)
	// runSession runs one session (session); pause waits d, reporting false
	// if ctx is done first; retry computes the pauses between failed
	// sessions. Fields so that tests can fake sessions and record pauses;
	// set by NewSubscriber.
	runSession func(ctx context.Context) error
	pause      func(ctx context.Context, d time.Duration) bool
	retry      backoff

	dec   *EventDecoder
	batch EventBatch
	salts []uint64
	// group is the KV cache group whose events feed the Sink: 0 until a
	// BlockStored names a full-attention group (fullSeen), then the first
	// such group (see followGroup).
	group    int
	fullSeen bool
	// rankWarned is set once a batch of another data-parallel rank was
	// logged (SubscriberConfig.DataParallel).
	rankWarned bool

	started  bool
	next     uint64 // the sequence number expected next
	lastHash uint64 // xxh3 of the payload of batch next-1
	// fresh is set when a new connection may carry another engine (a new
	// dialled session, or a listening socket that lost a connection over
	// a transport that does not report new ones, inproc): the next batch
	// is checked against the engine's replay history, or forces a resync
	// without replay. A sequence number alone cannot tell: a
	// restarted engine may have published more batches than the old one
	// before the subscriber reconnects.
	fresh bool
	// idle is set when the last dialled session ended only because the
	// engine was silent for IdleReconnect (the connection itself never
	// failed): without replay, a first batch that continues the sequence
	// exactly is then taken as the same engine's.
	idle bool
	// lost is set when a dialled session ended any other way (the
	// connection failed, a dial failed): the engine may have restarted, so
	// the next connection is checked as soon as it is made, before any
	// batch (a restarted engine publishes nothing until it serves a
	// request, and the router would route to its lost cache meanwhile).
	lost bool
	// up is set once the current session's socket is connected (or
	// listening); failing while sessions end without one since the last
	// failure logged (Run logs a failure streak once).
	up, failing bool
	// dups holds the payload hashes of the batches a catch-up on connect
	// applied, by sequence number, until a batch past them arrives: the
	// same batches may also come on the SUB socket (published between the
	// connection and the replay) and are then skipped, not taken for a
	// restart.
	dups map[uint64]uint64

	// gate is the current session's read-ahead bound (tests look at it).
	gate atomic.Pointer[byteGate]

	mu sync.Mutex // guards st
	st SubscriberStatus
}

type replayed struct {
	seq     uint64
	payload []byte
}

// NewSubscriber validates cfg and returns a subscriber; Run starts it.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if strings.Contains(cfg.Address, "*") {
		cfg.Listen = true
	}
	s := &Subscriber{cfg: cfg, dec: NewEventDecoder()}
	s.st.LastSeq = -1
	s.runSession, s.pause = s.session, sleepCtx
	s.retry = backoff{base: cfg.DialRetry, max: cfg.MaxDialRetry, rnd: rand.Float64}
	if cfg.ReplayAddress != "" {
		s.replay = s.zmqReplay
	}
	return s, nil
}

// Status returns the subscriber's counters.
func (s *Subscriber) Status() SubscriberStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *Subscriber) update(fn func(st *SubscriberStatus)) {
	s.mu.Lock()
	fn(&s.st)
	s.mu.Unlock()
}

// Run subscribes and applies batches until ctx is done, re-dialling after
// connection failures (after a back-off: DialRetry growing to MaxDialRetry,
// with jitter) and long silences (at once). It returns nil when ctx is
// cancelled.
func (s *Subscriber) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := s.runSession(ctx)
		if ctx.Err() != nil {
			break
		}
		if s.up {
			// A connection was made: the engine is back, and its next
			// failure starts a new streak.
			s.retry.reset()
		}
		if err != nil {
			// An idle engine's session ends every IdleReconnect: routine,
			// not worth a warning. Nor is each dial of an engine that
			// stays down (every back-off pause) once the first failure is.
			lvl := slog.LevelWarn
			if s.up {
				s.failing = false
			}
			switch {
			case errors.Is(err, errIdle), s.failing:
				lvl = slog.LevelDebug
			default:
				s.failing = true
			}
			s.cfg.Logger.Log(ctx, lvl, "kv events: session ended", "endpoint", s.cfg.Endpoint, "address", s.cfg.Address, "err", err)
			s.update(func(st *SubscriberStatus) { st.LastError = err.Error() })
		}
		if errors.Is(err, errIdle) && !s.lost {
			// The connection was fine, only silent: re-dial at once, so
			// that few batches are published while no connection is
			// subscribed.
			s.idle = true
			continue
		}
		s.idle, s.lost = false, true
		s.pause(ctx, s.retry.next())
	}
	s.update(func(st *SubscriberStatus) { st.Connected = false })
	return nil
}

// Connection back-off (SubscriberConfig.DialRetry), as gRPC's
// (grpc/doc/connection-backoff.md): each failure in a row multiplies the
// pause by backoffFactor, and each pause is spread by ±backoffJitter.
const (
	backoffFactor = 1.6
	backoffJitter = 0.2
)

// backoff computes the pauses between a subscriber's failed sessions: the
// n-th failure in a row waits min(base*1.6^n, max), times a random factor
// in [0.8, 1.2). Not safe for concurrent use (Run's own).
type backoff struct {
	base, max time.Duration
	rnd       func() float64 // uniform in [0, 1): rand.Float64, or a test's
	n         int            // failures since the last reset
}

// next returns the pause after one more failure.
func (b *backoff) next() time.Duration {
	d := float64(b.base)
	for i := 0; i < b.n && d < float64(b.max); i++ {
		d *= backoffFactor
	}
	d = min(d, float64(b.max))
	b.n++
	return time.Duration(d * (1 + backoffJitter*(2*b.rnd()-1)))
}

// reset starts a new streak: the next pause is about base again.
func (b *backoff) reset() { b.n = 0 }

// sleepCtx waits d, and reports false if ctx is done first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type subMsg struct {
	frames [][]byte
	err    error
	size   int64 // framesSize(frames)
}

// framesSize is the bytes of a message's frames.
func framesSize(f [][]byte) int64 {
	var n int64
	for _, b := range f {
		n += int64(len(b))
	}
	return n
}

// byteGate bounds the bytes of the messages a session's reader has
// handed over and the session has not taken yet: acquire waits while
// they would go over limit, unless none are queued (a larger message
// passes alone). Safe for one acquiring and one releasing goroutine.
type byteGate struct {
	limit int64
	freed chan struct{} // signalled (capacity 1) when bytes are released

	mu      sync.Mutex // guards queued and waiting
	queued  int64
	waiting bool // acquire waits for bytes to be released
}

func newByteGate(limit int64) *byteGate {
	return &byteGate{limit: limit, freed: make(chan struct{}, 1)}
}

// acquire adds n bytes once they fit, and reports false if ctx is done
// first.
func (g *byteGate) acquire(ctx context.Context, n int64) bool {
	for {
		g.mu.Lock()
		g.waiting = g.queued > 0 && g.queued+n > g.limit
		if !g.waiting {
			g.queued += n
			g.mu.Unlock()
			return true
		}
		g.mu.Unlock()
		select {
		case <-g.freed:
		case <-ctx.Done():
			return false
		}
	}
}

// state returns the bytes queued and whether acquire is waiting.
func (g *byteGate) state() (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queued, g.waiting
}

// release takes n bytes acquired back.
func (g *byteGate) release(n int64) {
	g.mu.Lock()
	g.queued -= n
	g.mu.Unlock()
	select {
	case g.freed <- struct{}{}:
	default:
	}
}

// session runs one SUB connection until ctx is done, the connection fails
// or it stays silent for IdleReconnect.
func (s *Subscriber) session(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	s.up = false
	opts := zmtpOptions{maxFrame: uint64(s.cfg.MaxFrameSize), handshake: s.cfg.ReplayTimeout}
	if s.cfg.Listen {
		// Only publishers: zmq4 would reject any other peer after its
		// handshake, which would have passed for an engine's reconnection.
		opts.peerTypes = []string{"PUB", "XPUB"}
	}
	// connected receives a listening socket's new connections (over the
	// subscriber's own transports, tcp and ipc), each before any of its
	// messages; nil otherwise.
	var connected chan struct{}
	if _, own := ownAddr(s.cfg.Address); own && s.cfg.Listen {
		connected = make(chan struct{})
		opts.onHandshake = func() {
			select {
			case connected <- struct{}{}:
			case <-ctx.Done():
			}
		}
	}
	sub := zmq4.NewSub(withZMTPOptions(ctx, opts), zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout),
		zmq4.WithLogger(nilLogger))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if s.cfg.Listen {
		addr, _ := ownAddr(s.cfg.Address)
		if err := sub.Listen(addr); err != nil {
			return fmt.Errorf("listen %s: %w", s.cfg.Address, err)
		}
	} else if err := dialWithin(sub, s.cfg.Address, s.cfg.ReplayTimeout, cancel); err != nil || ctx.Err() != nil {
		if err == nil {
			err = errors.New("no handshake in time")
		}
		return fmt.Errorf("dial %s: %w", s.cfg.Address, err)
	}
	s.update(func(st *SubscriberStatus) { st.Connected = true })
	defer s.update(func(st *SubscriberStatus) { st.Connected = false })
	s.up = true
	if s.failing {
		s.cfg.Logger.Info("kv events: connected again", "endpoint", s.cfg.Endpoint, "address", s.cfg.Address)
	}
	if connected == nil {
		s.fresh = true // a new connection: maybe a new engine
		if s.lost && !s.cfg.Listen {
			s.lost = false
			if s.started {
				s.verify(ctx)
			}
		}
		if !s.started {
			s.catchUp(ctx)
		}
	}

	// The messages read ahead of their handling: at most 64, and
	// MaxFrameSize bytes (a larger message alone), not 64 of the largest
	// an engine may send (4 GiB by default).
	msgs := make(chan subMsg, 64)
	gate := newByteGate(s.cfg.MaxFrameSize)
	s.gate.Store(gate)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by this session: stops when ctx is cancelled below
		defer wg.Done()
		defer close(msgs)
		for {
			m, err := sub.Recv()
			if err != nil && ctx.Err() != nil {
				return
			}
			size := framesSize(m.Frames)
			if !gate.acquire(ctx, size) {
				return
			}
			select {
			case msgs <- subMsg{frames: m.Frames, err: err, size: size}:
			case <-ctx.Done():
				return
			}
			// A dialled socket has one connection: its error ends the
			// session. A listening socket reports the loss of one
			// connection and keeps accepting (the engine reconnects).
			if err != nil && !s.cfg.Listen {
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()

	// A dialled connection may die silently (engine restart); re-dial after
	// a long silence. A listening socket just waits for the engine.
	idle := time.NewTimer(s.cfg.IdleReconnect)
	defer idle.Stop()
	if s.cfg.Listen {
		idle.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-idle.C:
			return errIdle
		case <-connected:
			s.engineConnected(ctx)
		case m, ok := <-msgs:
			if !ok {
				return errors.New("receiver stopped")
			}
			gate.release(m.size)
			if m.err != nil {
				if !s.cfg.Listen {
					return fmt.Errorf("recv: %w", m.err)
				}
				// The engine's connection ended; keep the listening
				// socket bound so that the restarted engine can connect
				// (closing it would also drop a connection the new
				// engine already made). Its new connection is checked
				// when it is made; over a transport that does not
				// tell (inproc), the next batch is.
				s.cfg.Logger.Info("kv events: engine connection ended", "endpoint", s.cfg.Endpoint, "err", m.err)
				s.update(func(st *SubscriberStatus) { st.LastError = m.err.Error() })
				if connected == nil {
					s.fresh = true
				}
				continue
			}
			if !s.cfg.Listen {
				// (A listening socket has no idle timer: re-binding it
				// would drop the engine's connection.)
				idle.Reset(s.cfg.IdleReconnect)
			}
			seq, payload, err := splitFrames(m.frames)
			if err != nil {
				s.update(func(st *SubscriberStatus) { st.DecodeErrors++; st.LastError = err.Error() })
				continue
			}
			s.handle(ctx, seq, payload)
		}
	}
}

// errIdle ends a dialled session that saw no batch for IdleReconnect.
var errIdle = errors.New("idle: no batch, reconnecting")

// nilLogger silences zmq4's own log output.
var nilLogger = newDiscardLogger()

// splitFrames takes [topic, seq, payload] (or [seq, payload]) apart.
func splitFrames(f [][]byte) (uint64, []byte, error) {
	switch len(f) {
	case 3:
		f = f[1:]
	case 2:
	default:
		return 0, nil, fmt.Errorf("kv events: message of %d frames, want 3", len(f))
	}
	if len(f[0]) != 8 {
		return 0, nil, fmt.Errorf("kv events: sequence frame of %d bytes, want 8", len(f[0]))
	}
	return binary.BigEndian.Uint64(f[0]), f[1], nil
}

// handle applies the batch seq after checking the sequence.
func (s *Subscriber) handle(ctx context.Context, seq uint64, payload []byte) {
	if s.dups != nil {
		if h, ok := s.dups[seq]; ok && seq < s.next && h == xxh3.Hash(payload) {
			return // applied by the catch-up
		}
		if seq >= s.next {
			s.dups = nil
		}
	}
	fresh := s.fresh
	s.fresh = false
	switch {
	case !s.started:
		s.started = true
		switch {
		case seq == 0:
		case !s.cfg.NoCatchUp && s.replay != nil:
			s.fill(ctx, 0, seq, false)
		default:
			s.missedHistory(ctx, seq)
		}
	case fresh && seq >= s.next:
		s.reconnected(ctx, seq, s.idle)
	case seq == s.next:
	case seq > s.next:
		s.update(func(st *SubscriberStatus) { st.Gaps++ })
		s.cfg.Logger.Warn("kv events: gap", "endpoint", s.cfg.Endpoint, "want", s.next, "got", seq)
		if s.replay == nil || !s.fill(ctx, s.next, seq, true) {
			s.resync("gap without replay")
		}
	default: // seq < s.next: the engine restarted its sequence
		if fresh {
			s.update(func(st *SubscriberStatus) { st.Reconnects++ })
		}
		s.restarted(ctx, seq, "sequence went back")
	}
	s.apply(seq, payload)
}

// missedHistory logs that a subscription that cannot catch up (no replay
// socket, or NoCatchUp) starts at batch seq > 0: the seq batches the engine
// published before it are lost, and with them the blocks they stored and
// every block later stored on top of those (an orphan: its prefix is
// unknown), until the engine stores them again. Without a replay socket
// that is a warning (an operator can add one); with NoCatchUp, which asks
// for it, an info line.
func (s *Subscriber) missedHistory(ctx context.Context, seq uint64) {
	lvl, why := slog.LevelWarn, "no replay socket (set the endpoint's kv_events.replay_address to catch up)"
	if s.cfg.NoCatchUp && s.replay != nil {
		lvl, why = slog.LevelInfo, "catch-up disabled (NoCatchUp)"
	}
	s.cfg.Logger.Log(ctx, lvl, "kv events: batches published before the subscription are lost; their blocks, and blocks stored on top of them, stay unindexed",
		"endpoint", s.cfg.Endpoint, "address", s.cfg.Address, "missed", seq, "why", why)
}

// restarted drops the endpoint's entries and catches up with the new
// engine's history before batch seq.
func (s *Subscriber) restarted(ctx context.Context, seq uint64, why string) {
	s.dropRestarted(why, "want", s.next, "got", seq)
	if seq > 0 && !s.cfg.NoCatchUp && s.replay != nil {
		s.fill(ctx, 0, seq, false)
	}
}

// dropRestarted drops the entries of an engine found restarted, logging
// why (with attrs), and counts the restart after the drop, as resync
// counts: whoever sees Restarts move finds the entries gone.
func (s *Subscriber) dropRestarted(why string, attrs ...any) {
	s.cfg.Logger.Info("kv events: engine restarted, dropping its entries",
		append([]any{"endpoint", s.cfg.Endpoint, "why", why}, attrs...)...)
	s.cfg.Sink.Clear(s.cfg.Endpoint)
	s.update(func(st *SubscriberStatus) { st.Restarts++ })
}

// reconnected checks the first batch (seq >= next) of a new connection.
// The sequence number cannot tell a restarted engine that already
// published more batches than the old one from the old engine after a
// network blip, so it asks the engine's replay socket for the last batch
// applied (next-1): the same engine returns the same bytes (a payload
// carries the engine's timestamp), a restarted one a different batch or
// none. Then the gap [next, seq) is filled from the same answer. Without a
// replay socket nothing can be verified and the endpoint's entries are
// dropped (resync), unless the previous connection never failed and only
// went silent (idle) and seq continues its sequence exactly: an idle
// engine is re-dialled every IdleReconnect, and dropping its entries each
// time would empty the index of every engine that is idle for a while.
func (s *Subscriber) reconnected(ctx context.Context, seq uint64, idle bool) {
	s.update(func(st *SubscriberStatus) { st.Reconnects++ })
	if s.replay == nil {
		if idle && seq == s.next {
			return
		}
		s.resync("new connection without replay: the engine may have restarted")
		return
	}
	got, same, ok := s.replayLast(ctx)
	if !ok {
		return
	}
	if !same {
		s.restarted(ctx, seq, "new connection, the engine's history differs")
		return
	}
	if seq == s.next {
		return
	}
	s.update(func(st *SubscriberStatus) { st.Gaps++ })
	s.cfg.Logger.Warn("kv events: gap", "endpoint", s.cfg.Endpoint, "want", s.next, "got", seq)
	if !s.applyRange(got[1:], s.next, seq, true) {
		s.resync("gap, replay incomplete")
		return
	}
	s.update(func(st *SubscriberStatus) { st.Replays++ })
}

// replayLast asks the engine's replay socket for the history from the last
// batch applied (next-1, so the subscription has started) and reports
// whether the engine still has that batch byte for byte (the same engine;
// a payload carries the engine's timestamp). When the replay gets no
// answer it resyncs (the engine may have restarted) and reports !ok.
func (s *Subscriber) replayLast(ctx context.Context) (got []replayed, same, ok bool) {
	last := s.next - 1
	got, err := s.replayRetry(ctx, last)
	if err != nil {
		s.cfg.Logger.Warn("kv events: replay failed", "endpoint", s.cfg.Endpoint, "from", last, "err", err)
		s.update(func(st *SubscriberStatus) { st.LastError = err.Error() })
		s.resync("new connection, replay failed: the engine may have restarted")
		return nil, false, false
	}
	same = len(got) > 0 && got[0].seq == last && xxh3.Hash(got[0].payload) == s.lastHash
	return got, same, true
}

// verify checks a new dialled connection that follows a failed one, as
// soon as it is made: the engine may have restarted with an empty cache,
// and it publishes nothing until it serves a request, so waiting for its
// first batch would leave its old entries in the index, drawing requests
// to a cache that is gone. With a replay socket the last batch applied
// (next-1) is asked for: the same bytes mean the same engine (the batches
// after it in the answer, published while the connection was down, are
// applied at once: applyMissed); another batch or none means a
// restarted engine, whose entries are dropped and whose first batch is
// then taken as a new subscription's (catching up its history). Without
// replay, or when the replay gets no answer (a restarting engine may not
// have bound it yet), the entries are dropped (resync) as the first batch
// would have dropped them, and that batch catches up what the replay still
// buffers.
func (s *Subscriber) verify(ctx context.Context) {
	s.update(func(st *SubscriberStatus) { st.Reconnects++ })
	s.fresh = false
	if s.replay == nil {
		s.resync("new connection without replay: the engine may have restarted")
		s.started = false
		return
	}
	got, same, ok := s.replayLast(ctx)
	if !ok {
		s.started = false
		return
	}
	if same {
		s.applyMissed(got[1:])
		return
	}
	s.dropRestarted("new connection, the engine's history differs", "want", s.next-1)
	s.started = false
}

// applyMissed applies the batches a verified engine published while its
// connection was down (the replay after next-1): an engine that went idle
// meanwhile publishes nothing that would bring them, and the index would
// go on claiming the blocks it evicted. Their copies the new subscription
// may deliver are skipped (dups). A hole in them (the engine's buffer
// cannot have one) drops the endpoint's entries.
func (s *Subscriber) applyMissed(got []replayed) {
	if len(got) == 0 {
		return
	}
	s.dups = make(map[uint64]uint64, len(got))
	if !s.applyRange(got, s.next, got[len(got)-1].seq+1, true) {
		s.resync("new connection, replay incomplete")
		return
	}
	s.update(func(st *SubscriberStatus) { st.Replays++ })
}

// engineConnected handles an engine's new connection to the listening
// socket, as soon as its handshake is done and before any of its batches,
// as a dialled session handles its connection: any connection after the
// first may come from a restarted engine, whose cache is gone but which
// publishes nothing until it serves a request, so it is verified at once
// (see verify), not at its first batch; then, when nothing of the engine's
// is trusted (the first connection, or a restart found), its history is
// caught up.
func (s *Subscriber) engineConnected(ctx context.Context) {
	s.fresh = false
	if s.started {
		s.verify(ctx)
	}
	if !s.started {
		s.catchUp(ctx)
	}
}

// catchUp replays and applies the history the engine buffers as soon as a
// connection is made, before the subscription has seen a batch (the router
// started, or the engine restarted): an engine that is idle publishes
// nothing, and the cache it holds would stay unknown to the router until
// its next batch. When the replay fails or the history is empty, the first
// batch catches up instead.
func (s *Subscriber) catchUp(ctx context.Context) {
	if s.replay == nil || s.cfg.NoCatchUp {
		return
	}
	got, err := s.replayRetry(ctx, 0)
	if err != nil || len(got) == 0 {
		if err != nil {
			s.cfg.Logger.Warn("kv events: catch-up replay failed", "endpoint", s.cfg.Endpoint, "err", err)
			s.update(func(st *SubscriberStatus) { st.LastError = err.Error() })
		}
		return
	}
	s.started, s.fresh = true, false
	s.dups = make(map[uint64]uint64, len(got))
	s.applyRange(got, got[0].seq, math.MaxUint64, false) // what continues the sequence
	s.update(func(st *SubscriberStatus) { st.Replays++ })
}

// fill replays batches [from, to) and applies them. With strict, it
// reports false unless the replay covered the whole range in order.
func (s *Subscriber) fill(ctx context.Context, from, to uint64, strict bool) bool {
	got, err := s.replayRetry(ctx, from)
	if err != nil {
		s.cfg.Logger.Warn("kv events: replay failed", "endpoint", s.cfg.Endpoint, "from", from, "err", err)
		s.update(func(st *SubscriberStatus) { st.LastError = err.Error() })
		return false
	}
	if !s.applyRange(got, from, to, strict) {
		return false
	}
	s.update(func(st *SubscriberStatus) { st.Replays++ })
	return true
}

// replayRetry runs one replay exchange, each attempt bounded by
// ReplayTimeout, and tries once more on a new connection when the first
// attempt got no answer at all (a request or a connection lost in flight).
func (s *Subscriber) replayRetry(ctx context.Context, from uint64) ([]replayed, error) {
	var got []replayed
	err := ctx.Err()
	for attempt := 0; attempt < 2 && ctx.Err() == nil; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
		got, err = s.replay(rctx, from)
		cancel()
		if err == nil || len(got) > 0 || errors.Is(err, errReplayTooLong) {
			break // an answer, even a failed one: asking again would get the same
		}
		s.cfg.Logger.Warn("kv events: replay got no answer", "endpoint", s.cfg.Endpoint, "from", from,
			"attempt", attempt+1, "err", err)
	}
	return got, err
}

// applyRange applies the replayed batches in [from, to). With strict, it
// stops and reports false unless they cover the whole range in order.
// Without, it catches up: the engine's buffer may have lost its oldest
// batches, so the range may start later than from, but only the batches
// after the last hole are applied, and none unless they reach to-1 (when
// to is not math.MaxUint64, the batch that follows them): a hole (a batch
// the engine's ROUTER socket dropped at its high-water mark) may hold the
// BlockRemoved of blocks stored before it. Each batch applied is kept in
// dups, when set, so that the subscription's copy of it is skipped
// (handle).
func (s *Subscriber) applyRange(got []replayed, from, to uint64, strict bool) bool {
	if !strict {
		got = s.lastRun(got, from, to)
	}
	want := from
	for _, r := range got {
		if r.seq < want || r.seq >= to {
			continue
		}
		if r.seq != want {
			if strict {
				s.cfg.Logger.Warn("kv events: replay incomplete", "endpoint", s.cfg.Endpoint, "want", want, "got", r.seq)
				return false
			}
			// Catching up: older history fell out of the engine's buffer;
			// take what there is.
		}
		s.apply(r.seq, r.payload)
		if s.dups != nil {
			s.dups[r.seq] = s.lastHash
		}
		want = r.seq + 1
	}
	if strict && want != to {
		s.cfg.Logger.Warn("kv events: replay incomplete", "endpoint", s.cfg.Endpoint, "want", want, "to", to)
		return false
	}
	return true
}

// lastRun returns the batches of got from the start of the last run of
// consecutive sequence numbers in [from, to) on (earlier ones repeated in
// it are skipped by applyRange), or nil when there is none or, to being
// finite, it does not end at to-1.
func (s *Subscriber) lastRun(got []replayed, from, to uint64) []replayed {
	start := -1
	var prev uint64
	for i, r := range got {
		if r.seq < from || r.seq >= to || (start >= 0 && r.seq <= prev) {
			continue
		}
		if start < 0 || r.seq != prev+1 {
			if start >= 0 {
				s.cfg.Logger.Warn("kv events: hole in the replayed history, applying what follows it", "endpoint", s.cfg.Endpoint,
					"want", prev+1, "got", r.seq)
			}
			start = i
		}
		prev = r.seq
	}
	if start < 0 {
		return nil
	}
	if to != math.MaxUint64 && prev != to-1 {
		s.cfg.Logger.Warn("kv events: replayed history ends before the batch that follows it, not applied", "endpoint", s.cfg.Endpoint,
			"want", to-1, "got", prev)
		return nil
	}
	return got[start:]
}

func (s *Subscriber) resync(why string) {
	s.cfg.Logger.Warn("kv events: resync, dropping the endpoint's entries", "endpoint", s.cfg.Endpoint, "why", why)
	s.cfg.Sink.Clear(s.cfg.Endpoint)
	s.update(func(st *SubscriberStatus) { st.Resyncs++ })
}

// apply decodes one batch and hands its events to the sink.
func (s *Subscriber) apply(seq uint64, payload []byte) {
	s.next = seq + 1
	s.lastHash = xxh3.Hash(payload)
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		// The batch's changes are lost: the index can no longer be trusted.
		// The entries are dropped before the batch is published as seen,
		// so that whoever waits on LastSeq finds them gone.
		s.resync("undecodable batch")
		s.update(func(st *SubscriberStatus) { st.DecodeErrors++; st.LastError = err.Error(); st.LastSeq = int64(seq) })
		return
	}
	if b := &s.batch; s.cfg.DataParallel && b.HasDPRank && b.DPRank != s.cfg.DataParallelRank {
		// Another rank's blocks: applying them would send this rank the
		// prefixes another one holds. The sequence still moves on (this
		// stream's batches are all there), so no gap is seen.
		if !s.rankWarned {
			s.rankWarned = true
			s.cfg.Logger.Warn("kv events: batch of another data-parallel rank ignored (is the address the rank's, port + rank?)",
				"endpoint", s.cfg.Endpoint, "address", s.cfg.Address, "want_rank", s.cfg.DataParallelRank, "got_rank", b.DPRank)
		}
		now := time.Now()
		s.update(func(st *SubscriberStatus) {
			st.LastSeq, st.LastBatchAt = int64(seq), now
			st.RankMismatches++
			st.LastError = fmt.Sprintf("batch %d names data_parallel_rank %d, not %d", seq, b.DPRank, s.cfg.DataParallelRank)
		})
		return
	}
	var stored, orphans, storeErrs, skipped uint64
	var lastErr error
	s.followGroup(&s.batch)
	for i := range s.batch.Events {
		ev := &s.batch.Events[i]
		if ev.GroupIdx != s.group && ev.Kind != EventAllBlocksCleared {
			skipped++ // other KV cache groups (sliding window, mamba) do not decide prefix hits
			continue
		}
		switch ev.Kind {
		case EventBlockStored:
			n, err := s.cfg.Sink.Store(s.cfg.Endpoint, kvindex.Stored{
				BlockHashes: ev.BlockHashes, Parent: ev.Parent, HasParent: ev.HasParent,
				Tokens: ev.TokenIDs, BlockSize: ev.BlockSize, Tier: mediumTier(ev.Medium), Salts: s.saltsFor(ev),
			})
			stored += uint64(n)
			switch {
			case errors.Is(err, kvindex.ErrUnknownParent), errors.Is(err, kvindex.ErrUnknownBlocks):
				orphans++
			case err != nil:
				storeErrs++
				lastErr = err
			}
		case EventBlockRemoved:
			s.cfg.Sink.Evict(s.cfg.Endpoint, ev.BlockHashes, mediumTier(ev.Medium))
		case EventAllBlocksCleared:
			s.cfg.Sink.Clear(s.cfg.Endpoint)
		default:
			skipped++
		}
	}
	now := time.Now()
	s.update(func(st *SubscriberStatus) {
		st.LastSeq = int64(seq)
		st.LastBatchAt = now
		st.Batches++
		st.Events += uint64(len(s.batch.Events))
		st.StoredBlocks += stored
		st.Orphans += orphans
		st.StoreErrors += storeErrs
		st.Skipped += skipped
		if lastErr != nil {
			st.LastError = lastErr.Error()
		}
	})
}

// followGroup picks, from the BlockStored events of batch, the KV cache
// group whose events feed the Sink. A hybrid model (sliding-window or Mamba
// layers besides full attention: Gemma 3, GPT-OSS, Qwen3-Next ...) has one
// group per layer type, numbered in the order the model's layers first use
// each type, and vLLM publishes every group's blocks in the step's batch,
// BlockStored events naming their group's kind (kv_cache_spec_kind),
// BlockRemoved events only its index. The prefix a request can reuse is the
// full-attention group's (a sliding-window group frees the blocks outside
// its window early; a Mamba group has another block size), and group 0 is
// often another kind (Gemma 3's first layer is a sliding-window one). So
// the first full-attention group a BlockStored names is followed from its
// batch on; until one does (engines that send no kinds: older vLLM,
// SGLang; models without full attention), group 0. Were another group's
// entries taken before, they are dropped.
func (s *Subscriber) followGroup(batch *EventBatch) {
	if s.fullSeen {
		return
	}
	for i := range batch.Events {
		ev := &batch.Events[i]
		if ev.Kind != EventBlockStored || !fullAttention(ev.SpecKind) {
			continue
		}
		s.fullSeen = true
		if ev.GroupIdx != s.group {
			s.cfg.Logger.Info("kv events: following the full-attention KV cache group", "endpoint", s.cfg.Endpoint,
				"group", ev.GroupIdx, "kind", ev.SpecKind, "was", s.group)
			s.group = ev.GroupIdx
			s.cfg.Sink.Clear(s.cfg.Endpoint)
		}
		return
	}
}

// fullAttention reports whether a KV cache spec kind keeps every block of a
// prefix (vLLM's full_attention, mla_attention, sink_full_attention).
func fullAttention(kind string) bool {
	return kind == "full_attention" || kind == "mla_attention" || strings.HasSuffix(kind, "_full_attention")
}

// saltsFor returns per-block salts for blocks whose engine hash covers more
// than their tokens (LoRA adapter, cache salt, multimodal inputs), or nil.
//
// An event with extra_keys (vLLM since PR #33304) gives each block's
// whole extra-keys tuple, the adapter's name included ((lora_name,) on
// every block of an adapter's request, (lora_name, cache_salt) on its
// first), so those entries alone are the salts: each is the hash of its
// msgpack bytes, which for a LoRA block is kvindex.BlockKey(lora, salt),
// the key kvindex.HashTokensKeyed folds into the request's chain. Folding
// lora_name in as well gave an adapter's blocks keys no request matched.
// An older vLLM sends lora_name alone: every block's tuple is then
// (lora_name,) (its cache_salt, if any, is not reported, and such a first
// block is not matched). A bare lora_id (the deprecated integer) names no
// adapter a request can: it salts every block apart.
func (s *Subscriber) saltsFor(ev *KVEvent) []uint64 {
	if ev.ExtraKeys != nil {
		salted := false
		for _, k := range ev.ExtraKeys {
			salted = salted || k != 0
		}
		if !salted {
			return nil
		}
		s.salts = s.salts[:0]
		for i := range ev.BlockHashes {
			var salt uint64
			if i < len(ev.ExtraKeys) {
				salt = ev.ExtraKeys[i]
			}
			s.salts = append(s.salts, salt)
		}
		return s.salts
	}
	var salt uint64
	switch {
	case ev.LoRAName != "":
		salt = kvindex.BlockKey(ev.LoRAName, "")
	case ev.HasLoRAID:
		salt = xxh3.HashString(fmt.Sprintf("lora-id:%d", ev.LoRAID))
	default:
		return nil
	}
	s.salts = s.salts[:0]
	for range ev.BlockHashes {
		s.salts = append(s.salts, salt)
	}
	return s.salts
}

func mediumTier(m string) kvroute.Tier {
	switch strings.ToUpper(m) {
	case "", "GPU", "CUDA", "HBM":
		return kvroute.TierGPU
	}
	return kvroute.TierCPU
}

// endMarker is the replay's end-of-stream sequence number (-1 as int64).
const endMarker = ^uint64(0)

const (
	// DefaultMaxReplayBatches is the default
	// SubscriberConfig.MaxReplayBatches: vLLM's default replay buffer
	// (--kv-events-config buffer_steps), the most batches its answer holds.
	DefaultMaxReplayBatches = 10000
	// DefaultMaxReplayBytes is the default SubscriberConfig.MaxReplayBytes:
	// 512 MiB, DefaultMaxReplayBatches batches of about 50 KiB, what a
	// step that stores a chunked prefill of 8192 tokens publishes (the
	// buffer's decode steps publish far less).
	DefaultMaxReplayBytes = 512 << 20
)

// errReplayTooLong fails a replay answer over SubscriberConfig's
// MaxReplayBatches or MaxReplayBytes.
var errReplayTooLong = errors.New("answer too long")

// zmqReplay asks the engine's ROUTER replay socket for every buffered batch
// from seq from on: it sends ["", from] on a DEALER socket and reads
// ["", seq, payload] replies until the end marker seq -1 (a REQ socket
// would fail after the first reply). An answer over MaxReplayBatches
// batches or MaxReplayBytes bytes fails (errReplayTooLong), its batches
// dropped: the callers would apply no part of a failed answer.
func (s *Subscriber) zmqReplay(ctx context.Context, from uint64) ([]replayed, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := zmq4.NewDealer(withZMTPOptions(ctx, zmtpOptions{maxFrame: uint64(s.cfg.MaxFrameSize)}),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout), zmq4.WithLogger(nilLogger))
	defer d.Close()
	if err := dialWithin(d, s.cfg.ReplayAddress, s.cfg.ReplayTimeout, cancel); err != nil {
		return nil, fmt.Errorf("replay: dial %s: %w", s.cfg.ReplayAddress, err)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return nil, fmt.Errorf("replay: send: %w", err)
	}
	var out []replayed
	var size int64
	for {
		m, err := d.Recv()
		if err != nil {
			return out, fmt.Errorf("replay: recv after %d batches: %w", len(out), err)
		}
		f := m.Frames
		if len(f) == 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return out, fmt.Errorf("replay: reply of %d frames", len(m.Frames))
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == endMarker {
			return out, nil
		}
		size += int64(len(f[1]))
		switch {
		case len(out) == s.cfg.MaxReplayBatches:
			return nil, fmt.Errorf("replay: %w: more than %d batches without the end marker (is the engine's buffer_steps larger? set kv_events.replay_buffer_steps)",
				errReplayTooLong, s.cfg.MaxReplayBatches)
		case size > s.cfg.MaxReplayBytes:
			return nil, fmt.Errorf("replay: %w: more than %d bytes of batches without the end marker (MaxReplayBytes), after %d batches",
				errReplayTooLong, s.cfg.MaxReplayBytes, len(out))
		}
		out = append(out, replayed{seq: seq, payload: f[1]})
	}
}

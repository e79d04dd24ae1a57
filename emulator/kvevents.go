package emulator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/engine"
	"github.com/vmihailenco/msgpack/v5"
)

// KV-event encodings (--kv-events-encoding).
const (
	// EncodingArray is vLLM's positional form before PR #42892: every event
	// is an array with its type tag first.
	EncodingArray = "array"
	// EncodingMap is the current form: every event is a map with a "type"
	// key. The outer batch stays an array in both encodings.
	EncodingMap = "map"
)

// KVEventsConfig configures the KV-event publisher, as vLLM's
// --kv-events-config does. The zero value publishes nothing.
type KVEventsConfig struct {
	// Endpoint is the PUB socket's endpoint, e.g. tcp://*:5557. As in vLLM
	// the socket binds when the endpoint contains "*" or "::" or is ipc://
	// or inproc://, and connects otherwise (then the subscriber binds).
	// Empty disables events.
	Endpoint string
	// ReplayEndpoint is the ROUTER socket's endpoint (always bound), e.g.
	// tcp://127.0.0.1:5558. Empty disables replay.
	ReplayEndpoint string
	// Topic is the first frame of every message; default "" (vLLM's).
	Topic string
	// Encoding is EncodingArray (default) or EncodingMap.
	Encoding string
	// BufferSteps is how many batches the replay buffer keeps; default
	// 10000.
	BufferSteps int
	// MaxQueue bounds batches waiting to be sent (vLLM's max_queue_size);
	// beyond it batches are dropped, counted and logged, before they get a
	// sequence number, so no subscriber sees them missing (vLLM's engine
	// blocks instead). Default 100000.
	MaxQueue int
}

func (c *KVEventsConfig) setDefaults() {
	if c.Encoding == "" {
		c.Encoding = EncodingArray
	}
	if c.BufferSteps == 0 {
		c.BufferSteps = 10000
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 100000
	}
}

func (c *KVEventsConfig) validate() error {
	if c.Encoding != EncodingArray && c.Encoding != EncodingMap {
		return fmt.Errorf("emulator: KVEvents.Encoding %q is not array or map", c.Encoding)
	}
	if c.BufferSteps < 0 || c.MaxQueue < 0 {
		return fmt.Errorf("emulator: KVEvents.BufferSteps and MaxQueue must not be negative")
	}
	if c.Endpoint == "" && c.ReplayEndpoint != "" {
		return fmt.Errorf("emulator: KVEvents.ReplayEndpoint needs KVEvents.Endpoint")
	}
	return nil
}

// offsetEndpoint is endpoint moved to data parallel rank rank as vLLM's
// ZmqEventPublisher.offset_endpoint_port moves it (for the PUB and the
// replay endpoint alike): unchanged for rank 0 or an empty endpoint; an
// endpoint containing "inproc" gets the suffix _dp<rank>; one containing
// "tcp" and a colon gets its port (after the last colon) plus rank; any
// other (ipc://) is an error, as in vLLM.
func offsetEndpoint(endpoint string, rank int) (string, error) {
	switch {
	case endpoint == "" || rank == 0:
		return endpoint, nil
	case strings.Contains(endpoint, "inproc"):
		return endpoint + "_dp" + strconv.Itoa(rank), nil
	case strings.Contains(endpoint, "tcp"):
		i := strings.LastIndexByte(endpoint, ':')
		if i < 0 {
			return endpoint, nil
		}
		port, err := strconv.Atoi(endpoint[i+1:])
		if err != nil {
			return "", fmt.Errorf("emulator: KVEvents endpoint %q: no port to offset by data parallel rank %d", endpoint, rank)
		}
		return endpoint[:i+1] + strconv.Itoa(port+rank), nil
	}
	return "", fmt.Errorf("emulator: KVEvents endpoint %q: data parallel rank %d needs a tcp or inproc endpoint (vLLM: \"Invalid endpoint: must contain 'inproc' or 'tcp'\")", endpoint, rank)
}

// shouldBind reports whether vLLM binds (rather than connects) the PUB
// socket for endpoint.
func shouldBind(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// EncodeEventBatch appends the msgpack form of one EventBatch to dst, as
// vLLM's msgspec encoder writes it: [ts, [events...], data_parallel_rank],
// each event positional (EncodingArray) or a map (EncodingMap), with
// trailing default-valued fields omitted as omit_defaults does.
func EncodeEventBatch(dst []byte, encoding string, ts float64, events []engine.KVEvent) ([]byte, error) {
	return EncodeEventBatchRank(dst, encoding, ts, 0, events)
}

// EncodeEventBatchRank is EncodeEventBatch for the engine core of data
// parallel rank rank: the batch's data_parallel_rank is rank, as vLLM's
// ZmqEventPublisher sets it to its own rank.
func EncodeEventBatchRank(dst []byte, encoding string, ts float64, rank int, events []engine.KVEvent) ([]byte, error) {
	return encodeEventBatch(dst, encoding, ts, rank, events, nil)
}

// encodeEventBatch is EncodeEventBatchRank with the lora_id of an adapter's
// BlockStored from loraID (nil: every lora_id is None).
func encodeEventBatch(dst []byte, encoding string, ts float64, rank int, events []engine.KVEvent, loraID func(string) int) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	if err := encodeBatch(enc, encoding == EncodingMap, ts, rank, events, loraID); err != nil {
		return dst, fmt.Errorf("emulator: encode kv events: %w", err)
	}
	return buf.Bytes(), nil
}

// encodeBatch writes one batch. A BlockRemoved of several hashes (the
// engine reports an allocation's evictions together) goes out as one event
// per hash, as vLLM's BlockPool emits one per evicted block
// (_maybe_evict_cached_block).
func encodeBatch(enc *msgpack.Encoder, asMap bool, ts float64, rank int, events []engine.KVEvent, loraID func(string) int) error {
	_ = enc.EncodeArrayLen(3)
	_ = enc.EncodeFloat64(ts)
	n := 0
	for i := range events {
		if ev := &events[i]; ev.Kind == engine.BlockRemoved && len(ev.BlockHashes) > 1 {
			n += len(ev.BlockHashes)
		} else {
			n++
		}
	}
	_ = enc.EncodeArrayLen(n)
	for i := range events {
		ev := &events[i]
		if ev.Kind == engine.BlockRemoved && len(ev.BlockHashes) > 1 {
			one := *ev
			for k := range ev.BlockHashes {
				one.BlockHashes = ev.BlockHashes[k : k+1]
				if err := encodeEvent(enc, asMap, &one, 0); err != nil {
					return err
				}
			}
			continue
		}
		id := 0
		if ev.LoRA != "" && loraID != nil {
			id = loraID(ev.LoRA)
		}
		if err := encodeEvent(enc, asMap, ev, id); err != nil {
			return err
		}
	}
	return enc.EncodeInt(int64(rank)) // data_parallel_rank
}

func encodeHashes(enc *msgpack.Encoder, hs []uint64) {
	_ = enc.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = enc.EncodeUint(h)
	}
}

// encodeEvent writes one event; loraID is the lora_id of an adapter's
// BlockStored (0: None).
func encodeEvent(enc *msgpack.Encoder, asMap bool, ev *engine.KVEvent, loraID int) error {
	medium := ev.Medium
	if medium == "" {
		medium = engine.MediumGPU
	}
	key := func(k string) {
		if asMap {
			_ = enc.EncodeString(k)
		}
	}
	switch ev.Kind {
	case engine.BlockStored:
		// Fields: block_hashes, parent_block_hash, token_ids, block_size,
		// lora_id, medium, lora_name (required, so always present), then
		// extra_keys, group_idx and kv_cache_spec_kind in the map form
		// (vLLM >= 0.26 sets them; kv_cache_spec_sliding_window is None,
		// omitted); in the array form extra_keys only for a salted first
		// block or an adapter's blocks (omit_defaults leaves out the
		// default None). An adapter's blocks have its lora_id and
		// lora_name (vLLM's BlockPool.cache_full_blocks), and each its
		// extra_keys entry: (lora_name,), the first of a salted prompt
		// (lora_name, cache_salt).
		extra := ev.Salt != "" || ev.LoRA != ""
		switch {
		case asMap:
			_ = enc.EncodeMapLen(11)
		case extra:
			_ = enc.EncodeArrayLen(9) // extra_keys too: not its default
		default:
			_ = enc.EncodeArrayLen(8)
		}
		key("type")
		_ = enc.EncodeString("BlockStored")
		key("block_hashes")
		encodeHashes(enc, ev.BlockHashes)
		key("parent_block_hash")
		if ev.ParentHash == nil {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeUint(*ev.ParentHash)
		}
		key("token_ids")
		_ = enc.EncodeArrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			_ = enc.EncodeUint(uint64(t))
		}
		key("block_size")
		_ = enc.EncodeInt(int64(ev.BlockSize))
		key("lora_id")
		if ev.LoRA != "" && loraID != 0 {
			_ = enc.EncodeInt(int64(loraID))
		} else {
			_ = enc.EncodeNil()
		}
		key("medium")
		_ = enc.EncodeString(medium)
		key("lora_name")
		if ev.LoRA != "" {
			_ = enc.EncodeString(ev.LoRA)
		} else {
			_ = enc.EncodeNil()
		}
		if asMap || extra {
			// One entry per block: the tuple of the adapter's name and,
			// on a salted first block, the cache_salt; None for a block
			// with neither.
			key("extra_keys")
			_ = enc.EncodeArrayLen(len(ev.BlockHashes))
			for i := range ev.BlockHashes {
				salt := ""
				if i == 0 {
					salt = ev.Salt
				}
				switch {
				case ev.LoRA != "" && salt != "":
					_ = enc.EncodeArrayLen(2)
					_ = enc.EncodeString(ev.LoRA)
					_ = enc.EncodeString(salt)
				case ev.LoRA != "" || salt != "":
					_ = enc.EncodeArrayLen(1)
					_ = enc.EncodeString(ev.LoRA + salt)
				default:
					_ = enc.EncodeNil()
				}
			}
		}
		if asMap {
			key("group_idx")
			_ = enc.EncodeInt(0)
			key("kv_cache_spec_kind")
			_ = enc.EncodeString("full_attention")
		}
	case engine.BlockRemoved:
		if asMap {
			_ = enc.EncodeMapLen(4)
		} else {
			_ = enc.EncodeArrayLen(3)
		}
		key("type")
		_ = enc.EncodeString("BlockRemoved")
		key("block_hashes")
		encodeHashes(enc, ev.BlockHashes)
		key("medium")
		_ = enc.EncodeString(medium)
		if asMap {
			key("group_idx")
			_ = enc.EncodeInt(0)
		}
	case engine.AllBlocksCleared:
		if asMap {
			_ = enc.EncodeMapLen(1)
		} else {
			_ = enc.EncodeArrayLen(1)
		}
		key("type")
		_ = enc.EncodeString("AllBlocksCleared")
	default:
		return fmt.Errorf("unknown event kind %v", ev.Kind)
	}
	return nil
}

// A BindError is New's error when a KV-event socket cannot be bound (its
// address is in use, say).
type BindError struct {
	// Endpoint is the endpoint that could not be bound (offset by the data
	// parallel rank).
	Endpoint string
	// Replay is set for the replay (ROUTER) socket, clear for the PUB one.
	Replay bool
	Err    error
}

func (e *BindError) Error() string {
	name := "kv events"
	if e.Replay {
		name = "kv events replay"
	}
	return fmt.Sprintf("emulator: %s: bind %s: %v", name, e.Endpoint, e.Err)
}

func (e *BindError) Unwrap() error { return e.Err }

// bindError is a BindError for zmq4's listen error err (which names the
// endpoint already: only its cause is kept).
func bindError(endpoint string, replay bool, err error) *BindError {
	if inner := errors.Unwrap(err); inner != nil {
		err = inner
	}
	return &BindError{Endpoint: endpoint, Replay: replay, Err: err}
}

// publisher sends KV-event batches on a ZMQ PUB socket and answers replay
// requests on a ROUTER socket. open binds the sockets (Server.New calls it,
// so they are bound before the engine serves); the engine loop hands it
// batches with publish; run sends them until its context is done and then
// closes the sockets, as close does when run never runs.
type publisher struct {
	cfg KVEventsConfig
	log *slog.Logger

	// Set by open. stop ends the sockets' context (and a PUB socket's
	// dial, which dialing waits for); closeOnce makes close run once.
	sock, router zmq4.Socket // router is nil without replay
	stop         context.CancelFunc
	dialing      sync.WaitGroup
	closeOnce    sync.Once

	// The encoded batches from the engine loop wait in queue (at most
	// cfg.MaxQueue, grown as needed rather than allocated at that size);
	// wake tells run there are some.
	qmu     sync.Mutex
	queue   [][]byte
	spare   [][]byte // run's last batch of the queue, reused
	dropped int64
	wake    chan struct{}

	mu   sync.Mutex // protects ring, next
	ring [][]byte   // ring[seq % len] = payload of batch seq
	next uint64     // seq of the next batch
}

func newPublisher(cfg KVEventsConfig, log *slog.Logger) *publisher {
	return &publisher{cfg: cfg, log: log, wake: make(chan struct{}, 1), ring: make([][]byte, max(cfg.BufferSteps, 1))}
}

// publish queues one encoded batch (see EncodeEventBatch) without
// blocking; payload must not be modified afterwards.
func (p *publisher) publish(payload []byte) {
	p.qmu.Lock()
	full := len(p.queue) >= p.cfg.MaxQueue
	if full {
		p.dropped++
	} else {
		p.queue = append(p.queue, payload)
	}
	n := p.dropped
	p.qmu.Unlock()
	if full {
		if n == 1 || n%1000 == 0 {
			p.log.Warn("kv events: queue full, batch dropped", "dropped", n, "max_queue", p.cfg.MaxQueue)
		}
		return
	}
	select {
	case p.wake <- struct{}{}:
	default: // run has been told
	}
}

// take returns the queued batches, in order, and empties the queue.
func (p *publisher) take() [][]byte {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	q := p.queue
	clear(p.spare)
	p.queue, p.spare = p.spare[:0], q
	return q
}

// open creates the sockets and binds them (a *BindError when it cannot),
// or, for a PUB endpoint that connects, starts connecting it in the
// background, retried like libzmq until close. On success close must be
// called (run calls it when it ends).
func (p *publisher) open() error {
	ctx, cancel := context.WithCancel(context.Background())
	var pub, router zmq4.Socket
	if shouldBind(p.cfg.Endpoint) {
		pub = zmq4.NewPub(ctx)
		if err := pub.Listen(p.cfg.Endpoint); err != nil {
			cancel()
			pub.Close()
			return bindError(p.cfg.Endpoint, false, err)
		}
	} else {
		// Connect like libzmq: retry until the subscriber is up, and
		// reconnect when it goes away (a bound socket must not: zmq4
		// would dial its own endpoint).
		pub = zmq4.NewPub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(250*time.Millisecond),
			zmq4.WithAutomaticReconnect(true))
	}
	if p.cfg.ReplayEndpoint != "" {
		router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("kvroute-replay")))
		if err := router.Listen(p.cfg.ReplayEndpoint); err != nil {
			cancel()
			pub.Close()
			router.Close()
			return bindError(p.cfg.ReplayEndpoint, true, err)
		}
	}
	p.sock, p.router, p.stop = pub, router, cancel
	if !shouldBind(p.cfg.Endpoint) {
		p.dialing.Go(func() {
			if err := pub.Dial(p.cfg.Endpoint); err != nil && ctx.Err() == nil {
				p.log.Warn("kv events: connect failed", "endpoint", p.cfg.Endpoint, "err", err)
			}
		})
	}
	return nil
}

// close closes the sockets open made and waits for the PUB socket's dial.
// It is safe to call more than once.
func (p *publisher) close() {
	p.closeOnce.Do(func() {
		p.stop()
		p.sock.Close()
		if p.router != nil {
			p.router.Close()
		}
		p.dialing.Wait()
	})
}

// run publishes until ctx is done, then closes the sockets (close) and
// waits for its goroutines before returning.
func (p *publisher) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if p.router != nil {
		wg.Go(func() { p.serveReplay(ctx, p.router) })
	}
	topic := []byte(p.cfg.Topic)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-p.wake:
			for _, payload := range p.take() {
				p.mu.Lock()
				seq := p.next
				p.next++
				p.ring[seq%uint64(len(p.ring))] = payload
				p.mu.Unlock()
				var seqb [8]byte
				binary.BigEndian.PutUint64(seqb[:], seq)
				if err := p.sock.Send(zmq4.NewMsgFrom(topic, seqb[:], payload)); err != nil && ctx.Err() == nil {
					p.log.Debug("kv events: send", "err", err)
				}
			}
		}
	}
	cancel()
	p.close() // ends serveReplay's Recv
	wg.Wait()
}

// serveReplay answers [id, "", start_seq] with every buffered batch from
// start_seq on, then the end marker (seq -1, empty payload).
func (p *publisher) serveReplay(ctx context.Context, router zmq4.Socket) {
	end := bytes.Repeat([]byte{0xff}, 8)
	for ctx.Err() == nil {
		msg, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var replies [][]byte // seq/payload pairs
		n := uint64(len(p.ring))
		first := uint64(0)
		if p.next > n {
			first = p.next - n
		}
		for seq := max(start, first); seq < p.next; seq++ {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], seq)
			replies = append(replies, sb[:], p.ring[seq%n])
		}
		p.mu.Unlock()
		for i := 0; i < len(replies); i += 2 {
			if err := router.Send(zmq4.NewMsgFrom(id, nil, replies[i], replies[i+1])); err != nil {
				break
			}
		}
		_ = router.Send(zmq4.NewMsgFrom(id, nil, end, nil))
	}
}

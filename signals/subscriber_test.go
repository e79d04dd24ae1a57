package signals

import (
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
)

const testTopic = "kv-events"

// fakeEngine publishes KV events like vLLM's ZmqEventPublisher: a PUB
// socket sending [topic, seq, payload] and a ROUTER replay socket that
// answers [id, "", start] with every buffered batch from start on and the
// -1 end marker.
type fakeEngine struct {
	t          *testing.T
	pub, route zmq4.Socket
	pubAddr    string
	replayAddr string
	enc        EventEncoding
	dpRank     int  // the data_parallel_rank its batches carry
	noRank     bool // its batches carry no data_parallel_rank (older vLLM, SGLang)
	// endless makes its replay answer a broken peer's: its buffer's
	// batches again and again, numbered on from the start asked for,
	// without ever the end marker. Set before a replay is asked for.
	endless bool

	mu      sync.Mutex
	seq     uint64
	buf     []replayed
	replays int

	ctx       context.Context // cancelled by close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

func newFakeEngine(t *testing.T, withReplay bool, enc EventEncoding) *fakeEngine {
	t.Helper()
	replayAddr := ""
	if withReplay {
		replayAddr = "tcp://127.0.0.1:0"
	}
	return newFakeEngineAt(t, "tcp://127.0.0.1:0", replayAddr, enc)
}

// newFakeEngineAt binds the PUB socket to pubAddr and, unless replayAddr is
// "", the replay socket to replayAddr: a restarted engine binds the
// addresses of the old one.
func newFakeEngineAt(t *testing.T, pubAddr, replayAddr string, enc EventEncoding) *fakeEngine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &fakeEngine{t: t, enc: enc, ctx: ctx, cancel: cancel}
	e.pub = zmq4.NewPub(ctx, zmq4.WithLogger(newDiscardLogger()))
	if err := e.pub.Listen(pubAddr); err != nil {
		t.Fatal(err)
	}
	e.pubAddr = "tcp://" + e.pub.Addr().String()
	if replayAddr != "" {
		e.route = zmq4.NewRouter(ctx, zmq4.WithLogger(newDiscardLogger()))
		if err := e.route.Listen(replayAddr); err != nil {
			t.Fatal(err)
		}
		e.replayAddr = "tcp://" + e.route.Addr().String()
		e.wg.Add(1)
		go e.serveReplay()
	}
	t.Cleanup(e.close)
	return e
}

func (e *fakeEngine) close() {
	e.closeOnce.Do(func() {
		e.cancel()
		e.pub.Close()
		if e.route != nil {
			e.route.Close()
		}
		e.wg.Wait()
	})
}

// serveReplay answers replay requests until the engine is closed. Like
// vLLM's (and the emulator's), it outlives a failed receive or send: zmq4's
// ROUTER reports a peer that hung up (an earlier replay's DEALER) as a
// receive error, and a fake that stopped there left later replays
// unanswered.
func (e *fakeEngine) serveReplay() {
	defer e.wg.Done()
	stopEndless := func() {}
	defer func() { stopEndless() }()
	for e.ctx.Err() == nil {
		m, err := e.route.Recv()
		// A new request, or the last one's DEALER hung up (zmq4's ROUTER
		// reports it as an error; its sends to a peer gone succeed).
		stopEndless()
		stopEndless = func() {}
		if err != nil {
			continue
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue // vLLM ignores malformed requests
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		e.mu.Lock()
		e.replays++
		buf := slices.Clone(e.buf)
		e.mu.Unlock()
		if e.endless {
			ctx, cancel := context.WithCancel(e.ctx)
			done := make(chan struct{})
			go func() { // owned by this loop: stopped at the next receive or its end
				defer close(done)
				e.serveEndless(ctx, id, start, buf)
			}()
			stopEndless = func() { cancel(); <-done }
			continue
		}
		for _, r := range buf {
			if r.seq >= start {
				if err := e.route.Send(zmq4.NewMsgFrom(id, []byte{}, be64(r.seq), r.payload)); err != nil {
					break
				}
			}
		}
		_ = e.route.Send(zmq4.NewMsgFrom(id, []byte{}, be64(endMarker), []byte{}))
	}
}

// serveEndless answers one replay request without an end, until ctx is
// done or a send fails.
func (e *fakeEngine) serveEndless(ctx context.Context, id []byte, start uint64, buf []replayed) {
	if len(buf) == 0 {
		return
	}
	for seq := start; ctx.Err() == nil; seq++ {
		if err := e.route.Send(zmq4.NewMsgFrom(id, []byte{}, be64(seq), buf[int(seq-start)%len(buf)].payload)); err != nil {
			return
		}
	}
}

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

// publish sends one batch with the next sequence number; with drop the
// batch is only buffered for replay (lost on the PUB socket).
func (e *fakeEngine) publish(drop bool, events ...KVEvent) uint64 {
	e.t.Helper()
	// Like vLLM's time.time(): batches of two engines differ.
	b := EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events, DPRank: e.dpRank, HasDPRank: !e.noRank}
	p, err := EncodeEventBatch(nil, &b, e.enc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	seq := e.seq
	e.seq++
	e.buf = append(e.buf, replayed{seq: seq, payload: p})
	e.mu.Unlock()
	if !drop {
		if err := e.pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(seq), p)); err != nil {
			e.t.Fatal(err)
		}
	}
	return seq
}

// replayCount returns the replay requests the engine has answered (or
// begun to: its buffer is taken when a request arrives).
func (e *fakeEngine) replayCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.replays
}

// restart resets the sequence and the replay buffer.
func (e *fakeEngine) restart() {
	e.mu.Lock()
	e.seq = 0
	e.buf = nil
	e.mu.Unlock()
}

func (e *fakeEngine) waitSubscribed() {
	e.t.Helper()
	tp, ok := e.pub.(interface{ Topics() []string })
	if !ok {
		e.t.Fatal("zmq4 PUB socket has no Topics method")
	}
	waitFor(e.t, "subscription", func() bool { return slices.Contains(tp.Topics(), testTopic) })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// prompt is 6 blocks of 4 tokens; stored cuts it into BlockStored events
// with engine hashes 1000+i.
var prompt = promptFrom(10)

// promptFrom returns a prompt of 6 blocks of 4 tokens counting up from
// first.
func promptFrom(first uint32) []uint32 {
	p := make([]uint32, 24)
	for i := range p {
		p[i] = first + uint32(i)
	}
	return p
}

// stored is the BlockStored event of blocks from to to (exclusive) of
// prompt.
func stored(from, to int) KVEvent { return storedOf(prompt, 1000, from, to) }

// storedOf is the BlockStored event of blocks from to to (exclusive) of p,
// block i with engine hash base+i.
func storedOf(p []uint32, base uint64, from, to int) KVEvent {
	ev := KVEvent{Kind: EventBlockStored, BlockSize: 4, Medium: "GPU", TokenIDs: p[from*4 : to*4]}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, base+uint64(i))
	}
	if from > 0 {
		ev.Parent, ev.HasParent = base+uint64(from-1), true
	}
	return ev
}

func removed(blocks ...int) KVEvent {
	ev := KVEvent{Kind: EventBlockRemoved, Medium: "GPU"}
	for _, b := range blocks {
		ev.BlockHashes = append(ev.BlockHashes, uint64(1000+b))
	}
	return ev
}

type harness struct {
	eng *fakeEngine
	idx *kvindex.Index
	sub *Subscriber
	ctx context.Context
}

func startSub(t *testing.T, eng *fakeEngine, mutate func(*SubscriberConfig)) *harness {
	t.Helper()
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	cfg := SubscriberConfig{Endpoint: "e1", Address: eng.pubAddr, ReplayAddress: eng.replayAddr, Topic: testTopic, Sink: idx}
	sub, ctx := runSubscriber(t, cfg, mutate)
	eng.waitSubscribed()
	return &harness{eng: eng, idx: idx, sub: sub, ctx: ctx}
}

// runSubscriber runs a Subscriber of cfg (changed by mutate, if not nil)
// until the test ends, and returns it with the context it runs under.
func runSubscriber(t *testing.T, cfg SubscriberConfig, mutate func(*SubscriberConfig)) (*Subscriber, context.Context) {
	t.Helper()
	if mutate != nil {
		mutate(&cfg)
	}
	sub, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return sub, ctx
}

func (h *harness) waitSeq(t *testing.T, seq int64) SubscriberStatus {
	t.Helper()
	waitFor(t, fmt.Sprintf("seq %d", seq), func() bool { return h.sub.Status().LastSeq == seq })
	return h.sub.Status()
}

func (h *harness) matched(t *testing.T) int {
	t.Helper()
	hits := h.idx.Match(kvindex.HashTokens(prompt, 4, nil), nil)
	if len(hits) == 0 {
		return 0
	}
	if len(hits) != 1 || hits[0].Endpoint != "e1" {
		t.Fatalf("hits %+v", hits)
	}
	return hits[0].Blocks
}

func TestSubscriberInOrder(t *testing.T) {
	for _, enc := range []EventEncoding{{}, {MapEvents: true}, {BytesHashes: true}} {
		t.Run(fmt.Sprintf("%+v", enc), func(t *testing.T) {
			h := startSub(t, newFakeEngine(t, true, enc), nil)
			h.eng.publish(false, stored(0, 2))
			h.eng.publish(false, stored(2, 5))
			h.waitSeq(t, 1)
			if got := h.matched(t); got != 5 {
				t.Fatalf("matched %d blocks, want 5", got)
			}
			h.eng.publish(false, removed(3, 4))
			st := h.waitSeq(t, 2)
			if got := h.matched(t); got != 3 {
				t.Fatalf("after BlockRemoved: matched %d blocks, want 3", got)
			}
			if st.Gaps != 0 || st.Resyncs != 0 || st.Batches != 3 || st.StoredBlocks != 5 || !st.Connected {
				t.Fatalf("status %+v", st)
			}
			h.eng.publish(false, KVEvent{Kind: EventAllBlocksCleared})
			h.waitSeq(t, 3)
			if got := h.matched(t); got != 0 {
				t.Fatalf("after AllBlocksCleared: matched %d blocks, want 0", got)
			}
		})
	}
}

func TestSubscriberGapReplay(t *testing.T) {
	h := startSub(t, newFakeEngine(t, true, EventEncoding{MapEvents: true}), nil)
	h.eng.publish(false, stored(0, 2))
	// The catch-up on connect is over once a batch is applied; it replayed
	// batch 0 if that was published first.
	before := h.waitSeq(t, 0).Replays
	h.eng.publish(true, stored(2, 4)) // lost on the PUB socket
	h.eng.publish(false, stored(4, 6))
	st := h.waitSeq(t, 2)
	if st.Gaps != 1 || st.Replays-before != 1 || st.Resyncs != 0 || st.Orphans != 0 {
		t.Fatalf("status %+v (%d replays before the gap), want 1 gap filled by 1 replay", st, before)
	}
	if got := h.matched(t); got != 6 {
		t.Fatalf("matched %d blocks, want 6 (the lost batch replayed)", got)
	}
}

func TestSubscriberGapWithoutReplay(t *testing.T) {
	h := startSub(t, newFakeEngine(t, false, EventEncoding{}), nil)
	h.eng.publish(false, stored(0, 2))
	h.waitSeq(t, 0)
	h.eng.publish(true, stored(2, 4))
	h.eng.publish(false, stored(4, 6))
	st := h.waitSeq(t, 2)
	if st.Gaps != 1 || st.Resyncs != 1 || st.Orphans != 1 {
		t.Fatalf("status %+v, want a gap, a resync and an orphan", st)
	}
	if got := h.matched(t); got != 0 {
		t.Fatalf("matched %d blocks after resync, want 0", got)
	}
	// Fresh sequences are indexed again.
	h.eng.publish(false, stored(0, 1))
	h.waitSeq(t, 3)
	if got := h.matched(t); got != 1 {
		t.Fatalf("matched %d blocks, want 1", got)
	}
}

func TestSubscriberReplayUnavailable(t *testing.T) {
	eng := newFakeEngine(t, false, EventEncoding{})
	h := startSub(t, eng, func(c *SubscriberConfig) {
		c.ReplayAddress = "tcp://127.0.0.1:1" // nothing listens there
		c.ReplayTimeout = 300 * time.Millisecond
	})
	h.eng.publish(false, stored(0, 2))
	h.waitSeq(t, 0)
	h.eng.publish(true, stored(2, 4))
	h.eng.publish(false, stored(4, 6))
	st := h.waitSeq(t, 2)
	if st.Gaps != 1 || st.Replays != 0 || st.Resyncs != 1 || !strings.Contains(st.LastError, "replay") {
		t.Fatalf("status %+v, want a failed replay and a resync", st)
	}
}

func TestSubscriberRestart(t *testing.T) {
	h := startSub(t, newFakeEngine(t, true, EventEncoding{}), nil)
	h.eng.publish(false, stored(0, 3))
	h.eng.publish(false, stored(3, 6))
	h.waitSeq(t, 1)
	if got := h.matched(t); got != 6 {
		t.Fatalf("matched %d, want 6", got)
	}
	h.eng.restart() // seq back to 0, cache empty
	h.eng.publish(false, stored(0, 1))
	waitFor(t, "restart", func() bool { return h.sub.Status().Restarts == 1 })
	st := h.waitSeq(t, 0)
	if got := h.matched(t); got != 1 {
		t.Fatalf("after restart matched %d blocks, want 1 (old entries dropped)", got)
	}
	if st.Resyncs != 0 || st.Gaps != 0 {
		t.Fatalf("status %+v", st)
	}
}

func TestSubscriberCatchUp(t *testing.T) {
	eng := newFakeEngine(t, true, EventEncoding{})
	// History published before the router subscribed.
	eng.publish(true, stored(0, 2))
	eng.publish(true, stored(2, 4))
	h := startSub(t, eng, nil)
	h.eng.publish(false, stored(4, 6))
	st := h.waitSeq(t, 2)
	if got := h.matched(t); got != 6 {
		t.Fatalf("matched %d blocks, want 6 (history replayed)", got)
	}
	if st.Replays != 1 || st.Gaps != 0 || st.Batches != 3 {
		t.Fatalf("status %+v", st)
	}
	// With NoCatchUp the history is not fetched and the continuation is an
	// orphan.
	eng2 := newFakeEngine(t, true, EventEncoding{})
	eng2.publish(true, stored(0, 2))
	h2 := startSub(t, eng2, func(c *SubscriberConfig) { c.NoCatchUp = true })
	h2.eng.publish(false, stored(2, 4))
	st = h2.waitSeq(t, 1)
	if st.Orphans != 1 || st.Replays != 0 || h2.matched(t) != 0 {
		t.Fatalf("NoCatchUp: status %+v", st)
	}
}

func TestSubscriberBadMessages(t *testing.T) {
	h := startSub(t, newFakeEngine(t, false, EventEncoding{}), nil)
	h.eng.publish(false, stored(0, 2))
	h.waitSeq(t, 0)
	// A short sequence frame and an undecodable payload.
	if err := h.eng.pub.Send(zmq4.NewMsgFrom([]byte(testTopic), []byte{1}, []byte{0x90})); err != nil {
		t.Fatal(err)
	}
	h.eng.mu.Lock()
	seq := h.eng.seq
	h.eng.seq++
	h.eng.mu.Unlock()
	if err := h.eng.pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(seq), []byte{0xc1})); err != nil {
		t.Fatal(err)
	}
	st := h.waitSeq(t, int64(seq))
	if st.DecodeErrors != 2 || st.Resyncs != 1 {
		t.Fatalf("status %+v, want 2 decode errors and a resync", st)
	}
	if got := h.matched(t); got != 0 {
		t.Fatalf("matched %d after an undecodable batch, want 0", got)
	}
}

// recordingSink records calls, to check what the subscriber hands over.
type recordingSink struct {
	mu    sync.Mutex
	calls []string
}

func (r *recordingSink) add(s string) { r.mu.Lock(); r.calls = append(r.calls, s); r.mu.Unlock() }
func (r *recordingSink) Store(ep string, s kvindex.Stored) (int, error) {
	r.add(fmt.Sprintf("store %s %v tier=%v salted=%v", ep, s.BlockHashes, s.Tier, s.Salts != nil))
	return len(s.BlockHashes), nil
}
func (r *recordingSink) Evict(ep string, h []uint64, tier kvroute.Tier) {
	r.add(fmt.Sprintf("evict %s %v tier=%v", ep, h, tier))
}
func (r *recordingSink) Clear(ep string)  { r.add("clear " + ep) }
func (r *recordingSink) Remove(ep string) { r.add("remove " + ep) }

func TestSubscriberApply(t *testing.T) {
	rec := &recordingSink{}
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "e", Address: "tcp://127.0.0.1:1", Sink: rec})
	if err != nil {
		t.Fatal(err)
	}
	lora := stored(0, 1)
	lora.LoRAName = "sql"
	cpu := stored(0, 1)
	cpu.Medium = "CPU"
	other := stored(0, 1)
	other.GroupIdx = 1
	b := EventBatch{Events: []KVEvent{stored(0, 1), lora, cpu, other, removed(0), {Kind: EventAllBlocksCleared}}}
	p, err := EncodeEventBatch(nil, &b, EventEncoding{})
	if err != nil {
		t.Fatal(err)
	}
	s.handle(context.Background(), 0, p)
	want := []string{
		"store e [1000] tier=gpu salted=false",
		"store e [1000] tier=gpu salted=true",
		"store e [1000] tier=cpu salted=false",
		"evict e [1000] tier=gpu",
		"clear e",
	}
	if !reflect.DeepEqual(rec.calls, want) {
		t.Fatalf("calls\n got %q\nwant %q", rec.calls, want)
	}
	if st := s.Status(); st.Skipped != 1 || st.Events != 6 {
		t.Fatalf("status %+v", st)
	}
}

func TestSubscriberConfigValidate(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{})
	for _, c := range []SubscriberConfig{
		{Address: "tcp://h:1", Sink: idx},
		{Endpoint: "e", Address: "tcp://h:1"},
		{Endpoint: "e", Address: "h:1", Sink: idx},
		{Endpoint: "e", Address: "tcp://h:1", ReplayAddress: "x", Sink: idx},
		{Endpoint: "e", Address: "tcp://h:1", Sink: idx, MaxFrameSize: 100},
		{Endpoint: "e", Address: "tcp://h:1", Sink: idx, MaxFrameSize: -1},
	} {
		if _, err := NewSubscriber(c); err == nil {
			t.Errorf("NewSubscriber(%+v): no error", c)
		}
	}
}

// TestSubscriberListen: the engine's PUB socket connects to the router,
// which binds (vLLM's rule for an endpoint naming a host).
func TestSubscriberListen(t *testing.T) {
	addr := freeTCPAddr(t)
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	sub, _ := runSubscriber(t, SubscriberConfig{Endpoint: "e1", Address: addr, Listen: true, Topic: testTopic, Sink: idx}, nil)
	waitFor(t, "listening", func() bool { return sub.Status().Connected })

	ectx, ecancel := context.WithCancel(context.Background())
	defer ecancel()
	pub := zmq4.NewPub(ectx, zmq4.WithLogger(newDiscardLogger()))
	defer pub.Close()
	if err := pub.Dial(addr); err != nil {
		t.Fatal(err)
	}
	tp := pub.(interface{ Topics() []string })
	waitFor(t, "subscription", func() bool { return slices.Contains(tp.Topics(), testTopic) })
	b := EventBatch{Events: []KVEvent{stored(0, 2)}}
	p, err := EncodeEventBatch(nil, &b, EventEncoding{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(0), p)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "batch", func() bool { return sub.Status().Batches == 1 })
	if hits := idx.Match(kvindex.HashTokens(prompt, 4, nil), nil); len(hits) != 1 || hits[0].Blocks != 2 {
		t.Fatalf("hits %+v", hits)
	}
	// A "*" address implies Listen; in dial mode it is rejected.
	if _, err := NewSubscriber(SubscriberConfig{Endpoint: "e", Address: "tcp://*:5557", Sink: idx}); err != nil {
		t.Fatalf("tcp://*:5557: %v", err)
	}
}

// prompt2 is another engine's prompt (engine hashes 2000+i).
var prompt2 = promptFrom(500)

// stored2 is stored of prompt2.
func stored2(from, to int) KVEvent { return storedOf(prompt2, 2000, from, to) }

// matchedOn returns how many leading blocks of p the index holds for e1.
func matchedOn(idx *kvindex.Index, p []uint32) int {
	for _, h := range idx.Match(kvindex.HashTokens(p, 4, nil), nil) {
		if h.Endpoint == "e1" {
			return h.Blocks
		}
	}
	return 0
}

// TestSubscriberRestartAhead: the engine restarts and its new incarnation
// publishes more batches than the old one did before the subscriber
// reconnects, so the first batch seen has a sequence number above the one
// expected. The old engine's blocks must go; the new one's must be there.
func TestSubscriberRestartAhead(t *testing.T) {
	for _, tc := range []struct {
		name       string
		replay     bool
		racing     bool // publish 1..ahead-1 on the PUB socket while the subscriber reconnects
		ahead      int  // batches the new engine publishes before the checked one
		last       KVEvent
		wantBlocks int
	}{
		// With replay, the new engine's history (prompt2 blocks 0-2) is
		// caught up and the last batch continues it.
		{"replay", true, false, 41, stored2(3, 6), 6},
		{"replay racing", true, true, 41, stored2(3, 6), 6},
		// The first batch seen has exactly the sequence number expected
		// from the old engine.
		{"replay exact", true, false, 10, stored2(3, 6), 6},
		// Without replay, the new connection forces a resync; the last
		// batch is a fresh sequence.
		{"no replay", false, false, 41, stored2(0, 2), 2},
		{"no replay racing", false, true, 41, stored2(0, 2), 2},
		{"no replay exact", false, false, 10, stored2(0, 2), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := newFakeEngine(t, tc.replay, EventEncoding{})
			h := startSub(t, old, func(c *SubscriberConfig) { c.DialRetry = 20 * time.Millisecond })
			old.publish(false, stored(0, 6))
			for range 9 {
				old.publish(false)
			}
			h.waitSeq(t, 9)
			if got := matchedOn(h.idx, prompt); got != 6 {
				t.Fatalf("old engine: matched %d blocks, want 6", got)
			}
			pubAddr, replayAddr := old.pubAddr, old.replayAddr
			old.close()
			waitFor(t, "disconnect", func() bool { return !h.sub.Status().Connected })

			eng := newFakeEngineAt(t, pubAddr, replayAddr, EventEncoding{})
			// Its first batch (the blocks the checked one continues) is
			// lost on the PUB socket even when racing: a subscriber that
			// reconnects before it is published (a test goroutine
			// descheduled on a loaded machine) would rightly apply it,
			// and without replay the new engine's prompt would then
			// match 3 blocks, not 2.
			eng.publish(true, stored2(0, 3))
			for range tc.ahead - 1 {
				eng.publish(!tc.racing)
			}
			eng.waitSubscribed()
			eng.publish(false, tc.last)
			st := h.waitSeq(t, int64(tc.ahead))
			if got := matchedOn(h.idx, prompt); got != 0 {
				t.Errorf("old engine's prompt: matched %d blocks, want 0 (stale entries); status %+v", got, st)
			}
			got := matchedOn(h.idx, prompt2)
			switch {
			case got == tc.wantBlocks:
			case tc.replay && strings.Contains(st.LastError, "replay"):
				// The catch-up replay got no answer (seen with zmq4 on a
				// loaded machine, twice in a row): the restart must still be
				// detected and the stale entries dropped (checked above and
				// below), but the new engine's history cannot be caught up.
				t.Logf("catch-up replay failed, new engine's prompt matched %d of %d blocks; status %+v", got, tc.wantBlocks, st)
			default:
				t.Errorf("new engine's prompt: matched %d blocks, want %d; status %+v", got, tc.wantBlocks, st)
			}
			if st.Restarts+st.Resyncs == 0 {
				t.Errorf("status %+v: neither a restart nor a resync", st)
			}
		})
	}
}

// TestSubscriberReconnectSameEngine: a new connection to the same engine
// (here after an idle timeout) keeps the entries when the replay socket
// shows the same history, and fills a gap from it.
func TestSubscriberReconnectSameEngine(t *testing.T) {
	eng := newFakeEngine(t, true, EventEncoding{})
	h := startSub(t, eng, func(c *SubscriberConfig) {
		c.IdleReconnect = 100 * time.Millisecond
		c.DialRetry = 10 * time.Millisecond
	})
	eng.publish(false, stored(0, 3))
	h.waitSeq(t, 0)
	waitFor(t, "idle reconnect", func() bool { return strings.Contains(h.sub.Status().LastError, "idle") })
	eng.publish(true, stored(3, 4)) // lost while reconnecting
	eng.waitSubscribed()
	// Batches keep coming until one arrives on a new connection.
	next := int64(2)
	waitFor(t, "a batch on a new connection", func() bool {
		if h.sub.Status().Reconnects > 0 {
			return true
		}
		eng.publish(false)
		next++
		return false
	})
	eng.publish(false, stored(4, 6))
	st := h.waitSeq(t, next)
	if got := matchedOn(h.idx, prompt); got != 6 {
		t.Errorf("matched %d blocks, want 6 (entries kept, lost batch replayed); status %+v", got, st)
	}
	if st.Restarts != 0 || st.Resyncs != 0 {
		t.Errorf("status %+v: want no restart and no resync", st)
	}
}

// TestSubscriberListenRestart: in Listen mode the engine connects to the
// router; it restarts several times (each new incarnation's PUB socket
// dials in, like the emulator's and libzmq's) and every incarnation is
// followed, with the previous one's entries dropped.
func TestSubscriberListenRestart(t *testing.T) {
	addr := freeTCPAddr(t)
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	sub, _ := runSubscriber(t, SubscriberConfig{Endpoint: "e1", Address: addr, Listen: true, Topic: testTopic,
		Sink: idx, DialRetry: 10 * time.Millisecond}, nil)
	waitFor(t, "listening", func() bool { return sub.Status().Connected })

	prompts := [][]uint32{prompt, prompt2}
	events := []func(int, int) KVEvent{stored, stored2}
	for round := range 6 {
		ectx, ecancel := context.WithCancel(context.Background())
		pub := zmq4.NewPub(ectx, zmq4.WithLogger(newDiscardLogger()), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithDialerRetry(20*time.Millisecond), zmq4.WithAutomaticReconnect(true))
		if err := pub.Dial(addr); err != nil {
			t.Fatal(err)
		}
		tp := pub.(interface{ Topics() []string })
		waitFor(t, fmt.Sprintf("round %d: subscription", round), func() bool { return slices.Contains(tp.Topics(), testTopic) })
		cur, prev := round%2, (round+1)%2
		// Each incarnation publishes more batches than the last one.
		n := 5 + 3*round
		for seq := range n {
			var evs []KVEvent
			if seq == n-1 {
				evs = []KVEvent{events[cur](0, 2)}
			}
			p, err := EncodeEventBatch(nil, &EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs}, EventEncoding{})
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(uint64(seq)), p)); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, fmt.Sprintf("round %d: seq %d", round, n-1), func() bool { return sub.Status().LastSeq == int64(n-1) })
		if got := matchedOn(idx, prompts[cur]); got != 2 {
			t.Errorf("round %d: matched %d blocks of this incarnation, want 2", round, got)
		}
		if got := matchedOn(idx, prompts[prev]); got != 0 {
			t.Errorf("round %d: matched %d blocks of the previous incarnation, want 0", round, got)
		}
		pub.Close()
		ecancel()
	}
	if st := sub.Status(); st.Reconnects != 5 || !st.Connected {
		t.Errorf("status %+v, want 5 reconnects", st)
	}
}

package signals

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/kvindex"
)

// wireGreeting is a ZMTP 3.0 greeting written out byte by byte (as libzmq
// sends it): signature 0xFF, 8 bytes of padding, 0x7F; version 3.0;
// mechanism "NULL" zero-padded to 20 bytes; as-server 0; 31 bytes of
// filler.
var wireGreeting = slices.Concat(
	[]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0},
	[]byte("NULL"), make([]byte, 16),
	[]byte{0}, make([]byte, 31))

// wireReady is a READY command frame (flags 0x04, short size) carrying
// the Socket-Type and an empty Identity.
func wireReady(sockType string) []byte {
	var body []byte
	body = append(body, 5)
	body = append(body, "READY"...)
	for _, p := range [][2]string{{"Socket-Type", sockType}, {"Identity", ""}} {
		body = append(body, byte(len(p[0])))
		body = append(body, p[0]...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(p[1])))
		body = append(body, p[1]...)
	}
	return append([]byte{0x04, byte(len(body))}, body...)
}

// rawPeer is a ZMTP peer written by hand on a TCP connection, to send what
// no ZMQ library would.
type rawPeer struct {
	t *testing.T
	c net.Conn
}

// dialRaw connects to a tcp:// address.
func dialRaw(t *testing.T, addr string) *rawPeer {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "tcp://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawPeer{t: t, c: c}
}

func (p *rawPeer) write(b ...[]byte) {
	p.t.Helper()
	if _, err := p.c.Write(slices.Concat(b...)); err != nil {
		p.t.Fatalf("raw peer: write: %v", err)
	}
}

// readFull reads len(b) bytes within 15s.
func (p *rawPeer) readFull(b []byte) {
	p.t.Helper()
	p.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	defer p.c.SetReadDeadline(time.Time{})
	if _, err := io.ReadFull(p.c, b); err != nil {
		p.t.Fatalf("raw peer: read: %v", err)
	}
}

// readFrame reads one frame and returns its flags and body.
func (p *rawPeer) readFrame() (byte, []byte) {
	p.t.Helper()
	var hdr [9]byte
	p.readFull(hdr[:2])
	size := uint64(hdr[1])
	if hdr[0]&zmtpFlagLong != 0 {
		p.readFull(hdr[2:])
		size = binary.BigEndian.Uint64(hdr[1:])
	}
	if size > 1<<20 {
		p.t.Fatalf("raw peer: frame of %d bytes", size)
	}
	body := make([]byte, size)
	p.readFull(body)
	return hdr[0], body
}

// handshake exchanges greetings and READY commands as a sockType socket.
func (p *rawPeer) handshake(sockType string) {
	p.t.Helper()
	p.write(wireGreeting)
	var g [64]byte
	p.readFull(g[:])
	if g[0] != 0xff || g[9] != 0x7f || g[10] != 3 || string(g[12:16]) != "NULL" {
		p.t.Fatalf("raw peer: greeting % x", g)
	}
	p.write(wireReady(sockType))
	flags, body := p.readFrame()
	if flags != 0x04 || !strings.HasPrefix(string(body), "\x05READY") {
		p.t.Fatalf("raw peer: got flags %#x body %q, want a READY command", flags, body)
	}
}

// waitClosed reads (and drops) whatever comes until the other side closes
// the connection, and fails the test if it is still open after 15s.
func (p *rawPeer) waitClosed(what string) {
	p.t.Helper()
	p.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	_, err := io.Copy(io.Discard, p.c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
		p.t.Fatalf("%s: the connection is still open after 15s", what)
	}
}

// freeTCPAddr returns a tcp:// address on 127.0.0.1 that nothing listens on.
func freeTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

type listenHarness struct {
	harness
	addr string // the router's listening address
}

// startListenSub runs a subscriber that listens on a free port, and waits
// until it listens.
func startListenSub(t *testing.T, mutate func(*SubscriberConfig)) *listenHarness {
	t.Helper()
	addr := freeTCPAddr(t)
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	cfg := SubscriberConfig{Endpoint: "e1", Address: addr, Listen: true, Topic: testTopic, Sink: idx}
	sub, ctx := runSubscriber(t, cfg, mutate)
	waitFor(t, "listening", func() bool { return sub.Status().Connected })
	return &listenHarness{harness: harness{idx: idx, sub: sub, ctx: ctx}, addr: addr}
}

// goodPub is a well-behaved engine: a stock zmq4 PUB socket (over zmq4's
// own tcp transport) that connects to the router. It dials in the
// background: zmq4's Dial waits for the listening side's handshake.
type goodPub struct {
	t      *testing.T
	pub    zmq4.Socket
	dialed chan struct{} // closed when Dial returned
	err    error         // Dial's, once dialed is closed
}

func newGoodPub(t *testing.T, addr string) *goodPub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &goodPub{t: t, pub: zmq4.NewPub(ctx, zmq4.WithLogger(newDiscardLogger())), dialed: make(chan struct{})}
	go func() {
		defer close(p.dialed)
		p.err = p.pub.Dial(addr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.dialed:
			p.pub.Close()
		default: // Dial never returned (the test failed): leave it
		}
	})
	return p
}

// deliver waits for the router's subscription and publishes batch seq
// with events until the subscriber has applied it.
func (p *goodPub) deliver(h *listenHarness, seq uint64, events ...KVEvent) {
	p.t.Helper()
	tp := p.pub.(interface{ Topics() []string })
	waitFor(p.t, "the router's subscription", func() bool { return slices.Contains(tp.Topics(), testTopic) })
	select {
	case <-p.dialed:
		if p.err != nil {
			p.t.Fatalf("dial: %v", p.err)
		}
	case <-time.After(15 * time.Second):
		p.t.Fatal("Dial did not return")
	}
	b := EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events}
	payload, err := EncodeEventBatch(nil, &b, EventEncoding{})
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(testTopic), be64(seq), payload)); err != nil {
		p.t.Fatal(err)
	}
	h.waitSeq(p.t, int64(seq))
}

// TestZMTPListenOversizedFrame: a peer that completes the handshake and
// then announces a frame (or a multipart message) over MaxFrameSize is
// dropped before anything is allocated for it, and the router keeps
// serving: a well-behaved engine connecting afterwards gets its batches
// applied. (zmq4 allocates whatever size a frame header announces: 2^62
// bytes made it panic, the process with it; 1 GiB it allocated and kept
// while waiting for the body.)
func TestZMTPListenOversizedFrame(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name     string
		send     [][]byte
		announce uint64 // bytes announced, to check the allocations against
	}{
		{"2^62-byte frame", [][]byte{zmtpLongHeader(0, 1<<62)}, 1 << 62},
		{"1 GiB frame", [][]byte{zmtpLongHeader(0, 1<<30)}, 1 << 30},
		{"limit+1 after a message", [][]byte{zmtpFrame(1, false, []byte(testTopic)), zmtpFrame(0, false, []byte("x")),
			zmtpLongHeader(0, limit+1)}, limit + 1},
		{"multipart message over the limit", [][]byte{zmtpFrame(1, true, make([]byte, limit/2)), zmtpLongHeader(1, limit/2)}, limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startListenSub(t, func(c *SubscriberConfig) { c.MaxFrameSize = limit })
			bad := dialRaw(t, h.addr)
			bad.handshake("PUB")
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			bad.write(tc.send...)
			bad.waitClosed("the peer that announced too much")
			runtime.ReadMemStats(&after)
			if tc.announce >= 1<<30 {
				if got := after.TotalAlloc - before.TotalAlloc; got > 1<<28 {
					t.Errorf("allocated %d bytes meanwhile, want far less than the %d announced", got, tc.announce)
				}
			}
			waitFor(t, "the error reported", func() bool { return strings.Contains(h.sub.Status().LastError, errFrameTooLarge.Error()) })

			good := newGoodPub(t, h.addr)
			good.deliver(h, 0, stored(0, 2))
			if got := matchedOn(h.idx, prompt); got != 2 {
				t.Errorf("matched %d blocks, want 2", got)
			}
		})
	}
}

// TestZMTPDialOversizedFrame: the same bound holds for a dialled engine
// (an engine, or anything that answers at its address, sending a huge
// frame header).
func TestZMTPDialOversizedFrame(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := make(chan *rawPeer, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				close(peers)
				return
			}
			peers <- &rawPeer{c: c}
		}
	}()
	defer wg.Wait()
	defer ln.Close()

	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	sub, _ := runSubscriber(t, SubscriberConfig{Endpoint: "e1", Address: "tcp://" + ln.Addr().String(), Topic: testTopic,
		Sink: idx, DialRetry: time.Hour}, nil)
	var p *rawPeer
	select {
	case p = <-peers:
	case <-time.After(15 * time.Second):
		t.Fatal("the subscriber did not dial")
	}
	p.t = t
	defer p.c.Close()
	p.handshake("PUB")
	if flags, body := p.readFrame(); flags != 0 || string(body) != "\x01"+testTopic {
		t.Fatalf("got flags %#x body %q, want the subscription", flags, body)
	}
	p.write(zmtpLongHeader(0, 1<<62))
	p.waitClosed("the engine that announced 2^62 bytes")
	waitFor(t, "the error reported", func() bool { return strings.Contains(sub.Status().LastError, errFrameTooLarge.Error()) })
}

// TestZMTPListenSilentPeers: peers that connect and never complete their
// side of the ZMTP handshake (nothing at all, the signature only, a
// greeting without READY) do not keep a well-behaved engine that connects
// after them from connecting, and are dropped after the handshake bound.
// (zmq4 ran each handshake in its accept loop with no deadline: the first
// silent peer kept every other connection out, for ever.)
func TestZMTPListenSilentPeers(t *testing.T) {
	h := startListenSub(t, func(c *SubscriberConfig) { c.ReplayTimeout = 300 * time.Millisecond })
	silent := []*rawPeer{dialRaw(t, h.addr), dialRaw(t, h.addr), dialRaw(t, h.addr)}
	silent[1].write(wireGreeting[:10])
	silent[2].write(wireGreeting)

	good := newGoodPub(t, h.addr)
	good.deliver(h, 0, stored(0, 2))
	if got := matchedOn(h.idx, prompt); got != 2 {
		t.Errorf("matched %d blocks, want 2", got)
	}
	for i, p := range silent {
		p.waitClosed(fmt.Sprintf("silent peer %d", i))
	}
	if st := h.sub.Status(); st.Reconnects != 0 || st.Resyncs != 0 {
		t.Errorf("status %+v: the silent peers counted as connections", st)
	}
}

// TestZMTPListenRejectedPeerClosed: a peer that completes the handshake
// but that zmq4 then rejects (a SUB socket connecting to the router's SUB)
// is closed, not left open: zmq4 drops such a connection without closing
// it.
func TestZMTPListenRejectedPeerClosed(t *testing.T) {
	ctx, cancel := context.WithCancel(withZMTPOptions(context.Background(), zmtpOptions{adopt: 200 * time.Millisecond}))
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithLogger(newDiscardLogger()))
	defer sub.Close()
	addr := freeTCPAddr(t)
	own, ok := ownAddr(addr)
	if !ok {
		t.Fatalf("ownAddr(%q): not the subscriber's transport", addr)
	}
	if err := sub.Listen(own); err != nil {
		t.Fatal(err)
	}
	p := dialRaw(t, addr)
	p.handshake("SUB")
	p.waitClosed("the rejected peer")
}

// dialPubTo replaces e's bound PUB socket with one that connects to addr,
// as vLLM's does when its endpoint names a host (the router listens).
func (e *fakeEngine) dialPubTo(addr string) {
	e.t.Helper()
	e.pub.Close()
	pub := zmq4.NewPub(e.ctx, zmq4.WithLogger(newDiscardLogger()))
	if err := pub.Dial(addr); err != nil {
		e.t.Fatal(err)
	}
	e.pub = pub
}

// TestSubscriberListenRestartDetectedOnConnect: in Listen mode, the engine
// is killed and a new one (an empty cache) connects to the router but
// serves no request yet, so it publishes nothing. The old engine's entries
// must be dropped as soon as it connects, not at its first batch, and the
// new engine's history (batches published before its connection) caught up
// at once. (A listening socket only checked the first batch after a lost
// connection: the router kept routing to a cache that was gone.)
func TestSubscriberListenRestartDetectedOnConnect(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			old := newFakeEngine(t, replay, EventEncoding{})
			h := startListenSub(t, func(c *SubscriberConfig) { c.ReplayAddress = old.replayAddr })
			old.dialPubTo(h.addr)
			old.waitSubscribed()
			old.publish(false, stored(0, 6))
			h.waitSeq(t, 0)
			if got := matchedOn(h.idx, prompt); got != 6 {
				t.Fatalf("old engine: matched %d blocks, want 6", got)
			}
			replayAddr := old.replayAddr
			old.close()

			eng := newFakeEngineAt(t, "tcp://127.0.0.1:0", replayAddr, EventEncoding{})
			wantNew := 0
			if replay {
				eng.publish(true, stored2(0, 3)) // before the connection: lost on the PUB socket
				wantNew = 3
			}
			eng.dialPubTo(h.addr)
			eng.waitSubscribed()
			waitFor(t, "the old engine's entries dropped", func() bool { return matchedOn(h.idx, prompt) == 0 })
			waitFor(t, "the new engine's history caught up", func() bool { return matchedOn(h.idx, prompt2) == wantNew })
			st := h.sub.Status()
			if st.Restarts+st.Resyncs != 1 || st.Reconnects != 1 {
				t.Errorf("status %+v: want one reconnect, and one restart or resync", st)
			}

			// The new engine's next batches continue its sequence.
			next := uint64(wantNew / 3)
			eng.publish(false, stored2(wantNew, 4))
			eng.publish(false, stored2(4, 5))
			st = h.waitSeq(t, int64(next+1))
			if got := matchedOn(h.idx, prompt2); got != 5 {
				t.Errorf("new engine: matched %d blocks, want 5; status %+v", got, st)
			}
			if st.Restarts+st.Resyncs != 1 || st.Orphans != 0 || st.Gaps != 0 {
				t.Errorf("status %+v: want still one restart or resync, no orphan, no gap", st)
			}
		})
	}
}

// TestSubscriberListenReconnectSameEngine: in Listen mode the engine's
// connection is lost and made again by the same engine (its replay history
// intact): the check on connect finds the same history, the entries stay,
// and a batch lost meanwhile is replayed.
func TestSubscriberListenReconnectSameEngine(t *testing.T) {
	eng := newFakeEngine(t, true, EventEncoding{})
	h := startListenSub(t, func(c *SubscriberConfig) { c.ReplayAddress = eng.replayAddr })
	eng.dialPubTo(h.addr)
	eng.waitSubscribed()
	eng.publish(false, stored(0, 3))
	h.waitSeq(t, 0)

	before := eng.replayCount()
	eng.dialPubTo(h.addr) // a new connection from the same engine
	eng.waitSubscribed()
	waitFor(t, "the new connection checked", func() bool { return h.sub.Status().Reconnects == 1 })
	// The check's replay must be answered before the next batch is
	// buffered: an answer that held it would apply it as missed while the
	// connection was down, and no gap would be seen.
	waitFor(t, "the check's replay answered", func() bool { return eng.replayCount() > before })
	eng.publish(true, stored(3, 4)) // lost
	eng.publish(false, stored(4, 6))
	st := h.waitSeq(t, 2)
	if got := matchedOn(h.idx, prompt); got != 6 {
		t.Errorf("matched %d blocks, want 6; status %+v", got, st)
	}
	if st.Restarts != 0 || st.Resyncs != 0 || st.Reconnects != 1 || st.Gaps != 1 {
		t.Errorf("status %+v: want 1 reconnect, 1 gap, no restart, no resync", st)
	}
}

// TestSubscriberListenCatchUpOnConnect: the router listens before the
// engine is up (its replay socket unreachable); when the engine connects,
// the history it already has is caught up at once, not at its next batch.
func TestSubscriberListenCatchUpOnConnect(t *testing.T) {
	replayAddr := freeTCPAddr(t)
	h := startListenSub(t, func(c *SubscriberConfig) {
		c.ReplayAddress = replayAddr
		c.ReplayTimeout = 300 * time.Millisecond
	})
	// A first connection while the replay socket is down (a probe: its
	// one-frame message counts as a decode error and proves the
	// subscriber's loop runs).
	probe := newGoodPub(t, h.addr)
	tp := probe.pub.(interface{ Topics() []string })
	waitFor(t, "the probe's subscription", func() bool { return slices.Contains(tp.Topics(), testTopic) })
	waitFor(t, "the probe's message", func() bool {
		if err := probe.pub.Send(zmq4.NewMsgFrom([]byte(testTopic))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		return h.sub.Status().DecodeErrors > 0
	})

	eng := newFakeEngineAt(t, "tcp://127.0.0.1:0", replayAddr, EventEncoding{})
	eng.publish(true, stored(0, 3))
	eng.publish(true, stored(3, 5))
	eng.dialPubTo(h.addr)
	waitFor(t, "history caught up without a new batch", func() bool { return matchedOn(h.idx, prompt) == 5 })
	eng.waitSubscribed()
	eng.publish(false, removed(4))
	st := h.waitSeq(t, 2)
	if got := matchedOn(h.idx, prompt); got != 4 {
		t.Errorf("matched %d blocks, want 4; status %+v", got, st)
	}
}

// TestSubscriberListenIdleKeepsConnection: a listening socket stays bound,
// and the engine's connection with it, however long the engine is silent.
// (The idle timer of dialled sessions was armed by the first batch on a
// listening socket too: IdleReconnect after it, the socket was closed and
// bound again, dropping the engine's connection; its next connection then
// dropped its entries for want of a replay socket.)
func TestSubscriberListenIdleKeepsConnection(t *testing.T) {
	const idle = 50 * time.Millisecond
	h := startListenSub(t, func(c *SubscriberConfig) { c.IdleReconnect = idle })
	good := newGoodPub(t, h.addr)
	good.deliver(h, 0, stored(0, 3))
	time.Sleep(10 * idle) // silent for many times IdleReconnect
	good.deliver(h, 1, stored(3, 6))
	st := h.sub.Status()
	if got := matchedOn(h.idx, prompt); got != 6 {
		t.Errorf("matched %d blocks, want 6; status %+v", got, st)
	}
	if st.Reconnects != 0 || st.Resyncs != 0 || st.LastError != "" {
		t.Errorf("status %+v: want no reconnect, no resync, no error", st)
	}
}

// TestSubscriberListenIPC: the subscriber's transport listens on ipc://
// too, and leaves no socket file behind: a subscriber started after it
// binds the same path.
func TestSubscriberListenIPC(t *testing.T) {
	addr := "ipc://" + t.TempDir() + "/kv.sock"
	for round := range 2 {
		idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
		sub, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: addr, Listen: true, Topic: testTopic, Sink: idx})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- sub.Run(ctx) }()
		waitFor(t, fmt.Sprintf("round %d: listening", round), func() bool { return sub.Status().Connected })
		h := &listenHarness{harness: harness{idx: idx, sub: sub, ctx: ctx}, addr: addr}
		good := newGoodPub(t, addr)
		good.deliver(h, 0, stored(0, 2))
		if got := matchedOn(idx, prompt); got != 2 {
			t.Errorf("round %d: matched %d blocks, want 2", round, got)
		}
		if st := sub.Status(); st.LastError != "" {
			t.Errorf("round %d: status %+v", round, st)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("round %d: Run: %v", round, err)
		}
	}
}

package signals

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"
)

// zmq4's listening socket accepts a connection and runs the ZMTP handshake
// on it inside its accept loop, with no deadline: one peer that connects
// and sends nothing (a port scanner, a half-started engine, a TCP health
// check) keeps every other engine from connecting, for ever. The
// subscriber's transports (registered in zmqdial.go) listen through a
// zmtpListener instead: it accepts connections in a loop of its own and
// reads each peer's side of the handshake (its greeting and READY command)
// in a goroutine of its own, within a deadline, before zmq4 sees the
// connection; zmq4 then replays the handshake from memory and never waits
// for the peer. A peer that does not complete its side within the deadline
// is dropped without ever reaching zmq4.
//
// For that, the listener sends the peer the greeting zmq4 would send
// (zmtpNullGreeting, for the NULL security mechanism, the only one the
// subscriber uses) and the connection swallows zmq4's own copy of it when
// zmq4 writes it: the peer (libzmq, zmq4) sends its READY command only once
// it has the greeting.

// zmtpOptions configures the subscriber's transports for one zmq4 socket;
// the socket's context carries them (withZMTPOptions) to its transport's
// Dial and Listen.
type zmtpOptions struct {
	// maxFrame bounds the frames and multipart messages a peer may send;
	// 0 means DefaultMaxFrameSize.
	maxFrame uint64
	// handshake bounds a peer's side of the handshake on a listening
	// socket: the time from its connection to its READY command; 0 means
	// 2s.
	handshake time.Duration
	// onHandshake, when not nil, is called (from zmq4's accept loop) for
	// each connection to a listening socket whose peer completed its side
	// of the handshake, before zmq4 takes the connection over: no message
	// of that peer's reaches the socket before onHandshake returns.
	onHandshake func()
	// adopt bounds the time from handing a connection to zmq4 to zmq4
	// reading past its handshake; 0 means zmtpAdoptTimeout. Tests shorten
	// it.
	adopt time.Duration
	// peerTypes, when not empty, are the socket types (READY's
	// Socket-Type, e.g. PUB) a listening socket accepts: another peer is
	// closed after its handshake, before zmq4 (which would reject it) or
	// onHandshake sees it, so that it does not pass for a reconnecting
	// engine.
	peerTypes []string
}

type zmtpOptionsKey struct{}

// withZMTPOptions returns ctx carrying o, for the zmq4 socket made with it.
func withZMTPOptions(ctx context.Context, o zmtpOptions) context.Context {
	return context.WithValue(ctx, zmtpOptionsKey{}, o)
}

// zmtpOptionsFrom returns the options ctx carries, with defaults applied.
func zmtpOptionsFrom(ctx context.Context) zmtpOptions {
	o, _ := ctx.Value(zmtpOptionsKey{}).(zmtpOptions)
	if o.maxFrame == 0 {
		o.maxFrame = DefaultMaxFrameSize
	}
	if o.handshake <= 0 {
		o.handshake = 2 * time.Second
	}
	if o.adopt <= 0 {
		o.adopt = zmtpAdoptTimeout
	}
	return o
}

const (
	// zmtpMaxHandshake bounds the bytes of a peer's greeting and READY
	// command (the READY carries the socket type, its identity of up to
	// 255 bytes and any application metadata).
	zmtpMaxHandshake = 64 << 10
	// zmtpAdoptTimeout is the default zmtpOptions.adopt: zmq4 replays the
	// handshake from memory at once, so only a connection zmq4 rejected
	// (a peer of an incompatible socket type: zmq4 neither keeps nor
	// closes it) reaches it, and is then closed.
	zmtpAdoptTimeout = 10 * time.Second
)

// zmtpNullGreeting is the ZMTP 3.0 greeting zmq4 sends with the NULL
// security mechanism, as a client or a server: signature (0xFF, 8 bytes of
// padding, 0x7F), version 3.0, mechanism "NULL" (zero-padded to 20 bytes),
// as-server 0, 31 bytes of filler.
var zmtpNullGreeting = func() [zmtpGreetingLen]byte {
	var g [zmtpGreetingLen]byte
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// zmtpConn is a connection a subscriber's zmq4 socket reads through: every
// byte the peer sends passes a zmtpScanner, which fails the connection at a
// frame header over the limit. On a listening socket it also holds the
// peer's side of the handshake, read by the listener, and replays it to
// zmq4 (see zmtpListener). Read and Write are called by one goroutine at a
// time (zmq4's), Close by any.
type zmtpConn struct {
	net.Conn
	scan zmtpScanner
	err  error // the scanner's error: every later Read returns it

	// Listening only: pre holds the peer's bytes the listener read (its
	// greeting, READY and anything after), replayed by Read before the
	// network; swallow the rest of zmtpNullGreeting (sent by the
	// listener) still to be dropped from zmq4's writes; read counts the
	// bytes Read returned; adopt closes the connection unless zmq4 reads
	// past the handshake in time (stopped then).
	pre, swallow []byte
	read         uint64
	adopt        *time.Timer

	mu        sync.Mutex  // guards stopCtx
	stopCtx   func() bool // stops closing the connection with its socket's context
	closeOnce sync.Once
	closeErr  error
}

// newZMTPConn wraps c for a socket whose context is ctx: c is closed when
// ctx is done.
func newZMTPConn(ctx context.Context, c net.Conn, maxFrame uint64) *zmtpConn {
	zc := &zmtpConn{Conn: c, scan: newZMTPScanner(maxFrame)}
	zc.mu.Lock() // ctx may be done already: the AfterFunc then runs at once
	zc.stopCtx = context.AfterFunc(ctx, func() { zc.Close() })
	zc.mu.Unlock()
	return zc
}

func (c *zmtpConn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.stopCtx()
		c.mu.Unlock()
		c.closeErr = c.Conn.Close()
	})
	return c.closeErr
}

func (c *zmtpConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.adopt != nil && c.read >= c.scan.firstEnd {
		// zmq4 is past the handshake: it took the connection.
		c.adopt.Stop()
		c.adopt = nil
	}
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		c.read += uint64(n)
		return n, nil
	}
	n, err := c.Conn.Read(p)
	k, serr := c.scan.scan(p[:n])
	c.read += uint64(k)
	if serr != nil {
		// A net.Error that is no timeout: zmq4 then drops the connection
		// from its socket.
		c.err = &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: serr}
		c.Close()
		return k, c.err
	}
	return n, err
}

func (c *zmtpConn) Write(p []byte) (int, error) {
	if len(c.swallow) == 0 {
		return c.Conn.Write(p)
	}
	k := min(len(c.swallow), len(p))
	if !bytes.Equal(p[:k], c.swallow[:k]) {
		// zmq4 greets otherwise than the listener did for it (another
		// security mechanism): the peer has the wrong greeting.
		c.Close()
		return 0, &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
			Err: errors.New("zmtp: zmq4's greeting differs from the one sent for it")}
	}
	c.swallow = c.swallow[k:]
	if k == len(p) {
		return k, nil
	}
	n, err := c.Conn.Write(p[k:])
	return k + n, err
}

// readHandshake sends zmtpNullGreeting and reads the peer's side of the
// handshake (greeting and first command, READY) into c.pre, all by
// deadline. With peerTypes, the READY must name one of them.
func (c *zmtpConn) readHandshake(deadline time.Time, peerTypes []string) error {
	if err := c.Conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := c.Conn.Write(zmtpNullGreeting[:]); err != nil {
		return fmt.Errorf("zmtp: send greeting: %w", err)
	}
	c.swallow = zmtpNullGreeting[:]
	var buf [512]byte
	for c.scan.frames == 0 {
		n, err := c.Conn.Read(buf[:])
		k, serr := c.scan.scan(buf[:n])
		c.pre = append(c.pre, buf[:k]...)
		switch {
		case serr != nil:
			return serr
		case len(c.pre) >= zmtpGreetingLen && !validGreeting(c.pre):
			return fmt.Errorf("zmtp: not a ZMTP 3 NULL-mechanism greeting: % x", c.pre[:zmtpGreetingLen])
		case c.scan.frames > 0:
		case err != nil:
			return fmt.Errorf("zmtp: read handshake (%d bytes): %w", len(c.pre), err)
		case len(c.pre) > zmtpMaxHandshake:
			return fmt.Errorf("zmtp: handshake over %d bytes", zmtpMaxHandshake)
		}
	}
	if len(peerTypes) > 0 {
		st, ok := readySocketType(c.pre)
		if !ok {
			return errors.New("zmtp: the peer's first command is not a READY naming its socket type")
		}
		if !slices.Contains(peerTypes, st) {
			return fmt.Errorf("zmtp: the peer is a %s socket, want one of %v", st, peerTypes)
		}
	}
	return c.Conn.SetDeadline(time.Time{})
}

// validGreeting reports whether g starts with a greeting zmq4 accepts:
// the signature, version 3 or above and the NULL mechanism.
func validGreeting(g []byte) bool {
	return g[0] == 0xff && g[9] == 0x7f && g[10] >= 3 && bytes.Equal(g[12:32], zmtpNullGreeting[12:32])
}

// zmtpListener is the net.Listener a subscriber's listening zmq4 socket
// accepts from: its Accept returns only connections whose peer has sent
// its side of the handshake (see the top of this file), so zmq4's accept
// loop never waits for a peer. It is safe for concurrent use.
type zmtpListener struct {
	net.Listener
	ctx   context.Context // the socket's
	opts  zmtpOptions
	ready chan *zmtpConn // connections with their peer's handshake read
	done  chan struct{}  // closed by Close
	wg    sync.WaitGroup // the accept loop and the handshakes

	mu      sync.Mutex // guards closed and pending
	closed  bool
	pending map[*zmtpConn]struct{} // in their handshake; Close closes them
}

var _ net.Listener = (*zmtpListener)(nil)

// newZMTPListener accepts connections from ln for the socket whose context
// is ctx, until Close.
func newZMTPListener(ctx context.Context, ln net.Listener, o zmtpOptions) *zmtpListener {
	l := &zmtpListener{Listener: ln, ctx: ctx, opts: o, ready: make(chan *zmtpConn), done: make(chan struct{}),
		pending: make(map[*zmtpConn]struct{})}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *zmtpListener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off (as
			// net/http does), since the error may last.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-l.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		zc := newZMTPConn(l.ctx, c, l.opts.maxFrame)
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			zc.Close()
			return
		}
		l.pending[zc] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(zc)
	}
}

// handshake reads the peer's side of the handshake and queues the
// connection for Accept, or closes it.
func (l *zmtpListener) handshake(c *zmtpConn) {
	defer l.wg.Done()
	err := c.readHandshake(time.Now().Add(l.opts.handshake), l.opts.peerTypes)
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
	if err != nil {
		c.Close()
		return
	}
	select {
	case l.ready <- c:
	case <-l.done:
		c.Close()
	}
}

// Accept returns the next connection whose peer has completed its side of
// the handshake, after calling onHandshake.
func (l *zmtpListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		if l.opts.onHandshake != nil {
			l.opts.onHandshake()
		}
		c.adopt = time.AfterFunc(l.opts.adopt, func() { c.Close() })
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: l.Addr().Network(), Addr: l.Addr(), Err: net.ErrClosed}
	}
}

// Close stops accepting, closes the connections still in their handshake
// and waits for the goroutines. Connections already accepted are zmq4's.
func (l *zmtpListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for c := range l.pending {
		c.Close()
	}
	l.mu.Unlock()
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

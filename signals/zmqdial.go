package signals

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4's Dial connects and then runs the ZMTP handshake on the new
// connection with no deadline and no context: an engine that accepts TCP
// connections but never answers (a frozen process: SIGSTOP, a hung
// interpreter; its kernel still completes the TCP handshake) blocks Dial,
// and with it the subscriber, forever, so that even the router's shutdown
// waits for it. The subscriber therefore dials through transports of its
// own, registered with zmq4 once, that close each connection when the
// socket's context ends; cancelling the context (at the end of a session,
// a replay's timeout, or a handshake that takes too long) unblocks Dial.
// The same transports listen through a zmtpListener (zmqlisten.go), and
// every connection, dialled or accepted, reads through a zmtpConn, which
// bounds the frames a peer may announce (zmqframe.go). The socket's
// context carries their options (withZMTPOptions).

// ownSchemes maps the schemes the subscriber dials and listens on to its
// own transports'.
var ownSchemes = map[string]string{"tcp": "kvroute-tcp", "ipc": "kvroute-ipc"}

var registerTransports = sync.OnceValue(func() error {
	for scheme, own := range ownSchemes {
		network := scheme
		if scheme == "ipc" {
			network = "unix"
		}
		if err := zmq4.RegisterTransport(own, zmtpTransport{Transport: transport.New(network), network: network}); err != nil {
			return err
		}
	}
	return nil
})

// ownAddr returns the address to give zmq4's Dial or Listen for addr: the
// same endpoint on the subscriber's own transport, and true; or addr and
// false for a scheme it has no transport for (inproc).
func ownAddr(addr string) (string, bool) {
	scheme, rest, ok := strings.Cut(addr, "://")
	if own := ownSchemes[scheme]; ok && own != "" && registerTransports() == nil {
		return own + "://" + rest, true
	}
	return addr, false
}

// zmtpTransport dials and listens like zmq4's own tcp and ipc transports
// (whose Addr it keeps), through zmtpConns and zmtpListeners.
type zmtpTransport struct {
	transport.Transport
	network string
}

var _ transport.Transport = zmtpTransport{}

// Dial connects to addr; the connection is closed when ctx (the zmq4
// socket's) is done.
func (t zmtpTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	return newZMTPConn(ctx, c, zmtpOptionsFrom(ctx).maxFrame), nil
}

// Listen binds addr; the listener's connections are closed when ctx (the
// zmq4 socket's) is done, and the listener when zmq4 closes it.
func (t zmtpTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	ln, err := net.Listen(t.network, addr)
	if err != nil {
		return nil, err
	}
	return newZMTPListener(ctx, ln, zmtpOptionsFrom(ctx)), nil
}

// dialWithin dials sock to addr, giving up (by cancelling cancel, the
// socket's context) when the connection and its handshake take longer than
// timeout.
func dialWithin(sock zmq4.Socket, addr string, timeout time.Duration, cancel context.CancelFunc) error {
	t := time.AfterFunc(timeout, cancel)
	defer t.Stop()
	a, _ := ownAddr(addr)
	return sock.Dial(a)
}

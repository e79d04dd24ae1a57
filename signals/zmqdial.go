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

// dialSchemes maps the schemes the subscriber dials to its own transports'.
var dialSchemes = map[string]string{"tcp": "kvroute-tcp", "ipc": "kvroute-ipc"}

var registerDialers = sync.OnceValue(func() error {
	for scheme, own := range dialSchemes {
		network := scheme
		if scheme == "ipc" {
			network = "unix"
		}
		if err := zmq4.RegisterTransport(own, ctxTransport{Transport: transport.New(network), network: network}); err != nil {
			return err
		}
	}
	return nil
})

// dialAddr returns the address to give zmq4's Dial for addr: the same
// endpoint on the subscriber's own transport.
func dialAddr(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if own := dialSchemes[scheme]; ok && own != "" && registerDialers() == nil {
		return own + "://" + rest
	}
	return addr
}

// ctxTransport dials like zmq4's own tcp and ipc transports and closes the
// connection when ctx (the zmq4 socket's) is done.
type ctxTransport struct {
	transport.Transport
	network string
}

func (t ctxTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { c.Close() })
	return c, nil
}

// dialWithin dials sock to addr, giving up (by cancelling cancel, the
// socket's context) when the connection and its handshake take longer than
// timeout.
func dialWithin(sock zmq4.Socket, addr string, timeout time.Duration, cancel context.CancelFunc) error {
	t := time.AfterFunc(timeout, cancel)
	defer t.Stop()
	return sock.Dial(dialAddr(addr))
}

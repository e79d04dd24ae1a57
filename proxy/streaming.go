package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// upstreamBody wraps an endpoint's response body on its way to the client.
// It reads the first bytes before the headers are sent (readFirst), notes
// the first byte (the first token of a stream) and, when an event
// stream breaks after its first byte, ends it the way vLLM ends a failed
// stream: an error event and "data: [DONE]", so that clients see a clean
// end rather than a truncated connection. Other bodies that break are
// aborted (http.ErrAbortHandler, by the reverse proxy).
type upstreamBody struct {
	rc      io.ReadCloser
	x       *exchange
	sse     bool // an event stream the router may end (openai.IsPlainEventStream)
	started bool
	tail    openai.EventTail // the last bytes passed on: did a stream break mid-event, or end?
	ended   bool             // the upstream failed: serve rest, then EOF
	rest    []byte

	// What readFirst read: served before anything else.
	first    [512]byte
	head     []byte // first's bytes not yet passed on
	firstErr error  // the error that came with them (io.EOF: an empty or short body), returned after head
}

// readFirst reads the body's first bytes, or its end, before the response's
// headers go to the client (modifyResponse): the first byte is the last
// moment an attempt can fail and be retried, so an error before it is
// returned (no byte read), and the headers are not sent. An error after
// some bytes is returned by Read after them, as any later failure. A body
// that keeps returning nothing and no error fails with io.ErrNoProgress, as
// bufio's readers do.
func (b *upstreamBody) readFirst() error {
	for range maxEmptyReads {
		b.x.stall.Waiting(true)
		n, err := b.rc.Read(b.first[:])
		b.x.stall.Waiting(false)
		if n > 0 {
			b.started = true
			b.x.firstByte(b.x.p.now())
			b.tail.Add(b.first[:n])
			b.head, b.firstErr = b.first[:n], err
			return nil
		}
		if err == io.EOF {
			b.firstErr = err
			return nil
		}
		if err != nil {
			return err
		}
	}
	return io.ErrNoProgress
}

// maxEmptyReads is how many reads returning nothing readFirst makes.
const maxEmptyReads = 100

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.ended {
		if len(b.rest) == 0 {
			return 0, io.EOF
		}
		n := copy(p, b.rest)
		b.rest = b.rest[n:]
		return n, nil
	}
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	var n int
	var err error
	if b.firstErr != nil {
		err, b.firstErr = b.firstErr, nil
	} else {
		b.x.stall.Waiting(true)
		n, err = b.rc.Read(p)
		b.x.stall.Waiting(false)
	}
	if n > 0 {
		if !b.started {
			b.started = true
			b.x.firstByte(b.x.p.now())
		}
		b.tail.Add(p[:n])
	}
	if err == nil || err == io.EOF {
		return n, err
	}
	var end *kvroute.Error
	switch {
	case b.sse && b.tail.SawDone():
		// The final event was sent: the exchange is complete, whatever
		// ends the response now (the client hanging up, the engine or a
		// hop between dropping the connection or going silent before
		// closing it). Nothing may follow [DONE], and the endpoint is not
		// to blame.
		return n, io.EOF
	case b.x.stall.Fired() && b.x.ctx.Err() == nil:
		// The engine, stopped or wedged, sent nothing for upstream_header:
		// the client is told rather than left waiting for it.
		b.x.streamFailed(errStalled)
		end = &kvroute.Error{Status: http.StatusGatewayTimeout, Type: kvroute.TypeUpstream,
			Message: fmt.Sprintf("endpoint %s sent nothing for %s", b.x.flight.Endpoint.ID, b.x.stall.Limit)}
	case b.x.ctx.Err() != nil && b.x.shuttingDown():
		// The drain deadline passed: the engine's request is cancelled,
		// and the client is told, as when a stream breaks; the endpoint
		// is not to blame.
		b.x.shutdown = true
		end = errShutdown
	case b.x.ctx.Err() != nil:
		b.x.clientGone = true
		return n, err // the client went away; nothing to tell it
	default:
		b.x.streamFailed(err)
		end = &kvroute.Error{Status: http.StatusBadGateway, Type: kvroute.TypeUpstream,
			Message: fmt.Sprintf("the stream from endpoint %s broke: %v", b.x.flight.Endpoint.ID, err)}
	}
	if !b.sse {
		return n, err
	}
	b.ended = true
	if b.started && !b.tail.AtBoundary() {
		b.rest = append(b.rest, "\n\n"...) // terminate the broken event
	}
	b.rest = openai.AppendErrorEvent(b.rest, end)
	return n, nil
}

func (b *upstreamBody) Close() error { return b.rc.Close() }

// streamFailed records an upstream failure after the first byte.
func (x *exchange) streamFailed(err error) {
	x.streamErr = err
	x.reportHealth(x.p.now(), false)
	x.m.series.RLock()
	x.p.metrics.streamErrors.WithLabelValues(x.pool.model, x.pool.label(x.flight.Endpoint.ID)).Inc()
	x.m.series.RUnlock()
	x.p.log.Warn("upstream failed mid-response", "request_id", x.req.ID, "model", x.pool.model,
		"endpoint", x.flight.Endpoint.ID, "error", err)
}

// errStalled cuts an attempt whose response went silent.
var errStalled = errors.New("proxy: the endpoint's response went silent for timeouts.upstream_header")

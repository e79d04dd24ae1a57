package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/internal/silence"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/signals"
)

// newTransport builds the upstream transport. Engines are few and busy:
// keep many idle connections per host so that bursts do not redial, but
// each only for timeouts.upstream_idle, under the engines' own keep-alive
// (5 s for vLLM's and SGLang's uvicorn): a connection the engine closes
// just as a request goes out on it loses the request.
func newTransport(t config.Timeouts) *http.Transport {
	d := &net.Dialer{Timeout: t.Dial, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil, // engines are reached directly, never through HTTP_PROXY
		DialContext:           d.DialContext,
		DialTLSContext:        dialTLS(d, t.Dial),
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       t.UpstreamIdle,
		ResponseHeaderTimeout: t.UpstreamHeader,
		ExpectContinueTimeout: 0,
		DisableCompression:    true, // forward bodies as the engine sent them
		ForceAttemptHTTP2:     false,
		// Prompts are large: with the default 4 KiB buffer a 32 KiB request
		// goes out in two writes and net/http allocates a fresh 32 KiB copy
		// buffer for the second. 64 KiB carries headers and a typical
		// prompt in one write, with no per-request buffer.
		WriteBufferSize: 64 << 10,
	}
}

// dialTLS connects to an https engine: its TCP dial and its TLS
// handshake, both within timeout (timeouts.dial). net/http's own handshake
// has no bound (TLSHandshakeTimeout 0), so an engine that takes
// connections but never answers (stopped: the kernel still accepts) held
// the request for as long as it stayed stopped. A failed handshake is a
// dial error (*net.OpError "dial", disagg.IsConnectError): the engine
// never saw the request, which is retried as a connect error.
func dialTLS(d *net.Dialer, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		tc := tls.Client(conn, &tls.Config{ServerName: host})
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Source: conn.LocalAddr(), Addr: conn.RemoteAddr(), Err: err}
		}
		return tc, nil
	}
}

// bufferPool recycles the reverse proxies' copy buffers (32 KiB each).
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

var copyBuffers httputil.BufferPool = &bufferPool{}

// endpointProxy forwards requests to one endpoint and holds its metrics'
// children, resolved once.
type endpointProxy struct {
	ep     *kvroute.Endpoint
	target *url.URL
	rp     *httputil.ReverseProxy

	inflight       prometheus.Gauge
	ttfb           prometheus.Observer
	cached, prompt prometheus.Counter // the engine's usage (feedback.go)
	// reportsCached reads the engine's cached tokens (observeUsage).
	reportsCached openai.CachedTokens
	// view is the engine's signals.View in the pool's router, once
	// looked up (pool.view): what its scrapes tell of its kind and LoRA
	// adapters.
	view atomic.Pointer[signals.View]
}

func (p *Proxy) newEndpointProxy(pl *pool, ep *kvroute.Endpoint) (*endpointProxy, error) {
	target, err := url.Parse(ep.URL)
	if err != nil {
		return nil, err
	}
	e := &endpointProxy{ep: ep, target: target,
		inflight: p.metrics.inflight.WithLabelValues(pl.model, ep.ID),
		ttfb:     p.metrics.ttfb.WithLabelValues(pl.model, ep.ID),
		cached:   p.fb.cached.WithLabelValues(pl.model, ep.ID),
		prompt:   p.fb.prompt.WithLabelValues(pl.model, ep.ID),
	}
	rank := ""
	if ep.IsDataParallel() {
		rank = strconv.Itoa(ep.DataParallelRank)
	}
	e.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The reverse proxy drops the client's forwarding headers;
			// the handler has set them (setForwarded).
			for _, k := range forwardedHeaders {
				if v := pr.In.Header[k]; len(v) > 0 {
					pr.Out.Header[k] = v
				}
			}
			// The router pins a data-parallel rank; a client never does
			// (it would override the pin, or pick a rank behind a plain
			// endpoint's back).
			pr.Out.Header.Del(kvroute.HeaderDataParallelRank)
			// The body is read whole before an attempt: the engine need
			// not be asked for a 100 Continue, whose interim response the
			// reverse proxy would pass on after clearing the headers the
			// handler set (X-Request-Id) from the final one.
			pr.Out.Header.Del("Expect")
			if rank != "" {
				pr.Out.Header.Set(kvroute.HeaderDataParallelRank, rank)
			}
			if x := exchangeFrom(pr.Out.Context()); x != nil {
				// The reverse proxy hides the body behind a wrapper that
				// net/http cannot see into, so it flushes the headers
				// alone and copies the body through a fresh buffer. The
				// body is in memory: say so, and headers and prompt go
				// out in one write.
				pr.Out.Body = io.NopCloser(bytes.NewReader(x.sent))
			}
		},
		Transport: p.transport,
		// 0: event streams and bodies of unknown length are flushed chunk by
		// chunk as they arrive (what streaming needs); a body of known length
		// goes out in one write when the handler returns.
		FlushInterval:  0,
		BufferPool:     copyBuffers,
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamError,
	}
	return e, nil
}

// modifyResponse runs when an endpoint's response headers arrive, before
// anything is sent to the client: the last moment an attempt can be
// retried. A 5xx's body is read here (up to maxSavedBody), under the
// attempt's silence bound like any other wait for the engine's bytes: kept
// to replay if its retry finds no endpoint, or passed on when no retry is
// left. A body that goes silent or breaks fails the attempt without it
// (failedBodyError): retried, or answered by upstreamError. Another
// response's first body bytes are read here too (upstreamBody.readFirst),
// so that its headers reach the client only with them: a body that breaks
// before its first byte fails the attempt the same way (retried as
// upstream_reset), one silent for upstream_header is answered 504 and not
// retried, like a wait for the headers.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeFrom(resp.Request.Context())
	if x == nil {
		return nil
	}
	now := p.now()
	x.status = resp.StatusCode
	x.stall.Arm()
	if kvroute.EndpointFailure(resp.StatusCode) {
		x.reportHealth(now, false)
		// One byte over the bound says the body is not whole.
		body, err := io.ReadAll(io.LimitReader(silence.Reader(resp.Body, x.stall), maxSavedBody+1))
		switch {
		case err != nil && x.ctx.Err() != nil:
			return err // the client went away, or the drain deadline passed: upstreamError says which
		case err != nil:
			err = &failedBodyError{endpoint: x.flight.Endpoint.ID, status: resp.StatusCode, silence: x.stall, err: err}
			x.upstreamErr = err
			if x.canRetry() {
				x.retry = retryStatus
				return errRetry
			}
			return err
		case x.canRetry():
			x.saveFailedResponse(resp, body)
			x.retry = retryStatus
			return errRetry
		}
		// The last attempt: the body read so far, then the rest.
		resp.Body = prefixedBody{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), Closer: resp.Body}
		resp.Body = &upstreamBody{rc: resp.Body, x: x, sse: openai.IsPlainEventStream(resp.Header)}
	} else {
		// The headers go to the client with the first body byte (or the
		// body's end): until then the attempt may fail and be retried.
		b := &upstreamBody{rc: resp.Body, x: x, sse: openai.IsPlainEventStream(resp.Header)}
		if err := b.readFirst(); err != nil {
			if x.ctx.Err() != nil {
				return err // the client went away, or the drain deadline passed: upstreamError says which
			}
			x.reportHealth(p.now(), false)
			err = &failedBodyError{endpoint: x.flight.Endpoint.ID, status: resp.StatusCode, silence: x.stall, err: err}
			x.upstreamErr = err
			// A silence is not retried, as a wait for the headers is not
			// (tookTooLong): the engine took the request.
			if x.canRetry() && !x.stall.Fired() {
				x.retry = retryReset
				return errRetry
			}
			return err
		}
		// The endpoint's success is reported when the response ends whole
		// (forward): reported at the first byte, it reset the endpoint's
		// consecutive failures before a break after it counted one, so an
		// engine whose every stream broke midway was never ejected.
		x.flowing = true
		resp.Body = b
	}
	h := resp.Header
	h.Del(HeaderRequestID) // the client's response already carries ours
	if p.cfg.Debug.Enabled {
		h.Set(HeaderEndpoint, x.flight.Endpoint.ID)
	}
	return nil
}

// prefixedBody is a response body whose first bytes were read ahead.
type prefixedBody struct {
	io.Reader
	io.Closer
}

// failedBodyError is the failure of an attempt whose response body, read
// before anything reached the client (a 5xx's, or another's first bytes),
// went silent for timeouts.upstream_header or broke. modifyResponse has
// reported the endpoint's health; the client gets 504 (silent) or 502.
type failedBodyError struct {
	endpoint string
	status   int
	silence  *silence.Watch // the attempt's bound: Fired if it cut the read
	err      error
}

func (e *failedBodyError) Error() string {
	if e.silent() {
		return fmt.Sprintf("endpoint %s answered %d, then its body sent nothing for %s", e.endpoint, e.status, e.silence.Limit)
	}
	return fmt.Sprintf("endpoint %s answered %d, then its body broke: %v", e.endpoint, e.status, e.err)
}

func (e *failedBodyError) Unwrap() error { return e.err }

func (e *failedBodyError) silent() bool { return e.silence.Fired() }

// upstreamError handles every failure of an attempt: a transport error
// (connect error, reset, timeout), errRetry from modifyResponse, or a
// failedBodyError from it that is not retried.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	if x == nil {
		openai.WriteError(w, fmt.Errorf("proxy: %w", err))
		return
	}
	if errors.Is(err, errRetry) {
		return // modifyResponse recorded it; the attempt loop retries
	}
	var fe *failedBodyError
	if errors.As(err, &fe) { // before the context's check: a silence cut cancels the attempt's
		x.status = upstreamStatus(err)
		openai.WriteError(w, &kvroute.Error{Status: x.status, Type: kvroute.TypeUpstream, Code: "upstream_error",
			Message: fmt.Sprintf("model %q: %v", x.req.Model, err)})
		return
	}
	if r.Context().Err() != nil {
		if x.shuttingDown() { // not the endpoint's fault either
			x.shutdown = true
			x.status = writeRoutingError(w, errShutdown) // with Retry-After, as a request held in the queue gets
			return
		}
		x.clientGone = true // the client went away: not the endpoint's fault
		return
	}
	x.reportHealth(p.now(), false)
	x.upstreamErr = err
	if x.canRetry() && !tookTooLong(err) {
		// An LLM request has no effect beyond its cost: one the engine took
		// and lost (it died mid-generation, before its headers) is retried
		// too, under its own reason.
		x.retry = retryReset
		if disagg.IsConnectError(err) {
			x.retry = retryConnect
		}
		return
	}
	x.status = upstreamStatus(err)
	openai.WriteError(w, &kvroute.Error{Status: x.status, Type: kvroute.TypeUpstream, Code: "upstream_error",
		Message: fmt.Sprintf("endpoint %s of model %q failed: %v", x.flight.Endpoint.ID, x.req.Model, err)})
}

// tookTooLong reports whether an attempt failed because the engine, having
// taken the request, did not answer within timeouts.upstream_header: not
// retried, since another engine would run the whole generation again. A
// timeout while connecting is a connect error, and is.
func tookTooLong(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !disagg.IsConnectError(err)
}

// upstreamStatus maps a transport error to the client's status: 504 for a
// timeout or a failed response's body gone silent, 502 otherwise.
func upstreamStatus(err error) int {
	var ne net.Error
	var fe *failedBodyError
	if errors.As(err, &fe) {
		if fe.silent() {
			return http.StatusGatewayTimeout
		}
		return http.StatusBadGateway
	}
	if errors.As(err, &ne) && ne.Timeout() {
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// maxSavedBody bounds the body of a failed response kept to replay when no
// other endpoint can take the retry, and the part of it read ahead on the
// last attempt.
const maxSavedBody = 64 << 10

// savedResponse is a 5xx response kept while a retry is attempted.
type savedResponse struct {
	status   int
	header   http.Header
	body     []byte // the whole body; nil when it was over maxSavedBody
	endpoint string
	model    string
}

// saveFailedResponse keeps resp, with its body read by modifyResponse (at
// most maxSavedBody+1 bytes), to replay if no other endpoint can take the
// retry. A body over maxSavedBody is not kept: a cut one would reach the
// client as a well-formed-looking but corrupt answer.
func (x *exchange) saveFailedResponse(resp *http.Response, body []byte) {
	h := resp.Header.Clone()
	if x.p.cfg.Debug.Enabled {
		h.Set(HeaderEndpoint, x.flight.Endpoint.ID)
	}
	if len(body) > maxSavedBody {
		body = nil
	}
	x.saved = &savedResponse{status: resp.StatusCode, header: h, body: body, endpoint: x.flight.Endpoint.ID, model: x.req.Model}
}

// write replays a saved failed response to the client: the engine's own
// answer (marked HeaderErrorSource upstream) when its body was kept whole,
// else the router's OpenAI-style error with the engine's status.
func (s *savedResponse) write(w http.ResponseWriter) {
	if s.body == nil {
		if v := s.header.Get(HeaderEndpoint); v != "" {
			w.Header().Set(HeaderEndpoint, v)
		}
		err := &kvroute.Error{Status: s.status, Type: kvroute.TypeUpstream, Code: "upstream_error",
			Message: fmt.Sprintf("model %q: endpoint %s answered %d with a body over %d KiB, not kept to pass on, and no other endpoint could take the retry",
				s.model, s.endpoint, s.status, maxSavedBody>>10)}
		if ra := s.header.Get("Retry-After"); ra != "" {
			w.Header().Set("Retry-After", ra) // the engine's, as the kept body's replay passes it on
			openai.WriteError(w, err)
		} else {
			writeRoutingError(w, err) // a 503 or 429 says when to try again
		}
		return
	}
	h := w.Header()
	h.Set(HeaderErrorSource, errorSourceUpstream)
	for k, v := range s.header {
		if k == "Content-Length" || k == "Connection" || k == "Transfer-Encoding" || k == "Keep-Alive" || k == HeaderRequestID {
			continue
		}
		h[k] = v
	}
	h.Set("Content-Length", fmt.Sprint(len(s.body)))
	w.WriteHeader(s.status)
	_, _ = w.Write(s.body)
}

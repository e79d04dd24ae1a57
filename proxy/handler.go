package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/silence"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

type exchangeKey struct{}

// exchange is one client request on its way through the proxy: its routing
// view, its attempts and their outcome. It belongs to the handler goroutine
// (the reverse proxy's hooks run on it too).
type exchange struct {
	p           *Proxy
	pool        *pool
	ctx         context.Context
	req         *kvroute.Request
	body        []byte        // as the client sent it
	naming      adapterNaming // how body names the adapter; body in other engines' forms
	sent        []byte        // the current attempt's body: body, or body rewritten by naming
	sentNamed   bool          // the last attempt sent a body rewritten by naming
	maxAttempts int
	attempt     int
	tried       []string
	m           *poolMetrics

	// The current attempt.
	flight      *router.Flight
	up          *endpointProxy // the flight's endpoint
	attemptAt   time.Time
	firstByteAt time.Time
	status      int         // the response status, or the status of the error written
	retry       retryReason // the attempt failed before its first byte and may be retried
	upstreamErr error       // the attempt's transport error, if any
	streamErr   error       // the upstream failed after the first byte
	clientGone  bool
	flowing     bool             // the response's first byte arrived (a status that is no failure): healthy if it ends whole
	shutdown    bool             // ended by the drain deadline (Serve)
	served      bool             // the reverse proxy returned (rather than aborted the handler)
	stall       *silence.Watch   // the attempt's silence bound, once its response is flowing (nil: none)
	saved       *savedResponse   // the last retried 5xx, replayed if no endpoint is left
	tail        openai.UsageTail // the attempt's last response bytes, for the engine's usage
	head        openai.EventHead // the attempt's first response bytes: did its stream open with an error event?
	tw          tailWriter       // the client's ResponseWriter, keeping tail
	mark        errorMarker      // under tw: marks the engine's own error responses
}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

func (p *Proxy) serveCompletions(w http.ResponseWriter, r *http.Request) {
	p.serveInference(w, r, openai.KindCompletion)
}

func (p *Proxy) serveChat(w http.ResponseWriter, r *http.Request) {
	p.serveInference(w, r, openai.KindChat)
}

// serveInference is the request path: read, parse, route, forward, retry.
func (p *Proxy) serveInference(w http.ResponseWriter, r *http.Request, kind openai.Kind) {
	start := p.now()
	id := requestID(r)
	w.Header().Set(HeaderRequestID, id)
	trusted := p.trustedClient(r)
	if !trusted {
		p.stripRoutingHeaders(r)
	}
	setForwarded(r, trusted)
	body, err := p.readBody(w, r)
	if err != nil {
		p.reject(w, r, start, "", err)
		return
	}
	ri, prompt, err := openai.ParseRequestInto(kind, body, openai.Options{Prompt: promptBuffers.get(), SessionField: p.sessionField})
	if err != nil {
		promptBuffers.put(prompt)
		p.reject(w, r, start, "", err)
		return
	}
	// A LoRA adapter is routed in its base model's pool, whichever form
	// (vLLM's or SGLang's) its client named it in.
	pl, adapter, err := p.resolveModel(&ri)
	if err != nil {
		promptBuffers.put(prompt)
		p.reject(w, r, start, "", err)
		return
	}
	if pl.disc != nil { // its discovery could not start: say so, not "none ready yet"
		if err := pl.disc.notRunning(); err != nil && len(pl.set.Load().eps) == 0 {
			promptBuffers.put(prompt)
			p.reject(w, r, start, pl.model, err)
			return
		}
	}
	// The client's ID goes to the engine and back to the client; the
	// routing core gets one no other request in progress has.
	routeID := p.ids.claim(id)
	defer p.ids.release(routeID)
	req := &kvroute.Request{
		ID:           routeID,
		Model:        pl.model,
		Adapter:      adapter,
		Tenant:       tenantOf(r, trusted, ri.User),
		SessionKey:   pl.session.key(r.Header, &ri),
		Prompt:       ri.Prompt,
		PromptTokens: ri.PromptTokens(),
		MaxTokens:    ri.MaxTokens,
		Stream:       ri.Stream,
		CacheSalt:    ri.CacheSalt,
		Arrival:      start,
	}
	if pl.precise != nil {
		if err := pl.precise.prepare(kind, body, &ri, req); err != nil {
			p.log.Debug("precise: prompt not tokenized, matching on characters", "request_id", id, "model", ri.Model, "error", err)
		}
	}
	if trusted {
		if s := r.Header.Get(HeaderKVSession); s != "" {
			req.SessionKey = s
		}
	}
	naming := newAdapterNaming(&ri, req)
	if pl.pd != nil {
		// The legs' bodies in the form the pool's engines read: vLLM's
		// here; the handoff names an SGLang leg's adapter itself, in
		// lora_path (disagg).
		if pl.pdAdapterForm() == openai.AdapterVLLM {
			if body, _, err = naming.bodyFor(openai.AdapterVLLM, body, req); err != nil {
				p.reject(w, r, start, pl.model, namingError(err))
				return
			}
		}
		// Serve returns once every leg of the request has ended (so the
		// routing ID, released on return, is free), but prompt is not
		// recycled: the planner may keep the request past Serve (a pin
		// that a failed Route did not consume).
		p.servePD(w, r, pl, req, body, start)
		return
	}
	// req.Prompt aliases prompt's storage; nothing keeps it past Done (the
	// pickers that store text, like sglang's tree, copy it).
	defer promptBuffers.put(prompt)
	x := &exchange{p: p, pool: pl, req: req, body: body, naming: naming, maxAttempts: p.cfg.Retry.Attempts, m: p.metrics.pools[pl.model]}
	// Sized for the attempts the pool can take: retry.attempts may be any
	// number ("every endpoint"), and sized by it alone a large one took the
	// process down (runtime: out of memory).
	x.tried = make([]string, 0, min(x.maxAttempts, len(pl.set.Load().eps)))
	x.ctx = context.WithValue(r.Context(), exchangeKey{}, x)
	out := r.WithContext(x.ctx)
	out.Header.Set(HeaderRequestID, id)
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil // the body is read whole: send its length, not chunks
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	defer x.finish(w, start)

	var failed string // the endpoint of the last attempt, which failed in a way another may fix
	for x.attempt = 0; x.attempt < x.maxAttempts; x.attempt++ {
		var f *router.Flight
		var err error
		if x.attempt == 0 {
			f, err = p.admit(x.ctx, pl, req, x.m) // in line behind the held requests, if any
		} else {
			t0 := p.now()
			f, err = pl.router.Route(t0, req, x.tried)
			x.m.decision.Observe(p.now().Sub(t0).Seconds())
		}
		if err != nil {
			if x.attempt > 0 {
				p.log.Warn("attempt failed, no other endpoint to retry on", "request_id", id, "model", pl.model,
					"endpoint", failed, "reason", x.retry.String(), "status", x.status, "error", x.upstreamErr)
				x.writeLastFailure(w)
			} else {
				x.writeError(w, err)
			}
			return
		}
		if x.attempt > 0 {
			// A retry is counted and logged once it has somewhere to go.
			x.m.series.RLock()
			p.metrics.retries.WithLabelValues(pl.model, pl.label(failed), x.retry.String()).Inc()
			x.m.series.RUnlock()
			p.log.Warn("retrying on another endpoint", "request_id", id, "model", pl.model, "failed", failed,
				"endpoint", f.Endpoint.ID, "reason", x.retry.String(), "status", x.status, "error", x.upstreamErr)
		}
		x.tried = append(x.tried, f.Endpoint.ID)
		if !x.forward(w, out, f) {
			return
		}
		failed = f.Endpoint.ID
		if x.retry == retryConnect && f.Endpoint.IsDataParallel() {
			// The server did not take the connection: its other
			// data-parallel ranks, behind the same URL, would not either.
			x.tried = pl.router.AppendSameServer(x.tried, f.Endpoint)
		}
	}
	p.log.Warn("attempt failed, retries exhausted", "request_id", id, "model", pl.model, "endpoint", failed,
		"reason", x.retry.String(), "status", x.status, "error", x.upstreamErr, "attempts", x.maxAttempts)
}

// forward runs one attempt on the flight's endpoint and reports whether it
// failed before its first byte in a way another endpoint may fix.
func (x *exchange) forward(w http.ResponseWriter, out *http.Request, f *router.Flight) (retry bool) {
	p := x.p
	x.flight, x.attemptAt, x.firstByteAt = f, p.now(), time.Time{}
	x.status, x.retry, x.upstreamErr, x.flowing = 0, retryNone, nil, false
	x.up = x.pool.upstream(f.Endpoint)
	if x.up == nil {
		return x.gone(w, f)
	}
	body, named, err := x.attemptBody(x.up)
	if err != nil {
		x.pool.router.Done(p.now(), f, kvroute.Outcome{PromptTokens: x.req.PromptTokens, CachedTokens: -1, Failed: true})
		var am *adapterMissing
		if errors.As(err, &am) {
			return x.adapterMissing(w, am)
		}
		x.writeError(w, namingError(err))
		return false
	}
	if named || x.sentNamed {
		// The engine reads the adapter in another form than the
		// client's: this attempt sends the body rewritten for it.
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		x.sentNamed = named
	}
	x.sent = body
	out.Body = io.NopCloser(bytes.NewReader(body))
	x.tail.Reset()
	x.head = openai.EventHead{}
	x.mark = errorMarker{ResponseWriter: w, x: x}
	x.tw = tailWriter{ResponseWriter: &x.mark, tail: &x.tail, head: &x.head}
	inflight := x.up.inflight
	inflight.Inc()
	attempt := out
	if d := p.cfg.Timeouts.UpstreamHeader; d > 0 {
		// The attempt's own context, so that a response gone silent for
		// upstream_header can be cut without the client's context.
		ctx, cancel := context.WithCancelCause(x.ctx)
		defer cancel(nil)
		x.stall = &silence.Watch{Limit: d, Cut: func() { cancel(errStalled) }}
		attempt = out.WithContext(ctx)
	}
	defer func() { // also runs when the reverse proxy aborts the handler
		x.stall.Stop()
		x.stall = nil
		inflight.Dec()
		// Any error answer is a failed outcome (its first byte is no first
		// token), though only some are the endpoint's failure for passive
		// health (kvroute.EndpointFailure): a prompt over the context length is
		// vLLM's 400, at once. So is a stream that opens with an error
		// event, an error the engine met after its 200 (SGLang's refusal
		// of an adapter it does not serve, an engine error before the
		// first token): it was passed on, and the endpoint served it.
		o := kvroute.Outcome{
			PromptTokens: x.req.PromptTokens,
			CachedTokens: -1,
			Failed: x.retry != retryNone || x.upstreamErr != nil || x.streamErr != nil || x.shutdown ||
				x.status >= http.StatusBadRequest || x.req.Stream && x.head.StartsWithError(),
		}
		// The first body byte is the first token only for streams; for other
		// requests it comes with the last token, so the TTFT stays unknown (0).
		if x.req.Stream && !x.firstByteAt.IsZero() && !o.Failed {
			o.TTFT = x.firstByteAt.Sub(x.attemptAt)
		}
		if !o.Failed && x.status == http.StatusOK {
			if prompt, cached, ok := openai.ParseUsage(x.tail.Bytes()); ok {
				o.PromptTokens, o.CachedTokens = prompt, x.up.observeUsage(prompt, cached)
			}
		}
		if x.flowing && x.streamErr == nil {
			// Passed on whole (or until its client left, or the drain
			// deadline): the endpoint served it, unless it ended with the
			// engine's own error event for a failure of its own.
			x.reportHealth(p.now(), !x.endedWithServerError())
		}
		x.pool.router.Done(p.now(), f, o)
		if x.status == http.StatusNotFound && x.fromUpstream(x.status) {
			p.notFound.warn(p, x.pool.model, f.Endpoint.ID, out.URL.Path)
		}
	}()
	x.up.rp.ServeHTTP(&x.tw, attempt) // panics with http.ErrAbortHandler when a copy fails
	x.served = true
	return x.retry != retryNone
}

// errEndpointGone is the failure of an attempt whose endpoint left the
// pool (a config reload) between its routing and its dispatch.
var errEndpointGone = errors.New("the endpoint was removed from the pool")

// gone ends an attempt routed to an endpoint that a reload removed before
// it was sent: retried on another endpoint when it may be, else 503. The
// endpoint's health is not at fault.
func (x *exchange) gone(w http.ResponseWriter, f *router.Flight) (retry bool) {
	x.upstreamErr = errEndpointGone
	// The attempt never reached the engine: its ID is not "tried" (it may
	// name the engine a reload put in its place, which a retry may take).
	if n := len(x.tried); n > 0 && x.tried[n-1] == f.Endpoint.ID {
		x.tried = x.tried[:n-1]
	}
	x.pool.router.Done(x.p.now(), f, kvroute.Outcome{PromptTokens: x.req.PromptTokens, CachedTokens: -1, Failed: true})
	if x.canRetry() {
		x.retry = retryGone
		return true
	}
	x.status = writeRoutingError(w, &kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
		Code: "endpoint_removed", Message: fmt.Sprintf("endpoint %s of model %q was removed from the pool", f.Endpoint.ID, x.req.Model)})
	return false
}

// adapterMissing ends an attempt whose engine cannot run the request's
// LoRA adapter (a llama.cpp server whose list was not known at the pick,
// where one known not to list it is no candidate, or whose list changed
// since), before it is sent: retried on another endpoint when
// it may be (this one stays tried), else answered with err. The
// endpoint's health is not at fault.
func (x *exchange) adapterMissing(w http.ResponseWriter, err *adapterMissing) (retry bool) {
	x.upstreamErr = err
	x.p.log.Debug("engine cannot run the request's LoRA adapter", "request_id", x.req.ID, "model", x.req.Model,
		"adapter", x.req.Adapter, "endpoint", x.flight.Endpoint.ID, "error", err)
	if x.canRetry() {
		x.retry = retryAdapter
		return true
	}
	x.status = writeRoutingError(w, err.err)
	return false
}

// firstByte records the first response body byte of the attempt.
func (x *exchange) firstByte(now time.Time) {
	x.firstByteAt = now
	x.pool.router.FirstToken(now, x.flight)
	x.up.ttfb.Observe(now.Sub(x.attemptAt).Seconds())
}

// endedWithServerError reports whether a 200 stream ended with an error
// event whose code is the endpoint's failure (kvroute.EndpointFailure): vLLM's
// 500 for a request its engine failed after the response began
// (finish_reason "error"), before or after tokens. A 400 event, a
// request the engine refused (SGLang's adapter it does not serve), is
// not the endpoint's fault. Nor is the router's own event that ends a
// stream at the drain deadline (shutdown).
func (x *exchange) endedWithServerError() bool {
	if !x.req.Stream || x.status != http.StatusOK || x.shutdown {
		return false
	}
	code, ok := openai.EndsWithErrorEvent(x.tail.Bytes())
	return ok && kvroute.EndpointFailure(code)
}

// reportHealth feeds passive health and counts ejections. An attempt on an
// endpoint that a reload has removed since, or whose ID now names another
// engine, says nothing of the endpoint the ID names now.
func (x *exchange) reportHealth(now time.Time, ok bool) {
	if x.pool.upstream(x.flight.Endpoint) == nil {
		return
	}
	id := x.flight.Endpoint.ID
	if x.pool.router.ReportResult(now, id, ok) {
		x.m.series.RLock()
		x.p.metrics.ejections.WithLabelValues(x.pool.model, x.pool.label(id), "passive").Inc()
		x.m.series.RUnlock()
		x.p.log.Warn("endpoint ejected", "model", x.pool.model, "endpoint", id, "request_id", x.req.ID)
	}
}

// writeError writes err to the client (with Retry-After for 503 and 429).
// Every 503 and 429 the router answers on its own goes through
// writeRoutingError, so that it says when to try again. The router's 404
// of an adapter that no endpoint's llama.cpp server lists is told the
// field the client named the adapter in.
func (x *exchange) writeError(w http.ResponseWriter, err error) {
	if ke := (*kvroute.Error)(nil); x.req.Adapter != "" && errors.As(err, &ke) && ke.Code == "model_not_found" && ke.Param == "" {
		ke.Param = x.naming.adapterParam(x.req.Adapter)
	}
	x.status = writeRoutingError(w, err)
}

func writeRoutingError(w http.ResponseWriter, err error) int {
	status := kvroute.StatusOf(err)
	var ue *router.UnavailableError
	var ke *kvroute.Error
	switch {
	case errors.As(err, &ke) && ke.Code == codeDiscoveryNotRunning:
		// No Retry-After: waiting does not help.
	case errors.As(err, &ue):
		w.Header().Set("Retry-After", strconv.Itoa(max(ue.RetryAfter, 1)))
	case status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "1")
	}
	openai.WriteError(w, err)
	return status
}

// writeLastFailure answers a request whose retry found no endpoint: with
// the failed attempt's own 5xx response when there was one, else 502
// (504 when the failure was a silence).
func (x *exchange) writeLastFailure(w http.ResponseWriter) {
	if x.saved != nil {
		x.status = x.saved.status
		x.saved.write(w)
		return
	}
	err := x.upstreamErr
	if err == nil {
		err = errors.New("no endpoint left to retry on")
	}
	if am := (*adapterMissing)(nil); errors.As(err, &am) && x.retry == retryAdapter {
		// The last endpoint tried cannot run the adapter either.
		x.status = writeRoutingError(w, am.err)
		return
	}
	if errors.Is(err, errEndpointGone) {
		// Not an upstream's failure: the pool changed under the request.
		x.status = writeRoutingError(w, &kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
			Code: "endpoint_removed", Message: fmt.Sprintf("model %q: the endpoint chosen was removed from the pool before the request was sent, and no other could take it", x.req.Model)})
		return
	}
	x.status = upstreamStatus(err)
	openai.WriteError(w, &kvroute.Error{Status: x.status, Type: kvroute.TypeUpstream, Code: "upstream_error",
		Message: fmt.Sprintf("model %q: every endpoint tried failed (%s): %v", x.req.Model, x.tried, err)})
}

// HeaderErrorSource is kvroute.HeaderErrorSource: "upstream" on an
// engine's error answer passed through (the aggregated path's and the P/D
// handoff's). Which endpoint answered is named only with debug.enabled
// (HeaderEndpoint).
const HeaderErrorSource = kvroute.HeaderErrorSource

const errorSourceUpstream = kvroute.ErrorSourceUpstream

// errorMarker is the client's ResponseWriter as the reverse proxy sees it
// (under tailWriter): it marks the engine's error responses with
// HeaderErrorSource. Unwrap keeps http.ResponseController working.
type errorMarker struct {
	http.ResponseWriter
	x *exchange
}

func (w *errorMarker) WriteHeader(code int) {
	if code >= 400 && w.x.fromUpstream(code) {
		w.Header().Set(HeaderErrorSource, errorSourceUpstream)
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap returns the client's ResponseWriter.
func (w *errorMarker) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// fromUpstream reports whether a response of status code in the current
// attempt is the engine's own (passed through), not one the router wrote
// for a failed attempt.
func (x *exchange) fromUpstream(code int) bool {
	return code == x.status && x.upstreamErr == nil && x.retry == retryNone && !x.shutdown
}

// notFoundEvery is how often an endpoint's 404s are logged at most.
const notFoundEvery = time.Minute

// notFoundLog rate-limits the warning that an engine answered an
// inference request 404: once per endpoint per notFoundEvery, with the
// number suppressed since. Safe for concurrent use.
type notFoundLog struct {
	mu   sync.Mutex                      // guards last
	last map[notFoundKey]*notFoundLogged // by model and endpoint
}

type notFoundKey struct{ model, endpoint string }

// forget drops an endpoint removed from its model's pool, so that a
// fleet whose engines come and go (discovery) does not grow the map.
func (l *notFoundLog) forget(model, endpoint string) {
	l.mu.Lock()
	delete(l.last, notFoundKey{model, endpoint})
	l.mu.Unlock()
}

type notFoundLogged struct {
	at         time.Time // when it was last logged
	suppressed int       // 404s not logged since
}

// warn logs an engine's 404 (on path, for model) unless the endpoint's
// last one logged is more recent than notFoundEvery. The engine most
// likely does not serve the model under the router's name: the model's
// name must be the one the engine serves (vLLM's --served-model-name).
func (l *notFoundLog) warn(p *Proxy, model, endpoint, path string) {
	now := p.now()
	k := notFoundKey{model, endpoint}
	l.mu.Lock()
	e := l.last[k]
	if e != nil && now.Sub(e.at) < notFoundEvery {
		e.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := 0
	if e != nil {
		suppressed = e.suppressed
	}
	if l.last == nil {
		l.last = make(map[notFoundKey]*notFoundLogged)
	}
	for k, e := range l.last { // endpoints gone (reloads, discovery)
		if now.Sub(e.at) > 10*notFoundEvery {
			delete(l.last, k)
		}
	}
	l.last[k] = &notFoundLogged{at: now}
	l.mu.Unlock()
	p.log.Warn("engine answered 404: it likely does not serve the model under this name, or not at this path",
		"model", model, "endpoint", endpoint, "path", path,
		"hint", "the engine must serve the model as "+strconv.Quote(model)+" (vLLM: --served-model-name); the 404 is passed to the client",
		"suppressed", suppressed)
}

// finish accounts for the request once it is answered (or aborted).
func (x *exchange) finish(w http.ResponseWriter, start time.Time) {
	p := x.p
	now := p.now()
	code := x.status
	switch {
	case x.shutdown || (!x.served && x.shuttingDown()): // (held in the queue, say)
		code = http.StatusServiceUnavailable
	case x.clientGone || (!x.served && x.ctx.Err() != nil):
		code = statusClientClosed
	case code == 0:
		code = http.StatusBadGateway
	}
	endpoint := ""
	x.m.series.RLock()
	if x.flight != nil {
		endpoint = x.pool.label(x.flight.Endpoint.ID)
	}
	p.metrics.requests.WithLabelValues(x.pool.model, endpoint, strconv.Itoa(code)).Inc()
	x.m.series.RUnlock()
	x.m.duration.Observe(now.Sub(start).Seconds())
	if p.log.Enabled(x.ctx, levelFor(code)) {
		p.log.Log(x.ctx, levelFor(code), "request", "request_id", x.req.ID, "model", x.req.Model, adapterAttr(x.req.Adapter),
			"endpoint", endpoint, "status", code, "attempts", len(x.tried), "stream", x.req.Stream, "prompt_tokens", x.req.PromptTokens,
			"duration", now.Sub(start), "stream_error", x.streamErr)
	}
}

// adapterAttr is a request log line's "adapter": the LoRA adapter the
// request names (kvroute.Request.Adapter), as the decision log has it; an
// empty attribute, which slog leaves out, for the base model.
func adapterAttr(adapter string) slog.Attr {
	if adapter == "" {
		return slog.Attr{}
	}
	return slog.String("adapter", adapter)
}

// errShutdown ends the requests still in progress when Serve's drain
// deadline passes.
// Its code is the status, as in vLLM's error events.
var errShutdown = &kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
	Message: "the router is shutting down and the drain deadline passed"}

// shuttingDown reports whether the exchange was ended by the drain deadline
// (rather than by its client going away).
func (x *exchange) shuttingDown() bool { return errors.Is(context.Cause(x.ctx), errShutdown) }

// statusClientClosed is nginx's code for a client that closed the
// connection before the response was complete; it is only a metric label.
const statusClientClosed = 499

// reject answers a request that failed before routing.
func (p *Proxy) reject(w http.ResponseWriter, r *http.Request, start time.Time, model string, err error) {
	status := writeRoutingError(w, err)
	p.metrics.requests.WithLabelValues(model, "", strconv.Itoa(status)).Inc()
	p.log.Debug("request rejected", "request_id", w.Header().Get(HeaderRequestID), "status", status, "error", err,
		"remote", r.RemoteAddr, "duration", p.now().Sub(start))
}

// readBody reads the request body within limits.max_body_bytes and
// timeouts.read_body.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) (body []byte, err error) {
	limit := p.cfg.Limits.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	if d := p.cfg.Timeouts.ReadBody; d > 0 {
		// The deadline is lifted once the body is read, so that the server
		// can notice a client going away during a long stream; after a
		// failed read it stays, and the connection is closed.
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(d)) == nil {
			defer func() {
				if err == nil {
					_ = rc.SetReadDeadline(time.Time{})
				} else {
					w.Header().Set("Connection", "close")
				}
			}()
		}
	}
	size := r.ContentLength
	if size < 0 {
		size = 512
	}
	size = min(size, 1<<20)      // a declared length is not yet a body: grow past 1 MiB as it arrives
	b := make([]byte, 0, size+1) // +1: the final read sees EOF without growing
	rd := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, rerr := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if rerr == io.EOF {
			return b, nil
		}
		if err = rerr; err != nil {
			var mbe *http.MaxBytesError
			var ne net.Error
			switch {
			case errors.As(err, &mbe):
				return nil, tooLarge(limit)
			case errors.As(err, &ne) && ne.Timeout():
				return nil, kvroute.Errorf(http.StatusRequestTimeout, kvroute.TypeInvalidRequest, "request_timeout", "",
					"reading the request body took longer than %s", p.cfg.Timeouts.ReadBody)
			}
			return nil, kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_body", "",
				"reading the request body: %v", err)
		}
	}
}

func tooLarge(limit int64) error {
	return kvroute.Errorf(http.StatusRequestEntityTooLarge, kvroute.TypeInvalidRequest, "request_too_large", "",
		"request body is larger than the limit of %d bytes", limit)
}

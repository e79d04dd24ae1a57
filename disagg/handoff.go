package disagg

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/silence"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

// Handoff protocols.
const (
	// ProtocolNixl is vLLM's NixlConnector handshake: a prefill request
	// with max_tokens=1 and kv_transfer_params.do_remote_decode, then the
	// original request to the decode engine with the returned params.
	ProtocolNixl = "nixl"
	// ProtocolSGLang is SGLang's bootstrap form: the same body, with
	// bootstrap_host/port/room, sent to both engines at once.
	ProtocolSGLang = "sglang"
)

// DefaultBootstrapPort is SGLang's --disaggregation-bootstrap-port default.
const DefaultBootstrapPort = 8998

// LabelBootstrapPort is the endpoint label that gives a prefill engine's
// SGLang bootstrap port.
const LabelBootstrapPort = kvroute.LabelBootstrapPort

// Doer sends HTTP requests; *http.Client implements it.
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// HandoffConfig configures a Handoff. Router, Planner and Client are
// required; the rest have documented defaults.
type HandoffConfig struct {
	// Model names the model in metrics and logs; default the router's.
	Model string
	// Router is the model's routing core; its Picker must be Planner.
	Router *router.Router
	// Planner places the requests (the router's Picker).
	Planner *Planner
	// Client sends the legs to the engines.
	Client Doer
	// Protocol is ProtocolNixl (default) or ProtocolSGLang.
	Protocol string
	// Attempts is the most placements tried per request (a failed leg
	// leads to a new plan that avoids the failed endpoints); default 3.
	Attempts int
	// BootstrapPort is the prefill engines' SGLang bootstrap port when an
	// endpoint has no bootstrap_port label; default 8998.
	BootstrapPort int
	// MaxReplyBytes caps a reply the router reads whole: a prefill reply
	// (one over it fails the leg) and a failed leg's error body (one over
	// it is answered with the router's own error under the engine's
	// status). Neither is ever cut. Default 4 MiB.
	MaxReplyBytes int64
	// PrefillGrace bounds how long an SGLang handoff waits for the prefill
	// leg's reply once the decode leg has answered the client in full
	// (the KV cache did arrive then): past it the leg is cancelled, so a
	// stuck prefill engine cannot hold the end of the client's response;
	// default 5s. A decode answer whose stream opens with an error event
	// (the decode engine refused the request in band) does not wait: the
	// leg is cancelled when it ended.
	PrefillGrace time.Duration
	// Silence, when positive, bounds each wait for the next bytes of an
	// answer being passed on to the client (the proxy's
	// timeouts.upstream_header, which bounds its headers): an engine that
	// hangs mid-answer ends the stream with a 504 error event (a JSON body
	// is aborted) and is reported failed; one that hangs before its
	// answer's first byte is reported failed and answered 504, not placed
	// again (its headers were not passed on). Time spent writing to a
	// slow client does not count. It bounds the same way the replies the
	// router reads whole (a prefill's, an error to replay): one cut is a
	// failed leg. Default 0: no bound.
	Silence time.Duration
	// EndpointHeader, when set, is a response header naming the endpoint
	// that answered the client (the decode engine, or the one that ran the
	// request whole or sent the error): the router's debug header, which
	// `kvroute bench` reads for its per-engine figures. Default none.
	EndpointHeader string
	// Metrics records the handoff (nil: none).
	Metrics *Metrics
	// Logger receives warnings and errors (nil: discard).
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Room draws SGLang bootstrap rooms; default a crypto-random 63-bit
	// value.
	Room func() uint64
	// Admit, when set, routes a request's first placement in place of
	// Router.Route (with nothing excluded): the proxy's queue escape hatch,
	// which may hold the request (in line behind requests held before it,
	// or when the policy sheds it with the "queue" action) and route it as
	// load drains. It returns the flight, or the error to answer with.
	// Nil: Router.Route.
	Admit func(ctx context.Context, req *kvroute.Request) (*router.Flight, error)
	// Inflight, when set, is called as each leg is sent to endpoint e,
	// and the function it returns when the leg ends (its answer closed,
	// or its sending failed): the proxy's kvroute_inflight_requests. Nil:
	// nothing is tracked.
	Inflight func(e *kvroute.Endpoint) (done func())
	// Usage, when set, is called with the usage reported on endpoint e
	// by a vLLM (nixl) prefill leg's reply, or by the answer (a 200
	// passed on whole, read from its tail: openai.ParseUsage) of a
	// request run whole on one node, not handed off:
	// usage.prompt_tokens and prompt_tokens_details.cached_tokens (-1
	// when the engine did not report it): the proxy's prefix cache
	// counters. It returns the cached tokens to take as the engine's
	// (the proxy reads an absent count as 0 from an endpoint that has
	// reported one: vLLM leaves the field out when nothing was cached).
	// Those and the prompt tokens are the flight's Outcome, which the
	// prefill policy learns from. A decode engine's usage after a
	// handoff is not reported: it counts the KV pulled from the prefill
	// engine as cached. Nil: not reported, and the figures are taken as
	// read.
	Usage func(e *kvroute.Endpoint, prompt, cached int) int
	// Live, when set, reports whether endpoint e, as a leg was routed to
	// it, is still in the pool: the pool's endpoints change while it
	// serves (the proxy's config reload and discovery), and an endpoint
	// removed since, or whose ID names another engine or role now, is not
	// live. A leg routed to an endpoint no longer live is not sent: its
	// flight ends, nobody's health is reported, and the request is placed
	// again over the pool as it is now (a decode leg whose prefill is done
	// goes to another decode node, as after a connect error); when no
	// placement is left it is answered 503 with code endpoint_removed. A
	// leg already sent when its endpoint leaves runs to its end, without
	// health reports. Nil: every endpoint routed to is live.
	Live func(e *kvroute.Endpoint) bool
}

// Handoff serves the requests of one P/D model: it places each request
// with the router and Planner, runs the legs in the engines' own protocol,
// streams the answer to the client and recovers from failed legs:
//
//   - a prefill reply without kv_transfer_params whose request ended on
//     its one token (finish_reason "stop": vLLM hands KV over only for a
//     request its length cap ended) is no failure: the request runs whole
//     on the planned decode node;
//   - a prefill leg that fails (transport error, 5xx, or another reply
//     without kv_transfer_params, which is counted and logged) leads to a new plan
//     that avoids the failed node: another prefill node, or, when none is
//     left, aggregated on a decode node (the planner's no_prefill rule);
//     on the last attempt the request runs aggregated on the planned
//     decode node at once;
//   - an answer's status and headers go to the client with its first
//     body byte (or its end, for an empty body), as on the aggregated
//     path, so a leg whose answer breaks between its headers and its
//     first byte has sent the client nothing and fails like one that got
//     no answer;
//   - a decode leg that fails before its first byte with a connect error
//     (the request never reached the engine, so the prefill's KV lease is
//     untouched) is retried once on another decode node with the same
//     kv_transfer_params; any other decode failure before its first byte
//     (a 5xx, a connection that breaks after the request was sent, before
//     or after the answer's headers: the engine may have pulled the KV,
//     and vLLM's prefill engine then holds no lease for another decode
//     node) leads to a new plan, which re-runs the prefill (now mostly a
//     prefix-cache hit), except a timeout waiting for the answer (the
//     client's response header timeout, or Silence before its first
//     byte), answered 504 at once as on the aggregated path: the
//     generation would run again only to time out the same way; a leg
//     that runs the request whole on one node (aggregated) is placed
//     again, or answered 504, the same way;
//   - SGLang's two legs share one context: when either fails, both are
//     cancelled and the pair is placed again with a new room;
//   - a client that goes away cancels every leg in flight.
//
// Client-supplied handoff fields and endpoint-naming headers are rejected
// (CheckClientRequest): the endpoints a leg names come only from the
// router's decision and the prefill engine's reply. A Handoff is safe for
// concurrent use.
type Handoff struct {
	cfg HandoffConfig
	log *slog.Logger
}

// NewHandoff validates cfg, fills its defaults and returns a Handoff.
func NewHandoff(cfg HandoffConfig) (*Handoff, error) {
	switch {
	case cfg.Router == nil:
		return nil, errors.New("disagg: handoff: router is required")
	case cfg.Planner == nil:
		return nil, errors.New("disagg: handoff: planner is required")
	case cfg.Client == nil:
		return nil, errors.New("disagg: handoff: client is required")
	}
	switch cfg.Protocol {
	case "":
		cfg.Protocol = ProtocolNixl
	case ProtocolNixl, ProtocolSGLang:
	default:
		return nil, fmt.Errorf("disagg: handoff: protocol must be nixl or sglang, got %q", cfg.Protocol)
	}
	if cfg.Model == "" {
		cfg.Model = cfg.Router.Model()
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 3
	}
	if cfg.BootstrapPort <= 0 {
		cfg.BootstrapPort = DefaultBootstrapPort
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = 4 << 20
	}
	if cfg.PrefillGrace <= 0 {
		cfg.PrefillGrace = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Room == nil {
		cfg.Room = cryptoRoom
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handoff{cfg: cfg, log: log}, nil
}

// newLegID gives the placement about to run its own X-Request-Id: the
// request's ID, a dot and 8 random base-36 digits. Every leg of one
// placement carries it (the decode leg's retry too): vLLM's NixlConnector
// before its remote_request_id (protocol version 2) found the prefill's
// held blocks by the decode request's own id. A second placement must not
// reuse it: a vLLM that does not randomise request ids (before v0.14, or
// VLLM_DISABLE_REQUEST_ID_RANDOMIZATION) still holds the first prefill
// under it, and a duplicate id fails its scheduler's assertion (or, in
// older versions, replaces the held request). Random, not a counter: a
// client that sends the same X-Request-Id on every request would collide
// with its own earlier request's held prefill.
func (x *exchange) newLegID() {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := make([]byte, 0, len(x.req.ID)+9)
	id = append(append(id, x.req.ID...), '.')
	for _, c := range b {
		id = append(id, digits[int(c)%len(digits)])
	}
	x.legID = string(id)
}

func cryptoRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// Result is what happened to one request.
type Result struct {
	// Status is the status written to the client (499 when the client went
	// away first).
	Status int
	// Disaggregated reports that the answering placement had two legs;
	// Prefill and Decode name its endpoints ("" when none answered).
	Disaggregated   bool
	Prefill, Decode string
	// Attempts is the number of placements tried.
	Attempts int
	// TTFB is how long the answering engine (Decode) took to its first
	// response byte, from when its leg was sent; 0 when none came.
	TTFB time.Duration
	// Err is why the request failed: the last leg failure when no
	// placement answered, the answer's own failure when it broke after its
	// first byte, or the prefill leg's failure after an SGLang decode leg
	// answered. Nil when the client got a whole answer, even after failed
	// legs that a later placement recovered from (the handoff's metrics
	// and logs count those).
	Err error
	// Abort reports that the answer broke after its status was sent, in a
	// body with no in-band way to say so (not an event stream, or one
	// content-encoded): the caller must abort the response once its
	// accounting is done (panic(http.ErrAbortHandler), as
	// httputil.ReverseProxy does), so that the client sees a broken
	// response rather than a complete-looking truncated one.
	Abort bool
}

// StatusClientClosed is the status recorded when the client went away.
const StatusClientClosed = 499

// ReasonRemoved is the LegError.Reason of a leg not sent because its
// endpoint left the pool after it was routed (HandoffConfig.Live).
const ReasonRemoved = "endpoint_removed"

// errEndpointRemoved is the Err of a ReasonRemoved leg.
var errEndpointRemoved = errors.New("the endpoint was removed from the pool before the leg was sent")

// LegError is a failed leg.
type LegError struct {
	// Leg is prefill, decode or aggregated; Endpoint the engine's ID.
	Leg, Endpoint string
	// Reason is status, transport, missing_kv_params, cancelled or
	// endpoint_removed (ReasonRemoved).
	Reason string
	// Status and Body are the engine's error response, if it sent one.
	Status int
	Body   []byte
	header http.Header
	// Connect reports a transport error before the request was sent.
	Connect bool
	// Timeout reports that the engine took the request and did not answer
	// in time (the client's response header timeout: the proxy's
	// timeouts.upstream_header), or sent its answer's headers and then
	// nothing for Silence.
	Timeout bool
	Err     error
}

func (e *LegError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("disagg: %s leg on %s: %s: %v", e.Leg, e.Endpoint, e.Reason, e.Err)
	default:
		return fmt.Sprintf("disagg: %s leg on %s: status %d: %s", e.Leg, e.Endpoint, e.Status, bytes.TrimSpace(e.Body))
	}
}

func (e *LegError) Unwrap() error { return e.Err }

// exchange is one request through the handoff.
type exchange struct {
	h    *Handoff
	w    http.ResponseWriter
	r    *http.Request
	ctx  context.Context
	path string
	body []byte
	req  *kvroute.Request
	// legID is the X-Request-Id of the current placement's legs (newLegID).
	legID string
	tried []string
	last  *LegError
	res   Result
	start time.Time
}

// Serve answers one client request for path (/v1/completions or
// /v1/chat/completions) whose body was already read and whose routing view
// req was parsed. It writes the response and returns what happened. A
// request whose context the server cancels with a *kvroute.Error cause
// (context.WithCancelCause; the proxy does at its drain deadline) is
// answered with that error: a JSON error before the answer began, an
// error event and "data: [DONE]" in a stream.
func (h *Handoff) Serve(w http.ResponseWriter, r *http.Request, path string, body []byte, req *kvroute.Request) Result {
	x := &exchange{h: h, w: w, r: r, ctx: r.Context(), path: path, body: body, req: req, start: h.cfg.Now()}
	if err := CheckClientRequest(body, r.Header); err != nil {
		var ke *kvroute.Error
		if errors.As(err, &ke) {
			h.cfg.Metrics.reject(h.cfg.Model, ke.Code)
		}
		h.log.Warn("pd: client request rejected", "request_id", req.ID, "error", err, "remote", r.RemoteAddr)
		openai.WriteError(w, err)
		x.res.Status = kvroute.StatusOf(err)
		x.res.Err = err
		return x.res
	}
	forceAgg := false
	for attempt := 0; attempt < h.cfg.Attempts; attempt++ {
		if x.ctx.Err() != nil {
			x.clientGone()
			return x.res
		}
		x.res.Attempts = attempt + 1
		last := attempt == h.cfg.Attempts-1
		var done bool
		if forceAgg {
			done = x.aggregatedOnDecode()
		} else {
			var fallbackDecode *kvroute.Endpoint
			done, fallbackDecode = x.placeAndRun(last)
			if !done && fallbackDecode != nil && attempt+1 == h.cfg.Attempts-1 {
				// The next attempt is the last: run aggregated on the
				// decode node rather than risk another prefill.
				forceAgg = true
				h.cfg.Planner.PinEndpoint(x.req, fallbackDecode)
				defer h.cfg.Planner.Unpin(x.req) // the client may leave before the attempt
			}
		}
		if done {
			return x.res
		}
	}
	x.writeLastFailure()
	return x.res
}

// placeAndRun routes one placement and runs it. done reports that the
// request is answered; otherwise the failure is recorded and, after a
// failed prefill leg, decode is the planned decode node.
func (x *exchange) placeAndRun(last bool) (done bool, decode *kvroute.Endpoint) {
	h := x.h
	var f *router.Flight
	var err error
	if h.cfg.Admit != nil && x.res.Attempts == 1 {
		f, err = h.cfg.Admit(x.ctx, x.req)
	} else {
		f, err = h.cfg.Router.Route(h.cfg.Now(), x.req, x.tried)
	}
	if err != nil {
		x.writeRoutingFailure(err)
		return true, nil
	}
	x.newLegID()
	plan, ok := h.cfg.Planner.Take(x.req)
	if !ok { // not planned by the Planner (a foreign picker): run whole on f
		plan = Plan{Prefill: f.Endpoint, Decode: f.Endpoint, Rule: "unplanned"}
	}
	h.cfg.Metrics.decision(h.cfg.Model, &plan)
	h.log.Debug("pd: placed", "request_id", x.req.ID, "leg_id", x.legID, "disaggregated", plan.Disaggregated, "prefill", plan.Prefill.ID,
		"decode", plan.Decode.ID, "reason", plan.Reason)
	if !plan.Disaggregated {
		if x.last != nil && x.last.Leg == "prefill" {
			h.cfg.Metrics.fallback(h.cfg.Model, "aggregated")
			h.log.Warn("pd: prefill failed, running aggregated", "request_id", x.req.ID, "endpoint", f.Endpoint.ID, "reason", plan.Reason)
		}
		return x.runWhole(f, "aggregated"), nil
	}
	switch h.cfg.Protocol {
	case ProtocolSGLang:
		return x.runSGLang(f, &plan), nil
	}
	return x.runNixl(f, &plan, last)
}

// aggregatedOnDecode runs the request whole on the pinned decode node (the
// fallback after a failed prefill).
func (x *exchange) aggregatedOnDecode() bool {
	h := x.h
	f, err := h.cfg.Router.Route(h.cfg.Now(), x.req, x.tried)
	if err != nil {
		x.writeRoutingFailure(err)
		return true
	}
	h.cfg.Planner.Take(x.req) // nothing planned after a pin; keep the books clean
	x.newLegID()
	h.cfg.Metrics.fallback(h.cfg.Model, "aggregated")
	h.log.Warn("pd: prefill failed, running aggregated on the decode node", "request_id", x.req.ID, "endpoint", f.Endpoint.ID)
	return x.runWhole(f, "aggregated")
}

// runWhole forwards the client's body to f's endpoint and streams the
// answer back.
func (x *exchange) runWhole(f *router.Flight, leg string) bool {
	h := x.h
	if x.gone(f, leg) {
		return false
	}
	t0 := h.cfg.Now()
	ctx, cut := context.WithCancel(x.ctx) // cut: the answer went silent (stream)
	defer cut()
	resp, lerr := x.post(ctx, f.Endpoint, x.body, leg)
	var a *answer
	if lerr == nil {
		a, lerr = x.begin(ctx, cut, resp, f, leg, t0)
	}
	if lerr != nil {
		x.legFailed(f, lerr)
		switch {
		case x.ctx.Err() != nil:
			return x.clientGone()
		case lerr.Status >= 400 && lerr.Status < 500:
			x.replay(lerr)
			return true
		case lerr.Timeout:
			x.writeTimeout(lerr)
			return true
		}
		return false
	}
	x.res.Prefill, x.res.Decode, x.res.Disaggregated = f.Endpoint.ID, f.Endpoint.ID, false
	x.stream(a, f)
	return true
}

// runNixl runs vLLM NixlConnector's two sequential legs.
func (x *exchange) runNixl(pf *router.Flight, plan *Plan, last bool) (bool, *kvroute.Endpoint) {
	h := x.h
	defer h.cfg.Planner.Finish(plan.Ticket)
	pbody, err := NixlPrefillBody(x.body)
	if err != nil { // CheckClientRequest parsed it already; unreachable in practice
		pf.Decision.Reason = err.Error()
		x.writeError(kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_body", "", "%v", err))
		h.cfg.Router.Done(h.cfg.Now(), pf, kvroute.Outcome{Failed: true})
		return true, nil
	}
	if x.gone(pf, "prefill") {
		return false, nil // placed again over the pool as it is now
	}
	t0 := h.cfg.Now()
	params, lerr := x.prefillNixl(pf, pbody)
	if lerr != nil {
		if x.ctx.Err() != nil {
			return x.clientGone(), nil
		}
		if lerr.Status >= 400 && lerr.Status < 500 { // the client's request is bad: answer with it
			x.replay(lerr)
			return true, nil
		}
		h.cfg.Metrics.fallback(h.cfg.Model, "replan")
		return false, plan.Decode
	}
	h.cfg.Metrics.observeStage(h.cfg.Model, "prefill", h.cfg.Now().Sub(t0).Seconds())
	dbody := x.body // no params (the prefill stopped on its first token): the decode node runs it whole
	if params != nil {
		if dbody, err = NixlDecodeBody(x.body, params); err != nil {
			x.writeError(kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_body", "", "%v", err))
			return true, nil
		}
	}
	dreq := *x.req
	h.cfg.Planner.PinEndpoint(&dreq, plan.Decode)
	defer h.cfg.Planner.Unpin(&dreq)
	for try := 0; try < 2; try++ {
		now := h.cfg.Now()
		df, err := h.cfg.Router.Route(now, &dreq, x.tried)
		if err != nil && try == 0 { // the planned decode node went away meanwhile
			h.cfg.Planner.PinDecode(&dreq, plan.Prefill)
			df, err = h.cfg.Router.Route(now, &dreq, x.tried)
		}
		if err != nil {
			if !x.live(plan.Decode) {
				// The planned decode node left the pool since the plan
				// and no other can take the leg: placed again, as
				// runSGLang does (answered endpoint_removed when nothing
				// is left to try).
				x.last = &LegError{Leg: "decode", Endpoint: plan.Decode.ID, Reason: ReasonRemoved, Err: errEndpointRemoved}
				h.cfg.Metrics.failure(h.cfg.Model, "decode", ReasonRemoved)
				return false, nil
			}
			x.writeRoutingFailure(err)
			return true, nil
		}
		if x.gone(df, "decode") {
			if try == 0 { // the lease is untouched: another decode node can pull it
				h.cfg.Planner.PinDecode(&dreq, plan.Prefill)
				continue
			}
			return false, nil
		}
		td := h.cfg.Now()
		dctx, cut := context.WithCancel(x.ctx) // cut: the answer went silent (stream)
		defer cut()
		resp, lerr := x.post(dctx, df.Endpoint, dbody, "decode")
		var a *answer
		if lerr == nil {
			// Its first bytes: a decode engine whose connection breaks
			// after its headers may have pulled the KV cache, leaving
			// no lease for another decode node: placed again below.
			a, lerr = x.begin(dctx, cut, resp, df, "decode", td)
		}
		if lerr != nil {
			x.legFailed(df, lerr)
			if x.ctx.Err() != nil {
				return x.clientGone(), nil
			}
			if lerr.Status >= 400 && lerr.Status < 500 {
				x.replay(lerr)
				return true, nil
			}
			if lerr.Timeout {
				x.writeTimeout(lerr)
				return true, nil
			}
			if lerr.Connect && try == 0 {
				// The request never reached the engine: the lease is
				// untouched, so another decode node can pull it.
				h.cfg.Metrics.fallback(h.cfg.Model, "decode_retry")
				h.cfg.Planner.PinDecode(&dreq, plan.Prefill)
				continue
			}
			h.cfg.Metrics.fallback(h.cfg.Model, "replan")
			return false, nil
		}
		if params != nil {
			x.handed(plan, df.Endpoint)
		}
		x.res.Prefill, x.res.Decode, x.res.Disaggregated = plan.Prefill.ID, df.Endpoint.ID, true
		x.stream(a, df)
		return true, nil
	}
	return false, nil
}

// prefillNixl runs the prefill leg and returns the engine's
// kv_transfer_params: nil, with no error, when the request ended on its
// first token (stoppedEarly), which leaves no KV to hand over.
func (x *exchange) prefillNixl(pf *router.Flight, pbody []byte) (json.RawMessage, *LegError) {
	h := x.h
	t0 := h.cfg.Now()
	resp, lerr := x.post(x.ctx, pf.Endpoint, pbody, "prefill")
	if lerr != nil {
		x.legFailed(pf, lerr)
		return nil, lerr
	}
	b, err := h.readReply(resp.Body)
	resp.Body.Close()
	if err != nil {
		lerr = &LegError{Leg: "prefill", Endpoint: pf.Endpoint.ID, Reason: transportReason(x.ctx), Err: err}
		x.legFailed(pf, lerr)
		return nil, lerr
	}
	params, err := KVTransferParams(b)
	if err != nil && errors.Is(err, ErrMissingKVParams) && stoppedEarly(b) {
		// The request ended on its first token (EOS, a stop token): the
		// engine holds no KV for it, and it is not the engine's failure.
		// The caller runs it whole on the decode node (nil params), as
		// vLLM's toy proxy sends it on without params.
		h.log.Debug("pd: prefill leg stopped on its first token, no KV to hand over; running whole on the decode node",
			"request_id", x.req.ID, "endpoint", pf.Endpoint.ID)
		params, err = nil, nil
	}
	if err != nil {
		lerr = &LegError{Leg: "prefill", Endpoint: pf.Endpoint.ID, Reason: "missing_kv_params", Status: resp.StatusCode, Err: err}
		h.log.Error("pd: prefill reply without kv_transfer_params: is the engine's KV connector configured? not recomputing on the decode node",
			"request_id", x.req.ID, "endpoint", pf.Endpoint.ID)
		x.legFailed(pf, lerr)
		return nil, lerr
	}
	now := h.cfg.Now()
	x.report(pf, true)
	h.cfg.Router.FirstToken(now, pf)
	o := kvroute.Outcome{PromptTokens: x.req.PromptTokens, CachedTokens: -1, TTFT: now.Sub(t0)}
	if prompt, cached, ok := openai.ParseUsage(b); ok {
		// The prefill engine's prefix cache, as it reported it: the
		// learning policy's and the proxy's feedback, as on the
		// aggregated path.
		if h.cfg.Usage != nil {
			cached = h.cfg.Usage(pf.Endpoint, prompt, cached)
		}
		o.PromptTokens, o.CachedTokens = prompt, cached
	}
	h.cfg.Router.Done(now, pf, o)
	return params, nil
}

// runSGLang runs SGLang's two concurrent legs.
func (x *exchange) runSGLang(pf *router.Flight, plan *Plan) bool {
	h := x.h
	defer h.cfg.Planner.Finish(plan.Ticket)
	if x.gone(pf, "prefill") {
		return false
	}
	host, port := bootstrapAddr(plan.Prefill, h.cfg.BootstrapPort)
	body, err := sglangBody(x.body, host, port, rankRoom(h.cfg.Room(), plan.Prefill), uint64(max(plan.Prefill.DataParallelSize, 1)))
	if err == nil && x.req.Adapter != "" {
		body, err = sglangAdapter(body, x.req.Model, x.req.Adapter)
	}
	if err != nil {
		x.writeError(kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_body", "", "%v", err))
		h.cfg.Router.Done(h.cfg.Now(), pf, kvroute.Outcome{Failed: true})
		return true
	}
	dreq := *x.req
	h.cfg.Planner.PinEndpoint(&dreq, plan.Decode)
	defer h.cfg.Planner.Unpin(&dreq)
	df, err := h.cfg.Router.Route(h.cfg.Now(), &dreq, x.tried)
	if err != nil {
		h.cfg.Router.Done(h.cfg.Now(), pf, kvroute.Outcome{Failed: true})
		if !x.live(plan.Decode) {
			// The planned decode node left the pool since the plan: the
			// pair is placed again.
			x.last = &LegError{Leg: "decode", Endpoint: plan.Decode.ID, Reason: ReasonRemoved, Err: errEndpointRemoved}
			h.cfg.Metrics.failure(h.cfg.Model, "decode", ReasonRemoved)
			return false
		}
		x.writeRoutingFailure(err)
		return true
	}
	if x.gone(df, "decode") {
		h.cfg.Router.Done(h.cfg.Now(), pf, kvroute.Outcome{Failed: true})
		return false
	}
	ctx, cancel := context.WithCancel(x.ctx)
	defer cancel()
	type legResult struct {
		resp *http.Response
		err  *LegError
	}
	t0 := h.cfg.Now()
	pch := make(chan *LegError, 1)
	dch := make(chan legResult, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the prefill leg: drained, its reply only tells success
		defer wg.Done()
		resp, lerr := x.post(ctx, plan.Prefill, body, "prefill")
		if lerr == nil {
			_, err := h.readReply(resp.Body)
			resp.Body.Close()
			if err != nil {
				lerr = &LegError{Leg: "prefill", Endpoint: plan.Prefill.ID, Reason: transportReason(ctx), Err: err}
			}
		}
		if lerr != nil {
			cancel() // either leg failing cancels both
		}
		pch <- lerr
	}()
	go func() {
		defer wg.Done()
		resp, lerr := x.post(ctx, df.Endpoint, body, "decode")
		dch <- legResult{resp, lerr}
	}()
	defer wg.Wait()

	var perr *LegError
	pdone := false
	var d legResult
	select {
	case perr = <-pch:
		pdone = true
		d = <-dch
	case d = <-dch:
	}
	var a *answer
	if d.err == nil && perr == nil {
		// The decode answer's first bytes, before anything goes to the
		// client: a decode leg that breaks before them is placed again
		// with its prefill, as one that failed outright. A prefill
		// failing meanwhile cancels ctx, which breaks the read; a silent
		// decode answer cancels both legs.
		a, d.err = x.begin(ctx, cancel, d.resp, df, "decode", t0)
	}
	if d.err != nil || perr != nil {
		cancel()
		if d.err == nil {
			d.resp.Body.Close()
		}
		if !pdone {
			perr = <-pch
		}
		x.sglangDone(pf, perr, t0)
		if d.err != nil {
			x.legFailed(df, d.err)
		} else {
			h.cfg.Router.Done(h.cfg.Now(), df, kvroute.Outcome{Failed: true})
		}
		if x.ctx.Err() != nil {
			return x.clientGone()
		}
		// A leg's 4xx is the engine's answer to the client's request: it
		// is replayed, not placed again. The prefill's comes first: its
		// failure cancelled the decode leg.
		for _, l := range []*LegError{perr, d.err} {
			if l != nil && l.Status >= 400 && l.Status < 500 {
				x.res.Err = l
				x.replay(l)
				return true
			}
		}
		if d.err != nil && d.err.Timeout {
			x.writeTimeout(d.err)
			return true
		}
		h.cfg.Metrics.fallback(h.cfg.Model, "replan")
		return false
	}
	x.handed(plan, df.Endpoint)
	x.res.Prefill, x.res.Decode, x.res.Disaggregated = plan.Prefill.ID, df.Endpoint.ID, true
	// A prefill failing while the decode streams cancels ctx, which
	// breaks the stream.
	x.stream(a, df)
	streamErr := x.res.Err
	// A decode engine that refused the request in its stream (SGLang's
	// 200 whose stream is an error event and [DONE]: its tokenizer
	// manager refuses, after the response started, an adapter it does
	// not serve) will not take the KV: the prefill leg, waiting in its
	// engine's bootstrap queue for a decode engine that never comes, is
	// cancelled now rather than after PrefillGrace (which held the end of
	// the client's answer). The client got the engine's answer: the
	// request's error is its stream's own, if it broke, not the cancelled
	// leg's.
	refused := x.res.Status == http.StatusOK && a.head.StartsWithError()
	if !pdone {
		if refused {
			cancel()
			perr = <-pch
		} else {
			perr = x.awaitPrefill(pch, cancel, plan.Prefill.ID)
		}
	}
	x.sglangDone(pf, perr, t0)
	switch {
	case refused:
		x.res.Err = streamErr
	case perr != nil && x.res.Err == nil:
		x.res.Err = perr
	}
	return true
}

// handed counts the KV bytes of plan's handoff, whose decode leg, on
// decode (the plan's node or a retry's), was answered.
func (x *exchange) handed(plan *Plan, decode *kvroute.Endpoint) {
	h := x.h
	h.cfg.Metrics.handed(h.cfg.Model, h.cfg.Planner.Fabric().Links().Between(plan.Prefill, decode).Name, plan.Transfer.Bytes)
}

// awaitPrefill waits for the prefill leg's result (on pch) after the decode
// leg answered, for at most PrefillGrace; then it cancels the legs (cancel)
// and takes the prefill for done: the decode's answer means its KV cache
// arrived, and only the prefill's reply was owed.
func (x *exchange) awaitPrefill(pch <-chan *LegError, cancel context.CancelFunc, prefill string) *LegError {
	t := time.NewTimer(x.h.cfg.PrefillGrace)
	defer t.Stop()
	select {
	case perr := <-pch:
		return perr
	case <-t.C:
	}
	cancel()
	<-pch
	x.h.log.Warn("pd: prefill leg still unanswered after the decode leg answered; cancelled it", "request_id", x.req.ID,
		"endpoint", prefill, "grace", x.h.cfg.PrefillGrace)
	return nil
}

// sglangDone ends the prefill leg's flight.
func (x *exchange) sglangDone(pf *router.Flight, perr *LegError, t0 time.Time) {
	h := x.h
	if perr != nil {
		x.legFailed(pf, perr)
		return
	}
	now := h.cfg.Now()
	x.report(pf, true)
	h.cfg.Router.FirstToken(now, pf)
	h.cfg.Router.Done(now, pf, kvroute.Outcome{PromptTokens: x.req.PromptTokens, CachedTokens: -1, TTFT: now.Sub(t0)})
	h.cfg.Metrics.observeStage(h.cfg.Model, "prefill", now.Sub(t0).Seconds())
}

// bootstrapAddr returns the SGLang bootstrap host (the prefill URL's host
// name) and port (the endpoint's bootstrap_port label, else def).
func bootstrapAddr(e *kvroute.Endpoint, def int) (string, int) {
	host := e.URL
	if u, err := url.Parse(e.URL); err == nil && u.Hostname() != "" {
		host = u.Hostname()
	}
	port := def
	if p, err := strconv.Atoi(e.Labels[LabelBootstrapPort]); err == nil && p > 0 && p < 65536 {
		port = p
	}
	return host, port
}

// rankRoom returns a room near room (room's low 62 bits, moved by less
// than DataParallelSize) whose remainder modulo
// DataParallelSize is prefill's data-parallel rank: an SGLang decode
// engine that is not told the prefill's rank looks for the KV in the
// prefill's DP group bootstrap_room % its DP size (the KV receivers in
// python/sglang/srt/disaggregation/), and the prefill leg runs on the rank
// the router pinned. A room for a plain endpoint is room itself.
func rankRoom(room uint64, prefill *kvroute.Endpoint) uint64 {
	if !prefill.IsDataParallel() {
		return room
	}
	n := uint64(prefill.DataParallelSize)
	room &= 1<<62 - 1 // a batch's rooms, stride n apart (sglangBody), stay below 1<<63
	r := room - room%n + uint64(prefill.DataParallelRank)%n
	if r > room && r >= n {
		r -= n
	}
	return r
}

// post sends one leg. A non-2xx answer is a *LegError with the engine's
// body; on success the caller owns resp.Body.
func (x *exchange) post(ctx context.Context, e *kvroute.Endpoint, body []byte, leg string) (answer *http.Response, _ *LegError) {
	h := x.h
	u := strings.TrimRight(e.URL, "/") + x.path
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, &LegError{Leg: leg, Endpoint: e.ID, Reason: "transport", Connect: true, Err: err}
	}
	for _, k := range ForwardHeaders {
		if v := x.r.Header.Values(k); len(v) > 0 {
			hr.Header[k] = append([]string(nil), v...)
		}
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("X-Request-Id", x.legID) // the same id on every leg of a placement
	if e.IsDataParallel() {
		// Pin the leg to the rank the router chose, as the aggregated path
		// does (a client's copy of the header was refused, and is never
		// forwarded): the prefill leg's rank is the one whose KV connector
		// holds the blocks and names itself in kv_transfer_params
		// (remote_engine_id <id>_dp<rank>, its own side-channel port), the
		// decode leg's the one that pulls them.
		hr.Header.Set(kvroute.HeaderDataParallelRank, strconv.Itoa(e.DataParallelRank))
	}
	if h.cfg.Inflight != nil {
		done := h.cfg.Inflight(e)
		defer func() {
			if answer == nil {
				done()
				return
			}
			answer.Body = &inflightBody{ReadCloser: answer.Body, done: done}
		}()
	}
	resp, err := h.cfg.Client.Do(hr)
	if err != nil {
		reason := transportReason(ctx)
		connect := IsConnectError(err)
		var ne net.Error
		timeout := !connect && ctx.Err() == nil && errors.As(err, &ne) && ne.Timeout()
		return nil, &LegError{Leg: leg, Endpoint: e.ID, Reason: reason, Connect: connect, Timeout: timeout, Err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, err := h.readReply(resp.Body)
		resp.Body.Close()
		if errors.Is(err, errReplyTooLarge) {
			// The engine's answer, whole, but too large to replay: its
			// status stands, answered with the router's error (replay).
			return nil, &LegError{Leg: leg, Endpoint: e.ID, Reason: "status", Status: resp.StatusCode, header: resp.Header, Err: err}
		}
		if err != nil { // the engine's answer is not whole: not one to replay
			return nil, &LegError{Leg: leg, Endpoint: e.ID, Reason: transportReason(ctx), Err: fmt.Errorf("%d answer: %w", resp.StatusCode, err)}
		}
		return nil, &LegError{Leg: leg, Endpoint: e.ID, Reason: "status", Status: resp.StatusCode, Body: b, header: resp.Header}
	}
	return resp, nil
}

// inflightBody is a leg's answer whose Close ends the leg's
// HandoffConfig.Inflight tracking, once.
type inflightBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *inflightBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

// transportReason is a leg's failure Reason for an error sending it or
// reading its reply under ctx: "cancelled" once ctx is done (the client
// left, or the other leg failed), which is not the engine's failure and
// is not reported to passive health (legFailed); else "transport".
func transportReason(ctx context.Context) string {
	if ctx.Err() != nil {
		return "cancelled"
	}
	return "transport"
}

// readReply reads a leg's whole reply body (at most MaxReplyBytes), which
// the router needs before it answers anything (an error to replay, a
// prefill's kv_transfer_params): each wait for its next bytes is bounded
// by Silence, as the waits of an answer passed on are, so an engine that
// sent its headers and hung cannot hold the request. A silence closes the
// body and is reported as errSilent.
func (h *Handoff) readReply(body io.ReadCloser) ([]byte, error) {
	var quiet *silence.Watch // nil: no bound
	if h.cfg.Silence > 0 {
		quiet = &silence.Watch{Limit: h.cfg.Silence, Cut: func() { body.Close() }}
		quiet.Arm()
		defer quiet.Stop()
	}
	// One byte over the cap says the reply is not whole.
	b, err := io.ReadAll(io.LimitReader(silence.Reader(body, quiet), h.cfg.MaxReplyBytes+1))
	if err != nil && quiet.Fired() {
		return b, fmt.Errorf("%w: nothing for %s", errSilent, h.cfg.Silence)
	}
	if err == nil && int64(len(b)) > h.cfg.MaxReplyBytes {
		return nil, fmt.Errorf("%w (%d bytes)", errReplyTooLarge, h.cfg.MaxReplyBytes)
	}
	return b, err
}

// errReplyTooLarge is the failure of a reply the router must read whole
// (a prefill's, an error to replay) that is over MaxReplyBytes: cut, it
// would be a corrupt answer, or a prefill reply read as one without
// kv_transfer_params.
var errReplyTooLarge = errors.New("the reply is over the size the router reads whole")

// IsConnectError reports an error from connecting (DNS, refused,
// unreachable, the dial's timeout): the engine never saw the request.
func IsConnectError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// legFailed records a failed leg: passive health (not for client errors
// or cancellations), the flight's end, metrics and the last failure.
func (x *exchange) legFailed(f *router.Flight, lerr *LegError) {
	h := x.h
	now := h.cfg.Now()
	if lerr.Reason != "cancelled" && lerr.Reason != ReasonRemoved && !(lerr.Status >= 400 && lerr.Status < 500) {
		x.report(f, false)
		x.tried = append(x.tried, f.Endpoint.ID)
		if lerr.Connect && f.Endpoint.IsDataParallel() {
			// The server did not take the connection: its other
			// data-parallel ranks, behind the same URL, would not either
			// (as the aggregated path excludes them).
			x.tried = h.cfg.Router.AppendSameServer(x.tried, f.Endpoint)
		}
		h.log.Warn("pd: leg failed", "request_id", x.req.ID, "leg", lerr.Leg, "endpoint", lerr.Endpoint, "reason", lerr.Reason,
			"status", lerr.Status, "error", lerr.Err)
	}
	h.cfg.Router.Done(now, f, kvroute.Outcome{PromptTokens: x.req.PromptTokens, CachedTokens: -1, Failed: true, Decode: lerr.Leg == "decode"})
	h.cfg.Metrics.failure(h.cfg.Model, lerr.Leg, lerr.Reason)
	x.last = lerr
	x.res.Err = lerr
}

// live reports whether endpoint e, as routed, is still in the pool
// (HandoffConfig.Live).
func (x *exchange) live(e *kvroute.Endpoint) bool {
	return x.h.cfg.Live == nil || x.h.cfg.Live(e)
}

// gone reports whether flight f, about to run leg, was routed to an
// endpoint that has left the pool since; if so the flight ends as a
// ReasonRemoved failure: the leg is not sent, no health is reported and
// its ID is not excluded from the next placement (it may name the engine
// that took its place).
func (x *exchange) gone(f *router.Flight, leg string) bool {
	if x.live(f.Endpoint) {
		return false
	}
	x.h.log.Warn("pd: endpoint removed from the pool before the leg was sent; placing again", "request_id", x.req.ID,
		"leg", leg, "endpoint", f.Endpoint.ID)
	x.legFailed(f, &LegError{Leg: leg, Endpoint: f.Endpoint.ID, Reason: ReasonRemoved, Err: errEndpointRemoved})
	return true
}

// report feeds passive health with the result of a leg on f's endpoint,
// unless the endpoint has left the pool since it was routed: a leg on an
// engine removed, or replaced under its ID, says nothing of the engine the
// ID names now.
func (x *exchange) report(f *router.Flight, ok bool) {
	h := x.h
	if !x.live(f.Endpoint) {
		return
	}
	if h.cfg.Router.ReportResult(h.cfg.Now(), f.Endpoint.ID, ok) {
		h.log.Warn("pd: endpoint ejected", "endpoint", f.Endpoint.ID)
	}
}

// hop-by-hop headers are not copied to the client.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true}

// connectionListed reports whether h's Connection header names the header
// k: such a header is for that connection only (RFC 9110 section 7.6.1)
// and is not copied on, as httputil.ReverseProxy drops it on the
// aggregated path.
func connectionListed(h http.Header, k string) bool {
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == k {
				return true
			}
		}
	}
	return false
}

// answer is a leg's 2xx response whose first bytes, or its end, were read
// (begin) before anything went to the client.
type answer struct {
	resp  *http.Response
	ctx   context.Context // the leg's: cancelled by its silence, or by SGLang's other leg failing
	quiet *silence.Watch  // the answer's silence bound (nil: none), armed
	buf   []byte          // buf[:n] are the first bytes
	n     int
	err   error            // what came with them: nil, io.EOF (a body this short), or the error after them
	ttft  time.Duration    // from the leg's dispatch to its first byte (0: an empty body)
	head  openai.EventHead // the first bytes passed on (stream)
}

// maxEmptyReads is how many reads returning nothing begin makes before it
// fails the answer with io.ErrNoProgress, as bufio's readers do.
const maxEmptyReads = 100

// begin reads the first bytes of a leg's 2xx answer, or its end, before its
// status and headers go to the client: until then the leg may fail and the
// request be placed again, as the aggregated path retries an attempt
// whose body breaks before its first byte. Each wait is bounded by
// Silence (the watch cuts the leg by cancelling ctx with cut). A failure
// before the first byte closes the body and is a *LegError: Timeout when
// the answer went silent (the engine took the generation: answered 504,
// not retried, as a wait for the headers), cancelled when ctx ended
// otherwise (the client left, or SGLang's prefill leg failed), else
// transport (the engine's connection broke after its headers). On
// success the first byte is the flight's first token.
func (x *exchange) begin(ctx context.Context, cut context.CancelFunc, resp *http.Response, f *router.Flight, leg string, t0 time.Time) (*answer, *LegError) {
	h := x.h
	a := &answer{resp: resp, ctx: ctx, buf: make([]byte, 32<<10)}
	if h.cfg.Silence > 0 {
		a.quiet = &silence.Watch{Limit: h.cfg.Silence, Cut: cut}
		a.quiet.Arm()
	}
	err := io.ErrNoProgress
	for range maxEmptyReads {
		a.quiet.Waiting(true)
		a.n, a.err = resp.Body.Read(a.buf)
		a.quiet.Waiting(false)
		if a.n > 0 || a.err == io.EOF {
			err = nil
			break
		}
		if a.err != nil {
			err = a.err
			break
		}
	}
	if err != nil {
		a.quiet.Stop()
		resp.Body.Close()
		lerr := &LegError{Leg: leg, Endpoint: f.Endpoint.ID, Reason: "transport",
			Err: fmt.Errorf("answered %d, then its body broke before its first byte: %w", resp.StatusCode, err)}
		switch {
		case a.quiet.Fired() && x.ctx.Err() == nil:
			lerr.Timeout = true
			lerr.Err = fmt.Errorf("answered %d, then %w: nothing for %s", resp.StatusCode, errSilent, h.cfg.Silence)
		case ctx.Err() != nil:
			lerr.Reason = "cancelled"
		}
		return nil, lerr
	}
	if a.n > 0 {
		now := h.cfg.Now()
		a.ttft = now.Sub(t0)
		x.res.TTFB = a.ttft
		h.cfg.Router.FirstToken(now, f)
		h.cfg.Metrics.observeStage(h.cfg.Model, "decode_first_byte", a.ttft.Seconds())
		h.cfg.Metrics.observeStage(h.cfg.Model, "ttfb", now.Sub(x.start).Seconds())
	}
	return a, nil
}

// stream sends an answer begun (begin) to the client: its status and
// headers with its first bytes, then the rest, flushing every read. The
// flight ends when the copy does, and the answer's end is the endpoint's
// passive health result (streamHealth).
func (x *exchange) stream(a *answer, f *router.Flight) {
	h := x.h
	resp, quiet := a.resp, a.quiet
	defer resp.Body.Close()
	defer quiet.Stop()
	dst := x.w.Header()
	for k, v := range resp.Header {
		if !hopHeaders[k] && k != "X-Request-Id" && !connectionListed(resp.Header, k) {
			dst[k] = v
		}
	}
	if h.cfg.EndpointHeader != "" {
		dst.Set(h.cfg.EndpointHeader, f.Endpoint.ID)
	}
	x.w.WriteHeader(resp.StatusCode)
	// This answer is the request's outcome: a failed leg before it, which
	// a placement since recovered from, is not the request's error.
	x.res.Status, x.res.Err = resp.StatusCode, nil
	sse := openai.IsPlainEventStream(resp.Header) // one the router can end in band
	rc := http.NewResponseController(x.w)
	buf := a.buf
	var tail openai.EventTail
	// A request run whole on one node (not handed off): its engine computed
	// the prompt against its own prefix cache, so its usage is the
	// feedback, as on the aggregated path. A decode engine's after a
	// handoff is not: it counts the KV pulled from the prefill engine as
	// cached.
	var usage openai.UsageTail
	readUsage := !x.res.Disaggregated && resp.StatusCode == http.StatusOK
	// A 200 stream's end also tells whether it ended with the engine's
	// own error event (streamHealth).
	keepTail := readUsage || sse && resp.StatusCode == http.StatusOK
	var streamErr error
	clientErr := false   // the write to the client failed, not the engine
	n, err := a.n, a.err // the first bytes, read by begin
	for {
		if n > 0 {
			tail.Add(buf[:n])
			a.head.Add(buf[:n])
			if keepTail {
				usage.Add(buf[:n])
			}
			if _, werr := x.w.Write(buf[:n]); werr != nil {
				streamErr, clientErr = werr, true
				break
			}
			_ = rc.Flush()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if sse && tail.SawDone() {
				// The stream broke after its final event (the client hung
				// up, or SGLang's prefill leg failed, before the engine
				// closed its response): the answer is complete.
				break
			}
			streamErr = err
			var end *kvroute.Error
			if stop := x.serverStop(); stop != nil {
				end = stop
			} else if quiet.Fired() && x.ctx.Err() == nil {
				streamErr = fmt.Errorf("%w: %w", errSilent, err)
				end = &kvroute.Error{Status: http.StatusGatewayTimeout, Type: kvroute.TypeUpstream,
					Message: fmt.Sprintf("endpoint %s sent nothing for %s", f.Endpoint.ID, h.cfg.Silence)}
			} else if x.ctx.Err() == nil {
				end = &kvroute.Error{Status: http.StatusBadGateway, Type: kvroute.TypeUpstream,
					Message: "the engine's stream broke: " + err.Error()}
			}
			// A JSON body cannot carry the error: the caller aborts it
			// (Result.Abort). A stream ends as vLLM ends a failed one, the
			// event it broke in (if any) terminated first (some bytes
			// went out: a failure before the first one failed the leg in
			// begin).
			if sse && end != nil {
				var b []byte
				if !tail.AtBoundary() {
					b = append(b, "\n\n"...)
				}
				_, _ = x.w.Write(openai.AppendErrorEvent(b, end))
				_ = rc.Flush()
			}
			break
		}
		quiet.Waiting(true)
		n, err = resp.Body.Read(buf)
		quiet.Waiting(false)
	}
	failed := streamErr != nil
	serverErr := false
	if !failed && keepTail && sse {
		code, ok := openai.EndsWithErrorEvent(usage.Bytes())
		serverErr = ok && kvroute.EndpointFailure(code)
	}
	x.streamHealth(a, f, failed && !clientErr, serverErr)
	if failed {
		x.res.Abort = !sse
		x.res.Err = fmt.Errorf("disagg: stream from %s: %w", f.Endpoint.ID, streamErr)
		if stop := x.serverStop(); stop != nil {
			x.res.Status = stop.Status
		} else if x.ctx.Err() != nil {
			x.res.Status = StatusClientClosed
		}
	}
	// A stream that opened with an error event (an error the engine met
	// after its 200) served the client, but its first bytes are no first
	// token: a failed outcome, as on the aggregated path.
	o := kvroute.Outcome{PromptTokens: x.req.PromptTokens, CachedTokens: -1, TTFT: a.ttft,
		Failed: failed || sse && a.head.StartsWithError(), Decode: x.res.Disaggregated}
	if readUsage && !failed {
		if prompt, cached, ok := openai.ParseUsage(usage.Bytes()); ok {
			if h.cfg.Usage != nil {
				cached = h.cfg.Usage(f.Endpoint, prompt, cached)
			}
			o.PromptTokens, o.CachedTokens = prompt, cached
		}
	}
	h.cfg.Router.Done(h.cfg.Now(), f, o)
}

// streamHealth reports the end of an answer passed on to the client
// (stream) to passive health. The answer counts as the endpoint's success
// only once it has ended whole, or was cut short by the client (gone, or
// a write to it failed) or the drain deadline, as on the aggregated path:
// reported at its first byte, the success reset the endpoint's
// consecutive failures before a break counted one, so an engine whose
// every stream broke midway was never ejected. broke is a failure reading
// the engine's answer after its first byte: the endpoint's failure, unless
// the leg was cancelled by another leg failing (SGLang's prefill), which
// says nothing of this engine. serverErr is a stream passed on whole that
// ended with the engine's own error event under a 5xx code
// (openai.EndsWithErrorEvent: vLLM's 500 for a request its engine failed
// after the 200): the endpoint's failure, as on the aggregated path.
func (x *exchange) streamHealth(a *answer, f *router.Flight, broke, serverErr bool) {
	switch {
	case serverErr:
		x.report(f, false)
	case !broke || x.ctx.Err() != nil:
		x.report(f, true)
	case a.quiet.Fired():
		x.report(f, false) // silent for Silence
	case a.ctx.Err() != nil:
		// The other leg failed: neither the engine's success nor its failure.
	default:
		x.report(f, false)
	}
}

// errSilent ends an answer whose engine sent nothing for Silence.
var errSilent = errors.New("the engine's answer went silent")

// replay writes a failed leg's own error response (a 4xx the client must
// see, or the last 5xx when nothing is left to try).
func (x *exchange) replay(l *LegError) {
	if l.Body == nil && errors.Is(l.Err, errReplyTooLarge) {
		if x.h.cfg.EndpointHeader != "" && l.Endpoint != "" {
			x.w.Header().Set(x.h.cfg.EndpointHeader, l.Endpoint)
		}
		openai.WriteError(x.w, &kvroute.Error{Status: l.Status, Type: kvroute.TypeUpstream, Code: "upstream_error",
			Message: fmt.Sprintf("model %q: the %s leg's engine answered %d with a body over %d bytes, not passed on", x.req.Model, l.Leg, l.Status, x.h.cfg.MaxReplyBytes)})
		x.res.Status = l.Status
		return
	}
	if ct := l.header.Get("Content-Type"); ct != "" {
		x.w.Header().Set("Content-Type", ct)
	}
	if x.h.cfg.EndpointHeader != "" && l.Endpoint != "" {
		x.w.Header().Set(x.h.cfg.EndpointHeader, l.Endpoint)
	}
	if l.Status >= 400 {
		x.w.Header().Set(kvroute.HeaderErrorSource, kvroute.ErrorSourceUpstream) // the engine's own answer
	}
	x.w.WriteHeader(l.Status)
	_, _ = x.w.Write(l.Body)
	x.res.Status = l.Status
}

// writeTimeout answers a leg that ran the generation (decode, or the
// whole request) and got no answer in time: 504, as the aggregated path
// does, and not retried, since another placement would run the whole
// generation again.
func (x *exchange) writeTimeout(l *LegError) {
	if x.h.cfg.EndpointHeader != "" {
		x.w.Header().Set(x.h.cfg.EndpointHeader, l.Endpoint)
	}
	x.writeError(&kvroute.Error{Status: http.StatusGatewayTimeout, Type: kvroute.TypeUpstream, Code: "upstream_error",
		Message: fmt.Sprintf("model %q: no answer in time", x.req.Model), Err: l})
}

func (x *exchange) writeError(err error) {
	openai.WriteError(x.w, err)
	x.res.Status = kvroute.StatusOf(err)
	x.res.Err = err
}

// writeRoutingFailure answers when the router has no endpoint: with the
// last leg failure when there was one.
func (x *exchange) writeRoutingFailure(err error) {
	if x.ctx.Err() != nil {
		// The client went away (or the server stopped the request) while
		// Admit held it: that, not the fleet's answer, ends the request.
		x.clientGone()
		return
	}
	if x.last != nil {
		x.writeLastFailure()
		return
	}
	var ue *router.UnavailableError
	switch status := kvroute.StatusOf(err); {
	case errors.As(err, &ue):
		x.w.Header().Set("Retry-After", strconv.Itoa(max(ue.RetryAfter, 1)))
	case status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests:
		x.w.Header().Set("Retry-After", "1")
	}
	x.writeError(err)
}

// writeLastFailure answers a request whose every placement failed.
func (x *exchange) writeLastFailure() {
	if x.ctx.Err() != nil {
		x.clientGone()
		return
	}
	l := x.last
	if l != nil && l.Status >= 500 && (len(l.Body) > 0 || errors.Is(l.Err, errReplyTooLarge)) {
		x.replay(l)
		return
	}
	if l != nil && l.Reason == ReasonRemoved {
		// Not an engine's failure: the pool changed under the request.
		x.writeError(&kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable, Code: ReasonRemoved, Err: l,
			Message: fmt.Sprintf("model %q: the endpoint chosen was removed from the pool before the request was sent, and no other could take it", x.req.Model)})
		return
	}
	e := &kvroute.Error{Status: http.StatusBadGateway, Type: kvroute.TypeUpstream, Code: "upstream_error",
		Message: fmt.Sprintf("model %q: every P/D placement tried failed (%v)", x.req.Model, x.tried)}
	if l != nil {
		e.Err = l // (its message ends e's: not repeated in Message)
	} else {
		e.Message += ": no placement left to try"
	}
	x.writeError(e)
}

// clientGone records a request whose context ended before an answer
// began: the client went away, or the server stopped it with an answer
// (serverStop), which is written. The request is done either way.
func (x *exchange) clientGone() bool {
	if stop := x.serverStop(); stop != nil {
		x.writeError(stop)
		x.res.Status, x.res.Err = stop.Status, stop
		return true
	}
	x.res.Status = StatusClientClosed
	return true
}

// serverStop returns the answer the server gave when it cancelled the
// request's context with a *kvroute.Error cause (the proxy's drain
// deadline: 503), nil when the context is live or the client went away.
func (x *exchange) serverStop() *kvroute.Error {
	if x.ctx.Err() == nil {
		return nil
	}
	var ke *kvroute.Error
	if errors.As(context.Cause(x.ctx), &ke) {
		return ke
	}
	return nil
}

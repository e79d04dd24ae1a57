package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/router"
)

// Prefill/decode disaggregation: a model whose pool has prefill or decode
// endpoints is served by a disagg.Handoff. Its router's picker is a
// disagg.Planner (the configured policy, or kv-aware with parameters
// derived from pd.profile, places the prefill stage); the handoff runs the
// legs in the engines' protocol (pd.protocol) and streams the decode
// engine's answer. The first placement of a request goes through the same
// queue as on aggregated pools (admit): in line behind the requests held,
// if any, and held when the prefill policy sheds it with the "queue"
// action. Requests carrying handoff fields (kv_transfer_params,
// bootstrap_*) or endpoint-naming headers are rejected with 400.

// newPlanner builds the P/D planner of model m, with picker (nil: the
// planner's default) placing the prefill stage.
func newPlanner(m *config.Model, picker kvroute.Picker) (*disagg.Planner, error) {
	pc := m.PD
	prof, err := engine.LookupProfile(pc.Profile)
	if err != nil {
		return nil, fmt.Errorf("pd.profile: %w", err)
	}
	links := disagg.DefaultLinks()
	if len(pc.Links) > 0 {
		links.Rules = nil
		for _, l := range pc.Links {
			links.Rules = append(links.Rules, disagg.LinkRule{Same: l.Same, Link: pdLink(l)})
		}
	}
	if pc.DefaultLink.Gbps > 0 {
		links.Default = pdLink(pc.DefaultLink)
	}
	return disagg.NewPlanner(disagg.Config{
		Profile:  prof,
		Links:    links,
		Mode:     disagg.Mode(pc.Mode),
		Protocol: pc.Protocol,
		Conditional: disagg.Conditional{ShortTokens: pc.ShortTokens, LocalISL: pc.LocalISL, LocalRatio: pc.LocalRatio,
			MaxLocalTokens: pc.MaxLocalTokens, Margin: pc.Margin},
		Prefill: picker,
		Seed:    m.Policy.Seed,
	})
}

func pdLink(l config.PDLink) disagg.Link {
	return disagg.Link{Name: l.Name, Gbps: l.Gbps, Efficiency: l.Efficiency, Setup: l.Setup}
}

// newHandoff builds the P/D handoff of a pool.
func (p *Proxy) newHandoff(pl *pool, m *config.Model, planner *disagg.Planner) (*disagg.Handoff, error) {
	hdr := ""
	if p.cfg.Debug.Enabled {
		hdr = HeaderEndpoint
	}
	return disagg.NewHandoff(disagg.HandoffConfig{
		Model:          m.Name,
		EndpointHeader: hdr,
		Router:         pl.router,
		Planner:        planner,
		Client:         &http.Client{Transport: p.transport},
		Protocol:       m.PD.Protocol,
		Attempts:       m.PD.Attempts,
		BootstrapPort:  m.PD.BootstrapPort,
		Silence:        p.cfg.Timeouts.UpstreamHeader,
		Metrics:        p.pdMetrics,
		Logger:         p.log,
		Now:            p.now,
		Admit: func(ctx context.Context, req *kvroute.Request) (*router.Flight, error) {
			// Timed as the aggregated path's routings are (the pool's
			// metrics exist once New has built every pool).
			return p.admit(ctx, pl, req, p.metrics.pools[pl.model])
		},
		// Each leg counts in kvroute_inflight_requests on its endpoint
		// while it runs, as the aggregated path's attempts do.
		Inflight: func(e *kvroute.Endpoint) func() {
			up := pl.upstream(e)
			if up == nil { // removed since it was routed: the leg is not sent (Live)
				return func() {}
			}
			g := up.inflight // the gauge the leg rose, whatever replaces the endpoint meanwhile
			g.Inc()
			return g.Dec
		},
		// The prefix cache hits an engine reported for a prompt it
		// computed (a prefill leg's, or a request run whole on one
		// node), counted as the aggregated path counts its engines'
		// (feedback.go).
		Usage: func(e *kvroute.Endpoint, prompt, cached int) int {
			if up := pl.upstream(e); up != nil {
				return up.observeUsage(prompt, cached)
			}
			return cached
		},
		// A reload or discovery may remove a leg's endpoint between its
		// routing and its sending (reload.go).
		Live: func(e *kvroute.Endpoint) bool { return pl.upstream(e) != nil },
	})
}

// servePD answers a request for a P/D model and accounts for it like the
// aggregated path does.
func (p *Proxy) servePD(w http.ResponseWriter, r *http.Request, pl *pool, req *kvroute.Request, body []byte, start time.Time) {
	// At the drain deadline Serve cancels the request's context with
	// errShutdown: the handoff ends its legs and tells the client why.
	res := pl.pd.Serve(w, r, r.URL.Path, body, req)
	code := res.Status
	if code == 0 {
		code = http.StatusBadGateway
	}
	now := p.now()
	if up := pl.set.Load().byID[res.Decode]; up != nil && res.TTFB > 0 {
		up.ttfb.Observe(res.TTFB.Seconds()) // as the aggregated path does for its endpoint
	}
	var le *disagg.LegError
	legFailed := errors.As(res.Err, &le)
	// The answer broke after its first byte (Result.Err with the answer's
	// own status: a failed leg is a LegError, an answer the router wrote
	// a 4xx or 5xx, a client gone 499): a stream error on the decode
	// endpoint, as the aggregated path counts one (streamFailed). A write
	// to a client gone is not the engine's.
	broke := res.Decode != "" && res.Err != nil && !legFailed && code >= 200 && code < 400 && r.Context().Err() == nil
	m := p.metrics.pools[pl.model]
	m.series.RLock() // from label to the write: see poolMetrics.series
	p.metrics.requests.WithLabelValues(pl.model, pl.label(res.Decode), strconv.Itoa(code)).Inc()
	if broke {
		p.metrics.streamErrors.WithLabelValues(pl.model, pl.label(res.Decode)).Inc()
	}
	m.series.RUnlock()
	m.duration.Observe(now.Sub(start).Seconds())
	lvl := levelFor(code)
	if p.log.Enabled(r.Context(), lvl) {
		p.log.Log(r.Context(), lvl, "request", "request_id", req.ID, "model", req.Model, adapterAttr(req.Adapter), "prefill", res.Prefill,
			"endpoint", res.Decode, "disaggregated", res.Disaggregated, "status", code, "attempts", res.Attempts,
			"stream", req.Stream, "prompt_tokens", req.PromptTokens, "duration", now.Sub(start), "error", res.Err)
	}
	if code == http.StatusNotFound && legFailed && le.Status == http.StatusNotFound {
		p.notFound.warn(p, pl.model, le.Endpoint, r.URL.Path) // the engine's 404, replayed
	}
	if res.Abort {
		// The answer broke after its status was sent, in a body that
		// cannot say so: abort the response, as the reverse proxy does on
		// the aggregated path, rather than end it as if complete.
		panic(http.ErrAbortHandler)
	}
}

package signals

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// SlotsRetry is how long a scraper leaves a llama.cpp server's /slots
// alone after it answered 404 or 501 (--no-slots, or a server without the
// endpoint) before it asks again.
const SlotsRetry = time.Minute

// slotsState is a Scraper's reading of a llama.cpp server's /slots and
// /props; only the loop goroutine uses it.
type slotsState struct {
	slotsURL, propsURL string
	buf                bytes.Buffer
	off                bool      // /slots answered 404 or 501: not served
	retryAt            time.Time // when off, ask again from then
	failing            bool      // in a failure streak of /slots
	props              Props     // the last /props read (TotalSlots 0: none)
	propsStale         bool      // read /props at the next /slots
	propsFailing       bool      // the last /props failed (logged)
	lastTotal          int       // the slots the last /slots listed
	alone              bool      // the last scrape read /slots alone (slotsAlone)
}

// slotsURLs derives the /slots and /props URLs from a metrics URL
// (llamaURL).
func slotsURLs(metricsURL string) (slots, props string, err error) {
	if slots, err = llamaURL(metricsURL, "slots"); err != nil {
		return "", "", err
	}
	props, err = llamaURL(metricsURL, "props")
	return slots, props, err
}

// llamaURL derives the URL of a llama.cpp server's endpoint name (slots,
// props, lora-adapters) from its metrics URL: the path's last element
// "metrics" replaced (so that a prefix stays), or the path replaced; the
// query stays (llama.cpp's router mode names the model with ?model=).
func llamaURL(metricsURL, name string) (string, error) {
	u, err := url.Parse(metricsURL)
	if err != nil {
		return "", err
	}
	base := "/"
	if i := strings.LastIndexByte(u.Path, '/'); i >= 0 && u.Path[i+1:] == "metrics" {
		base = u.Path[:i+1]
	}
	u.Path, u.RawPath = base+name, ""
	return u.String(), nil
}

// notServed reports whether err is an answer of 404 or 501 (an endpoint a
// llama.cpp server does not serve: /slots with --no-slots, /metrics
// without --metrics), and returns it.
func notServed(err error) (*statusError, bool) {
	var se *statusError
	ok := errors.As(err, &se) && (se.code == http.StatusNotFound || se.code == http.StatusNotImplemented)
	return se, ok
}

// slotsAlone reads a llama.cpp server whose /metrics failed with err from
// its /slots alone, and reports whether it could. llama.cpp serves
// /metrics only with --metrics (else 501 "This server does not support
// metrics endpoint. Start it with `--metrics`") but /slots by default, so
// a server started without --metrics still shows its busy slots and, on
// builds that report n_prompt_tokens, the KV they hold; its deferred
// requests (waiting) stay unknown. It applies to a target of flavour
// llamacpp whose /metrics answered 404 or 501, and to one of flavour auto
// whose /metrics answered llama.cpp's 501. The switch to /slots alone and
// back is logged once each way.
func (s *Scraper) slotsAlone(ctx context.Context, err error) (Metrics, bool) {
	se, ok := notServed(err)
	switch {
	case !ok:
		return Metrics{}, false
	case s.target.Flavor == FlavorAuto || s.target.Flavor == "":
		if se.code != http.StatusNotImplemented || !bytes.Contains(se.head, []byte("does not support metrics endpoint")) {
			return Metrics{}, false
		}
	case s.target.Flavor != FlavorLlamaCPP:
		return Metrics{}, false
	}
	m := Metrics{Flavor: FlavorLlamaCPP}
	if !s.addSlots(ctx, &m) {
		return Metrics{}, false
	}
	if !s.slots.alone {
		s.slots.alone = true
		s.cfg.Logger.Info("llama.cpp server without /metrics (started without --metrics?): its busy slots and KV are read from /slots alone, its waiting requests are unknown",
			"endpoint", s.target.Endpoint, "url", s.target.MetricsURL, "status", se.status)
	}
	return m, true
}

// addSlots reads the llama.cpp server's /slots (and /props when needed)
// into m, a successful /metrics scrape (or, from slotsAlone, an empty
// one). A server that does not serve /slots (404, 501: --no-slots) is
// logged once and asked again after SlotsRetry; other failures are logged
// once per streak. Either way m keeps its /metrics signals: /slots only
// adds to them. It reports whether it added /slots' signals.
func (s *Scraper) addSlots(ctx context.Context, m *Metrics) bool {
	st := &s.slots
	if st.slotsURL == "" {
		var err error
		if st.slotsURL, st.propsURL, err = slotsURLs(s.target.MetricsURL); err != nil {
			return false // NewScraper checked the URL
		}
		st.propsStale = true
	}
	if st.off && time.Now().Before(st.retryAt) {
		return false
	}
	_, err := s.get(ctx, st.slotsURL, jsonAccept, &st.buf)
	var sl Slots
	if err == nil {
		sl, err = ParseSlots(st.buf.Bytes())
	}
	if ctx.Err() != nil {
		return false
	}
	off, isOff := notServed(err)
	switch {
	case isOff:
		if !st.off {
			s.cfg.Logger.Info("llama.cpp server does not serve /slots (started with --no-slots?): its busy slots and KV are read from /metrics alone",
				"endpoint", s.target.Endpoint, "url", st.slotsURL, "status", off.status, "retry_in", SlotsRetry)
		}
		st.off, st.retryAt, st.failing = true, time.Now().Add(SlotsRetry), false
		return false
	case err != nil:
		if !st.failing {
			s.cfg.Logger.Warn("llama.cpp /slots failed: signals from /metrics alone until it recovers",
				"endpoint", s.target.Endpoint, "url", st.slotsURL, "err", err)
		}
		st.failing = true
		return false
	}
	if st.off || st.failing {
		s.cfg.Logger.Info("llama.cpp /slots read", "endpoint", s.target.Endpoint, "url", st.slotsURL)
		st.propsStale = true // the server may have restarted meanwhile
	}
	st.off, st.failing = false, false
	if sl.Total != st.lastTotal {
		st.propsStale = true // restarted with another -np
	}
	st.lastTotal = sl.Total
	if st.propsStale {
		s.readProps(ctx, sl)
	}
	applySlots(m, sl, st.props)
	return true
}

// readProps reads /props; a failure leaves the slots' own count.
func (s *Scraper) readProps(ctx context.Context, sl Slots) {
	st := &s.slots
	_, err := s.get(ctx, st.propsURL, jsonAccept, &st.buf)
	var p Props
	if err == nil {
		p, err = ParseProps(st.buf.Bytes())
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		if !st.propsFailing {
			s.cfg.Logger.Warn("llama.cpp /props failed: total slots from /slots", "endpoint", s.target.Endpoint, "url", st.propsURL, "err", err)
		}
		// Asked again when the slots change or /slots recovers.
		st.props, st.propsStale, st.propsFailing = Props{}, false, true
		return
	}
	st.propsStale, st.propsFailing = false, false
	if p != st.props {
		s.cfg.Logger.Info("llama.cpp slots", "endpoint", s.target.Endpoint, "total_slots", p.TotalSlots, "n_ctx", p.NCtx,
			"slots_listed", sl.Total, "n_prompt_tokens", sl.HasTokens)
	}
	st.props = p
}

package signals

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// loraState is a Scraper's reading of a llama.cpp server's
// /lora-adapters; only the loop goroutine uses it.
type loraState struct {
	url     string
	buf     bytes.Buffer
	list    *LlamaAdapters // the last list read (nil: none yet)
	next    time.Time      // when to read it again
	stale   bool           // read it at the next scrape (a failure streak ended)
	off     bool           // /lora-adapters answered 404 or 501: not served
	failing bool           // in a failure streak of /lora-adapters
}

// addLoRAList sets m.LlamaAdapters, m being a llama.cpp server's scrape:
// the adapters its GET /lora-adapters listed (same URL as /metrics with
// the path's last element "metrics" replaced by "lora-adapters", query
// kept), read at the first scrape, every LoRAListInterval and at the
// first scrape after a failed one. A server that does not serve the
// endpoint (404 or 501: a build before it, August 2024) lists none,
// logged once, and is asked again after SlotsRetry; another failure keeps
// the last list read (none before the first), logged once per streak,
// and is retried at the next scrape. A change of the list is logged.
func (s *Scraper) addLoRAList(ctx context.Context, m *Metrics) {
	st := &s.lora
	defer func() { m.LlamaAdapters = st.list }()
	if st.url == "" {
		var err error
		if st.url, err = llamaURL(s.target.MetricsURL, "lora-adapters"); err != nil {
			return // NewScraper checked the URL
		}
	}
	now := time.Now()
	if st.list != nil && !st.stale && now.Before(st.next) {
		return
	}
	_, err := s.get(ctx, st.url, jsonAccept, &st.buf)
	var list []LlamaAdapter
	if err == nil {
		list, err = ParseLoRAAdapters(st.buf.Bytes())
	}
	if ctx.Err() != nil {
		return
	}
	st.stale = false
	off, isOff := notServed(err)
	switch {
	case isOff:
		if !st.off {
			s.cfg.Logger.Info("llama.cpp server does not serve /lora-adapters: it is taken to have no LoRA adapters",
				"endpoint", s.target.Endpoint, "url", st.url, "status", off.status, "retry_in", SlotsRetry)
		}
		st.off, st.failing, st.next = true, false, now.Add(SlotsRetry)
		st.list = s.setLoRAList(st.list, nil)
		return
	case err != nil:
		if !st.failing {
			s.cfg.Logger.Warn("llama.cpp /lora-adapters failed: its adapters are those last read until it recovers",
				"endpoint", s.target.Endpoint, "url", st.url, "err", err)
		}
		st.failing = true
		return
	}
	if st.off || st.failing {
		s.cfg.Logger.Info("llama.cpp /lora-adapters read", "endpoint", s.target.Endpoint, "url", st.url)
	}
	st.off, st.failing, st.next = false, false, now.Add(s.cfg.LoRAListInterval)
	st.list = s.setLoRAList(st.list, list)
}

// setLoRAList returns the adapters of list, old itself when it lists the
// same ones; a change is logged (its ambiguous names as a warning).
func (s *Scraper) setLoRAList(old *LlamaAdapters, list []LlamaAdapter) *LlamaAdapters {
	t := NewLlamaAdapters(list)
	if old != nil && old.Equal(t) {
		return old
	}
	adapters := make([]string, 0, t.Len())
	for _, a := range t.List() {
		adapters = append(adapters, fmt.Sprintf("%d=%s(scale %g)", a.ID, a.Path, a.Scale))
	}
	s.cfg.Logger.Info("llama.cpp LoRA adapters", "endpoint", s.target.Endpoint, "adapters", adapters)
	if amb := t.Ambiguous(); len(amb) > 0 {
		s.cfg.Logger.Warn("llama.cpp LoRA adapters share a name: the name routes to neither (give the files distinct names)",
			"endpoint", s.target.Endpoint, "names", amb)
	}
	return t
}

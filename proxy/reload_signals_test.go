package proxy

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/policy"
)

// TestReloadMovesScrapeGroup: an endpoint whose own scrape_interval
// changes moves to another scrape group (another signals.Manager); its
// KV-event subscription, which listens on a socket, stops in the old group
// before it starts in the new one, so it never finds its address in use.
func TestReloadMovesScrapeGroup(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	port := freeport.Consecutive(t, 1)
	mk := func(iv time.Duration) config.Config {
		c := testConfig(policy.Default, a.URL, b.URL)
		m := &c.Models[0]
		m.Signals = config.Signals{ScrapeInterval: 10 * time.Millisecond}
		m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
		m.Endpoints[0].ID, m.Endpoints[1].ID = "a", "b"
		m.Endpoints[1].Signals.ScrapeInterval = iv
		m.Endpoints[1].KVEvents = config.KVEvents{Address: "tcp://127.0.0.1:" + strconv.Itoa(port), Listen: true}
		return c
	}
	var logs syncbuf.Buffer
	p, err := New(Options{Config: mk(10 * time.Millisecond), NewPicker: policy.New,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.RunSignals(ctx) }()
	defer func() { cancel(); <-done }()
	for i := range 20 {
		iv := 10 * time.Millisecond
		if i%2 == 0 {
			iv = 20 * time.Millisecond
		}
		if _, err := p.Reload(reloadTo(mk(iv))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // pace: let the new subscription bind
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "address already in use") {
			t.Errorf("a subscription found its address in use: %s", l)
		}
	}
}

// TestReloadModelSignalsNeedRestart: a model-level signals setting changed
// in the file is reported as needing a restart and is not applied: the
// endpoints, which inherit it, keep inheriting the running value (so it
// is not an endpoint change either).
func TestReloadModelSignalsNeedRestart(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	mk := func(iv time.Duration) config.Config {
		c := testConfig(policy.Default, a.URL)
		c.Models[0].Signals = config.Signals{ScrapeInterval: iv}
		return c
	}
	tp := newTestProxyWith(t, mk(700*time.Millisecond), policy.New)
	res, err := tp.Reload(reloadTo(mk(10 * time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Models) != 0 || !slices.Contains(res.Restart, "models[0].signals") {
		t.Errorf("reload: models %+v, restart %q; want no endpoint change and models[0].signals needing a restart", res.Models, res.Restart)
	}
	if got := tp.Router("m").Endpoints(); len(got) != 1 {
		t.Fatalf("endpoints %+v", got)
	}
	if iv := tp.pools["m"].set.Load().model.Endpoints[0].Signals.ScrapeInterval; iv != 700*time.Millisecond {
		t.Errorf("the endpoint's scrape interval after the reload: %v, want the running 700ms", iv)
	}
	// An endpoint's own setting is the endpoint's, and changes live.
	next := mk(10 * time.Millisecond)
	next.Models[0].Endpoints[0].Signals.ScrapeInterval = 50 * time.Millisecond
	if res, err := tp.Reload(reloadTo(next)); err != nil || len(res.Models) != 1 {
		t.Errorf("reload of the endpoint's own scrape_interval: %+v, %v; want one model changed", res, err)
	}
}

// TestReloadPDModelSignalsNotRefused: a model-level signals setting
// changed on a P/D model (needing a restart) does not refuse the reload as
// if its endpoints had changed: another model's endpoints change.
func TestReloadPDModelSignalsNotRefused(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	mk := func(iv time.Duration, urls ...string) config.Config {
		c := testConfig(policy.Default, urls...)
		pd := pdTestConfig("", "nixl", a.URL, b.URL)
		pd.Models[0].Signals = config.Signals{ScrapeInterval: iv}
		c.Models = append(c.Models, pd.Models[0])
		return c
	}
	tp := newTestProxyWith(t, mk(700*time.Millisecond, a.URL), policy.New)
	res, err := tp.Reload(reloadTo(mk(500*time.Millisecond, a.URL, b.URL)))
	if err != nil || len(res.Models) != 1 || res.Models[0].Model != "m" {
		t.Errorf("reload: %+v, %v; want model m's endpoints changed", res, err)
	}
}

// TestReloadRefusedLeavesNoSeries: a reload refused after a model's new
// endpoints were prepared (here: another, aggregated, model is given a
// decode endpoint, which needs a restart) leaves no metric series of
// endpoints that never joined.
func TestReloadRefusedLeavesNoSeries(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	cfg := testConfig(policy.Default, a.URL)
	other := testConfig(policy.Default, a.URL).Models[0]
	other.Name = "other"
	cfg.Models = append(cfg.Models, other)
	cfg.Models[0].Signals.Disabled = true
	cfg.Models[1].Signals.Disabled = true
	tp := newTestProxyWith(t, cfg, policy.New)
	next := cfg
	next.Models = slices.Clone(cfg.Models)
	next.Models[0].Endpoints = append(slices.Clone(cfg.Models[0].Endpoints), config.Endpoint{ID: "ghost", URL: "http://127.0.0.1:1"})
	next.Models[1].Endpoints = slices.Clone(cfg.Models[1].Endpoints)
	next.Models[1].Endpoints[0].Role = "decode"
	if _, err := tp.Reload(reloadTo(next)); err == nil {
		t.Fatal("a reload making an aggregated model disaggregated was not refused")
	}
	if out := gather(t, tp); strings.Contains(out, "ghost") {
		t.Errorf("/metrics names an endpoint that never joined:\n%s", grepLines(out, "ghost"))
	}
}

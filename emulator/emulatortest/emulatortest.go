// Package emulatortest runs emulated engines (package emulator) behind
// httptest servers, for the tests of the packages that talk to engines: the
// proxy, the P/D handoff, the commands.
package emulatortest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
)

// Start runs an emulator.Server with cfg behind an httptest.Server, tells
// it the server's host and port (the address P/D handshakes advertise), and
// stops both when the test ends. Its KV-event sockets (cfg.KVEvents) are
// bound when Start returns, so a subscriber may connect at once. wrap, when not nil, wraps the engine's
// handler (to record or alter requests). A zero cfg.Engine.Profile is the
// tiny profile and a zero cfg.Speed is 100 (a hundred times real time).
func Start(t testing.TB, cfg emulator.Config, wrap func(http.Handler) http.Handler) (*emulator.Server, *httptest.Server) {
	t.Helper()
	cfg = defaults(t, cfg)
	s, err := emulator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // New bound the KV-event sockets
	return s, serve(t, s.Handler(), wrap, s.SetAdvertise, s.Run)
}

// StartDP is Start for a data-parallel engine of size ranks
// (emulator.NewDP): one httptest.Server in front of every rank, which
// serves their P/D side channel too.
func StartDP(t testing.TB, cfg emulator.Config, size int, wrap func(http.Handler) http.Handler) (*emulator.DP, *httptest.Server) {
	t.Helper()
	cfg = defaults(t, cfg)
	d, err := emulator.NewDP(cfg, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, serve(t, d.Handler(), wrap, d.SetAdvertise, d.Run)
}

// defaults fills Start's defaults into cfg.
func defaults(t testing.TB, cfg emulator.Config) emulator.Config {
	t.Helper()
	if cfg.Engine.Profile.Name == "" {
		p, err := engine.LookupProfile("tiny")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Engine.Profile = p
	}
	if cfg.Speed == 0 {
		cfg.Speed = 100
	}
	return cfg
}

// serve runs engine handler h (wrapped by wrap) behind an httptest.Server,
// tells the engine its address (advertise) and runs its loop (run) until
// the test ends.
func serve(t testing.TB, h http.Handler, wrap func(http.Handler) http.Handler, advertise func(string, int),
	run func(context.Context) error) *httptest.Server {
	t.Helper()
	if wrap != nil {
		h = wrap(h)
	}
	hs := httptest.NewServer(h)
	host, port, err := net.SplitHostPort(hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	advertise(host, p)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := run(ctx); err != nil {
			t.Errorf("emulated engine: Run: %v", err)
		}
	})
	t.Cleanup(func() {
		hs.Close()
		cancel()
		wg.Wait()
	})
	return hs
}

// LoRA returns a LoRA configuration serving the named adapters (each at
// /adapters/<name>), with a max_lora slot for each.
func LoRA(names ...string) emulator.LoRAConfig {
	c := emulator.LoRAConfig{Enable: true, MaxLoRAs: len(names)}
	for _, n := range names {
		c.Modules = append(c.Modules, emulator.LoRAModule{Name: n, Path: "/adapters/" + n})
	}
	return c
}

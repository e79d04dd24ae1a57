package proxy

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
)

// syncBuffer is a bytes.Buffer safe for a logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReloadMovesScrapeGroup: an endpoint whose own scrape_interval
// changes moves to another scrape group (another signals.Manager); its
// KV-event subscription, which listens on a socket, stops in the old group
// before it starts in the new one, so it never finds its address in use.
func TestReloadMovesScrapeGroup(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	port := consecutivePorts(t, 1)
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
	var logs syncBuffer
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

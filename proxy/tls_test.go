package proxy

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTLSHandshakeBoundedByDial: connecting to an https engine is its TCP
// dial and its TLS handshake, both within timeouts.dial. An engine that
// takes connections but never answers (stopped: the kernel still accepts)
// held the request in net/http's handshake, which has no bound of its own,
// for as long as it stayed stopped, whatever the timeouts. The failed
// handshake is a connect error: the engine never saw the request, which is
// retried on another endpoint.
func TestTLSHandshakeBoundedByDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	stopped := "https://" + ln.Addr().String()
	good := newBackend(t, "good", okHandler("good"))
	cfg := testConfig("first", stopped, good.URL)
	cfg.Timeouts.Dial = 100 * time.Millisecond
	tp := newTestProxy(t, cfg)
	t.Cleanup(func() { // before the proxy's server closes: it waits for its handlers
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})

	c := &http.Client{Timeout: 10 * time.Second} // a hang guard, not a timing assertion
	resp, err := c.Post(tp.srv.URL+PathCompletions, "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatalf("the request to a stopped https engine did not end: %v", err)
	}
	if out := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(out, "good") {
		t.Errorf("got %d %q, want 200 from good", resp.StatusCode, out)
	}
	if v := tp.metric(t, tp.metrics.retries, "m", stopped, "connect_error"); v != 1 {
		t.Errorf("kvroute_retries_total{reason=connect_error}: got %v, want 1", v)
	}
}

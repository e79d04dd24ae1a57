package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// keepAliveEngine is an HTTP/1.1 engine that closes connections idle for
// longer than keepAlive, as uvicorn does for vLLM and SGLang (5 s). On a
// network the engine's close and a request the router sends on the
// connection at that moment cross: the request reaches a closed socket
// and is never answered. The crossing is made deterministic here: a
// request that arrives on a connection idle for longer than keepAlive is
// dropped with the connection, unanswered, as if the engine had closed it
// just before.
type keepAliveEngine struct {
	ln        net.Listener
	keepAlive time.Duration
	conns     atomic.Int32 // connections accepted
	served    atomic.Int32
	dropped   atomic.Int32 // requests that met a closed connection
	wg        sync.WaitGroup
	mu        sync.Mutex
	open      map[net.Conn]struct{}
}

func newKeepAliveEngine(t *testing.T, keepAlive time.Duration) *keepAliveEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &keepAliveEngine{ln: ln, keepAlive: keepAlive, open: map[net.Conn]struct{}{}}
	e.wg.Go(e.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		e.mu.Lock()
		for c := range e.open {
			_ = c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *keepAliveEngine) URL() string { return "http://" + e.ln.Addr().String() }

func (e *keepAliveEngine) accept() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.conns.Add(1)
		e.mu.Lock()
		e.open[c] = struct{}{}
		e.mu.Unlock()
		e.wg.Go(func() { e.serve(c) })
	}
}

func (e *keepAliveEngine) serve(c net.Conn) {
	defer func() {
		e.mu.Lock()
		delete(e.open, c)
		e.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	var idleSince time.Time
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if !idleSince.IsZero() && time.Since(idleSince) > e.keepAlive {
			e.dropped.Add(1)
			return // closed by the engine's keep-alive timeout
		}
		body := `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`
		_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\n\r\n"+body)
		if err != nil {
			return
		}
		e.served.Add(1)
		idleSince = time.Now()
	}
}

// TestUpstreamIdleBelowEngineKeepAlive: the router drops a connection to
// an engine once it has been idle for timeouts.upstream_idle, so with that
// below the engine's keep-alive timeout no request is sent on a connection
// the engine is closing. With the transport's 90 s the second request,
// sent after the engine's keep-alive had passed, went out on the stale
// connection and was lost (502 with no other endpoint to retry on).
func TestUpstreamIdleBelowEngineKeepAlive(t *testing.T) {
	e := newKeepAliveEngine(t, 300*time.Millisecond)
	cfg := testConfig("first", e.URL())
	cfg.Timeouts.UpstreamIdle = 100 * time.Millisecond
	tp := newTestProxy(t, cfg)
	for i := range 2 {
		if i > 0 {
			time.Sleep(600 * time.Millisecond) // past the engine's keep-alive
		}
		resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if d := e.dropped.Load(); d != 0 {
		t.Errorf("%d requests sent on a connection the engine had closed", d)
	}
	if c := e.conns.Load(); c != 2 {
		t.Errorf("engine accepted %d connections, want 2 (the idle one dropped by the router)", c)
	}
}

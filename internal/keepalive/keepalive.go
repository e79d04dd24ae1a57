// Package keepalive is, for tests, an HTTP/1.1 engine that closes
// connections idle for longer than its keep-alive timeout, as uvicorn does
// for vLLM and SGLang (5 s), and makes deterministic the loss that timeout
// causes a client keeping idle connections longer. On a network the
// engine's close and a request the client sends on the connection at that
// moment cross: the request reaches a closed socket and is never
// answered. Here a request that arrives on a connection idle for longer
// than the timeout is dropped with the connection, unanswered, as if the
// engine had closed it just before. The proxy and bench tests of their
// idle-connection timeouts share it.
package keepalive

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Body is the JSON completion the engine answers a request with; Stream
// the event stream it answers one that asks for a stream with.
const (
	Body   = `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	Stream = "data: {\"id\":\"cmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"id\":\"cmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
)

// Engine is the engine. Its counters may be read while it serves.
type Engine struct {
	Conns   atomic.Int32 // connections accepted
	Served  atomic.Int32 // requests answered
	Dropped atomic.Int32 // requests that met a connection closed for idleness

	ln        net.Listener
	keepAlive time.Duration
	wg        sync.WaitGroup
	mu        sync.Mutex
	open      map[net.Conn]struct{}
}

// Start serves an engine with the given keep-alive timeout on a loopback
// port until the test ends.
func Start(t testing.TB, keepAlive time.Duration) *Engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{ln: ln, keepAlive: keepAlive, open: map[net.Conn]struct{}{}}
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

// URL is the engine's base URL.
func (e *Engine) URL() string { return "http://" + e.ln.Addr().String() }

func (e *Engine) accept() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.Conns.Add(1)
		e.mu.Lock()
		e.open[c] = struct{}{}
		e.mu.Unlock()
		e.wg.Go(func() { e.serve(c) })
	}
}

func (e *Engine) serve(c net.Conn) {
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
		body, _ := io.ReadAll(req.Body)
		if !idleSince.IsZero() && time.Since(idleSince) > e.keepAlive {
			e.Dropped.Add(1)
			return // closed by the keep-alive timeout as the request arrived
		}
		typ, answer := "application/json", Body
		if bytes.Contains(body, []byte(`"stream":true`)) {
			typ, answer = "text/event-stream", Stream
		}
		_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: "+typ+"\r\nContent-Length: "+
			strconv.Itoa(len(answer))+"\r\n\r\n"+answer)
		if err != nil {
			return
		}
		e.Served.Add(1)
		idleSince = time.Now()
	}
}

package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// idPicker is a prefill policy that records the routing IDs it places.
type idPicker struct {
	mu  sync.Mutex
	ids []string
}

func (p *idPicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.mu.Lock()
	p.ids = append(p.ids, req.ID)
	p.mu.Unlock()
	return firstHealthy.Pick(now, req, cands)
}

func (p *idPicker) placed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.ids...)
}

// TestPDRoutingIDHeldUntilLegsEnd: on a P/D pool, a request's routing ID
// stays claimed until every leg using it has ended, not only until its
// client has its answer: with SGLang's concurrent legs, the decode engine
// may answer while the prefill leg is still in flight. Another request
// with the same X-Request-Id arriving then gets a routing ID of its own,
// and the ID is free again once the first request's legs have all ended.
func TestPDRoutingIDHeldUntilLegsEnd(t *testing.T) {
	release := make(chan struct{}) // ends the first prefill leg
	firstPrefill := make(chan struct{})
	var once sync.Once
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		first := false
		once.Do(func() { first = true })
		if first {
			close(firstPrefill)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-p","choices":[{"index":0,"text":"","finish_reason":"length"}]}`)
	}))
	t.Cleanup(prefill.Close)
	var closeOnce sync.Once
	t.Cleanup(func() { closeOnce.Do(func() { close(release) }) })
	decodeAnswered := make(chan struct{}, 4)
	decode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // as SGLang's decode engine waits for the KV from the prefill
		case <-firstPrefill:
		case <-r.Context().Done():
			return
		}
		okHandler("d0")(w, r)
		w.(http.Flusher).Flush()
		decodeAnswered <- struct{}{}
	}))
	t.Cleanup(decode.Close)
	ip := &idPicker{}
	cfg := pdTestConfig("ids", "sglang", prefill.URL, decode.URL)
	tp := newTestProxyWith(t, cfg, onePicker(ip))
	base, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	sendDup := func() <-chan answer {
		req, _ := http.NewRequestWithContext(base, http.MethodPost, tp.srv.URL+PathCompletions,
			strings.NewReader(`{"model":"tiny","prompt":"one routing id per request in progress","max_tokens":2}`))
		req.Header.Set(HeaderRequestID, "dup")
		return send(req)
	}
	ok := func(name string, ch <-chan answer) {
		t.Helper()
		if a := recv(t, name+"'s answer", ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("%s: got %d %s (%v), want 200", name, a.status, a.body, a.err)
		}
	}

	first := sendDup()
	recv(t, "the first decode leg answered", decodeAnswered)
	// The first request's prefill leg is still in flight under "dup".
	second := sendDup()
	ok("the second request", second)
	if got := ip.placed(); len(got) != 2 || got[0] != "dup" || got[1] == "dup" {
		t.Fatalf("routing IDs placed: got %q, want \"dup\" then another while the first request's prefill leg ran", got)
	}
	closeOnce.Do(func() { close(release) })
	ok("the first request", first)
	ok("the third request", sendDup())
	if got := ip.placed(); len(got) != 3 || got[2] != "dup" {
		t.Fatalf("routing IDs placed: got %q, want \"dup\" again once the first request's legs had ended", got)
	}
}

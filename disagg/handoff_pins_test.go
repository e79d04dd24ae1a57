package disagg

import (
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
)

// pinsLeft returns how many pins the planner holds.
func (p *Planner) pinsLeft() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pins)
}

// TestPDPinsDoNotLeak: a decode leg whose Route fails before the planner's
// Pick runs (no endpoint left healthy: the router answers "unavailable"
// without asking the picker) leaves no pin behind. The pin map is keyed by
// request: a leaked pin would hold the request (and its prompt) for the
// life of the process.
func TestPDPinsDoNotLeak(t *testing.T) {
	var f *pdFixture
	pe := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	u, err := url.Parse(pe.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	// The prefill node serves the prefill leg, and meanwhile the health
	// checks find the whole pool down.
	p := fake(t, func(w http.ResponseWriter, r *http.Request) {
		f.r.SetActiveHealth(time.Now(), "p", false)
		f.r.SetActiveHealth(time.Now(), "d", false)
		rp.ServeHTTP(w, r)
	})
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	f = newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	code, body := f.post(t, completion(false, 2))
	if code == http.StatusOK {
		t.Fatalf("got 200 %s from a pool that went down during the prefill leg", body)
	}
	if n := f.pl.pinsLeft(); n != 0 {
		t.Fatalf("after the request (%d %s): the planner holds %d pins, want 0", code, body, n)
	}
}

// TestPDSGLangStuckPrefillAfterDecode: once the decode leg has answered the
// client in full, a prefill engine that never replies holds the end of the
// response for PrefillGrace at most: its leg is then cancelled, and the
// request counts as served (the decode's answer means the KV arrived).
func TestPDSGLangStuckPrefillAfterDecode(t *testing.T) {
	prefillGone := make(chan struct{}, 1)
	p := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // (the server notices a client gone only once the body is read)
		<-r.Context().Done()      // never replies
		prefillGone <- struct{}{}
	})
	d := fake(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-d","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}`)
	})
	f := newPD(t, ProtocolSGLang, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	f.h.cfg.PrefillGrace = 50 * time.Millisecond
	// A hang guard, far above the grace: without it the answer never ends.
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Post(f.srv.URL+"/v1/completions", "application/json", strings.NewReader(completion(false, 2)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "cmpl-d") {
		t.Fatalf("got %d %s (%v), want the decode engine's answer", resp.StatusCode, b, err)
	}
	select {
	case <-prefillGone:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck prefill leg was not cancelled")
	}
	if st := f.r.Status(time.Now()); len(st) != 2 || !st[0].Healthy || !st[1].Healthy {
		t.Errorf("endpoints after a late prefill reply: %+v, want both healthy", st)
	}
}

package disagg

import (
	"net/http"
	"net/http/httputil"
	"net/url"
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

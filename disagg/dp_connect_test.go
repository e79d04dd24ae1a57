package disagg

import (
	"net/http"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestPDDataParallelDecodeConnectSkipsServer: a decode leg that fails
// with a connect error is retried once "on another decode node" with the
// same kv_transfer_params (Handoff doc). When the failed decode endpoint is
// one rank of a data-parallel server, its sibling ranks share the dead URL
// (the aggregated path excludes them all, proxy/handler.go); the handoff
// retries on the sibling rank, which cannot connect either, and so the
// request pays a second prefill.
func TestPDDataParallelDecodeConnectSkipsServer(t *testing.T) {
	pre := emu(t, kvroute.RolePrefill, ProtocolNixl)
	live := emu(t, kvroute.RoleDecode, ProtocolNixl)
	const dead = "http://127.0.0.1:1"
	eps := []kvroute.Endpoint{endpoint("p", pre.URL, kvroute.RolePrefill, "rack", "r1")}
	for r := range 2 { // the dead data-parallel decode server shares p's rack: cheaper link, picked first
		e := endpoint(kvroute.DataParallelID("d", r), dead, kvroute.RoleDecode, "rack", "r1")
		e.DataParallelSize, e.DataParallelRank = 2, r
		eps = append(eps, e)
	}
	eps = append(eps, endpoint("e", live.URL, kvroute.RoleDecode))
	f := newPD(t, ProtocolNixl, ModeAlways, eps...)
	code, body, dec := f.postH(t, completion(false, 3))
	if code != http.StatusOK {
		t.Fatalf("got %d %s", code, body)
	}
	if n := len(f.rec.to(pre.URL)); n != 1 {
		t.Errorf("prefill legs: got %d, want 1 (the decode retry after a connect error should go to another server, e, "+
			"not to a sibling rank of the dead one); answered by %s; legs to the dead server: %d", n, dec, len(f.rec.to(dead)))
	}
}

// TestPDDataParallelPrefillConnectSkipsServer: a prefill leg whose data-parallel
// server refuses the connection leads to a new plan that "avoids the
// failed node" (Handoff doc); only the failed rank is avoided, so the next
// plan may take its sibling on the same dead URL.
func TestPDDataParallelPrefillConnectSkipsServer(t *testing.T) {
	live := emu(t, kvroute.RolePrefill, ProtocolNixl)
	dec := emu(t, kvroute.RoleDecode, ProtocolNixl)
	const dead = "http://127.0.0.1:1"
	var eps []kvroute.Endpoint
	for r := range 4 {
		e := endpoint(kvroute.DataParallelID("p", r), dead, kvroute.RolePrefill)
		e.DataParallelSize, e.DataParallelRank = 4, r
		eps = append(eps, e)
	}
	eps = append(eps, endpoint("q", live.URL, kvroute.RolePrefill), endpoint("d", dec.URL, kvroute.RoleDecode))
	f := newPD(t, ProtocolNixl, ModeAlways, eps...)
	bad := 0
	for i := range 6 {
		before := len(f.rec.to(dead))
		code, body := f.post(t, completion(false, 3))
		if code != http.StatusOK {
			t.Fatalf("request %d: got %d %s", i, code, body)
		}
		if n := len(f.rec.to(dead)) - before; n > 1 {
			bad++
			t.Logf("request %d: %d legs sent to the dead server's ranks", i, n)
		}
	}
	if bad > 0 {
		t.Errorf("%d of 6 requests were sent to more than one rank of the dead prefill server", bad)
	}
	t.Logf("fallbacks: %s", f.logs.String())
}

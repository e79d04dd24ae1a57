package disagg

import (
	"net/http"
	"testing"

	"github.com/kvroute/kvroute"
)

// hopFront passes each leg on to the engine at u and answers with its
// status and body under headers of its own: Connection names X-Engine-Hop,
// a header for this connection only (RFC 9110 7.6.1), and X-Engine-Kept is
// an end-to-end header.
func hopFront(t *testing.T, u string) string {
	return fake(t, func(w http.ResponseWriter, r *http.Request) {
		resp, answer, ok := relay(t, w, r, u)
		if !ok {
			return
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.Header().Set("Connection", "X-Engine-Hop")
		w.Header().Set("X-Engine-Hop", "for this connection only")
		w.Header().Set("X-Engine-Kept", "end to end")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}).URL
}

// TestPDAnswerDropsConnectionHeaders: the headers an engine's answer names
// in its Connection header are hop-by-hop and do not reach the client, as
// on the aggregated path (httputil.ReverseProxy); the others do.
func TestPDAnswerDropsConnectionHeaders(t *testing.T) {
	for _, stream := range []bool{false, true} {
		p := emu(t, kvroute.RolePrefill, ProtocolNixl)
		d := hopFront(t, emu(t, kvroute.RoleDecode, ProtocolNixl).URL)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d, kvroute.RoleDecode))
		res, w := serveDirect(t, f, stream)
		wholeAnswer(t, res, w, stream)
		h := w.Result().Header
		if got := h.Get("X-Engine-Hop"); got != "" {
			t.Errorf("stream=%v: X-Engine-Hop reached the client (%q); the engine's Connection header names it", stream, got)
		}
		if got := h.Get("X-Engine-Kept"); got != "end to end" {
			t.Errorf("stream=%v: X-Engine-Kept: got %q, want %q", stream, got, "end to end")
		}
	}
}

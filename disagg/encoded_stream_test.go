package disagg

import (
	"net/http"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/internal/gzipstream"
)

// TestPDEncodedStreamBreakIsAborted: a decode engine's event stream sent
// content-encoded (by the engine, or a hop before the router such as an
// nginx with gzip on) and passed on as it is (the proxy's transport has
// DisableCompression), that broke mid-stream, was ended with the error
// event and data: [DONE] appended as plain text after the compressed
// bytes, so the client's gzip reader failed on corrupt input instead of
// seeing a broken stream (proxy's TestEncodedStreamBreakIsAborted, on the
// aggregated path). The router cannot speak inside an encoding it does not
// apply: such a stream is aborted as a JSON body is (Result.Abort), the
// client keeps the compressed events the engine sent, then a truncated
// transfer, and the break is still the request's error.
func TestPDEncodedStreamBreakIsAborted(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := fake(t, gzipstream.Breaking)
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	// As the proxy's transport: encoded bodies are passed on as they are.
	f.rec.c = &http.Client{Transport: &http.Transport{DisableCompression: true}}
	resp, raw := gzipstream.Post(t, f.srv.URL+"/v1/completions", completion(true, 4))
	gzipstream.CheckTruncated(t, resp, raw)
}

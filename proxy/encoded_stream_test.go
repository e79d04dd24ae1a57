package proxy

import (
	"testing"

	"github.com/kvroute/kvroute/internal/gzipstream"
)

// TestEncodedStreamBreakIsAborted: an event stream the engine (or a hop
// before the router, an nginx with gzip on) sent gzip-encoded to a client
// that accepts gzip, and that broke mid-stream, was ended with the error
// event and data: [DONE] appended as plain text after the compressed
// bytes: the client's gzip reader failed on corrupt input (and a lenient
// one returned garbage) instead of seeing a broken stream. The router
// cannot speak inside an encoding it does not apply, so such a stream is
// aborted as another broken body is: the client sees the compressed
// events the engine sent, then a truncated transfer; the failure is
// still counted.
func TestEncodedStreamBreakIsAborted(t *testing.T) {
	be := newBackend(t, "a", gzipstream.Breaking)
	tp := newTestProxy(t, testConfig("first", be.URL))
	resp, raw := gzipstream.Post(t, tp.srv.URL+PathCompletions, streamBody)
	gzipstream.CheckTruncated(t, resp, raw)
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 1 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 1", v)
	}
}

package proxy

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
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
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, "data: {\"n\":0}\n\n")
		_ = zw.Flush()
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	req, err := http.NewRequest(http.MethodPost, tp.srv.URL+PathCompletions, strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "gzip") // set by hand: the client leaves the body encoded
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body) // an abort is a read error: what came before it is what the client has
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("got status %d, Content-Encoding %q; want 200 gzip", resp.StatusCode, resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("gzip header: %v (body %q)", err, raw)
	}
	dec, err := io.ReadAll(zr)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("decoding the body: got error %v, want io.ErrUnexpectedEOF (a truncated stream, not a corrupt one); raw body %q", err, raw)
	}
	if string(dec) != "data: {\"n\":0}\n\n" {
		t.Errorf("decoded body: got %q, want the engine's event", dec)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 1 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 1", v)
	}
}

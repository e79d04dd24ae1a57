// Package gzipstream is, for tests, an engine whose gzip-encoded event
// stream breaks after its first event, and the check of what a client
// accepting gzip must then have: that event, then a truncated (not a
// corrupt) stream. The proxy and disagg tests of a broken encoded stream
// share it.
package gzipstream

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// Event is the one event Breaking sends before it breaks.
const Event = "data: {\"n\":0}\n\n"

// Breaking is an engine's handler: it reads the request, sends Event in a
// gzip-encoded text/event-stream, flushed, then dies mid-stream.
func Breaking(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Content-Encoding", "gzip")
	zw := gzip.NewWriter(w)
	fmt.Fprint(zw, Event)
	_ = zw.Flush()
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler) // the engine dies mid-stream
}

// Post sends body to url as a client that accepts gzip and leaves the
// body encoded, and returns the response and the raw body read until its
// end or break.
func Post(t testing.TB, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
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
	return resp, raw
}

// CheckTruncated checks that a response to Breaking's stream is a 200 gzip
// body that decodes to Event and then ends short, as a truncated stream
// does, rather than failing as corrupt input.
func CheckTruncated(t testing.TB, resp *http.Response, raw []byte) {
	t.Helper()
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
	if string(dec) != Event {
		t.Errorf("decoded body: got %q, want the engine's event", dec)
	}
}

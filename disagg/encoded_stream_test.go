package disagg

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
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
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, "data: {\"n\":0}\n\n")
		_ = zw.Flush()
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	})
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	// As the proxy's transport: encoded bodies are passed on as they are.
	f.rec.c = &http.Client{Transport: &http.Transport{DisableCompression: true}}
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/completions", strings.NewReader(completion(true, 4)))
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
}

package disagg

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/router"
)

// brokenBody is an engine that answers 200 with a JSON body of declared
// length cut short: its connection closes after the first bytes.
func brokenBody(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		headersThenReset(t, w, "application/json", `{"id":"cmpl-d","object":"text_completion","choices":[{"index":0,"text":"trunc`)
	}
}

// TestPDBrokenJSONAnswerIsAborted: a non-streaming answer whose body breaks
// after its status was sent must reach the client as a broken response
// (the connection aborted, as httputil.ReverseProxy does on the aggregated
// path), never as a complete-looking 200 with a truncated JSON body.
func TestPDBrokenJSONAnswerIsAborted(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := fake(t, brokenBody(t))
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	resp, err := http.Post(f.srv.URL+"/v1/completions", "application/json", strings.NewReader(completion(false, 2)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("got a complete %d response %q, want the body's read to fail (aborted response)", resp.StatusCode, b)
	}
}

// TestPDAdmitClientGone: a request whose client goes away while Admit holds
// it (the proxy's queue) is recorded as the client's (499), whatever
// error Admit returns then (the queue's shed error), and nothing is
// written.
func TestPDAdmitClientGone(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	held := make(chan struct{})
	f.h.cfg.Admit = func(ctx context.Context, _ *kvroute.Request) (*router.Flight, error) {
		close(held)
		<-ctx.Done()
		return nil, &kvroute.Error{Status: http.StatusTooManyRequests, Type: kvroute.TypeOverloaded, Code: "overloaded",
			Message: "still overloaded"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := completion(false, 2)
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
	kr := &kvroute.Request{ID: "gone", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 2, Arrival: time.Now()}
	go func() {
		<-held
		cancel()
	}()
	rec := httptest.NewRecorder()
	res := f.h.Serve(rec, req, "/v1/completions", []byte(body), kr)
	if res.Status != StatusClientClosed || rec.Body.Len() != 0 {
		t.Errorf("got result %d, response %d %q; want 499 and nothing written", res.Status, rec.Code, rec.Body)
	}
}

// TestPDStreamBrokenMidEventEndsCleanly: a decode stream that breaks in the
// middle of an event ends, for the client, with that event terminated, then
// vLLM's error event and [DONE], each its own event (as on the aggregated
// path): the error event must not be glued onto the broken one's line,
// where a client's SSE parser sees one event of invalid JSON and never the
// error.
func TestPDStreamBrokenMidEventEndsCleanly(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		headersThenReset(t, w, "text/event-stream", "data: {\"n\":0}\n\ndata: {\"n\":1,\"te")
	})
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	code, body := f.post(t, completion(true, 4))
	if code != http.StatusOK {
		t.Fatalf("got %d %s", code, body)
	}
	var data []string
	for ev := range strings.SplitSeq(body, "\n\n") {
		if ev != "" {
			data = append(data, ev)
		}
	}
	if len(data) != 4 || data[0] != `data: {"n":0}` || data[1] != `data: {"n":1,"te` ||
		!strings.HasPrefix(data[2], `data: {"error":`) || data[3] != "data: [DONE]" {
		t.Fatalf("got events %q, want the first, the broken one terminated, the error event and [DONE]", data)
	}
}

// cancelAfterDone is a client that hangs up once it has read the final
// event of a stream.
type cancelAfterDone struct {
	*httptest.ResponseRecorder
	cancel context.CancelFunc
}

func (w *cancelAfterDone) Write(p []byte) (int, error) {
	n, err := w.ResponseRecorder.Write(p)
	if strings.HasSuffix(w.Body.String(), "data: [DONE]\n\n") {
		w.cancel()
	}
	return n, err
}

// TestPDClientClosingAfterDoneIsServed: a client that hangs up after the
// final event of a stream, before the decode engine closed its response,
// got its whole answer: the request is served (200), not counted as the
// client's (499) or as a broken stream, as on the aggregated path.
func TestPDClientClosingAfterDoneIsServed(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"n\":0}\n\ndata: [DONE]\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the engine is slow to close its response
	})
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := completion(true, 4)
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
	kr := &kvroute.Request{ID: "done", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Stream: true, Arrival: time.Now()}
	w := &cancelAfterDone{ResponseRecorder: httptest.NewRecorder(), cancel: cancel}
	res := f.h.Serve(w, req, "/v1/completions", []byte(body), kr)
	if res.Status != http.StatusOK || res.Err != nil {
		t.Errorf("got result %d (%v), want 200 and no error: the client had its whole answer", res.Status, res.Err)
	}
	if got := w.Body.String(); got != "data: {\"n\":0}\n\ndata: [DONE]\n\n" {
		t.Errorf("client got %q, want the engine's stream as it was", got)
	}
}

// TestPDAnswerTimeoutIsNotRetried: a leg that runs the generation (the
// decode leg, or the whole request on one node) and gets no response
// headers within the transport's ResponseHeaderTimeout (the proxy's
// timeouts.upstream_header) is answered 504 at once, as on the aggregated
// path: another placement would run the whole generation again (and a
// new prefill with it), only to time out the same way.
func TestPDAnswerTimeoutIsNotRetried(t *testing.T) {
	for _, tt := range []struct {
		proto string
		mode  Mode
	}{{ProtocolNixl, ModeAlways}, {ProtocolSGLang, ModeAlways}, {ProtocolNixl, ModeNever}} {
		t.Run(tt.proto+"/"+string(tt.mode), func(t *testing.T) {
			p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
			if tt.proto == ProtocolSGLang {
				p = fake(t, func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"id":"cmpl-p","choices":[{"index":0,"text":"","finish_reason":"length"}]}`)
				})
			}
			slow := func(w http.ResponseWriter, r *http.Request) { // a generation longer than the timeout
				_, _ = io.Copy(io.Discard, r.Body)
				<-r.Context().Done()
			}
			d1, d2 := fake(t, slow), fake(t, slow)
			eps := []kvroute.Endpoint{endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d1", d1.URL, kvroute.RoleDecode),
				endpoint("d2", d2.URL, kvroute.RoleDecode)}
			if tt.mode == ModeNever {
				eps = eps[1:]
			}
			f := newPD(t, tt.proto, tt.mode, eps...)
			f.rec.c = &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 100 * time.Millisecond}}
			code, body := f.post(t, completion(false, 2))
			if code != http.StatusGatewayTimeout {
				t.Errorf("got %d %s, want 504", code, body)
			}
			if n := len(f.rec.to(d1.URL)) + len(f.rec.to(d2.URL)); n != 1 {
				t.Errorf("the generation was sent %d times, want once", n)
			}
		})
	}
}

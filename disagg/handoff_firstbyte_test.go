package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/openai"
)

// headersThenReset writes on w's connection a 200's headers for a body of
// contentType (a stream's chunked, another's with a Content-Length of 400
// it never fulfils), then body ("" for none; a stream's as one chunk), and
// drops the connection: an engine that died, or a hop that dropped the
// connection, after the answer's headers or in the middle of its body.
func headersThenReset(t *testing.T, w http.ResponseWriter, contentType, body string) {
	t.Helper()
	conn, bw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	chunked := strings.HasPrefix(contentType, openai.ContentTypeEventStream)
	framing := "Content-Length: 400"
	if chunked {
		framing = "Transfer-Encoding: chunked"
	}
	_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: " + contentType + "\r\n" + framing + "\r\n\r\n")
	switch {
	case body == "":
	case chunked:
		_, _ = bw.WriteString(strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n")
	default:
		_, _ = bw.WriteString(body)
	}
	_ = bw.Flush()
}

// resetFront is a decode engine in front of the emulated engine at u: it
// passes each leg on to u and, when fail says so, reads u's whole answer
// (u has pulled the prefill's KV cache then: the lease is consumed) and
// sends the client only its headers before dropping the connection.
// Otherwise it passes u's answer on.
func resetFront(t *testing.T, u string, fail func() bool) *httptest.Server {
	return fake(t, func(w http.ResponseWriter, r *http.Request) {
		resp, answer, ok := relay(t, w, r, u)
		if !ok {
			return
		}
		if resp.StatusCode == http.StatusOK && fail() {
			headersThenReset(t, w, resp.Header.Get("Content-Type"), "")
			return
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	})
}

// relay sends r on to the engine at u and reads its whole answer; on a
// failure it has answered w itself and returns ok false.
func relay(t *testing.T, w http.ResponseWriter, r *http.Request, u string) (resp *http.Response, answer []byte, ok bool) {
	body, _ := io.ReadAll(r.Body)
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return nil, nil, false
	}
	out.Header = r.Header.Clone()
	resp, err = http.DefaultClient.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return nil, nil, false
	}
	defer resp.Body.Close()
	answer, _ = io.ReadAll(resp.Body)
	return resp, answer, true
}

// serveDirect runs body through f's handoff as the proxy does, on a
// recorder, and returns the result and what the client got.
func serveDirect(t *testing.T, f *pdFixture, stream bool) (Result, *httptest.ResponseRecorder) {
	t.Helper()
	body := completion(stream, 4)
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	kr := &kvroute.Request{ID: "first-byte", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Stream: stream,
		Arrival: time.Now()}
	w := httptest.NewRecorder()
	done := make(chan Result, 1)
	go func() { done <- f.h.Serve(w, req, "/v1/completions", []byte(body), kr) }()
	select {
	case res := <-done:
		return res, w
	case <-time.After(30 * time.Second): // a hang guard
		t.Fatal("Serve did not return")
	}
	return Result{}, nil
}

// checkBooks fails t unless the router holds no flight on any endpoint and
// the planner no pin and no untaken plan.
func checkBooks(t *testing.T, f *pdFixture) {
	t.Helper()
	for _, st := range f.r.Status(time.Now()) {
		if st.Load.InFlight != 0 {
			t.Errorf("endpoint %s has %d flights in the router, want 0", st.ID, st.Load.InFlight)
		}
	}
	if n := f.pl.pinsLeft(); n != 0 {
		t.Errorf("%d pins left, want 0", n)
	}
	if n := f.pl.plansLeft(); n != 0 {
		t.Errorf("%d plans left, want 0", n)
	}
}

// wholeAnswer fails t unless the client got a complete 200 answer: a
// stream that ends with [DONE] and carries no error event, or a whole
// completion.
func wholeAnswer(t *testing.T, res Result, w *httptest.ResponseRecorder, stream bool) {
	t.Helper()
	got := w.Body.String()
	if res.Status != http.StatusOK || w.Code != http.StatusOK || res.Abort {
		t.Fatalf("got result %d (abort %v, %v), response %d %q; want a whole 200 answer", res.Status, res.Abort, res.Err, w.Code, got)
	}
	if stream {
		if !strings.HasSuffix(got, "data: [DONE]\n\n") || strings.Contains(got, `"error"`) {
			t.Errorf("client got stream %q, want the engine's events and [DONE], no error", got)
		}
		return
	}
	var c openai.Completion
	if err := json.Unmarshal([]byte(got), &c); err != nil || len(c.Choices) != 1 || c.Usage.CompletionTokens != 4 {
		t.Errorf("client got %q (%v), want a completion of 4 tokens", got, err)
	}
}

// errorAnswer fails t unless the client got status with an OpenAI-style
// error body of type upstream_error, and nothing else.
func errorAnswer(t *testing.T, res Result, w *httptest.ResponseRecorder, status int) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	err := json.Unmarshal(w.Body.Bytes(), &e)
	if res.Status != status || w.Code != status || res.Abort || err != nil || e.Error.Type != kvroute.TypeUpstream || e.Error.Message == "" {
		t.Errorf("got result %d (abort %v), response %d %q; want %d with an upstream_error body", res.Status, res.Abort, w.Code, w.Body, status)
	}
}

// TestPDDecodeResetBeforeFirstByte: a decode engine that sends its
// answer's headers and drops the connection before any body byte (it died
// after pulling the KV cache) sent the client nothing yet: the request is
// placed again, prefill included (the decode engine consumed the
// prefill's lease, so the same kv_transfer_params would find none), and
// the client gets a whole 200 answer from the other decode engine, never
// a 200 whose body breaks. The books balance afterwards. The same holds
// for a request run whole on a decode engine (ModeNever).
func TestPDDecodeResetBeforeFirstByte(t *testing.T) {
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		for _, mode := range []Mode{ModeAlways, ModeNever} {
			if proto == ProtocolSGLang && mode == ModeNever {
				continue // the same runWhole as nixl's
			}
			for _, stream := range []bool{false, true} {
				t.Run(proto+"/"+string(mode)+"/stream="+strconv.FormatBool(stream), func(t *testing.T) {
					var failed atomic.Bool
					once := func() bool { return failed.CompareAndSwap(false, true) } // the first decode leg, whichever node
					p := emu(t, kvroute.RolePrefill, proto)
					_, port := hostPort(t, p.URL)
					d1 := resetFront(t, emu(t, kvroute.RoleDecode, proto).URL, once)
					d2 := resetFront(t, emu(t, kvroute.RoleDecode, proto).URL, once)
					eps := []kvroute.Endpoint{endpoint("p", p.URL, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port)),
						endpoint("d1", d1.URL, kvroute.RoleDecode), endpoint("d2", d2.URL, kvroute.RoleDecode)}
					if mode == ModeNever {
						eps = eps[1:]
					}
					f := newPD(t, proto, mode, eps...)
					res, w := serveDirect(t, f, stream)
					wholeAnswer(t, res, w, stream)
					if !failed.Load() {
						t.Fatal("no decode leg was dropped")
					}
					n1, n2 := len(f.rec.to(d1.URL)), len(f.rec.to(d2.URL))
					if n1 != 1 || n2 != 1 {
						t.Errorf("decode legs: %d on d1, %d on d2; want one each (the retry on the other node)", n1, n2)
					}
					leg := "aggregated"
					if mode == ModeAlways {
						leg = "decode"
						prefills := f.rec.to(p.URL)
						if len(prefills) != 2 || prefills[0].id == prefills[1].id {
							t.Errorf("prefill legs %+v: want two, under two ids (a new placement)", prefills)
						}
					}
					if got := counter(t, f.h.cfg.Metrics.failures, "tiny", leg, "transport"); got != 1 {
						t.Errorf("%s failures (transport): got %v, want 1", leg, got)
					}
					if res.Attempts != 2 {
						t.Errorf("attempts: got %d, want 2", res.Attempts)
					}
					checkBooks(t, f)
				})
			}
		}
	}
}

// TestPDDecodeResetLastAttempt: when no placement is left, a decode leg
// dropped before its first byte is answered as a failed request, 502 with
// an OpenAI error body, not as a 200 whose body breaks.
func TestPDDecodeResetLastAttempt(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
			d := resetFront(t, emu(t, kvroute.RoleDecode, emulator.PDNixl).URL, func() bool { return true })
			f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
			res, w := serveDirect(t, f, stream)
			errorAnswer(t, res, w, http.StatusBadGateway)
			if n := len(f.rec.to(d.URL)); n != 1 {
				t.Errorf("decode legs: got %d, want 1", n)
			}
			checkBooks(t, f)
		})
	}
}

// TestPDDecodeSilentBeforeFirstByte: a decode engine that sends its
// answer's headers and then nothing for Silence is answered 504 with an
// error body, as on the aggregated path (its headers were not passed on),
// and not retried: the engine took the generation, and another would run
// it again only to time out the same way.
func TestPDDecodeSilentBeforeFirstByte(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			hang := func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if stream {
					w.Header().Set("Content-Type", openai.ContentTypeEventStream)
				} else {
					w.Header().Set("Content-Type", "application/json")
				}
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				select { // hung
				case <-r.Context().Done():
				case <-release:
				}
			}
			p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
			d1, d2 := fake(t, hang), fake(t, hang)
			f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d1", d1.URL, kvroute.RoleDecode),
				endpoint("d2", d2.URL, kvroute.RoleDecode))
			f.h.cfg.Silence = 300 * time.Millisecond
			res, w := serveDirect(t, f, stream)
			errorAnswer(t, res, w, http.StatusGatewayTimeout)
			if n := len(f.rec.to(d1.URL)) + len(f.rec.to(d2.URL)); n != 1 {
				t.Errorf("the generation was sent %d times, want once", n)
			}
			checkBooks(t, f)
		})
	}
}

// emptyReads is a response body whose every read returns nothing and no
// error.
type emptyReads struct{}

func (emptyReads) Read([]byte) (int, error) { return 0, nil }
func (emptyReads) Close() error             { return nil }

// doerFunc adapts a function to Doer.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// TestPDDecodeBodyWithoutProgress: a decode answer whose body keeps
// returning nothing and no error fails the leg (io.ErrNoProgress, as
// bufio's readers do) rather than holding the request in a loop of empty
// reads: with no placement left the client gets 502.
func TestPDDecodeBodyWithoutProgress(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := fake(t, http.NotFound) // never reached: the client answers for it
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	f.h.cfg.Client = doerFunc(func(r *http.Request) (*http.Response, error) {
		if "http://"+r.URL.Host == d.URL {
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: emptyReads{},
				Request: r}, nil
		}
		return f.rec.Do(r)
	})
	res, w := serveDirect(t, f, false)
	errorAnswer(t, res, w, http.StatusBadGateway)
	if !errors.Is(res.Err, io.ErrNoProgress) {
		t.Errorf("result error %v, want io.ErrNoProgress", res.Err)
	}
	checkBooks(t, f)
}

// TestPDSGLangPrefillFailsAfterDecodeHeaders: an SGLang prefill leg that
// fails once the decode engine has sent its answer's headers, before any
// body byte, cancels the pair before the client got anything: the request
// is placed again (here aggregated on the decode node, the only prefill
// node having failed) and the client gets a whole answer, not a 200 whose
// stream carries the cancelled decode leg's error.
func TestPDSGLangPrefillFailsAfterDecodeHeaders(t *testing.T) {
	headers := make(chan struct{})
	var first atomic.Bool
	d := emu(t, kvroute.RoleDecode, emulator.PDSGLang)
	front := resetFront(t, d.URL, func() bool { return false })
	dec := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if !first.CompareAndSwap(false, true) {
			front.Config.Handler.ServeHTTP(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", openai.ContentTypeEventStream)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(headers)
		<-r.Context().Done() // waits for a bootstrap that never comes
	})
	p := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-headers
		status500(w, r)
	})
	f := newPD(t, ProtocolSGLang, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", dec.URL, kvroute.RoleDecode))
	res, w := serveDirect(t, f, true)
	wholeAnswer(t, res, w, true)
	if n := len(f.rec.to(dec.URL)); n != 2 {
		t.Errorf("decode node legs: got %d, want 2 (the pair, then the request whole)", n)
	}
	checkBooks(t, f)
}

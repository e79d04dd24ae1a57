package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// headersThenDie is an engine that crashes after its response headers:
// it answers 200 with contentType (an event stream chunked, anything else
// with a Content-Length it never fulfils), sends body (maybe nothing),
// then drops the connection.
func headersThenDie(t *testing.T, contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		if contentType == openai.ContentTypeEventStream {
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n", contentType)
			if body != "" {
				fmt.Fprintf(bw, "%x\r\n%s\r\n", len(body), body)
			}
		} else {
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: 400\r\n\r\n%s", contentType, body)
		}
		_ = bw.Flush()
	}
}

// learnerProxy serves urls with the "learn" policy (first healthy, keeps
// the outcomes the router feeds back) and returns that picker.
func learnerProxy(t *testing.T, urls ...string) (*testProxy, func() []kvroute.Outcome) {
	t.Helper()
	var l *learner
	cfg := testConfig("learn", urls...)
	cfg.Models[0].Router.FailThreshold = 1
	tp := newTestProxyWith(t, cfg, func(string, map[string]any, uint64) (kvroute.Picker, error) {
		l = &learner{}
		return l, nil
	})
	return tp, func() []kvroute.Outcome { return l.got() }
}

// firstByteCases are the two kinds of answer whose first byte the proxy
// waits for before the headers go out: a stream and a JSON body.
var firstByteCases = []struct {
	name, contentType, path, body string
}{
	{"stream", openai.ContentTypeEventStream, PathCompletions, streamBody},
	{"json", "application/json", PathChatCompletions, chatBody},
}

// TestFailureBeforeFirstByteIsRetried: an engine that sends its 200's
// headers and then dies before the first body byte has sent the client
// nothing (the headers wait for that byte), so the request is retried on
// another endpoint like a reset before the headers: the client gets the
// other endpoint's whole answer, and the failed attempt is the endpoint's
// failure (a failed outcome for the policy, passive health, the retry
// counted as upstream_reset).
func TestFailureBeforeFirstByteIsRetried(t *testing.T) {
	for _, tc := range firstByteCases {
		t.Run(tc.name, func(t *testing.T) {
			dying := newBackend(t, "dying", headersThenDie(t, tc.contentType, ""))
			good := newBackend(t, "good", okHandler("good"))
			tp, outcomes := learnerProxy(t, dying.URL, good.URL)
			resp := tp.post(t, tc.path, tc.body)
			out := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Backend") != "good" {
				t.Fatalf("got %d from %q: %q, want 200 from good", resp.StatusCode, resp.Header.Get("X-Backend"), out)
			}
			if tc.name == "stream" {
				ev := events(t, strings.NewReader(out))
				if len(ev) != 4 || ev[3] != "[DONE]" || strings.Contains(out, "error") {
					t.Errorf("events: got %q, want good's 3 chunks and [DONE]", ev)
				}
			} else if !strings.Contains(out, "from good") {
				t.Errorf("body: got %q, want good's answer", out)
			}
			if d, g := dying.hits.Load(), good.hits.Load(); d != 1 || g != 1 {
				t.Errorf("attempts: got %d on dying and %d on good, want 1 and 1", d, g)
			}
			if v := tp.metric(t, tp.metrics.retries, "m", dying.URL, "upstream_reset"); v != 1 {
				t.Errorf("kvroute_retries_total{dying,upstream_reset}: got %v, want 1", v)
			}
			if v := tp.metric(t, tp.metrics.ejections, "m", dying.URL, "passive"); v != 1 {
				t.Errorf("kvroute_ejections_total{dying,passive} (fail_threshold 1): got %v, want 1", v)
			}
			if v := tp.metric(t, tp.metrics.streamErrors, "m", dying.URL); v != 0 {
				t.Errorf("kvroute_upstream_stream_errors_total{dying}: got %v, want 0 (nothing was streamed)", v)
			}
			waitFor(t, "both attempts' outcomes", func() bool { return len(outcomes()) == 2 })
			got := outcomes()
			if len(got) != 2 || got[0].Endpoint != dying.URL || !got[0].Failed || got[1].Endpoint != good.URL || got[1].Failed {
				t.Errorf("outcomes: got %+v, want dying's failed, then good's", got)
			}
		})
	}
}

// TestFailureAfterFirstByteIsNotRetried: once a body byte has reached the
// client, a failure is not retried: an event stream ends with an error
// event and [DONE], another body is cut (the response aborted).
func TestFailureAfterFirstByteIsNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, path, body, first string
	}{
		{"stream", openai.ContentTypeEventStream, PathCompletions, streamBody, "data: {\"n\":0}\n\n"},
		{"json", "application/json", PathChatCompletions, chatBody, `{"id":"cmpl-1","choices":[{"text":"trunc`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dying := newBackend(t, "dying", headersThenDie(t, tc.contentType, tc.first))
			good := newBackend(t, "good", okHandler("good"))
			tp, outcomes := learnerProxy(t, dying.URL, good.URL)
			resp, err := http.Post(tp.srv.URL+tc.path, "application/json", strings.NewReader(tc.body))
			var b []byte
			if err == nil {
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if tc.name == "stream" {
				ev := events(t, strings.NewReader(string(b)))
				var e openai.ErrorResponse
				if err != nil || resp.StatusCode != http.StatusOK || len(ev) != 3 || ev[0] != `{"n":0}` || ev[2] != "[DONE]" ||
					json.Unmarshal([]byte(ev[1]), &e) != nil || e.Error.Code != float64(502) {
					t.Fatalf("got %d %q (%v), want 200 with dying's first chunk, a 502 error event and [DONE]", resp.StatusCode, ev, err)
				}
			} else if err == nil {
				// The first bytes went to the server's buffer, not always
				// to the client: the client sees the request fail, before
				// or after the status.
				t.Fatalf("got a complete %d response %q, want it aborted", resp.StatusCode, b)
			}
			if g := good.hits.Load(); g != 0 {
				t.Errorf("requests to good: got %d, want 0 (not retried)", g)
			}
			if v := tp.metric(t, tp.metrics.retries, "m", dying.URL, "upstream_reset"); v != 0 {
				t.Errorf("kvroute_retries_total{dying,upstream_reset}: got %v, want 0", v)
			}
			waitFor(t, "the attempt's outcome", func() bool { return len(outcomes()) == 1 })
			if got := outcomes(); got[0].Endpoint != dying.URL || !got[0].Failed {
				t.Errorf("outcome: got %+v, want dying's failed", got[0])
			}
		})
	}
}

// TestFailureBeforeFirstByteNoRetryLeft: with no other endpoint, an
// engine that dies between its headers and its first body byte is
// answered 502 in OpenAI's error shape (nothing had reached the client),
// not a 200 whose body is an error event or cut short.
func TestFailureBeforeFirstByteNoRetryLeft(t *testing.T) {
	for _, tc := range firstByteCases {
		t.Run(tc.name, func(t *testing.T) {
			dying := newBackend(t, "dying", headersThenDie(t, tc.contentType, ""))
			tp := newTestProxy(t, testConfig("first", dying.URL))
			resp := tp.post(t, tc.path, tc.body)
			b := readAll(t, resp)
			wantErrorBody(t, resp.StatusCode, b, http.StatusBadGateway, "answered 200, then its body broke")
			waitFor(t, "the request accounted for as 502", func() bool {
				return tp.metric(t, tp.metrics.requests, "m", dying.URL, "502") == 1
			})
		})
	}
}

// TestSilenceBeforeFirstByteIs504: an engine that sends its stream's
// headers and then nothing for timeouts.upstream_header is answered 504,
// as when its headers do not come, and not retried (it took the request:
// another engine would run it again); nothing had reached the client, so
// the answer is an error response, not a 200 with an error event.
func TestSilenceBeforeFirstByteIs504(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	hung := newBackend(t, "hung", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", openai.ContentTypeEventStream)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	good := newBackend(t, "good", okHandler("good"))
	cfg := testConfig("first", hung.URL, good.URL)
	cfg.Timeouts.UpstreamHeader = 100 * time.Millisecond
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathCompletions, streamBody)
	b := readAll(t, resp)
	wantErrorBody(t, resp.StatusCode, b, http.StatusGatewayTimeout, "sent nothing")
	if g := good.hits.Load(); g != 0 {
		t.Errorf("requests to good: got %d, want 0 (not retried)", g)
	}
}

// TestEmptyBodyIsPassedOn: a response whose body ends before any byte (a
// 200 with no body) is the engine's answer, not a failure: its headers
// reach the client at the body's end, and nothing is retried.
func TestEmptyBodyIsPassedOn(t *testing.T) {
	empty := newBackend(t, "empty", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Backend", "empty")
		w.WriteHeader(http.StatusOK)
	})
	good := newBackend(t, "good", okHandler("good"))
	tp, outcomes := learnerProxy(t, empty.URL, good.URL)
	resp := tp.post(t, PathChatCompletions, chatBody)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || b != "" || resp.Header.Get("X-Backend") != "empty" {
		t.Fatalf("got %d %q from %q, want empty's empty 200", resp.StatusCode, b, resp.Header.Get("X-Backend"))
	}
	if g := good.hits.Load(); g != 0 {
		t.Errorf("requests to good: got %d, want 0", g)
	}
	waitFor(t, "the attempt's outcome", func() bool { return len(outcomes()) == 1 })
	if got := outcomes(); got[0].Failed {
		t.Errorf("outcome: got %+v, want a success", got[0])
	}
}

// emptyReads is a body whose reads return nothing and no error, 10,000
// times (so that a reader that never gives up ends), then an error.
type emptyReads struct{ n int }

func (r *emptyReads) Read([]byte) (int, error) {
	if r.n++; r.n > 10_000 {
		return 0, errors.New("read 10,000 times")
	}
	return 0, nil
}

func (r *emptyReads) Close() error { return nil }

// TestReadFirstNoProgress: a body that returns nothing and no error, read
// after read, fails the first read with io.ErrNoProgress rather than
// spinning the handler forever.
func TestReadFirstNoProgress(t *testing.T) {
	rc := &emptyReads{}
	b := &upstreamBody{rc: rc, x: &exchange{}}
	if err := b.readFirst(); err != io.ErrNoProgress || rc.n != maxEmptyReads {
		t.Errorf("got %v after %d reads, want %v after %d", err, rc.n, io.ErrNoProgress, maxEmptyReads)
	}
}

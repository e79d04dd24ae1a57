package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/keepalive"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

// fakeServer streams OpenAI-style SSE. Per request it reads the session
// header to pick a behaviour; the first-token delay is the session's
// "delay" entry.
type fakeServer struct {
	firstDelay map[string]time.Duration // by session
	tokenDelay time.Duration
	cached     int
	inFlight   atomic.Int32
	maxSeen    atomic.Int32
	mu         sync.Mutex // guards bodies
	bodies     []map[string]any
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.inFlight.Add(1)
	// Leave before the last byte is flushed, so that a client that starts a
	// new request after reading the end never sees this one counted.
	leave := sync.OnceFunc(func() { f.inFlight.Add(-1) })
	defer leave()
	for {
		m := f.maxSeen.Load()
		if n <= m || f.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	session := r.Header.Get("X-Session-Id")
	switch session {
	case "fail500":
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
		return
	case "reject":
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
		return
	case "hang":
		<-r.Context().Done()
		return
	}
	maxTokens := int(body["max_tokens"].(float64))
	openai.SetHeaders(w.Header())
	w.Header().Set("X-Kvroute-Endpoint", "engine-"+session)
	sse := openai.NewSSEWriter(w)
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	emit := func(text string) {
		if chat {
			sse.Data(fmt.Appendf(nil, `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`, text))
		} else {
			sse.Data(fmt.Appendf(nil, `{"object":"text_completion","choices":[{"index":0,"text":%q,"finish_reason":null}]}`, text))
		}
	}
	if chat {
		sse.Data([]byte(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`))
		_ = sse.Flush()
	}
	time.Sleep(f.firstDelay[session])
	for i := range maxTokens {
		if i > 0 {
			time.Sleep(f.tokenDelay)
		}
		if session == "midstream" && i == 2 {
			sse.Data([]byte(`{"error":{"message":"engine died","type":"BadRequestError","code":500}}`))
			sse.Done()
			_ = sse.Flush()
			return
		}
		if session == "cut" && i == 2 {
			_ = sse.Flush()
			panic(http.ErrAbortHandler) // drop the connection mid-stream
		}
		emit(fmt.Sprintf(" t%d", i))
		_ = sse.Flush()
	}
	prompt := 100
	sse.Data(fmt.Appendf(nil, `{"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
		prompt, prompt+maxTokens, maxTokens, f.cached))
	sse.Done()
	leave()
	_ = sse.Flush()
}

func reqs(sessions ...string) []workload.Request {
	var out []workload.Request
	for i, s := range sessions {
		out = append(out, workload.Request{ID: fmt.Sprintf("r%d", i), Session: s, PromptLen: 32, OutputLen: 5,
			Segments: []workload.Segment{{Key: uint64(i % 2), Len: 32}}})
	}
	return out
}

// spaced returns n requests of one session (reqs' first), with IDs "0" to
// n-1 in order, arriving gap apart.
func spaced(n int, gap time.Duration) []workload.Request {
	rs := make([]workload.Request, n)
	for i := range rs {
		rs[i] = reqs("x")[0]
		rs[i].ID = fmt.Sprint(i)
		rs[i].Arrival = time.Duration(i) * gap
	}
	return rs
}

func bySession(res *Result, rs []workload.Request) map[string]report.Sample {
	out := map[string]report.Sample{}
	sess := map[string]string{}
	for _, r := range rs {
		sess[r.ID] = r.Session
	}
	for _, s := range res.Samples {
		out[sess[s.ID]] = s
	}
	return out
}

func TestStreamMeasures(t *testing.T) {
	fs := &fakeServer{firstDelay: map[string]time.Duration{"slow": 60 * time.Millisecond}, tokenDelay: 2 * time.Millisecond, cached: 64}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	for _, api := range []string{APIChat, APICompletions} {
		t.Run(api, func(t *testing.T) {
			rs := reqs("fast", "slow")
			res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", API: api, IgnoreEOS: true}, rs)
			if err != nil {
				t.Fatal(err)
			}
			got := bySession(res, rs)
			if len(got) != 2 {
				t.Fatalf("got %d samples, want 2", len(res.Samples))
			}
			for name, s := range got {
				if !s.OK() {
					t.Fatalf("%s: error %q", name, s.Err)
				}
				if s.OutputTokens != 5 || len(s.ITL) != 4 || s.CachedTokens != 64 || s.PromptTokens != 100 {
					t.Errorf("%s: got %d tokens, %d gaps, %d cached, %d prompt; want 5, 4, 64, 100", name, s.OutputTokens, len(s.ITL), s.CachedTokens, s.PromptTokens)
				}
				if s.Engine != "engine-"+name {
					t.Errorf("%s: engine %q, want %q", name, s.Engine, "engine-"+name)
				}
				var sum time.Duration
				for _, g := range s.ITL {
					if g <= 0 {
						t.Errorf("%s: non-positive inter-token gap %v", name, g)
					}
					sum += g
				}
				if !(0 < s.TTFT && s.TTFT+sum <= s.E2E) {
					t.Errorf("%s: want 0 < TTFT %v and TTFT + gaps %v <= E2E %v", name, s.TTFT, s.TTFT+sum, s.E2E)
				}
			}
			// The server holds "slow" 60ms before its first token.
			if slow := got["slow"]; slow.TTFT < 60*time.Millisecond {
				t.Errorf("slow TTFT %v, want >= 60ms", slow.TTFT)
			}
			body := fs.bodies[len(fs.bodies)-1]
			if body["stream"] != true || body["ignore_eos"] != true || body["model"] != "m" {
				t.Errorf("request body %v lacks stream/ignore_eos/model", body)
			}
			if so, _ := body["stream_options"].(map[string]any); so["include_usage"] != true {
				t.Errorf("stream_options %v, want include_usage", body["stream_options"])
			}
		})
	}
}

func TestErrorsPerRequest(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	rs := reqs("fail500", "reject", "midstream", "cut", "ok")
	res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Timeout: time.Minute}, rs)
	if err != nil {
		t.Fatal(err)
	}
	// The hanging request runs alone with a short timeout, so that a slow
	// machine cannot time the others out.
	hang := reqs("hang")
	hang[0].ID = "hang"
	hres, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Timeout: 100 * time.Millisecond}, hang)
	if err != nil {
		t.Fatal(err)
	}
	res.Samples = append(res.Samples, hres.Samples...)
	rs = append(rs, hang...)
	got := bySession(res, rs)
	for sess, want := range map[string]string{"fail500": "http_500", "midstream": ErrMidstream, "cut": ErrMidstream, "hang": ErrTimeout, "ok": ""} {
		if got[sess].Err != want {
			t.Errorf("%s: error kind %q, want %q", sess, got[sess].Err, want)
		}
	}
	if !got["reject"].Rejected {
		t.Errorf("429 not counted as a rejection: %+v", got["reject"])
	}
	row := res.Summary(report.SummaryOptions{Name: "x", OracleHitRate: -1})
	if row.Completed != 1 || row.Rejected != 1 || row.ErrorCount() != 4 {
		t.Errorf("row: completed %d rejected %d errors %v; want 1, 1, 4", row.Completed, row.Rejected, row.Errors)
	}
	// What the server said comes with the counts: the message of the
	// error body or event, not just its kind.
	if got := res.ErrorExamples["http_500"]; got != "boom" {
		t.Errorf("ErrorExamples[http_500] = %q, want %q", got, "boom")
	}
	// (Alone: "cut" is a midstream error too, and the first one is kept.)
	mres, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Timeout: time.Minute}, reqs("midstream"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mres.ErrorExamples[ErrMidstream], "error event: engine died"; got != want {
		t.Errorf("ErrorExamples[%s] = %q, want %q", ErrMidstream, got, want)
	}
	if got := hres.ErrorExamples[ErrTimeout]; got == "" {
		t.Errorf("ErrorExamples[%s] is empty, want the transport error", ErrTimeout)
	}
}

// TestNotStreamed: a server that answers a whole JSON response instead of a
// stream is a bad response that says so, not a "midstream" failure.
func TestNotStreamed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m"}, reqs("a"))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Samples[0].Err; got != ErrBadReply {
		t.Errorf("error kind %q, want %q", got, ErrBadReply)
	}
	if got := res.ErrorExamples[ErrBadReply]; !strings.Contains(got, "not a text/event-stream") {
		t.Errorf("example %q, want it to say the reply is not a stream", got)
	}
}

// TestNotAStream: a 200 whose body is not an event stream (a web page at
// the URL, a proxy's notice) is a bad reply that says what came back, not a
// stream broken midway; a stream served without its content type (a Go
// server that sets none sends text/plain) is still read as one.
func TestNotAStream(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Session-Id") == "page" {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, "<!doctype html><html><body>Welcome to the dashboard</body></html>\n")
			return
		}
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	rs := reqs("page", "sniffed")
	res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m"}, rs)
	if err != nil {
		t.Fatal(err)
	}
	got := bySession(res, rs)
	if s := got["page"]; s.Err != ErrBadReply {
		t.Errorf("a web page: error kind %q, want %q (examples %q)", s.Err, ErrBadReply, res.ErrorExamples)
	}
	if ex := res.ErrorExamples[ErrBadReply]; !strings.Contains(ex, "text/html") || !strings.Contains(ex, "Welcome to the dashboard") {
		t.Errorf("example %q, want the content type and the body's start", ex)
	}
	if s := got["sniffed"]; s.Err != "" || s.OutputTokens != 1 {
		t.Errorf("a stream sent as %s: error %q, %d tokens; want a success with 1", "text/plain", s.Err, s.OutputTokens)
	}
}

func TestErrorMessage(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","code":404}}`, "The model `x` does not exist."},
		{`{"error":"model not loaded"}`, "model not loaded"},
		{`{"detail":"Not Found"}`, "Not Found"},
		{`{"object":"error","message":"too long"}`, "too long"},
		{"upstream connect error", "upstream connect error"},
		{"", "(empty body)"},
	} {
		if got := errorMessage([]byte(tc.body)); got != tc.want {
			t.Errorf("errorMessage(%q) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestRefusedAndUnresolvable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct{ url, want string }{
		{"http://" + addr, ErrConnect},
		{"http://no-such-host.invalid:80", ErrDNS},
	} {
		res, err := Run(context.Background(), Config{URL: tc.url, Model: "m", Timeout: 5 * time.Second}, reqs("a", "b", "c"))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Samples {
			if s.Err != tc.want {
				t.Errorf("%s: error kind %q, want %q", tc.url, s.Err, tc.want)
			}
		}
		if len(res.Samples) != 3 {
			t.Errorf("%s: got %d samples, want 3", tc.url, len(res.Samples))
		}
	}
}

func TestOpenLoopAndCap(t *testing.T) {
	fs := &fakeServer{firstDelay: map[string]time.Duration{"x": 150 * time.Millisecond}}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	rs := spaced(8, 5*time.Millisecond)
	// Open loop: later requests do not wait for earlier ones.
	if _, err := Run(context.Background(), Config{URL: srv.URL, Model: "m"}, rs); err != nil {
		t.Fatal(err)
	}
	if got := fs.maxSeen.Load(); got < 2 {
		t.Errorf("server saw at most %d concurrent requests, want >= 2 (open loop)", got)
	}
	// The cap bounds concurrency.
	fs.maxSeen.Store(0)
	res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", MaxInFlight: 2}, rs)
	if err != nil {
		t.Fatal(err)
	}
	if got := fs.maxSeen.Load(); got > 2 {
		t.Errorf("server saw %d concurrent requests, want <= 2", got)
	}
	if res.Delayed == 0 || len(res.Samples) != 8 {
		t.Errorf("delayed %d samples %d; want > 0 and 8", res.Delayed, len(res.Samples))
	}
}

func TestLimitsAndCancel(t *testing.T) {
	fs := &fakeServer{firstDelay: map[string]time.Duration{"x": time.Millisecond}}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	rs := spaced(10, time.Millisecond)
	res, _ := Run(context.Background(), Config{URL: srv.URL, Model: "m", MaxRequests: 3}, rs)
	if len(res.Samples) != 3 {
		t.Errorf("MaxRequests 3: got %d samples", len(res.Samples))
	}
	res, _ = Run(context.Background(), Config{URL: srv.URL, Model: "m", Duration: 4 * time.Millisecond}, rs)
	if len(res.Samples) != 5 {
		t.Errorf("Duration 4ms: got %d samples, want 5 (arrivals 0..4ms)", len(res.Samples))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, _ = Run(ctx, Config{URL: srv.URL, Model: "m"}, rs)
	if n := len(res.Samples) + len(res.Interrupted); n > 1 {
		t.Errorf("cancelled run issued %d requests", n)
	}
	if len(res.Samples) > 0 {
		t.Errorf("cancelled run: samples %+v, want none (a request cut short is in Interrupted)", res.Samples)
	}
}

func TestTokensPrompt(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	rs := reqs("x")
	if _, err := Run(context.Background(), Config{URL: srv.URL + "/v1", Model: "m", API: APICompletions, Prompt: PromptTokens}, rs); err != nil {
		t.Fatal(err)
	}
	p, ok := fs.bodies[0]["prompt"].([]any)
	if !ok || len(p) != 32 {
		t.Fatalf("prompt %v: want 32 token ids", fs.bodies[0]["prompt"])
	}
	want := rs[0].PromptTokens()
	for i, v := range p {
		if uint32(v.(float64)) != want[i] {
			t.Fatalf("token %d: got %v, want %d", i, v, want[i])
		}
	}
}

// TestAdapterModel: a request for a LoRA adapter names the adapter in its
// "model" field, as vLLM and kvroute serve take it; the others Config.Model.
func TestAdapterModel(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	rs := reqs("x", "y")
	rs[1].Adapter = "sql-lora"
	if _, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", MaxInFlight: 1}, rs); err != nil {
		t.Fatal(err)
	}
	var got []any
	for _, b := range fs.bodies {
		got = append(got, b["model"])
	}
	if len(got) != 2 || got[0] != "m" || got[1] != "sql-lora" {
		t.Errorf("models %v, want [m sql-lora]", got)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "localhost:8000", Model: "m"}, "scheme"},
		{Config{URL: "http://", Model: "m"}, "no host"},
		// Addresses no connection can use: every request failed as
		// "transport" instead.
		{Config{URL: "http://x:99999", Model: "m"}, `url "http://x:99999" has port 99999, not 1-65535`},
		{Config{URL: "http://x:0", Model: "m"}, `url "http://x:0" has port 0, not 1-65535`},
		{Config{URL: "http://:8000", Model: "m"}, `url "http://:8000" has no host`},
		{Config{URL: "http://x:abc", Model: "m"}, `invalid port ":abc"`},
		{Config{URL: "http://x", Model: ""}, "model"},
		{Config{URL: "http://x", Model: "m", API: "embeddings"}, "api"},
		{Config{URL: "http://x", Model: "m", Prompt: PromptTokens}, "completions"},
		{Config{URL: "http://x\x7f", Model: "m"}, "url"},
		// The other API's path: requests went to
		// .../v1/completions/v1/chat/completions, a 404 each.
		{Config{URL: "http://x/v1/completions", Model: "m"}, `url "http://x/v1/completions" is the completions API's path, not the chat API's`},
		{Config{URL: "http://x/v1/chat/completions/", Model: "m", API: APICompletions}, "is the chat API's path"},
		// net/http refuses to send them: every request failed (transport).
		{Config{URL: "http://x", Model: "m", Header: http.Header{"X Foo": {"bar"}}}, `header "X Foo": not a valid header name`},
		{Config{URL: "http://x", Model: "m", Header: http.Header{"X-Foo": {"a\x01b"}}}, "header X-Foo: value"},
		{Config{URL: "http://x", Model: "m", Header: http.Header{"Host": {"a\nb"}}}, "header Host: value"},
	} {
		if _, err := Run(context.Background(), tc.cfg, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want error containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct{ url, api, want string }{
		{"http://h:1", APIChat, "http://h:1/v1/chat/completions"},
		{"http://h:1/", APICompletions, "http://h:1/v1/completions"},
		{"http://h:1/v1", APIChat, "http://h:1/v1/chat/completions"},
		{"http://h:1/v1/completions", APICompletions, "http://h:1/v1/completions"},
		// A query (a gateway's key or API version) stays the query, after
		// the path: it was written before the path, which became part of it.
		{"http://h:1?api-version=2", APIChat, "http://h:1/v1/chat/completions?api-version=2"},
		{"https://gw.example/llm/v1/?key=k", APICompletions, "https://gw.example/llm/v1/completions?key=k"},
		{"http://h:1/v1/chat/completions?key=k", APIChat, "http://h:1/v1/chat/completions?key=k"},
	} {
		c := Config{URL: tc.url, API: tc.api}
		if got := c.endpoint(); got != tc.want {
			t.Errorf("endpoint(%q, %s) = %q, want %q", tc.url, tc.api, got, tc.want)
		}
	}
}

// TestStreamBrokenMidEvent: a stream that breaks (or times out) halfway
// through an event leaves the SSE reader an unterminated, unparseable last
// event, and kvroute serve ends an engine's stream that broke so with the
// cut event then an error event; the request failed for the break
// (midstream, timeout, with what the router said), not for a bad reply.
func TestStreamBrokenMidEvent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // (unread, it would make the close a reset, which may drop what was sent)
		w.Header().Set("Content-Type", openai.ContentTypeEventStream)
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"del")
		w.(http.Flusher).Flush()
		switch r.Header.Get("X-Session-Id") {
		case "router":
			// kvroute serve ends an engine's stream that broke mid-event
			// this way: the event cut short, then an error event.
			w.Write(openai.AppendErrorEvent([]byte("\n\n"), &kvroute.Error{Status: http.StatusBadGateway,
				Type: kvroute.TypeUpstream, Message: "the stream from endpoint e1 broke: unexpected EOF"}))
			return
		case "hang":
			<-r.Context().Done()
			return
		}
		panic(http.ErrAbortHandler) // drop the connection mid-event
	}))
	defer srv.Close()
	for _, tc := range []struct {
		session, want string
		timeout       time.Duration
		example       string
	}{
		{"cut", ErrMidstream, time.Minute, "cut short"},
		{"hang", ErrTimeout, 200 * time.Millisecond, ""},
		{"router", ErrMidstream, time.Minute, "error event: the stream from endpoint e1 broke"},
	} {
		t.Run(tc.session, func(t *testing.T) {
			res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Timeout: tc.timeout}, reqs(tc.session))
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Samples[0].Err; got != tc.want {
				t.Errorf("error kind %q (examples %v), want %q", got, res.ErrorExamples, tc.want)
			}
			if got := res.ErrorExamples[tc.want]; got == "" || !strings.Contains(got, tc.example) {
				t.Errorf("examples %v: want one for %q that says %q", res.ErrorExamples, tc.want, tc.example)
			}
		})
	}
}

// TestConnectionsReused: a request reads its body to the end after
// data: [DONE], so that its connection serves the next request. A server
// ends the body a moment after [DONE] (vLLM's uvicorn sends the chunked
// body's end in a write of its own); closed before that end, the
// connection was dropped, and every request paid for a new one (TCP, TLS)
// in its TTFT and left a socket in TIME_WAIT behind.
func TestConnectionsReused(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fs.ServeHTTP(w, r)
		time.Sleep(2 * time.Millisecond) // then the body ends
	}))
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	rs := spaced(20, 0)
	res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", MaxInFlight: 1}, rs) // one at a time
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Samples {
		if !s.OK() {
			t.Fatalf("request %s: error %q", s.ID, s.Err)
		}
	}
	// One connection serves them all; a few more would be a stalled
	// machine missing the body's end (a connection is then dropped).
	if got := conns.Load(); got > 5 {
		t.Errorf("%d requests one after the other opened %d connections, want 1", len(rs), got)
	}
}

// TestRequestsOutOfOrder: Run sends each request at its arrival only when
// the requests come in arrival order (it waits for them one by one, and
// stops at the first beyond Duration); it says so instead of sending a
// request late, or not at all.
func TestRequestsOutOfOrder(t *testing.T) {
	rs := reqs("a", "b")
	rs[0].Arrival = time.Second
	_, err := Run(context.Background(), Config{URL: "http://127.0.0.1:1", Model: "m", Timeout: time.Second}, rs)
	if err == nil || !strings.Contains(err.Error(), "arrival order") {
		t.Fatalf("got %v, want an error about the arrival order", err)
	}
}

// TestHostHeader: a Host header (--header 'Host: name', to reach a virtual
// host behind an ingress) is the request's host; net/http ignores a Host
// field among the headers, so it was not sent.
func TestHostHeader(t *testing.T) {
	hosts := make(chan string, 1)
	fs := &fakeServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
		fs.ServeHTTP(w, r)
	}))
	defer srv.Close()
	hdr := http.Header{}
	hdr.Set("Host", "llm.example.test")
	res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Header: hdr}, reqs("x"))
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Samples[0]; !s.OK() {
		t.Fatalf("error %q", s.Err)
	}
	if got := <-hosts; got != "llm.example.test" {
		t.Errorf("the server saw host %q, want llm.example.test", got)
	}
}

// TestInterrupted: cancelling a run's context (Ctrl-C) cuts short the
// requests in flight; they have no outcome, so they are counted apart
// (Result.Interrupted), not as failures that would raise the error rate.
// MaxInFlight 1 makes the order exact: the first requests complete, the
// one the server is answering when the run is cancelled is cut short, the
// rest are never sent. Either way: before the response's headers, or in
// the middle of its stream.
func TestInterrupted(t *testing.T) {
	for _, midstream := range []bool{false, true} {
		t.Run(fmt.Sprintf("midstream=%v", midstream), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fs := &fakeServer{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Session-Id") != "last" {
					// Answered after a while, so that the next request is
					// due while this one holds the only slot (delayed),
					// however late the scheduler runs on a loaded machine.
					time.Sleep(100 * time.Millisecond)
					fs.ServeHTTP(w, r)
					return
				}
				_, _ = io.Copy(io.Discard, r.Body) // (until then the server does not see the client leave)
				if midstream {
					openai.SetHeaders(w.Header())
					sse := openai.NewSSEWriter(w)
					sse.Data([]byte(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`))
					_ = sse.Flush()
				}
				cancel() // Ctrl-C while this request is in flight
				<-r.Context().Done()
			}))
			defer srv.Close()
			rs := reqs("x", "x", "x", "last", "x")
			res, err := Run(ctx, Config{URL: srv.URL, Model: "m", MaxInFlight: 1}, rs)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Samples) != 3 {
				t.Errorf("%d samples, want the 3 requests that completed before the interrupt: %+v", len(res.Samples), res.Samples)
			}
			for _, s := range res.Samples {
				if !s.OK() {
					t.Errorf("sample %s: error %q, want none", s.ID, s.Err)
				}
			}
			if len(res.Interrupted) != 1 || res.Interrupted[0].ID != "r3" || res.Interrupted[0].Err != ErrInterrupted {
				t.Errorf("interrupted %+v, want request r3 with kind %q", res.Interrupted, ErrInterrupted)
			}
			// r1..r3 waited for the slot and were sent; r4 waited and
			// never was: it is not a request sent late.
			if res.Delayed != 3 {
				t.Errorf("delayed %d, want 3", res.Delayed)
			}
			row := res.Summary(report.SummaryOptions{Name: "x", OracleHitRate: -1})
			if row.Requests != 3 || row.Completed != 3 || row.ErrorCount() != 0 {
				t.Errorf("row: requests %d completed %d errors %v; want 3, 3, none", row.Requests, row.Completed, row.Errors)
			}
			if _, ok := res.ErrorExamples[ErrCanceled]; ok || len(res.ErrorExamples) > 0 {
				t.Errorf("error examples %v, want none (no request failed)", res.ErrorExamples)
			}
		})
	}
}

// TestIdleTimeoutBelowServerKeepAlive: the default client drops a
// connection idle for Config.IdleTimeout, so with that below the server's
// keep-alive timeout no request goes out on a connection the server is
// closing. With net/http's default 90 s the second request, sent after the
// server's keep-alive had passed, was lost and counted as the server's
// failure.
func TestIdleTimeoutBelowServerKeepAlive(t *testing.T) {
	e := keepalive.Start(t, 300*time.Millisecond)
	rs := reqs("a", "b")
	rs[1].Arrival = 600 * time.Millisecond // past the server's keep-alive
	res, err := Run(context.Background(), Config{URL: e.URL(), Model: "m", IdleTimeout: 100 * time.Millisecond}, rs)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Samples {
		if s.Err != "" {
			t.Errorf("request %s: error %q (%s)", s.ID, s.Err, res.ErrorExamples[s.Err])
		}
	}
	if d := e.Dropped.Load(); d != 0 {
		t.Errorf("%d requests sent on a connection the server had closed", d)
	}
}

// TestRunDeadline: a run whose context has a deadline (Run bounded with
// context.WithTimeout) ends like one cancelled: the requests in flight at
// the deadline are interrupted, not timeout failures, while a request's own
// Config.Timeout is still a timeout.
func TestRunDeadline(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Session-Id") == "slow" {
			openai.SetHeaders(w.Header())
			sse := openai.NewSSEWriter(w)
			sse.Data([]byte(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`))
			_ = sse.Flush()
		}
		<-r.Context().Done()
	}))
	defer srv.Close()
	t.Run("run deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		res, err := Run(ctx, Config{URL: srv.URL, Model: "m"}, reqs("x", "slow"))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Samples) != 0 || len(res.Interrupted) != 2 {
			t.Errorf("samples %+v, interrupted %+v; want none and both requests", res.Samples, res.Interrupted)
		}
		if len(res.ErrorExamples) > 0 {
			t.Errorf("error examples %v, want none (no request failed)", res.ErrorExamples)
		}
	})
	t.Run("request timeout", func(t *testing.T) {
		res, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Timeout: 200 * time.Millisecond}, reqs("x", "slow"))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Samples) != 2 || len(res.Interrupted) != 0 {
			t.Fatalf("samples %+v, interrupted %+v; want both requests timed out", res.Samples, res.Interrupted)
		}
		for _, s := range res.Samples {
			if s.Err != ErrTimeout {
				t.Errorf("sample %s: error %q, want %q", s.ID, s.Err, ErrTimeout)
			}
		}
		if ex := res.ErrorExamples[ErrTimeout]; !strings.Contains(ex, "timeout expired (200ms)") {
			t.Errorf("timeout example %q, want one naming the request's timeout", ex)
		}
	})
}

// TestConfigHeaderValueNotEchoed: a header value Validate refuses is not
// repeated in the error, which goes to a terminal or a CI log: it is often
// a credential (Authorization: Bearer <key>).
func TestConfigHeaderValueNotEchoed(t *testing.T) {
	cfg := Config{URL: "http://x", Model: "m", Header: http.Header{"Authorization": {"Bearer sk-secret123\r"}}}
	err := cfg.Validate()
	if err == nil || strings.Contains(err.Error(), "sk-secret") || !strings.Contains(err.Error(), "header Authorization: value") {
		t.Errorf("got %v, want an error naming the header, not its value", err)
	}
}

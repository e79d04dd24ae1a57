package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

// API selects the endpoint requests are sent to.
const (
	// APIChat sends POST /v1/chat/completions with the prompt as one user
	// message.
	APIChat = "chat"
	// APICompletions sends POST /v1/completions.
	APICompletions = "completions"
)

// Prompt forms.
const (
	// PromptText sends the prompt as text (workload.Request.PromptText).
	PromptText = "text"
	// PromptTokens sends the prompt as token ids (completions only).
	PromptTokens = "tokens"
)

// Error kinds recorded in report.Sample.Err.
const (
	ErrConnect   = "connect"   // connection refused or unreachable
	ErrDNS       = "dns"       // host name did not resolve
	ErrTimeout   = "timeout"   // the per-request timeout expired
	ErrCanceled  = "canceled"  // cancelled while the run went on (a request cut short by the run's end is ErrInterrupted)
	ErrTransport = "transport" // any other failure before a response
	ErrMidstream = "midstream" // an error event (or event: error, llama.cpp's error: line), a finish_reason "abort", no answer at all, or a broken stream after a 200
	ErrBadReply  = "bad_response"
	// HTTP errors are "http_<status>", e.g. http_500; 429 is a rejection.

	// ErrInterrupted marks the samples in Result.Interrupted: requests cut
	// short by the cancellation of the run's context (e.g. Ctrl-C). It is
	// not a failure and never appears in Result.Samples.
	ErrInterrupted = "interrupted"
)

// Config configures a run. Zero fields take the documented defaults.
type Config struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:8000; the API
	// path (/v1/chat/completions or /v1/completions) is appended to its
	// path (before a query, which every request keeps) unless the path
	// already ends in it (Validate refuses one that ends in the other
	// API's path), and a path ending in /v1 (an OpenAI client's base URL)
	// gets the rest of it. Validate refuses a scheme other than http and
	// https, no host, and a port out of 1-65535. Required.
	URL string
	// Model is the "model" field of every request but those for a LoRA
	// adapter (workload.Request.Adapter), whose "model" is the adapter's
	// name, as vLLM and kvroute serve take it. Required.
	Model string
	// API is chat (default) or completions.
	API string
	// Prompt is text (default) or tokens (completions only).
	Prompt string
	// MaxInFlight caps concurrent requests; default 1024. When the cap is
	// reached, the next request waits for a free slot (and is counted in
	// Result.Delayed): arrivals stay open-loop up to the cap.
	MaxInFlight int
	// Timeout bounds each request from send to last byte; default 10m.
	Timeout time.Duration
	// Duration stops issuing requests whose arrival offset is later than it
	// (0 = the whole workload). Requests already sent are awaited.
	Duration time.Duration
	// MaxRequests stops after issuing this many requests (0 = no limit).
	MaxRequests int
	// IgnoreEOS sends vLLM's "ignore_eos": true so that every request
	// generates exactly its OutputLen tokens.
	IgnoreEOS bool
	// Header is added to every request (e.g. Authorization); a Host field
	// sets the requests' host (a virtual host behind an ingress). Validate
	// refuses a name that is not an HTTP token and a value with a control
	// character (net/http would fail every request).
	Header http.Header
	// IdleTimeout is how long the default client keeps an idle connection
	// for the next request; default 4s, under the 5 s after which vLLM's
	// and SGLang's servers (uvicorn) close it: a request sent on a
	// connection the server is closing is lost, and would be counted as
	// the server's failure.
	IdleTimeout time.Duration
	// Client sends the requests; nil = a client with a transport sized for
	// MaxInFlight and no overall timeout.
	Client *http.Client
	// Progress, when non-nil, is advanced once per finished request.
	Progress *report.Progress
	// Collector, when non-nil, also receives each request's sample as the
	// request finishes, so that a caller can show the figures so far
	// (Collector.Summary) while Run runs: the same samples, and so the same
	// figures, as the Result's once the run ends. Nil = none.
	Collector *report.Collector
	// Logger receives per-run information; nil = discard.
	Logger *slog.Logger
}

func (c *Config) withDefaults() Config {
	o := *c
	if o.API == "" {
		o.API = APIChat
	}
	if o.Prompt == "" {
		o.Prompt = PromptText
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1024
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 4 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate checks the configuration after defaults.
func (c *Config) Validate() error {
	o := c.withDefaults()
	u, err := url.Parse(o.URL)
	if err != nil {
		return fmt.Errorf("bench: url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("bench: url %q: scheme must be http or https", o.URL)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("bench: url %q has no host", o.URL)
	}
	// url.Parse takes any digits for the port; one no connection can use
	// failed every request as a transport error.
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("bench: url %q has port %s, not 1-65535", o.URL, p)
		}
	}
	if o.Model == "" {
		return errors.New("bench: model is required")
	}
	switch o.API {
	case APIChat, APICompletions:
	default:
		return fmt.Errorf("bench: api %q is not one of chat, completions", o.API)
	}
	// A URL that ends in the other API's path would get that path
	// appended (.../v1/completions/v1/chat/completions): a 404 each.
	if p := strings.TrimRight(u.Path, "/"); strings.HasSuffix(p, "/v1/chat/completions") && o.API != APIChat ||
		strings.HasSuffix(p, "/v1/completions") && o.API != APICompletions {
		want := APIChat
		if o.API == APIChat {
			want = APICompletions
		}
		return fmt.Errorf("bench: url %q is the %s API's path, not the %s API's: give the server's base URL or api %s", o.URL, want, o.API, want)
	}
	switch o.Prompt {
	case PromptText:
	case PromptTokens:
		if o.API != APICompletions {
			return errors.New("bench: prompt tokens needs api completions (chat messages are text)")
		}
	default:
		return fmt.Errorf("bench: prompt %q is not one of text, tokens", o.Prompt)
	}
	for k, vs := range o.Header {
		if !validHeaderName(k) {
			return fmt.Errorf("bench: header %q: not a valid header name", k)
		}
		for _, v := range vs {
			// (The value is not repeated: it is often a credential.)
			if i := invalidHeaderByte(v); i >= 0 {
				return fmt.Errorf("bench: header %s: value holds a control character (byte %d of %d: %q)", k, i+1, len(v), v[i])
			}
		}
	}
	return nil
}

// validHeaderName reports whether k is an HTTP field name (an RFC 9110
// token), as net/http requires of every request it sends.
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range []byte(k) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// invalidHeaderByte returns the index of the first control character but
// tab in v, or -1 when it holds none.
func invalidHeaderByte(v string) int {
	for i, c := range []byte(v) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return i
		}
	}
	return -1
}

// endpoint returns the full request URL: the API path goes after the
// URL's path, before its query (a gateway's key or API version), and a
// fragment, never sent, is dropped.
func (c *Config) endpoint() string {
	path := "/v1/chat/completions"
	if c.API == APICompletions {
		path = "/v1/completions"
	}
	u, _, _ := strings.Cut(c.URL, "#")
	u, query, hasQuery := strings.Cut(u, "?")
	if hasQuery {
		query = "?" + query
	}
	base := strings.TrimRight(u, "/")
	if strings.HasSuffix(base, path) {
		return base + query
	}
	return strings.TrimSuffix(base, "/v1") + path + query
}

// Result is the outcome of a run.
type Result struct {
	// Samples holds one sample per issued request, in completion order;
	// Arrival is the offset from the run's start at which it was sent (its
	// scheduled arrival unless MaxInFlight delayed it).
	Samples []report.Sample
	// Start is the wall-clock start of the run, Elapsed its length.
	Start   time.Time
	Elapsed time.Duration
	// Interrupted holds the requests in flight when the run's context was
	// cancelled (e.g. Ctrl-C) and cut short by it, their Err
	// ErrInterrupted: they have no outcome, neither completed nor failed,
	// so they are not in Samples (nor given to Config.Collector), whose
	// error rate they would distort. Nil when the run was not interrupted.
	Interrupted []report.Sample
	// Delayed counts requests sent later than scheduled because
	// MaxInFlight requests were already in flight.
	Delayed int
	// ErrorExamples holds, per error kind (report.Sample.Err), what the
	// first request that failed with it got: the server's error body (an
	// HTTP error or an error event in the stream) or the transport error,
	// cut to a few hundred bytes. Nil when no request failed.
	ErrorExamples map[string]string
}

// Summary returns the run's report row (see report.Summarize).
func (r *Result) Summary(o report.SummaryOptions) report.Row {
	return report.Summarize(r.Samples, o)
}

// Run replays reqs against the server open-loop: request i is sent at
// Start + reqs[i].Arrival, whatever happened to earlier ones, in its own
// goroutine (at most MaxInFlight at once), and measured from send to last
// byte. Failures of any kind are recorded per request; Run returns an error
// only for a bad configuration or requests out of arrival order. Cancelling
// ctx, or its deadline, stops issuing and cancels the requests in flight (recorded in
// Result.Interrupted, not as failures); Run always waits for every
// goroutine it started.
func Run(ctx context.Context, cfg Config, reqs []workload.Request) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].Arrival < reqs[i-1].Arrival {
			return nil, fmt.Errorf("bench: request %q arrives at %v, before the one before it (%v): requests go in arrival order",
				reqs[i].ID, reqs[i].Arrival, reqs[i-1].Arrival)
		}
	}
	c := cfg.withDefaults()
	client := c.Client
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = c.MaxInFlight
		tr.MaxIdleConnsPerHost = c.MaxInFlight
		tr.IdleConnTimeout = c.IdleTimeout
		tr.DisableCompression = true
		client = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	r := &runner{cfg: c, client: client, url: c.endpoint(), coll: report.NewCollector(), cut: report.NewCollector(),
		runID: strconv.FormatInt(time.Now().UnixNano()%1e10, 36)}
	res := &Result{Start: time.Now()}
	sem := make(chan struct{}, c.MaxInFlight)
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	issued := 0
	c.Logger.Info("bench start", "url", r.url, "requests", len(reqs), "max_in_flight", c.MaxInFlight)
schedule:
	for i := range reqs {
		req := &reqs[i]
		if c.Duration > 0 && req.Arrival > c.Duration {
			break
		}
		if c.MaxRequests > 0 && issued >= c.MaxRequests {
			break
		}
		if wait := time.Until(res.Start.Add(req.Arrival)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break schedule
			case <-timer.C:
			}
		}
		late := false // waited for a slot
		select {
		case sem <- struct{}{}:
		default:
			late = true
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break schedule
			}
		}
		if ctx.Err() != nil {
			<-sem
			break
		}
		if late { // (counted once sent: one that never was is not late)
			res.Delayed++
		}
		issued++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s := r.do(ctx, req, time.Since(res.Start))
			defer c.Progress.Add(1)
			if s.Err == ErrCanceled && ctx.Err() != nil {
				// Cut short by the run's end: no outcome to count.
				s.Err = ErrInterrupted
				r.cut.Add(s)
				return
			}
			r.coll.Add(s)
			if c.Collector != nil {
				c.Collector.Add(s)
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(res.Start)
	res.Samples = r.coll.Samples()
	if r.cut.Len() > 0 {
		res.Interrupted = r.cut.Samples()
		if !slices.ContainsFunc(res.Samples, func(s report.Sample) bool { return s.Err == ErrCanceled }) {
			delete(r.examples, ErrCanceled) // the interrupted requests' (no failure)
			if len(r.examples) == 0 {
				r.examples = nil
			}
		}
	}
	res.ErrorExamples = r.examples
	c.Logger.Info("bench done", "issued", issued, "elapsed", res.Elapsed, "delayed", res.Delayed, "interrupted", len(res.Interrupted))
	return res, nil
}

type runner struct {
	cfg    Config
	client *http.Client
	url    string
	coll   *report.Collector // the samples of requests with an outcome
	cut    *report.Collector // those of requests cut short by the run's cancellation
	runID  string

	mu       sync.Mutex        // protects examples and cached
	examples map[string]string // error kind -> the first such failure's message
	// cached reads each engine's cached tokens (X-Kvroute-Endpoint, ""
	// without the header; cachedTokens).
	cached map[string]*openai.CachedTokens
}

// cachedTokens returns a usage's cached tokens as the engine that served
// the request reports them in this run (openai.CachedTokens: 0 when left
// out by an engine that has reported them, as vLLM leaves them out when
// none were cached; -1, unknown, before).
func (r *runner) cachedTokens(engine string, u *openai.Usage) int {
	r.mu.Lock()
	c := r.cached[engine]
	if c == nil {
		if r.cached == nil {
			r.cached = map[string]*openai.CachedTokens{}
		}
		c = &openai.CachedTokens{}
		r.cached[engine] = c
	}
	r.mu.Unlock()
	return c.Of(u.CachedTokens())
}

// maxExample bounds an error example's length in bytes.
const maxExample = 300

// example records msg as the example of error kind, unless it has one.
func (r *runner) example(kind, msg string) {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > maxExample {
		msg = strings.ToValidUTF8(msg[:maxExample], "") + "..."
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.examples[kind]; ok {
		return
	}
	if r.examples == nil {
		r.examples = map[string]string{}
	}
	r.examples[kind] = msg
}

// body builds the JSON request body.
func (r *runner) body(req *workload.Request) ([]byte, error) {
	m := map[string]any{
		"model":          r.cfg.Model,
		"max_tokens":     req.OutputLen,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if r.cfg.IgnoreEOS {
		m["ignore_eos"] = true
	}
	if req.Tenant != "" {
		m["user"] = req.Tenant
	}
	if req.Adapter != "" {
		m["model"] = req.Adapter
	}
	switch {
	case r.cfg.API == APIChat:
		m["messages"] = []map[string]string{{"role": "user", "content": req.PromptText()}}
	case r.cfg.Prompt == PromptTokens && (req.Tokens != nil || len(req.Segments) > 0):
		m["prompt"] = req.PromptTokens()
	default:
		m["prompt"] = req.PromptText()
	}
	return json.Marshal(m)
}

// do sends one request and measures it. sentAt is the send offset from the
// run's start, and the sample's Arrival (the scheduled offset unless
// MaxInFlight delayed the request, see Result.Samples).
func (r *runner) do(ctx context.Context, req *workload.Request, sentAt time.Duration) report.Sample {
	s := report.Sample{ID: req.ID, Arrival: sentAt, PromptTokens: req.PromptLen, CachedTokens: -1}
	body, err := r.body(req)
	if err != nil {
		s.Err = ErrBadReply
		return s
	}
	ctx, cancel := context.WithTimeoutCause(ctx, r.cfg.Timeout, fmt.Errorf("%w (%v)", errRequestTimeout, r.cfg.Timeout))
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		s.Err = ErrTransport
		return s
	}
	for k, vs := range r.cfg.Header {
		if http.CanonicalHeaderKey(k) == "Host" && len(vs) > 0 {
			hreq.Host = vs[0] // net/http sends req.Host, ignoring a Host field in the header
			continue
		}
		for _, v := range vs {
			hreq.Header.Add(k, v)
		}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", openai.ContentTypeEventStream)
	hreq.Header.Set("X-Request-Id", "bench-"+r.runID+"-"+req.ID)
	if req.Session != "" {
		hreq.Header.Set("X-Session-Id", req.Session)
	}
	t0 := time.Now()
	resp, err := r.client.Do(hreq)
	if err != nil {
		s.E2E = time.Since(t0)
		s.Err = classify(ctx, err)
		r.example(s.Err, err.Error())
		return s
	}
	defer resp.Body.Close()
	s.Engine = resp.Header.Get("X-Kvroute-Endpoint")
	if resp.StatusCode != http.StatusOK {
		head := make([]byte, 4*maxExample)
		n, _ := io.ReadFull(resp.Body, head)
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		s.E2E = time.Since(t0)
		if resp.StatusCode == http.StatusTooManyRequests {
			s.Rejected = true
		} else {
			s.Err = "http_" + strconv.Itoa(resp.StatusCode)
			r.example(s.Err, errorMessage(head[:n]))
		}
		return s
	}
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		// A whole response, not a stream: the server ignored "stream":
		// true, so there is no first token to time.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		s.E2E = time.Since(t0)
		s.Err = ErrBadReply
		r.example(s.Err, "the server answered "+ct+", not a text/event-stream: it does not stream (\"stream\": true)")
		return s
	}
	r.readStream(ctx, resp.Body, resp.Header.Get("Content-Type"), t0, &s)
	// Read the body to its end, so that the connection serves a later
	// request: the end (of a chunked body) comes a moment after [DONE],
	// and a body closed before it closes its connection, so the next
	// request pays for a new one (TCP, TLS) in its TTFT and the client
	// piles up sockets in TIME_WAIT. A server that keeps the body open
	// after [DONE] costs drainWait; the connection is then dropped.
	stop := time.AfterFunc(drainWait, cancel)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	stop.Stop()
	return s
}

// drainWait and maxDrain bound the wait for, and the bytes read to, the end
// of a stream's body after its last event.
const (
	drainWait = 250 * time.Millisecond
	maxDrain  = 64 << 10
)

// errorMessage returns an error body's message: the OpenAI-style
// {"error": {"message": ...}} (or a top-level "message" or "detail", as
// some servers send), else the body itself.
func errorMessage(body []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(body, &e) == nil {
		var env errorEnvelope
		var str string
		switch {
		case json.Unmarshal(e.Error, &env) == nil && env.Message != "":
			return env.Message
		case json.Unmarshal(e.Error, &str) == nil && str != "":
			return str
		case e.Message != "":
			return e.Message
		case e.Detail != nil:
			return fmt.Sprint(e.Detail)
		}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return "(empty body)"
	}
	return string(body)
}

// chunk is the union of the chat and completion chunk fields bench reads.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"` // vLLM's newer name, OpenRouter's
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openai.Usage `json:"usage"`
	// Error is an error event's: an object with a message (OpenAI, vLLM)
	// or a string (TGI).
	Error json.RawMessage `json:"error"`
}

type errorEnvelope struct {
	Message string `json:"message"`
}

// readStream consumes an SSE response, filling s's timings and counts. ct
// is the response's Content-Type: a body of another type (a web page at the
// URL) that holds no event is a bad reply, not a broken stream; one that
// holds events is read as a stream (a Go server that sets no type sends
// text/plain).
func (r *runner) readStream(ctx context.Context, body io.Reader, ct string, t0 time.Time, s *report.Sample) {
	var head *headReader
	if mt, _, _ := mime.ParseMediaType(ct); ct != "" && mt != openai.ContentTypeEventStream {
		head = &headReader{r: body}
		body = head
	}
	sr := openai.NewSSEReader(body)
	var last time.Time
	chunks := 0
	events := 0
	aborted := false  // a choice finished with "abort"
	finished := false // a choice had a finish_reason
	bad := ""         // the first unparseable event, with why
	badLast := false  // the last event read was unparseable
	var usage *openai.Usage
	for {
		ev, err := sr.Next()
		if err != nil {
			s.E2E = time.Since(t0)
			if events == 0 && head != nil && errors.Is(err, io.EOF) {
				s.Err = ErrBadReply
				r.example(s.Err, fmt.Sprintf("the server answered %s, not a text/event-stream, and no event: %s", ct, head.b))
				break
			}
			ended := "the stream ended before data: [DONE]"
			if badLast {
				ended += ", its last event unparseable (cut short?): " + bad
			}
			if bad == "" || !errors.Is(err, io.EOF) {
				// (A stream that ended cleanly after an unparseable event
				// failed for that event, below.)
				r.broken(ctx, err, ended, s)
			}
			break
		}
		badLast = false
		events++
		if ev.IsDone() {
			s.E2E = time.Since(t0)
			break
		}
		now := time.Now()
		if ev.Type == "error" {
			// An error event (event: error, or llama.cpp's old "error:"
			// line), whatever its data holds.
			s.E2E = time.Since(t0)
			s.Err = ErrMidstream
			r.example(s.Err, "error event: "+errorMessage(ev.Data))
			break
		}
		var c chunk
		if err := json.Unmarshal(ev.Data, &c); err != nil {
			// Read on: what follows may say why. An event cut short by a
			// stream that broke or timed out halfway through it (the SSE
			// reader hands it over as if whole), or that kvroute serve
			// ended with an error event after an engine's stream broke
			// mid-event, is a failure of the stream, not a bad reply.
			if bad == "" {
				bad = fmt.Sprintf("%v: data: %s", err, ev.Data)
			}
			badLast = true
			continue
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			s.E2E = time.Since(t0)
			s.Err = ErrMidstream
			r.example(s.Err, "error event: "+errorMessage(ev.Data))
			break
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		got := false
		for _, ch := range c.Choices {
			if ch.Text != "" || ch.Delta.Content != "" || ch.Delta.ReasoningContent != "" || ch.Delta.Reasoning != "" {
				got = true
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finished = true
				aborted = aborted || *ch.FinishReason == openai.FinishAbort
			}
		}
		if got {
			if chunks == 0 {
				s.TTFT = now.Sub(t0)
			} else {
				s.ITL = append(s.ITL, now.Sub(last))
			}
			last = now
			chunks++
		}
	}
	if bad != "" && s.Err == "" {
		s.Err = ErrBadReply
		r.example(s.Err, bad)
	}
	if aborted && s.Err == "" {
		// The engine gave up on the request (vLLM: an abort, e.g. a
		// failed KV transfer) and ended the stream as if it had finished:
		// the answer is cut short, a failure like a broken stream.
		s.Err = ErrMidstream
		r.example(s.Err, fmt.Sprintf("the server aborted the request (finish_reason %q) after %d content chunks", openai.FinishAbort, chunks))
	}
	if s.Err == "" && chunks == 0 && !finished && (usage == nil || usage.CompletionTokens <= 0) {
		// No content, no finished choice, no token counted: no answer.
		// vLLM ends a request that failed before its first token so
		// (data: [DONE] alone, its error dropped).
		s.Err = ErrMidstream
		r.example(s.Err, "the stream ended (data: [DONE]) without an answer: no content, no finish_reason, no completion tokens in usage")
	}
	s.OutputTokens = chunks
	if usage != nil {
		if usage.CompletionTokens > 0 {
			s.OutputTokens = usage.CompletionTokens
		}
		if usage.PromptTokens > 0 {
			s.PromptTokens = usage.PromptTokens
		}
		s.CachedTokens = r.cachedTokens(s.Engine, usage)
	}
	if s.Err == "" && chunks == 0 {
		s.TTFT = s.E2E
	}
}

// headReader keeps the first maxExample bytes read through it.
type headReader struct {
	r io.Reader
	b []byte
}

func (h *headReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if k := min(n, maxExample-len(h.b)); k > 0 {
		h.b = append(h.b, p[:k]...)
	}
	return n, err
}

// broken records on s a stream that ended by err before data: [DONE]
// (ended is the example for a stream that just stopped).
func (r *runner) broken(ctx context.Context, err error, ended string, s *report.Sample) {
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		s.Err = ErrMidstream
		r.example(s.Err, ended)
	case ctx.Err() != nil:
		s.Err = classify(ctx, err)
		r.example(s.Err, err.Error())
	default:
		s.Err = ErrMidstream
		r.example(s.Err, err.Error())
	}
}

// errRequestTimeout is the cause of a request's context when
// Config.Timeout expired.
var errRequestTimeout = errors.New("the request's timeout expired")

// classify maps a transport error of a request with context ctx to an
// error kind. A request whose context ended for another reason than its
// own timeout was cancelled, also by a deadline of the run's context
// (Run's caller ending the run, as Ctrl-C does).
func classify(ctx context.Context, err error) string {
	var dnsErr *net.DNSError
	switch {
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), errRequestTimeout):
		return ErrTimeout
	case errors.Is(err, context.Canceled) || ctx.Err() != nil:
		return ErrCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case errors.As(err, &dnsErr):
		return ErrDNS
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.ECONNRESET) && !isTimeout(err):
		return ErrConnect
	case isTimeout(err):
		return ErrTimeout
	}
	return ErrTransport
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

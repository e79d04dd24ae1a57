package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

func TestRequestErrors(t *testing.T) {
	_, hs := testServer(t, Config{})
	long := strings.Repeat("word ", 1100)
	tests := []struct {
		name, path, body string
		status           int
		msg              string
	}{
		{"bad json", "/v1/completions", `{"prompt":`, 400, "JSON decode error"},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, 400, "prompt"},
		{"no messages", "/v1/chat/completions", `{"max_tokens":3}`, 400, "messages"},
		{"n=2", "/v1/completions", `{"prompt":"a","n":2}`, 400, "n must be 1"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "max_tokens must be at least 1, got 0."},
		{"stream options without stream", "/v1/completions", `{"prompt":"a","stream_options":{"include_usage":true}}`, 400, "Stream options can only be defined when `stream=True`."},
		{"wrong model", "/v1/completions", `{"model":"other","prompt":"a"}`, 404, "The model `other` does not exist."},
		{"too long", "/v1/completions", `{"prompt":"` + long + `","max_tokens":10}`, 400, "This model's maximum context length is 1024 tokens. However, you requested"},
		{"too long chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "in the messages"},
		{"max_tokens too large", "/v1/completions", `{"prompt":"a","max_tokens":5000}`, 400, "(1 in the prompt, 5000 in the completion)"},
		{"batched prompt", "/v1/completions", `{"prompt":["a","b"]}`, 400, "batched prompts"},
		{"bad stop", "/v1/completions", `{"prompt":"a","stop":5}`, 400, "stop"},
		{"bad content part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "text only"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, 400, "The prompt cannot be empty."},
		{"token out of vocabulary", "/v1/completions", `{"prompt":[1,2,5000]}`, 400, "Token id 5000 is out of vocabulary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, hs.URL+tt.path, tt.body)
			if code != tt.status {
				t.Fatalf("got status %d (%s), want %d", code, body, tt.status)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("got body %s: %v", body, err)
			}
			if !strings.Contains(e.Error.Message, tt.msg) {
				t.Errorf("got message %q, want it to contain %q", e.Error.Message, tt.msg)
			}
			if e.Error.Code != tt.status || e.Error.Type != errorType(tt.status) {
				t.Errorf("got code %d type %q, want %d %q", e.Error.Code, e.Error.Type, tt.status, errorType(tt.status))
			}
		})
	}
}

func TestEndpoints(t *testing.T) {
	_, hs := testServer(t, Config{})
	tests := []struct {
		path   string
		status int
		body   string
	}{
		{"/health", 200, ""},
		{"/v1/models", 200, `"id":"tiny"`},
		{"/nope", 404, `{"detail":"Not Found"}`},
	}
	for _, tt := range tests {
		resp, err := http.Get(hs.URL + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.body) {
			t.Errorf("%s: got %d %s, want %d containing %s", tt.path, resp.StatusCode, b, tt.status, tt.body)
		}
	}
}

// readStream reads an SSE response into its data payloads.
func readStream(t *testing.T, r io.Reader) []string {
	t.Helper()
	sr := openai.NewSSEReader(r)
	var out []string
	for {
		e, err := sr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(e.Data))
	}
}

// normaliseStream replaces ids and timestamps and merges consecutive
// content chunks (their number depends on timing) so the stream's shape
// can be compared with a golden file.
func normaliseStream(t *testing.T, events []string) string {
	t.Helper()
	var b strings.Builder
	var pending string
	flush := func() {
		if pending != "" {
			b.WriteString("content " + pending + "\n")
			pending = ""
		}
	}
	for _, e := range events {
		if e == openai.Done {
			flush()
			b.WriteString("[DONE]\n")
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(e), &m); err != nil {
			t.Fatalf("chunk %s: %v", e, err)
		}
		id, _ := m["id"].(string)
		if !strings.HasPrefix(id, "chatcmpl-") && !strings.HasPrefix(id, "cmpl-") {
			t.Errorf("got id %q", id)
		}
		m["id"], m["created"] = "ID", 0
		choices, _ := m["choices"].([]any)
		if len(choices) == 1 {
			c := choices[0].(map[string]any)
			if d, ok := c["delta"].(map[string]any); ok && d["role"] == nil && c["finish_reason"] == nil {
				s, _ := d["content"].(string)
				pending += s
				continue
			}
			if txt, ok := c["text"].(string); ok && c["finish_reason"] == nil {
				pending += txt
				continue
			}
		}
		if len(choices) == 1 && choices[0].(map[string]any)["finish_reason"] != nil { // final chunk: its text depends on timing too
			c := choices[0].(map[string]any)
			if d, ok := c["delta"].(map[string]any); ok {
				s, _ := d["content"].(string)
				pending += s
				d["content"] = "(merged)"
			} else if txt, ok := c["text"].(string); ok {
				pending += txt
				c["text"] = "(merged)"
			}
		}
		flush()
		out, _ := json.Marshal(m)
		b.WriteString(string(out) + "\n")
	}
	flush()
	return b.String()
}

func TestStreamGolden(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 1})
	tests := []struct{ name, path, body string }{
		{"chat_stream", "/v1/chat/completions", `{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":6,"seed":42,"stream":true,"stream_options":{"include_usage":true}}`},
		{"chat_stream_stop", "/v1/chat/completions", `{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":30,"seed":42,"stream":true,"stop":["na ga"]}`},
		{"completion_stream", "/v1/completions", `{"prompt":"Once upon a time","max_tokens":5,"seed":3,"stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(hs.URL+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("got content type %q", ct)
			}
			golden(t, tt.name+".golden", []byte(normaliseStream(t, readStream(t, resp.Body))))
		})
	}
}

func TestStopStringNonStreaming(t *testing.T) {
	_, hs := testServer(t, Config{})
	// Find the text the seed generates, then stop on a word inside it.
	_, body := post(t, hs.URL+"/v1/completions", `{"prompt":"abc","max_tokens":12,"seed":9}`)
	var full openai.Completion
	if err := json.Unmarshal(body, &full); err != nil {
		t.Fatal(err)
	}
	words := strings.Fields(full.Choices[0].Text)
	if len(words) < 6 {
		t.Fatalf("got %q, want 6+ words", full.Choices[0].Text)
	}
	stop := words[5]
	i := strings.Index(full.Choices[0].Text, stop)
	req, _ := json.Marshal(map[string]any{"prompt": "abc", "max_tokens": 12, "seed": 9, "stop": []string{"zzzz", stop}})
	_, body = post(t, hs.URL+"/v1/completions", string(req))
	var got openai.Completion
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	c := got.Choices[0]
	if c.Text != full.Choices[0].Text[:i] || *c.FinishReason != "stop" || c.StopReason != stop {
		t.Errorf("got text %q finish %v stop_reason %v, want %q stop %q", c.Text, *c.FinishReason, c.StopReason, full.Choices[0].Text[:i], stop)
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 1})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions",
		bytes.NewBufferString(`{"prompt":"long one","max_tokens":900,"stream":true,"ignore_eos":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sr := openai.NewSSEReader(resp.Body)
	if _, err := sr.Next(); err != nil { // one token arrived
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		mfs := scrape(t, hs.URL)
		var aborted, running float64
		for _, m := range mfs["vllm:request_success_total"].GetMetric() {
			if labelsOf(m)["finished_reason"] == "abort" {
				aborted = value(m)
			}
		}
		running = value(mfs["vllm:num_requests_running"].GetMetric()[0])
		if aborted == 1 && running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got aborted %v running %v, want 1 and 0 after the client left", aborted, running)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func FuzzHandler(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":2}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"max_tokens":1,"stop":["a","b"]}`,
		`{"prompt":[[5,6]],"max_completion_tokens":2,"seed":-1}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"max_tokens":1,"n":1}`,
		`{"prompt":"x","kv_transfer_params":{"do_remote_decode":true},"max_tokens":1}`,
		`{"prompt":"x","bootstrap_room":5,"bootstrap_port":1}`,
		`{"prompt":null}`, `[]`, `{"prompt":"a","max_tokens":-1}`, "\x00",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	// Role prefill: a fuzzed do_remote_prefill must not make the server
	// call whatever remote_host the input names.
	s, err := New(Config{Model: "tiny", Engine: tinyEngine(f), Speed: 1000, DefaultMaxTokens: 4, Role: kvroute.RolePrefill})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := newRecorder()
		req, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(body))
		h.ServeHTTP(rec, req)
		switch rec.code {
		case 200:
			if strings.HasPrefix(rec.header.Get("Content-Type"), "text/event-stream") {
				evs := readStream(t, bytes.NewReader(rec.body.Bytes()))
				if len(evs) == 0 || evs[len(evs)-1] != openai.Done {
					t.Errorf("stream without [DONE]: %q", rec.body.String())
				}
				return
			}
			if !json.Valid(rec.body.Bytes()) {
				t.Errorf("invalid JSON response %q", rec.body.String())
			}
		case 400, 404, 413:
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.body.Bytes(), &e); err != nil || e.Error.Code != rec.code || e.Error.Message == "" {
				t.Errorf("status %d with body %q", rec.code, rec.body.String())
			}
		default:
			t.Errorf("body %q: got status %d %q", body, rec.code, rec.body.String())
		}
	})
}

func TestRequestIDHeader(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, tt := range []struct{ path, body, want string }{
		{"/v1/completions", `{"prompt":"a","max_tokens":1}`, "cmpl-req-42"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`, "chatcmpl-req-42"},
	} {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+tt.path, strings.NewReader(tt.body))
		req.Header.Set("X-Request-Id", "req-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			ID string `json:"id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if v.ID != tt.want || resp.Header.Get("X-Request-Id") != "req-42" {
			t.Errorf("%s: got id %q header %q, want %q and the header echoed", tt.path, v.ID, resp.Header.Get("X-Request-Id"), tt.want)
		}
	}
}

func TestContinuousUsageStats(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 1})
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":"count with me","max_tokens":4,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := readStream(t, resp.Body)
	last := -1
	for _, e := range events[:len(events)-1] {
		var c openai.CompletionChunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage == nil || c.Usage.PromptTokens != 3 || c.Usage.CompletionTokens < last || c.Usage.TotalTokens != 3+c.Usage.CompletionTokens {
			t.Fatalf("chunk %s: want usage with prompt 3 and non-decreasing completion tokens", e)
		}
		last = c.Usage.CompletionTokens
	}
	if last != 4 {
		t.Errorf("got final completion_tokens %d, want 4", last)
	}
}

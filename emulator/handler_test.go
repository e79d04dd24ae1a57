package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

// TestRequestErrors checks each bad input's status and vLLM's error body:
// message, type ("Bad Request" for what vLLM's request models reject,
// BadRequestError or NotFoundError for what its serving layer rejects) and
// param (null unless vLLM names the field).
func TestRequestErrors(t *testing.T) {
	_, hs := testServer(t, Config{})
	long := strings.Repeat("word ", 1100)
	const bad = typeValidation
	tests := []struct {
		name, path, body string
		status           int
		msg              string
		typ              string // "" is errorType(status)
		param            any    // nil is null
	}{
		{"bad json", "/v1/completions", `{"prompt":`, 400, "JSON decode error", bad, "body"},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, 400, "Either prompt or prompt_embeds must be provided and non-empty.", bad, "prompt"},
		{"no messages", "/v1/chat/completions", `{"max_tokens":3}`, 400, "messages", bad, "body.messages"},
		{"n=2", "/v1/completions", `{"prompt":"a","n":2}`, 400, "n must be 1", "", nil},
		{"max_tokens 0", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "", "max_tokens"},
		{"max_completion_tokens -1", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":-1}`, 400, "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)", "", "max_tokens"},
		{"min_tokens negative", "/v1/completions", `{"prompt":"a","min_tokens":-1}`, 400, "min_tokens must be greater than or equal to 0, got -1.", "", nil},
		{"min_tokens above max_tokens", "/v1/completions", `{"prompt":"a","max_tokens":3,"min_tokens":4}`, 400, "min_tokens must be less than or equal to max_tokens=3, got 4.", "", nil},
		{"min_tokens above default", "/v1/completions", `{"prompt":"a","min_tokens":17}`, 400, "min_tokens must be less than or equal to max_tokens=16, got 17.", "", nil},
		{"stream options without stream", "/v1/completions", `{"prompt":"a","stream_options":{"include_usage":true}}`, 400, "Stream options can only be defined when `stream=True`.", bad, "stream_options"},
		{"wrong model", "/v1/completions", `{"model":"other","prompt":"a"}`, 404, "The model `other` does not exist.", "", "model"},
		{"suffix", "/v1/completions", `{"prompt":"a","suffix":"b"}`, 400, "suffix is not currently supported", "", nil},
		{"empty suffix", "/v1/completions", `{"prompt":"a","suffix":""}`, 400, "suffix is not currently supported", "", nil},
		{"wrong model, max_tokens 0", "/v1/completions", `{"model":"other","prompt":"a","max_tokens":0}`, 404, "The model `other` does not exist.", "", "model"},
		{"too long", "/v1/completions", `{"prompt":"` + long + `","max_tokens":10}`, 400,
			"You passed 1101 input tokens and requested 10 output tokens. However, the model's context length is only 1024 tokens, " +
				"resulting in a maximum input length of 1014 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=1101)", "", "input_tokens"},
		{"too long chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400,
			"input tokens and requested 0 output tokens. However, the model's context length is only 1024 tokens, resulting in a maximum input length of 1024 tokens.", "", "input_tokens"},
		{"max_tokens too large", "/v1/completions", `{"prompt":"a","max_tokens":5000}`, 400,
			"max_tokens=5000cannot be greater than max_model_len=max_total_tokens=1024. Please request fewer output tokens. (parameter=max_tokens, value=5000)", "", "max_tokens"},
		{"max_completion_tokens too large", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":5000}`, 400,
			"max_completion_tokens=5000cannot be greater than", "", "max_completion_tokens"},
		{"batched prompt", "/v1/completions", `{"prompt":["a","b"]}`, 400, "batched prompts", "", nil},
		{"bad stop", "/v1/completions", `{"prompt":"a","stop":5}`, 400, "stop", bad, "body.stop"},
		{"empty stop", "/v1/completions", `{"prompt":"a","stop":""}`, 400, "stop cannot contain an empty string.", "", nil},
		{"empty stop in list", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"stop":["x",""]}`, 400, "stop cannot contain an empty string.", "", nil},
		// Content parts vLLM refuses when it renders the messages, after
		// the model check (chat_utils.py): an image on a text-only model, a
		// type it does not know, a part without a type.
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, 400, "tiny is not a multimodal model", "", nil},
		{"image part without type", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"image_url":"http://x/y.png"}]}]}`, 400, "tiny is not a multimodal model", "", nil},
		{"audio part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}]}]}`, 400, "tiny is not a multimodal model", "", nil},
		{"image part, wrong model", "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, 404, "The model `other` does not exist.", "", "model"},
		{"unknown part type", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"foo","text":"a"}]}]}`, 400,
			"Unsupported chat content part type: 'foo'. Supported types: audio_embeds, audio_url, image_embeds, image_pil, image_url, input_audio, input_image, input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, video_url. (parameter=type, value=foo)", "", "type"},
		{"part without type", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"text":"a"}]}]}`, 400, "Missing 'type' field in multimodal part.", "", nil},
		{"part with a number type", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":1,"text":"a"}]}]}`, 400, "Invalid 'type' field in multimodal part.", "", nil},
		{"text part with a number", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, 400, "should be a valid string", bad, "body.messages.0.content"},
		{"content a number", "/v1/chat/completions", `{"messages":[{"role":"user","content":1}]}`, 400, "Input should be a valid string or a list of content parts", bad, "body.messages.0.content"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, 400, "Either prompt or prompt_embeds must be provided and non-empty.", bad, "prompt"},
		{"empty prompt, encoding/json path", "/v1/completions", `{"prompt":"","Z":1}`, 400, "Either prompt or prompt_embeds must be provided and non-empty.", bad, "prompt"},
		{"token out of vocabulary", "/v1/completions", `{"prompt":[1,2,5000]}`, 400, "Token id 5000 is out of vocabulary", "", nil},
		{"max_tokens with a fraction", "/v1/completions", `{"prompt":"a","max_tokens":1.5}`, 400, "got a number with a fractional part", bad, "body"},
		{"max_tokens 0.0", "/v1/completions", `{"prompt":"a","max_tokens":0.0}`, 400, "max_tokens must be at least 1, got 0.", "", "max_tokens"},
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
			typ := tt.typ
			if typ == "" {
				typ = errorType(tt.status)
			}
			if e.Error.Code != tt.status || e.Error.Type != typ {
				t.Errorf("got code %d type %q, want %d %q", e.Error.Code, e.Error.Type, tt.status, typ)
			}
			if e.Error.Param != tt.param {
				t.Errorf("got param %v, want %v", e.Error.Param, tt.param)
			}
		})
	}
}

// TestRequestLaxForms: what vLLM's server accepts beyond strict JSON
// integers and bodies: a leading byte-order mark (Python's json.loads
// skips it in bytes) and max_tokens written as a whole number in float
// form (pydantic's lax integers), as the router's parser accepts them too.
func TestRequestLaxForms(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", "\ufeff{\"prompt\":\"a b\",\"max_tokens\":3,\"ignore_eos\":true}"},
		{"/v1/completions", `{"prompt":"a b","max_tokens":3.0,"ignore_eos":true}`},
		{"/v1/completions", `{"prompt":"a b","max_tokens":3e0,"ignore_eos":true,"Z":1}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":3.0,"ignore_eos":true}`},
		{"/v1/completions", `{"prompt":"a b","max_tokens":3,"seed":7.0,"min_tokens":1.0,"n":1.0,"ignore_eos":true}`},
		{"/v1/completions", `{"prompt":"a b","max_tokens":3,"ignore_eos":true,"suffix":null}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":3,"ignore_eos":true,"suffix":"x"}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":3,"seed":-2e3,"ignore_eos":true}`},
	} {
		code, body := post(t, hs.URL+tc.path, tc.body)
		if code != 200 {
			t.Errorf("%s %q: status %d (%s), want 200", tc.path, tc.body, code, body)
			continue
		}
		var r struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil || r.Usage.CompletionTokens != 3 {
			t.Errorf("%s %q: %s (%v), want 3 completion tokens", tc.path, tc.body, body, err)
		}
	}
}

func TestEndpoints(t *testing.T) {
	_, hs := testServer(t, Config{})
	tests := []struct {
		method, path string
		status       int
		body, allow  string
	}{
		{"GET", "/health", 200, "", ""},
		{"GET", "/v1/models", 200, `"id":"tiny"`, ""},
		{"GET", "/nope", 404, `{"detail":"Not Found"}`, ""},
		{"GET", "/v1/completions", 405, `{"detail":"Method Not Allowed"}`, "POST"},
		{"POST", "/health", 405, `{"detail":"Method Not Allowed"}`, "GET, HEAD"},
		{"DELETE", "/v1/models", 405, `{"detail":"Method Not Allowed"}`, "GET, HEAD"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, hs.URL+tt.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.body) || resp.Header.Get("Allow") != tt.allow {
			t.Errorf("%s %s: got %d %s Allow %q, want %d containing %s Allow %q", tt.method, tt.path, resp.StatusCode, b,
				resp.Header.Get("Allow"), tt.status, tt.body, tt.allow)
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
	var mfs map[string]*dto.MetricFamily
	// Running 0 after the request was seen: the token can reach the
	// client before the loop publishes the step's stats (at most every
	// statsEvery while busy), so a scrape at once may still read the
	// snapshot from before the request, with nothing running.
	waitFor(t, "the request aborted", func() bool {
		mfs = scrape(t, hs.URL)
		return value(mfs["vllm:num_requests_running"].GetMetric()[0]) == 0 &&
			value(mfs["vllm:prompt_tokens_total"].GetMetric()[0]) > 0
	})
	// As in vLLM, whose front end forgets a request its client left
	// (OutputProcessor.abort_requests): no finish is recorded, in
	// request_success_total (any reason) or the per-request histograms,
	// but the tokens generated before are counted.
	for _, m := range mfs["vllm:request_success_total"].GetMetric() {
		if v := value(m); v != 0 {
			t.Errorf("request_success_total{finished_reason=%q}: got %v, want 0", labelsOf(m)["finished_reason"], v)
		}
	}
	if n := mfs["vllm:e2e_request_latency_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 0 {
		t.Errorf("e2e_request_latency_seconds: got %d observations, want 0", n)
	}
	if n := mfs["vllm:request_generation_tokens"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 0 {
		t.Errorf("request_generation_tokens: got %d observations, want 0", n)
	}
	if v := value(mfs["vllm:generation_tokens_total"].GetMetric()[0]); v < 1 {
		t.Errorf("generation_tokens_total: got %v, want the tokens generated before the abort (1 or more)", v)
	}
}

func FuzzHandler(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":2}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"max_tokens":1,"stop":["a","b"]}`,
		`{"prompt":[[5,6]],"max_completion_tokens":2,"seed":-1}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"max_tokens":1,"n":1}`,
		`{"messages":[{"role":"user","content":["a",{"type":"input_text","text":null},{"type":"image_url","image_url":{"url":"u"}},{"type":7},{"text":"b"},{"type":"tool_reference","name":"t"}]}],"max_tokens":1}`,
		`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"chat_template_kwargs":{"x":1},"tools":[],"max_tokens":1}`,
		`{"prompt":"x","kv_transfer_params":{"do_remote_decode":true},"max_tokens":1}`,
		`{"prompt":"x","bootstrap_room":5,"bootstrap_port":1}`,
		`{"prompt":null}`, `[]`, `{"prompt":"a","max_tokens":-1}`, "\x00",
		`{"prompt":"a","max_tokens":3,"return_token_ids":true,"stream":true,"stop":["e"],"logprobs":null,"n":null}`,
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":2,"return_token_ids":true,"logprobs":true,"top_logprobs":2,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"function":{"name":"f"}}}`,
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

// TestStreamOptionsDefaults checks vLLM's StreamOptions defaults:
// include_usage is true unless given, so {} or continuous_usage_stats alone
// still end the stream with the usage chunk (and continuous_usage_stats
// alone puts usage in every chunk); an empty stream_options is allowed
// without stream, a non-empty one is not.
func TestStreamOptionsDefaults(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 1})
	tests := []struct {
		name, opts             string
		usageChunk, continuous bool
	}{
		{"empty", `{}`, true, false},
		{"continuous only", `{"continuous_usage_stats":true}`, true, true},
		{"include_usage false", `{"include_usage":false,"continuous_usage_stats":true}`, false, false},
		{"include_usage null", `{"include_usage":null}`, false, false},
		{"other key", `{"x":1}`, true, false},
		{"null", `null`, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(
				`{"prompt":"count with me","max_tokens":3,"stream":true,"stream_options":`+tt.opts+`}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			events := readStream(t, resp.Body)
			if len(events) < 2 || events[len(events)-1] != openai.Done {
				t.Fatalf("got events %q, want chunks then [DONE]", events)
			}
			var chunks []openai.CompletionChunk
			for _, e := range events[:len(events)-1] {
				var c openai.CompletionChunk
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("chunk %s: %v", e, err)
				}
				chunks = append(chunks, c)
			}
			last := chunks[len(chunks)-1]
			gotUsageChunk := len(last.Choices) == 0 && last.Usage != nil
			if gotUsageChunk != tt.usageChunk {
				t.Errorf("got usage chunk %v (last event %s), want %v", gotUsageChunk, events[len(events)-2], tt.usageChunk)
			}
			if gotUsageChunk && (last.Usage.PromptTokens != 3 || last.Usage.CompletionTokens != 3) {
				t.Errorf("got usage %+v, want 3 prompt and 3 completion tokens", *last.Usage)
			}
			for _, c := range chunks {
				if len(c.Choices) > 0 && (c.Usage != nil) != tt.continuous {
					t.Errorf("content chunk with usage %v, want %v", c.Usage != nil, tt.continuous)
				}
			}
		})
	}
	t.Run("empty without stream", func(t *testing.T) {
		code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"a","max_tokens":1,"stream_options":{}}`)
		if code != http.StatusOK {
			t.Errorf("got %d %s, want 200 (vLLM's validator lets an empty stream_options through)", code, body)
		}
	})
}

// TestContentPartsJoined checks that a message given as text parts is
// tokenized as vLLM renders it: the parts joined with newlines, those whose
// text is empty or null dropped (chat_utils.py: `if parse_res:`).
func TestContentPartsJoined(t *testing.T) {
	_, hs := testServer(t, Config{})
	usage := func(content string) int {
		t.Helper()
		code, body := post(t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":`+content+`}],"max_tokens":1}`)
		if code != http.StatusOK {
			t.Fatalf("got %d %s", code, body)
		}
		var c openai.ChatCompletion
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatal(err)
		}
		return c.Usage.PromptTokens
	}
	parts := usage(`[{"type":"text","text":"alpha"},{"type":"text","text":"beta"}]`)
	joined := usage(`"alpha\nbeta"`)
	if parts != joined {
		t.Errorf("got %d prompt tokens for the parts, want %d (those of \"alpha\\nbeta\")", parts, joined)
	}
	ids := func(content string) string {
		t.Helper()
		code, body := post(t, hs.URL+"/tokenize", `{"messages":[{"role":"user","content":`+content+`}]}`)
		if code != http.StatusOK {
			t.Fatalf("got %d %s", code, body)
		}
		var tok struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(body, &tok); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(tok.Tokens)
	}
	empty := `[{"type":"text","text":""},{"type":"text","text":"alpha"},{"type":"text","text":null},{"type":"text","text":""},{"type":"text","text":"beta"}]`
	if got, want := ids(empty), ids(`"alpha\nbeta"`); got != want {
		t.Errorf("got ids %s for %s, want %s (those of \"alpha\\nbeta\")", got, empty, want)
	}
}

// TestModelsShape checks GET /v1/models against vLLM's ModelList: the card's
// fields and its permission list.
func TestModelsShape(t *testing.T) {
	_, hs := testServer(t, Config{})
	resp, err := http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 {
		t.Fatalf("got %+v, want one model in a list", list)
	}
	card := list.Data[0]
	for k, want := range map[string]any{"id": "tiny", "object": "model", "owned_by": "vllm", "root": "tiny", "parent": nil, "max_model_len": 1024.0} {
		if got, ok := card[k]; !ok || got != want {
			t.Errorf("got %s %v (present %v), want %v", k, got, ok, want)
		}
	}
	perms, _ := card["permission"].([]any)
	if len(perms) != 1 {
		t.Fatalf("got permission %v, want one ModelPermission", card["permission"])
	}
	p := perms[0].(map[string]any)
	if id, _ := p["id"].(string); !strings.HasPrefix(id, "modelperm-") || len(id) != len("modelperm-")+32 {
		t.Errorf("got permission id %q, want modelperm- and 32 hex digits", id)
	}
	for k, want := range map[string]any{"object": "model_permission", "allow_create_engine": false, "allow_sampling": true,
		"allow_logprobs": true, "allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
		"organization": "*", "group": nil, "is_blocking": false} {
		if got, ok := p[k]; !ok || got != want {
			t.Errorf("got permission %s %v (present %v), want %v", k, got, ok, want)
		}
	}
	if _, ok := p["created"].(float64); !ok {
		t.Errorf("got permission created %v, want a number", p["created"])
	}
}

// TestMaxCompletionTokensScope checks that max_completion_tokens limits a
// chat response but, as in vLLM (whose CompletionRequest has no such
// field), is ignored by /v1/completions.
func TestMaxCompletionTokensScope(t *testing.T) {
	_, hs := testServer(t, Config{})
	tests := []struct {
		path, body string
		want       int
	}{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":2,"ignore_eos":true}`, 2},
		{"/v1/completions", `{"prompt":"hi","max_tokens":5,"max_completion_tokens":2,"ignore_eos":true}`, 5},
	}
	for _, tt := range tests {
		code, body := post(t, hs.URL+tt.path, tt.body)
		if code != http.StatusOK {
			t.Fatalf("%s: got %d %s", tt.path, code, body)
		}
		var r struct {
			Usage openai.Usage `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		if r.Usage.CompletionTokens != tt.want {
			t.Errorf("%s: got %d completion tokens, want %d", tt.path, r.Usage.CompletionTokens, tt.want)
		}
	}
}

// TestCompletionDefaultMaxTokens checks vLLM's CompletionRequest default:
// a completions request without max_tokens (or with null) generates 16
// tokens and is length-checked as asking for 16; chat gets the rest of the
// context up to Config.DefaultMaxTokens.
func TestCompletionDefaultMaxTokens(t *testing.T) {
	_, hs := testServer(t, Config{DefaultMaxTokens: 40})
	tests := []struct {
		name, path, body string
		want             int
	}{
		{"absent", "/v1/completions", `{"prompt":"hi"}`, 16},
		{"null", "/v1/completions", `{"prompt":"hi","max_tokens":null}`, 16},
		{"given", "/v1/completions", `{"prompt":"hi","max_tokens":20}`, 20},
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, hs.URL+tt.path, tt.body)
			if code != http.StatusOK {
				t.Fatalf("got %d %s", code, body)
			}
			var r struct {
				Usage openai.Usage `json:"usage"`
			}
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			if r.Usage.CompletionTokens != tt.want {
				t.Errorf("got %d completion tokens, want %d", r.Usage.CompletionTokens, tt.want)
			}
		})
	}
	long := strings.Repeat("word ", 1010) // 1011 tokens: fits the context, not with 16 more
	code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"`+long+`"}`)
	if want := "You passed 1011 input tokens and requested 16 output tokens."; code != http.StatusBadRequest || !strings.Contains(string(body), want) {
		t.Errorf("got %d %s, want 400 containing %q", code, body, want)
	}
}

// TestMinTokens checks min_tokens as vLLM's sampler applies it: no EOS
// before min_tokens tokens are out (the EOS, when it comes, is token
// min_tokens+1 or later), and no stop string either.
func TestMinTokens(t *testing.T) {
	_, hs := testServer(t, Config{EOSMean: 2})
	completion := func(body string) openai.Completion {
		t.Helper()
		code, b := post(t, hs.URL+"/v1/completions", body)
		if code != http.StatusOK {
			t.Fatalf("got %d %s", code, b)
		}
		var c openai.Completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	early := 0
	for seed := range 20 {
		free := completion(fmt.Sprintf(`{"prompt":"abc","max_tokens":20,"seed":%d}`, seed))
		if free.Usage.CompletionTokens <= 10 {
			early++
		}
		held := completion(fmt.Sprintf(`{"prompt":"abc","max_tokens":20,"min_tokens":10,"seed":%d}`, seed))
		if n := held.Usage.CompletionTokens; n <= 10 {
			t.Errorf("seed %d: got %d completion tokens (finish %s) with min_tokens 10, want more than 10", seed, n, *held.Choices[0].FinishReason)
		}
	}
	if early == 0 {
		t.Fatalf("no seed ended within 10 tokens without min_tokens: the test proves nothing")
	}
	// A stop string inside the first min_tokens tokens is not looked for.
	full := completion(`{"prompt":"abc","max_tokens":12,"seed":3,"ignore_eos":true}`)
	words := strings.Fields(full.Choices[0].Text)
	if len(words) < 4 {
		t.Fatalf("got %q, want 4+ words", full.Choices[0].Text)
	}
	stop := words[1]
	if strings.Count(full.Choices[0].Text, stop) != 1 {
		t.Skipf("stop %q occurs more than once in %q", stop, full.Choices[0].Text)
	}
	body, _ := json.Marshal(map[string]any{"prompt": "abc", "max_tokens": 12, "seed": 3, "ignore_eos": true, "stop": stop, "min_tokens": 11})
	if got := completion(string(body)); got.Choices[0].Text != full.Choices[0].Text || *got.Choices[0].FinishReason != openai.FinishLength {
		t.Errorf("stop %q within min_tokens: got %q finish %s, want the whole %q finish length", stop, got.Choices[0].Text,
			*got.Choices[0].FinishReason, full.Choices[0].Text)
	}
}

// TestEngineRequestID: the engine's request id is the response id, a dash
// and the request's number in base 36, made in one allocation.
func TestEngineRequestID(t *testing.T) {
	for _, tc := range []struct {
		resp string
		n    uint64
	}{{"cmpl-1", 0}, {"chatcmpl-" + strings.Repeat("f", 32), 123456789}, {"cmpl-" + strings.Repeat("x", 100), math.MaxUint64}} {
		if got, want := engineRequestID(tc.resp, tc.n), tc.resp+"-"+strconv.FormatUint(tc.n, 36); got != want {
			t.Errorf("engineRequestID(%q, %d) = %q, want %q", tc.resp, tc.n, got, want)
		}
	}
	id := "chatcmpl-" + strings.Repeat("f", 32)
	if n := testing.AllocsPerRun(100, func() { _ = engineRequestID(id, 987654321) }); n != 1 {
		t.Errorf("engineRequestID: %v allocations, want 1", n)
	}
}

// TestRoleString: the common roles come without an allocation, others as
// they are.
func TestRoleString(t *testing.T) {
	for _, r := range []string{"system", "user", "assistant", "tool", "x"} {
		if got := roleString([]byte(r)); got != r {
			t.Errorf("roleString(%q) = %q", r, got)
		}
	}
	b := []byte("assistant")
	if n := testing.AllocsPerRun(100, func() { _ = roleString(b) }); n != 0 {
		t.Errorf("roleString(assistant): %v allocations, want 0", n)
	}
}

// TestChatBodyRecycled: chat requests whose contents alias their bodies
// (recycled through bodyPool once encoded), served at once, each get the
// prompt of their own messages.
func TestChatBodyRecycled(t *testing.T) {
	s, hs := testServer(t, Config{})
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			sys := strings.Repeat(fmt.Sprintf("rule %d applies here. ", i), 5+i%7)
			msgs := []tokenizer.Message{{Role: "system", Content: sys}, {Role: "user", Content: fmt.Sprintf("question %d", i)}}
			body := fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":2}`, sys, msgs[1].Content)
			code, out := post(t, hs.URL+"/v1/chat/completions", body)
			var resp struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				}
			}
			if err := json.Unmarshal(out, &resp); code != 200 || err != nil {
				t.Errorf("request %d: status %d, %v: %s", i, code, err, out)
				return
			}
			if want := len(s.encodeChat(msgs)); resp.Usage.PromptTokens != want {
				t.Errorf("request %d: %d prompt tokens, want %d", i, resp.Usage.PromptTokens, want)
			}
		})
	}
	wg.Wait()
}

// TestRequestKeysCaseSensitive: vLLM's request models (pydantic) match
// keys exactly, so a key that differs only in case is an unknown key,
// ignored (as the router's parser ignores it), where encoding/json would
// take it for the field.
func TestRequestKeysCaseSensitive(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, tc := range []struct {
		path, body string
		status     int
		completion int // completion tokens of a 200
	}{
		{"/v1/completions", `{"prompt":"a b","max_tokens":2,"ignore_eos":true,"Stream":true}`, 200, 2},
		{"/v1/completions", `{"prompt":"a b","max_tokens":2,"ignore_eos":true,"MAX_TOKENS":5}`, 200, 2},
		{"/v1/completions", `{"Prompt":"a b","max_tokens":2}`, 400, 0},
		{"/v1/chat/completions", `{"messages":[{"Role":"user","content":"hi"}],"max_tokens":2}`, 400, 0},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi","Type":"image_url"}]}],"max_tokens":2,"ignore_eos":true}`, 200, 2},
	} {
		code, body := post(t, hs.URL+tc.path, tc.body)
		if code != tc.status {
			t.Errorf("%s: got status %d (%.200s), want %d", tc.body, code, body, tc.status)
			continue
		}
		if code != 200 {
			continue
		}
		var r struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil || r.Usage.CompletionTokens != tc.completion {
			t.Errorf("%s: got %.200s (%v), want a JSON response with %d completion tokens", tc.body, body, err, tc.completion)
		}
	}
}

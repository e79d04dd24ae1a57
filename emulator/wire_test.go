package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

// wireNorm replaces what varies between runs in a response's raw bytes
// (ids, timestamps, generated text) and keeps the rest, key order
// included: the exact shape vLLM's pydantic models dump.
var wireNorm = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`"id":"(chatcmpl|cmpl)-[^"]*"`), `"id":"$1-ID"`},
	{regexp.MustCompile(`"created":\d+`), `"created":0`},
	{regexp.MustCompile(`"(text|content)":"(?:[^"\\]|\\.)+"`), `"$1":"T"`},
}

func normWire(s string) string {
	for _, n := range wireNorm {
		s = n.re.ReplaceAllString(s, n.repl)
	}
	return s
}

// streamShapes returns a stream's events normalised (normWire), runs of
// equal events (content chunks, whose number depends on timing) once.
func streamShapes(t *testing.T, url, body string) []string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []string
	for _, e := range readStream(t, resp.Body) {
		e = normWire(e)
		if len(out) > 0 && out[len(out)-1] == e {
			continue
		}
		out = append(out, e)
	}
	return out
}

// TestVLLMWireShapes pins the exact JSON of whole responses and stream
// chunks to what current vLLM sends (vllm/entrypoints/openai/completion
// and chat_completion: protocol.py's models, serving.py's dumps): a whole
// response is model_dump() (every field, null ones too), a completions
// chunk model_dump_json(exclude_unset=False), a chat chunk
// model_dump_json(exclude_unset=True) with the fields serving.py passes.
func TestVLLMWireShapes(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 1})
	const usage = `"usage":{"prompt_tokens":4,"total_tokens":9,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}`
	t.Run("completion", func(t *testing.T) {
		_, b := post(t, hs.URL+"/v1/completions", `{"prompt":"Once upon a time","max_tokens":5,"seed":3}`)
		want := `{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"T","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null}],"service_tier":null,"system_fingerprint":null,` + usage + `,"kv_transfer_params":null}`
		if got := normWire(string(b)); got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("chat", func(t *testing.T) {
		_, b := post(t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":6,"seed":42}`)
		want := `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"T","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":13,"total_tokens":19,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":0}},"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}`
		if got := normWire(string(b)); got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	for _, tc := range []struct {
		name, path, body string
		want             []string
	}{
		{"completion stream", "/v1/completions", `{"prompt":"Once upon a time","max_tokens":5,"seed":3,"stream":true,"stream_options":{"include_usage":true}}`, []string{
			`{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"T","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}`,
			`{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"T","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}`,
			`{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tiny","choices":[],` + usage + `}`,
			`[DONE]`,
		}},
		{"completion stream continuous usage", "/v1/completions", `{"prompt":"Once upon a time","max_tokens":1,"seed":3,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, []string{
			`{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"T","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":4,"total_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`,
			`{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tiny","choices":[],"usage":{"prompt_tokens":4,"total_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`,
			`[DONE]`,
		}},
		{"chat stream", "/v1/chat/completions", `{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":6,"seed":42,"stream":true}`, []string{
			`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}`,
			`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,"delta":{"content":"T"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
			`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,"delta":{"content":"T"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}`,
			`[DONE]`,
		}},
		{"chat stream continuous usage", "/v1/chat/completions", `{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":1,"seed":42,"stream":true,"stream_options":{"continuous_usage_stats":true}}`, []string{
			`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":13,"total_tokens":13,"completion_tokens":0},"prompt_token_ids":null}`,
			`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,"delta":{"content":"T"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":13,"total_tokens":14,"completion_tokens":1}}`,
			`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[],"usage":{"prompt_tokens":13,"total_tokens":14,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`,
			`[DONE]`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := streamShapes(t, hs.URL+tc.path, tc.body)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestChatRoleWithoutGenerationPrompt: a chat request whose
// add_generation_prompt is false is answered in the role of its last
// message, streamed or not, as vLLM's get_chat_request_role
// (chat_completion/serving.py) answers it; with the generation prompt, in
// the assistant's.
func TestChatRoleWithoutGenerationPrompt(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, tc := range []struct{ name, extra, last, want string }{
		{"default", ``, "user", "assistant"},
		{"generation prompt", `,"add_generation_prompt":true`, "user", "assistant"},
		{"no generation prompt", `,"add_generation_prompt":false`, "user", "user"},
		{"continue final message", `,"add_generation_prompt":false,"continue_final_message":true`, "assistant", "assistant"},
		{"another role", `,"add_generation_prompt":false`, "tool", "tool"},
		// vLLM reads the request's own field: a chat_template_kwargs
		// add_generation_prompt reaches only the template.
		{"kwargs", `,"chat_template_kwargs":{"add_generation_prompt":false}`, "user", "assistant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"messages":[{"role":"system","content":"be brief"},{"role":"` + tc.last + `","content":"hello there"}],"max_tokens":2` + tc.extra
			status, b := post(t, hs.URL+"/v1/chat/completions", body+`}`)
			var c openai.ChatCompletion
			if err := json.Unmarshal(b, &c); err != nil || status != http.StatusOK || len(c.Choices) != 1 {
				t.Fatalf("status %d, %v: %s", status, err, b)
			}
			if got := c.Choices[0].Message.Role; got != tc.want {
				t.Errorf("message role %q, want %q", got, tc.want)
			}
			resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(body+`,"stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			events := readStream(t, resp.Body)
			var first openai.ChatChunk
			if len(events) == 0 || json.Unmarshal([]byte(events[0]), &first) != nil || len(first.Choices) != 1 {
				t.Fatalf("stream %q", events)
			}
			if got := first.Choices[0].Delta.Role; got != tc.want {
				t.Errorf("first chunk role %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHeldBackChunks: a streamed output whose text is all held back (here
// for a stop string longer than the whole text) is still sent, as a chunk
// with empty text, as vLLM sends it: its output processor hands the front
// end an output at every due step (the first token, then every
// --stream-interval tokens), whose text may be "", and its serving code
// skips a chunk only when it has neither text nor tokens
// (completion/serving.py completion_stream_generator,
// chat_completion/serving.py chat_completion_stream_generator: the
// "chunked prefill case"). The emulator sent nothing until the end.
func TestHeldBackChunks(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	stop := strings.Repeat("z", 400) // longer than the text: all of it is held back
	for _, tc := range []struct {
		path     string
		interval int
	}{
		{"/v1/completions", 1},
		{"/v1/chat/completions", 1},
		{"/v1/completions", 10},
	} {
		t.Run(fmt.Sprintf("%s/interval%d", tc.path, tc.interval), func(t *testing.T) {
			_, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1, StreamInterval: tc.interval})
			body := `{"prompt":"held back","messages":[{"role":"user","content":"held back"}],"max_tokens":12,"ignore_eos":true,"seed":7,"stop":["` + stop +
				`"],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`
			if tc.path == "/v1/chat/completions" {
				body = strings.Replace(body, `"prompt":"held back",`, "", 1)
			} else {
				body = strings.Replace(body, `"messages":[{"role":"user","content":"held back"}],`, "", 1)
			}
			resp, err := http.Post(hs.URL+tc.path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var counts []int
			var texts []string
			for _, e := range readStream(t, resp.Body) {
				if e == openai.Done {
					break
				}
				var c struct {
					Choices []struct {
						Text         *string `json:"text"`
						Delta        *struct{ Role, Content string }
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
					Usage *openai.Usage `json:"usage"`
				}
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("chunk %q: %v", e, err)
				}
				if len(c.Choices) == 0 || c.Choices[0].Delta != nil && c.Choices[0].Delta.Role != "" {
					continue // the usage chunk, the chat role chunk
				}
				text := ""
				if ch := c.Choices[0]; ch.Text != nil {
					text = *ch.Text
				} else if ch.Delta != nil {
					text = ch.Delta.Content
				}
				counts = append(counts, c.Usage.CompletionTokens)
				texts = append(texts, text)
			}
			if len(counts) < 2 || counts[0] != 1 || counts[len(counts)-1] != 12 {
				t.Fatalf("content chunks at tokens %v (texts %q): want the first at token 1, the last at 12", counts, texts)
			}
			for i, c := range counts[:len(counts)-1] {
				if texts[i] != "" {
					t.Errorf("chunk %d (at token %d) has text %q, want it held back", i, c, texts[i])
				}
				if (c-1)%tc.interval != 0 {
					t.Errorf("chunk %d at token %d (all: %v): want 1 + a multiple of %d", i, c, counts, tc.interval)
				}
			}
			if texts[len(texts)-1] == "" {
				t.Errorf("the final chunk has no text (chunks %q)", texts)
			}
		})
	}
}

// TestStopHoldBackChars: a stream with stop strings holds back the last
// (longest stop string's length - 1) characters of its text, counted in
// characters as vLLM's detokenizer counts them (stop_buffer_length, in
// vllm/v1/engine/detokenizer.py: Python string lengths), not bytes: with
// the stop string "ééééé" (5 characters, 10 bytes) the text streamed by a
// chunk at token c is the text of the first c tokens less its last 4
// characters.
func TestStopHoldBackChars(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	_, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
	const n = 12
	body := func(maxTokens int) string {
		return fmt.Sprintf(`{"prompt":"hold back","max_tokens":%d,"ignore_eos":true,"seed":5,"stop":["ééééé"]`, maxTokens)
	}
	prefix := make([]string, n+1) // prefix[c]: the text of the first c tokens
	for c := 1; c <= n; c++ {
		_, b := post(t, hs.URL+"/v1/completions", body(c)+`}`)
		var r openai.Completion
		if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("max_tokens %d: %v: %s", c, err, b)
		}
		prefix[c] = r.Choices[0].Text
	}
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json",
		strings.NewReader(body(n)+`,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sent strings.Builder
	chunks := 0
	for _, e := range readStream(t, resp.Body) {
		if e == openai.Done {
			break
		}
		var c openai.CompletionChunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("chunk %q: %v", e, err)
		}
		if len(c.Choices) == 0 {
			continue
		}
		sent.WriteString(c.Choices[0].Text)
		k := c.Usage.CompletionTokens
		want := prefix[k]
		if c.Choices[0].FinishReason == nil {
			want = want[:max(0, len(want)-4)] // ASCII text: 4 characters are 4 bytes
		}
		if sent.String() != want {
			t.Errorf("after the chunk at token %d: streamed %q, want %q", k, sent.String(), want)
		}
		chunks++
	}
	if chunks < 2 {
		t.Errorf("%d content chunks, want one per token", chunks)
	}
}

// TestStreamHeaders: a stream's headers are those of vLLM's
// StreamingResponse(media_type="text/event-stream") (Starlette adds the
// charset), without caching or proxy-buffering headers vLLM does not send.
func TestStreamHeaders(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(
			`{"prompt":"p","messages":[{"role":"user","content":"p"}],"max_tokens":2,"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		readStream(t, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get("Content-Type"); got != "text/event-stream; charset=utf-8" {
			t.Errorf("%s: Content-Type %q", path, got)
		}
		for _, h := range []string{"Cache-Control", "X-Accel-Buffering", "Connection"} {
			if v, ok := resp.Header[h]; ok {
				t.Errorf("%s: header %s: %q, which vLLM does not send", path, h, v)
			}
		}
	}
}

// TestBodyRequestID: a request's id is its X-Request-Id header's, else
// its body's request_id (a field of vLLM's request models, default a
// random uuid), prefixed as vLLM prefixes it
// (engine/serving.py _base_request_id; completion/serving.py and
// chat_completion/serving.py create_*); a request_id that is not a string
// is vLLM's validation error.
func TestBodyRequestID(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, tc := range []struct {
		name, path, extra, header string
		status                    int
		want                      string
	}{
		{"completion", "/v1/completions", `,"request_id":"my-req-1"`, "", 200, "cmpl-my-req-1"},
		{"chat", "/v1/chat/completions", `,"request_id":"my-req-2"`, "", 200, "chatcmpl-my-req-2"},
		{"chat stream", "/v1/chat/completions", `,"request_id":"my-req-3","stream":true`, "", 200, "chatcmpl-my-req-3"},
		{"header wins", "/v1/completions", `,"request_id":"body"`, "hdr", 200, "cmpl-hdr"},
		{"null", "/v1/completions", `,"request_id":null`, "", 400, ""},
		{"number", "/v1/chat/completions", `,"request_id":7`, "", 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"prompt":"p","messages":[{"role":"user","content":"p"}],"max_tokens":2` + tc.extra + `}`
			req, _ := http.NewRequest(http.MethodPost, hs.URL+tc.path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if tc.header != "" {
				req.Header.Set("X-Request-Id", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status != 200 {
				var e openai.ErrorResponse
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error.Param == nil || *e.Error.Param != "body.request_id" {
					t.Errorf("error %+v (%v), want one about body.request_id", e, err)
				}
				return
			}
			events := []string{}
			if strings.HasPrefix(resp.Header.Get("Content-Type"), openai.ContentTypeEventStream) {
				events = readStream(t, resp.Body)
			} else {
				b, _ := io.ReadAll(resp.Body)
				events = append(events, string(b))
			}
			var ids []string
			for _, ev := range events {
				var c struct{ ID string }
				if ev != openai.Done && json.Unmarshal([]byte(ev), &c) == nil {
					ids = append(ids, c.ID)
				}
			}
			if len(ids) == 0 {
				t.Fatal("no response")
			}
			for _, id := range ids {
				if id != tc.want {
					t.Errorf("id %q, want %q", id, tc.want)
				}
			}
		})
	}
}

package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

func TestLoadMetricsHeader(t *testing.T) {
	_, hs := testServer(t, Config{})
	tests := []struct{ format, wantPrefix, wantPart string }{
		{"TEXT", "TEXT named_metrics.kv_cache_usage_perc=", "named_metrics.num_requests_waiting=0.0"},
		{"JSON", `JSON {"named_metrics": {"kv_cache_usage_perc": `, `"num_requests_running": `},
		{"", "", ""},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":1}`))
		if tt.format != "" {
			req.Header.Set("endpoint-load-metrics-format", tt.format)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := resp.Header.Get("endpoint-load-metrics")
		if !strings.HasPrefix(got, tt.wantPrefix) || !strings.Contains(got, tt.wantPart) || (tt.format == "") != (got == "") {
			t.Errorf("format %q: got header %q, want prefix %q containing %q", tt.format, got, tt.wantPrefix, tt.wantPart)
		}
		if tt.format == "JSON" {
			var v map[string]map[string]float64
			if err := json.Unmarshal([]byte(strings.TrimPrefix(got, "JSON ")), &v); err != nil || len(v["named_metrics"]) != 3 {
				t.Errorf("got JSON %q: %v", got, err)
			}
		}
	}
}

func TestAppendPyFloat(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{{0, "0.0"}, {2, "2.0"}, {0.31, "0.31"}, {1e21, "1e+21"}}
	for _, tt := range tests {
		if got := string(appendPyFloat(nil, tt.v)); got != tt.want {
			t.Errorf("appendPyFloat(%v): got %q, want %q", tt.v, got, tt.want)
		}
	}
}

func TestTokenizeMatchesUsage(t *testing.T) {
	_, hs := testServer(t, Config{})
	msgs := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Count the tokens of this chat."}]`
	code, body := post(t, hs.URL+"/tokenize", `{"messages":`+msgs+`}`)
	if code != 200 {
		t.Fatalf("got %d %s", code, body)
	}
	var tk struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &tk); err != nil {
		t.Fatal(err)
	}
	_, body = post(t, hs.URL+"/v1/chat/completions", `{"messages":`+msgs+`,"max_tokens":1}`)
	var c openai.ChatCompletion
	_ = json.Unmarshal(body, &c)
	if tk.Count != c.Usage.PromptTokens || len(tk.Tokens) != tk.Count || tk.MaxModelLen != 1024 {
		t.Errorf("got tokenize count %d (%d ids, max_model_len %d), want the chat's prompt_tokens %d", tk.Count, len(tk.Tokens), tk.MaxModelLen, c.Usage.PromptTokens)
	}
	code, body = post(t, hs.URL+"/tokenize", `{"prompt":"hello world"}`)
	if code != 200 || !strings.Contains(string(body), `"count":2`) {
		t.Errorf("got %d %s, want 2 tokens", code, body)
	}
	// An empty prompt is a completions error, not a /tokenize one.
	code, body = post(t, hs.URL+"/tokenize", `{"prompt":""}`)
	if code != 200 || !strings.Contains(string(body), `"count":0`) {
		t.Errorf("got %d %s, want 0 tokens", code, body)
	}
}

func TestVersion(t *testing.T) {
	_, hs := testServer(t, Config{})
	resp, err := http.Get(hs.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"version":"` + Version + `"}`; string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
	// Clients parse it as vLLM's (packaging.version, PEP 440) to gate
	// features: a release of the shapes the emulator emits (0.16 or
	// later: the message's reasoning field), the emulator named in its
	// local label.
	m := regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)\+[a-z0-9]+(?:\.[a-z0-9]+)*$`).FindStringSubmatch(Version)
	if m == nil {
		t.Fatalf("Version %q is not a PEP 440 release with a local label", Version)
	}
	if major, minor := m[1], m[2]; major == "0" && len(minor) < 2 || major == "0" && len(minor) == 2 && minor < "16" {
		t.Errorf("Version %q is older than the 0.16 shapes the emulator emits", Version)
	}
}

// TestResetPrefixCache resets the cache over HTTP: an AllBlocksCleared
// event is published, and a repeated prompt is no longer a cache hit.
func TestResetPrefixCache(t *testing.T) {
	ctx, endpoint, replay := listeningSub(t)
	_, hs := testServer(t, Config{KVEvents: KVEventsConfig{Endpoint: endpoint, ReplayEndpoint: replay}})
	prompt := `{"prompt":"` + strings.Repeat("reset me please ", 20) + `","max_tokens":1}`
	cached := func() int {
		_, body := post(t, hs.URL+"/v1/completions", prompt)
		var c openai.Completion
		_ = json.Unmarshal(body, &c)
		return c.Usage.CachedTokens()
	}
	cached()
	if got := cached(); got == 0 {
		t.Fatalf("got 0 cached tokens on a repeat, want > 0")
	}
	if code, body := post(t, hs.URL+"/reset_prefix_cache", ""); code != 200 {
		t.Fatalf("reset: got %d %s", code, body)
	}
	if got := cached(); got != 0 {
		t.Errorf("got %d cached tokens after a reset, want 0", got)
	}
	waitFor(t, "the AllBlocksCleared event, replayed", func() bool {
		return slices.ContainsFunc(replayEvents(t, ctx, replay, EncodingArray), func(e decodedEvent) bool { return e.Type == "AllBlocksCleared" })
	})
}

// TestTokenizeRequests checks POST /tokenize against vLLM's
// create_tokenize: it checks the model (404 for another), its request
// models have no generation options (a generation request's max_tokens,
// n or stream_options are extra keys, ignored), and a body its models
// reject is the 400 of vLLM's validation handler (type "Bad Request",
// param).
func TestTokenizeRequests(t *testing.T) {
	_, hs := testServer(t, Config{})
	for _, tc := range []struct {
		body   string
		status int
		typ    string
		param  any
	}{
		{`{"model":"other","prompt":"hello world"}`, 404, "NotFoundError", "model"},
		{`{"prompt":"hello world","max_tokens":0,"n":2,"stream_options":{"include_usage":true}}`, 200, "", nil},
		{`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, 200, "", nil},
		{`{"prompt":5}`, 400, typeValidation, "body.prompt"},
		// A content part vLLM refuses is refused after the model check.
		{`{"model":"other","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, 404, "NotFoundError", "model"},
		{`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, 400, "BadRequestError", nil},
	} {
		code, body := post(t, hs.URL+"/tokenize", tc.body)
		if code != tc.status {
			t.Errorf("%s: got status %d (%s), want %d", tc.body, code, body, tc.status)
			continue
		}
		if code == 200 {
			continue
		}
		var e struct {
			Error struct {
				Type  string `json:"type"`
				Param any    `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != tc.typ || e.Error.Param != tc.param {
			t.Errorf("%s: got %s, want type %q param %v", tc.body, body, tc.typ, tc.param)
		}
	}
}

// TestContentPartsAsText: the content parts vLLM reads as text (plain
// strings, "text", "input_text" and "output_text" by their text, "refusal"
// and "thinking" by the member of that name, "tool_reference" by its name) give a chat the prompt of
// their texts joined with "\n", those with empty, null or no text dropped
// (chat_utils.py, _parse_chat_message_content_part).
func TestContentPartsAsText(t *testing.T) {
	_, hs := testServer(t, Config{})
	tokens := func(content string) string {
		t.Helper()
		code, body := post(t, hs.URL+"/tokenize", `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":`+content+`}]}`)
		if code != 200 {
			t.Fatalf("tokenize %s: got status %d (%s), want 200", content, code, body)
		}
		var tk struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(body, &tk); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(tk.Tokens)
	}
	want := tokens(`"alpha\nbeta"`)
	for _, parts := range []string{
		`[{"type":"text","text":"alpha"},{"type":"text","text":"beta"}]`,
		`[{"type":"input_text","text":"alpha"},{"type":"output_text","text":"beta"}]`,
		`["alpha",{"type":"refusal","refusal":"beta"}]`,
		`[{"type":"tool_reference","name":"alpha"},{"type":"tool_reference"},{"type":"text","text":"beta"}]`,
		`[{"type":"thinking","thinking":"alpha","closed":true},{"type":"text","text":null},{"type":"input_text","text":""},{"type":"refusal"},"",{"type":"text","text":"beta"}]`,
	} {
		if got := tokens(parts); got != want {
			t.Errorf("content %s: got tokens %s, want %s (those of \"alpha\\nbeta\")", parts, got, want)
		}
	}
	code, body := post(t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]},{"role":"user","content":["again"]}],"max_tokens":2}`)
	if code != 200 {
		t.Errorf("chat with input_text, refusal and string parts: got status %d (%s), want 200", code, body)
	}
}

// TestDetokenize checks POST /detokenize against vLLM's create_detokenize
// and DetokenizeRequest: the ids' text with their special tokens, the
// model checked, its request model's errors, FastAPI's 405 for another
// method.
func TestDetokenize(t *testing.T) {
	// A HuggingFace tokenizer, whose decoding gives the text back (the
	// built-in one's words are made up), with a BOS and a chat template.
	tj, err := os.ReadFile("../tokenizer/testdata/tiny/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]string{"bos_token": "<s>", "eos_token": "</s>",
		"chat_template": `{% for m in messages %}<|user|>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}`})
	tiny, err := tokenizer.Load(tj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, hs := testServer(t, Config{Tokenizer: tiny})
	_, body := post(t, hs.URL+"/tokenize", `{"prompt":"hello world, again"}`)
	var tk struct{ Tokens []uint32 }
	if err := json.Unmarshal(body, &tk); err != nil || len(tk.Tokens) == 0 {
		t.Fatalf("tokenize: got %s: %v", body, err)
	}
	ids, _ := json.Marshal(tk.Tokens)
	_, chat := post(t, hs.URL+"/tokenize", `{"messages":[{"role":"user","content":"hi"}]}`)
	if err := json.Unmarshal(chat, &tk); err != nil {
		t.Fatal(err)
	}
	chatIDs, _ := json.Marshal(tk.Tokens)
	const bad = typeValidation
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"round trip, BOS kept", `{"tokens":` + string(ids) + `}`, 200, `{"prompt":"<s>hello world, again"}`},
		{"special tokens kept", `{"model":"tiny","tokens":` + string(chatIDs) + `}`, 200, `{"prompt":"<|user|>user: hi</s>"}`},
		{"empty", `{"tokens":[],"model":null}`, 200, `{"prompt":""}`},
		{"whole floats, unknown ids dropped", `{"tokens":[` + strings.Trim(string(ids), "[]") + `,4294967296,1e3]}`, 200, ""},
		{"other model", `{"model":"other","tokens":[1]}`, 404, errBodyStatus("The model `other` does not exist.", "NotFoundError", "model", 404)},
		{"no tokens", `{"model":"tiny"}`, 400, errBody("1 validation error for DetokenizeRequest\ntokens\n  Field required", bad, "body.tokens")},
		{"tokens not a list", `{"tokens":"1 2"}`, 400, errBody("1 validation error for DetokenizeRequest\ntokens\n  Input should be a valid list", bad, "body.tokens")},
		{"negative id", `{"tokens":[1,-1]}`, 400, errBody("1 validation error for DetokenizeRequest\ntokens.1\n  Input should be greater than or equal to 0", bad, "body.tokens.1")},
		{"string id", `{"tokens":["a"]}`, 400, errBody("1 validation error for DetokenizeRequest\ntokens.0\n  Input should be a valid integer", bad, "body.tokens.0")},
		{"model a number", `{"model":1,"tokens":[]}`, 400, errBody("1 validation error for DetokenizeRequest\nmodel\n  Input should be a valid string", bad, "body.model")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, got := post(t, hs.URL+"/detokenize", tc.body)
			if code != tc.status {
				t.Fatalf("got status %d (%s), want %d", code, got, tc.status)
			}
			want := tc.want
			if want == "" {
				// 2^32 is dropped, 1000 is an id of tiny's vocabulary.
				want = `{"prompt":"<s>hello world, again` + tiny.Decode([]uint32{1000}) + `"}`
			}
			if canonical(t, got) != canonical(t, []byte(want)) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
	resp, err := http.Get(hs.URL + "/detokenize")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || string(b) != `{"detail":"Method Not Allowed"}` || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /detokenize: got %d %s Allow %q, want FastAPI's 405", resp.StatusCode, b, resp.Header.Get("Allow"))
	}
}

// FuzzParseDetokenize: any body is a request or an error, never a panic.
func FuzzParseDetokenize(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2,3]}`, `{"model":"m","tokens":[]}`, `{"tokens":[1.0,-1]}`, `{"tokens":null}`, `null`, `[1]`, `{"tokens":[9223372036854775807,1e300]}`, "\xef\xbb\xbf{}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r, aerr := parseDetokenize([]byte(body))
		if (r == nil) == (aerr == nil) {
			t.Fatalf("body %q: got request %v and error %v, want one", body, r, aerr)
		}
	})
}

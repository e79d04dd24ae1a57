package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// testdata/tiny is a hand-made byte-level BPE tokenizer.json (GPT-2 style
// ByteLevel pre-tokenizer with its regex, a BOS TemplateProcessing, added
// tokens with rstrip, lstrip and single_word) whose ids can be worked out by
// hand: bytes are ids 0-255, then the merges he=256 ll=257 hell=258 hello=259
// Ġw=260 or=261 Ġwor=262 ld=263 Ġworld=264 ĠĠ=265 ĠĠĠĠ=266 12=267 123=268, and
// the added tokens <s>=300 </s>=301 <|user|>=302 [MASK]=303.
func loadTiny(tb testing.TB) *HF {
	tb.Helper()
	t, err := LoadDir("testdata/tiny")
	if err != nil {
		tb.Fatalf("LoadDir(testdata/tiny): %v", err)
	}
	return t
}

func TestTinyEncode(t *testing.T) {
	tok := loadTiny(t)
	tests := []struct {
		text string
		want []uint32
	}{
		{"", []uint32{}},
		{"hello world", []uint32{259, 264}},
		{"hello  world", []uint32{259, 32, 264}},
		{"hello     world", []uint32{259, 266, 264}},
		{"123456", []uint32{268, '4', '5', '6'}},
		{"<s>hello</s>", []uint32{300, 259, 301}},
		{"<|user|>   hello", []uint32{302, 259}},                 // rstrip eats the spaces
		{"a [MASK]", []uint32{'a', 303}},                         // lstrip eats the space
		{"a[MASK]", []uint32{'a', '[', 'M', 'A', 'S', 'K', ']'}}, // single_word: not a match
		{"é", []uint32{0xC3, 0xA9}},
		{"<s", []uint32{'<', 's'}},
	}
	for _, tt := range tests {
		got := tok.Encode(tt.text)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
	if got, want := tok.EncodeAddSpecial("hello"), []uint32{300, 259}; !slices.Equal(got, want) {
		t.Errorf("EncodeAddSpecial(hello) = %v, want %v", got, want)
	}
	if got, want := tok.Decode([]uint32{300, 259, 264, 32, 999999}), "<s>hello world "; got != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
	if id, ok := tok.EOS(); !ok || id != 301 {
		t.Errorf("EOS() = %d, %v, want 301, true", id, ok)
	}
	if id, ok := tok.TokenID("Ġworld"); !ok || id != 264 {
		t.Errorf("TokenID(Ġworld) = %d, %v, want 264, true", id, ok)
	}
	if got := tok.VocabSize(); got != 304 {
		t.Errorf("VocabSize() = %d, want 304", got)
	}
	if got, want := tok.SpecialTokens(), []string{"</s>", "<s>", "<|user|>", "[MASK]"}; !slices.Equal(got, want) {
		t.Errorf("SpecialTokens() = %q, want %q", got, want)
	}
}

func TestTinyChatTemplate(t *testing.T) {
	tok := loadTiny(t)
	tmpl, err := tok.ChatTemplate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render([]Message{{Role: "user", Content: "  hi  "}}, ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|user|>user: hi</s>\n<|user|>assistant:"; got != want {
		t.Errorf("Render = %q, want %q", got, want)
	}
	if _, err := NewChatTemplate("{% for %}", "", ""); err == nil {
		t.Errorf("NewChatTemplate(bad) = nil error, want an error")
	}
	bad, err := NewChatTemplate("{{ raise_exception('no system role') }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Render(nil, ChatOptions{}); err == nil || !strings.Contains(err.Error(), "no system role") {
		t.Errorf("Render(raise_exception) error = %v, want the template's message", err)
	}
}

func TestLoadErrors(t *testing.T) {
	good, err := os.ReadFile("testdata/tiny/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, json, wantErr string
	}{
		{"not json", `{`, "tokenizer.json"},
		{"wordpiece", `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, "WordPiece"},
		{"empty vocab", `{"model": {"type": "BPE", "vocab": {}}}`, "empty vocab"},
		{"byte fallback", `{"model": {"type": "BPE", "vocab": {"a": 0}, "byte_fallback": true}}`, "byte_fallback"},
		{"bad merge", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`, "not in vocab"},
		{"merge without space", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}}`, "no space"},
		{"normalizer", `{"normalizer": {"type": "Precompiled"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`, "Precompiled"},
		{"pre-tokenizer", `{"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`, "Metaspace"},
		{"split behaviour", `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`, "Removed"},
		{"bad regex", `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`, "pattern"},
		{"decoder", `{"decoder": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`, "Metaspace"},
		{"post-processor", `{"post_processor": {"type": "BertProcessing"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`, "BertProcessing"},
		{"empty added", `{"added_tokens": [{"id": 1, "content": ""}], "model": {"type": "BPE", "vocab": {"a": 0}}}`, "empty content"},
		// Without a ByteLevel pre-tokenizer HuggingFace runs the BPE on the
		// text's characters, not on its bytes' byte-level runes: "a b" is
		// [a, b] there (no token for a raw space), [a, Ġ, b] here.
		{"no ByteLevel", `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2}}}`, "ByteLevel"},
		{"Split without ByteLevel", `{"pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2}}}`, "ByteLevel"},
		// A Split after ByteLevel sees the byte-level runes (Ġ, not " ").
		{"Split after ByteLevel", `{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "use_regex": false}, {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}]}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2}}}`, "after ByteLevel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load([]byte(tt.json), nil)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Load error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
	if _, err := Load(good, []byte(`{"chat_template": 3`)); err == nil {
		t.Errorf("Load(bad config) = nil error, want an error")
	}
	if tok, err := LoadDir("testdata/tiny/tokenizer.json"); err != nil {
		t.Errorf("LoadDir(file) error = %v", err)
	} else if _, err := tok.ChatTemplate(); err != nil {
		t.Errorf("LoadDir(file): tokenizer_config.json beside it not read: %v", err)
	}
	if _, err := LoadDir("testdata/does-not-exist"); err == nil {
		t.Errorf("LoadDir(missing) = nil error, want an error")
	}
}

func FuzzLoad(f *testing.F) {
	good, err := os.ReadFile("testdata/tiny/tokenizer.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, "hello world")
	f.Add([]byte(`{"pre_tokenizer": {"type": "ByteLevel", "use_regex": false}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}, "added_tokens": [{"id": 3, "content": "x", "lstrip": true, "rstrip": true}]}`), "ab xab")
	f.Add([]byte(`{"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}, "model": {"vocab": {"a": 0}}}`), "A a")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		tok, err := Load(data, nil)
		if err != nil {
			return
		}
		ids := tok.Encode(text)
		_ = tok.Decode(ids)
		_ = tok.EncodeAddSpecial(text)
	})
}

func FuzzEncodeTiny(f *testing.F) {
	for _, s := range []string{"hello world", "<s>x</s>", "a [MASK] b", "  \n\t 123 é 🙂 \xff"} {
		f.Add(s)
	}
	tok := loadTiny(f)
	cache := NewCache(tok, CacheConfig{MaxTokens: 64, MinSegmentBytes: 1})
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if int(id) >= tok.VocabSize() {
				t.Fatalf("id %d out of range", id)
			}
		}
		if got := cache.Encode(s); !slices.Equal(got, ids) {
			t.Fatalf("cached Encode(%q) = %v, want %v", s, got, ids)
		}
		if strings.Contains(s, "<|user|>") || strings.Contains(s, "[MASK]") {
			return // these strip whitespace around them
		}
		if got := tok.Decode(ids); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	})
}

func TestRenderChat(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "hi"}}
	tiny := loadTiny(t)
	noTemplate, err := Load(mustRead(t, "testdata/tiny/tokenizer.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	badTemplate, err := Load(mustRead(t, "testdata/tiny/tokenizer.json"), []byte(`{"chat_template": "{% if %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		tok     Tokenizer
		want    string
		wantErr bool
	}{
		{"builtin", Builtin(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false},
		{"hf template", tiny, "<|user|>user: hi</s>\n<|user|>assistant:", false},
		{"cache", NewCache(tiny, CacheConfig{}), "<|user|>user: hi</s>\n<|user|>assistant:", false},
		{"hf without template", noTemplate, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false},
		{"hf with a broken template", badTemplate, "", true},
	}
	for _, tt := range tests {
		got, err := RenderChat(tt.tok, msgs, true)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: RenderChat = %q, %v; want %q, error %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
	if _, ok := Builtin().(EOSer).EOS(); !ok {
		t.Errorf("Builtin has no EOS")
	}
	if got := Builtin().(Vocab).VocabSize(); got != BuiltinVocabSize {
		t.Errorf("Builtin VocabSize = %d, want %d", got, BuiltinVocabSize)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestValueFromJSON(t *testing.T) {
	tmpl, err := NewChatTemplate("{{ x | tojson }}|{% for k in x %}{{ k }},{% endfor %}|{{ x.b[1] + 1 }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(nil, ChatOptions{JSONVars: map[string]json.RawMessage{"x": json.RawMessage(`{"z": null, "b": [true, 41, 2.5, "é"], "a": {}}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"z": null, "b": [true, 41, 2.5, "é"], "a": {}}|z,b,a,|42`; got != want {
		t.Errorf("render = %q, want %q", got, want)
	}
	for _, bad := range []string{``, `{`, `[1,]`, `{"a" 1}`, `1 2`, strings.Repeat("[", 300) + strings.Repeat("]", 300)} {
		if _, err := valueFromJSON([]byte(bad)); err == nil {
			t.Errorf("valueFromJSON(%q) = nil error, want an error", bad)
		}
	}
	if _, err := tmpl.RenderJSON(json.RawMessage(`{"role": "user"}`), ChatOptions{}); err == nil {
		t.Errorf("RenderJSON(object) = nil error, want an error")
	}
}

func FuzzValueFromJSON(f *testing.F) {
	f.Add([]byte(`[{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": 2}}}]}]`))
	f.Add([]byte(`{"a": [1, 2.5e3, -0, "x\u00e9", null, true]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := valueFromJSON(data); err == nil && !json.Valid(data) {
			t.Fatalf("valueFromJSON accepted invalid JSON %q", data)
		}
	})
}

func TestVocabMergesJSON(t *testing.T) {
	var v hfVocab
	if err := json.Unmarshal([]byte(` { "a" : 0, "\u0120b\"": 1 ,"ab":2}`), &v); err != nil {
		t.Fatal(err)
	}
	if len(v) != 3 || v["Ġb\""] != 1 || v["ab"] != 2 {
		t.Errorf("vocab = %v", v)
	}
	for _, in := range []string{`[["a", "b"], ["Ġ\u0041", "c"]]`, `["a b", "ĠA c"]`} {
		var m hfMerges
		if err := json.Unmarshal([]byte(in), &m); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if want := (hfMerges{{"a", "b"}, {"ĠA", "c"}}); !slices.Equal(m, want) {
			t.Errorf("merges(%s) = %q, want %q", in, m, want)
		}
	}
	for _, bad := range []string{`{"a": -1}`, `{"a": 1.5}`, `{"a": 99999999999}`, `{"a": "1"}`, `[]`} {
		var v hfVocab
		if err := json.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("vocab %s: accepted, want an error", bad)
		}
	}
	for _, bad := range []string{`[1]`, `[["a"]]`, `["ab"]`, `[["a", 1]]`, `[["a", "b", "c"]]`, `{}`} {
		var m hfMerges
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("merges %s: accepted, want an error", bad)
		}
	}
}

func TestLlamaClassAddsBOS(t *testing.T) {
	tj := mustRead(t, "testdata/tiny/tokenizer.json")
	tests := []struct {
		config string
		want   []uint32
	}{
		{`{"bos_token": "<s>", "eos_token": "</s>"}`, []uint32{300, 259}}, // tokenizer.json's TemplateProcessing
		{`{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}`, []uint32{300, 259}},
		{`{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false}`, []uint32{259}},
		{`{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "add_eos_token": true}`, []uint32{300, 259, 301}},
	}
	for _, tt := range tests {
		tok, err := Load(tj, []byte(tt.config))
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.EncodeAddSpecial("hello"); !slices.Equal(got, tt.want) {
			t.Errorf("config %s: EncodeAddSpecial(hello) = %v, want %v", tt.config, got, tt.want)
		}
	}
}

// tinyWith loads testdata/tiny/tokenizer.json after edit changes its JSON.
func tinyWith(t *testing.T, edit func(map[string]any)) *HF {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(mustRead(t, "testdata/tiny/tokenizer.json"), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Load(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// addToken appends an added token to a tokenizer.json's added_tokens.
func addToken(m map[string]any, id int, content string, normalized bool) {
	m["added_tokens"] = append(m["added_tokens"].([]any), map[string]any{
		"id": id, "content": content, "normalized": normalized, "special": false,
		"single_word": false, "lstrip": false, "rstrip": false,
	})
}

// TestAddedSingleWord checks single_word tokens ([MASK] in testdata/tiny,
// with lstrip) as HuggingFace's AddedVocabulary: a match is rejected when a
// word character (the regex \w: letters, marks, decimal digits, connector
// punctuation, joiners) touches it, so ² (a number but not a digit) does not
// stop it; and a rejected match is skipped whole, no shorter or overlapping
// token is looked for inside it. The expectations are HuggingFace tokenizers
// 0.23.2's, with its ids.
func TestAddedSingleWord(t *testing.T) {
	tok := tinyWith(t, func(m map[string]any) { addToken(m, 304, "SK", false) })
	tests := []struct {
		text string
		want []uint32
	}{
		{"x²[MASK]", []uint32{'x', 0xC2, 0xB2, 303}},
		{"x [MASK]²", []uint32{'x', 303, 0xC2, 0xB2}},
		{"x\u0301 [MASK]", []uint32{'x', 0xCC, 0x81, 303}},
		{"x‿[MASK]", []uint32{'x', 0xE2, 0x80, 0xBF, '[', 'M', 'A', 'S', 'K', ']'}},
		{"x\u200d[MASK]", []uint32{'x', 0xE2, 0x80, 0x8D, '[', 'M', 'A', 'S', 'K', ']'}},
		{"Ⅻ[MASK]", []uint32{0xE2, 0x85, 0xAB, '[', 'M', 'A', 'S', 'K', ']'}},
		{"١[MASK]", []uint32{0xD9, 0xA1, '[', 'M', 'A', 'S', 'K', ']'}},
		{"x_[MASK]", []uint32{'x', '_', '[', 'M', 'A', 'S', 'K', ']'}},
		{"a[MASK]", []uint32{'a', '[', 'M', 'A', 'S', 'K', ']'}},
		{"a [MASK]b", []uint32{'a', ' ', '[', 'M', 'A', 'S', 'K', ']', 'b'}},
		{"SK", []uint32{304}},
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestAddedNormalized checks that an added token marked normalized is
// matched in the normalized text by its normalized content, as
// HuggingFace's AddedVocabulary does: with a Lowercase normalizer, a
// normalized "<|User|>" matches "<|USER|>" and "<|User|>" (the raw-matched
// <|user|> of testdata/tiny is found first in the raw text). The
// expectations are HuggingFace tokenizers 0.23.2's, with its ids.
func TestAddedNormalized(t *testing.T) {
	tok := tinyWith(t, func(m map[string]any) {
		m["normalizer"] = map[string]any{"type": "Lowercase"}
		addToken(m, 304, "<|User|>", true)
	})
	tests := []struct {
		text string
		want []uint32
	}{
		{"<|User|>", []uint32{304}},
		{"<|user|>", []uint32{302}},
		{"<|USER|>hi", []uint32{304, 'h', 'i'}},
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
	if id, ok := tok.TokenID("<|User|>"); !ok || id != 304 {
		t.Errorf("TokenID(<|User|>) = %d, %v, want 304, true", id, ok)
	}
}

// TestLowercaseNormalizer checks the Lowercase normalizer against
// HuggingFace's, which lowercases each character with Rust's
// char::to_lowercase: İ (U+0130) becomes "i" and a combining dot above
// (U+0307), not Go's single "i"; final sigma is not special-cased. The
// expectations are HuggingFace tokenizers 0.23.2's.
func TestLowercaseNormalizer(t *testing.T) {
	tok := tinyWith(t, func(m map[string]any) { m["normalizer"] = map[string]any{"type": "Lowercase"} })
	tests := []struct {
		text string
		want []uint32
	}{
		{"İ", []uint32{'i', 0xCC, 0x87}},
		{"hİ <|user|>", []uint32{'h', 'i', 0xCC, 0x87, ' ', 302}},
		{"ΣΑΣ", []uint32{0xCF, 0x83, 0xCE, 0xB1, 0xCF, 0x83}},
		{"ǅ", []uint32{0xC7, 0x86}},
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestDuplicateMerges checks that a merge listed twice takes the rank of its
// last occurrence, as in HuggingFace's BPE (its merge map is built in list
// order, later entries replacing earlier ones): with the merges 1 2, 12 3,
// 2 3, 1 2 the pair (2, 3) merges before (1, 2). The expectation is
// HuggingFace tokenizers 0.23.2's.
func TestDuplicateMerges(t *testing.T) {
	tok := tinyWith(t, func(m map[string]any) {
		model := m["model"].(map[string]any)
		model["vocab"].(map[string]any)["23"] = 304
		model["merges"] = append(model["merges"].([]any), "2 3", "1 2")
	})
	if got, want := tok.Encode("123"), []uint32{'1', 304}; !slices.Equal(got, want) {
		t.Errorf("Encode(123) = %v, want %v", got, want)
	}
}

// TestAddedNormalizedWithoutNormalizer checks the order in which added
// tokens are matched when tokenizer.json has no normalizer: as
// HuggingFace's AddedVocabulary does, the tokens not marked normalized are
// cut out of the text first, and those marked normalized are looked for
// only in the text between them, so a normalized "qr" loses "qrs" to a
// raw "rs" although it starts first. The expectations are HuggingFace
// tokenizers 0.23.2's (which numbers the two tokens 273 and 274).
func TestAddedNormalizedWithoutNormalizer(t *testing.T) {
	tok := tinyWith(t, func(m map[string]any) {
		addToken(m, 304, "qr", true)
		addToken(m, 305, "rs", false)
	})
	const qr, rs = 304, 305
	tests := []struct {
		text string
		want []uint32
	}{
		{"qrs", []uint32{'q', rs}},
		{"qr", []uint32{qr}},
		{"xqrsqr", []uint32{'x', 'q', rs, qr}},
		{"qqrr", []uint32{'q', qr, 'r'}},
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

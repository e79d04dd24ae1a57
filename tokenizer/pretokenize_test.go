package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func splitPieces(s splitter, text string) []string {
	var out []string
	start := 0
	for _, end := range s.appendSplits(nil, text) {
		out = append(out, text[start:end])
		start = end
	}
	return out
}

func TestLlamaSplitter(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"I'm  DON'T they'LL", []string{"I", "'m", " ", " DON", "'T", " they", "'LL"}},
		{"12345 678", []string{"123", "45", " ", "678"}},
		{"a   b", []string{"a", "  ", " b"}},
		{"a  \n\n  b", []string{"a", "  \n\n", " ", " b"}},
		{"x  ", []string{"x", "  "}},
		{" !!\n\nok", []string{" !!\n\n", "ok"}},
		{"(hi)", []string{"(hi", ")"}},
		{"\thello", []string{"\thello"}},
		{"\nhello", []string{"\n", "hello"}},
		{"'hello", []string{"'hello"}},
		{"日本語 テキスト", []string{"日本語", " テキスト"}},
		{"e\u0301t", []string{"e", "\u0301t"}},
		{"🙂🙂 ok", []string{"🙂🙂", " ok"}},
		{"\xff\xfeab", []string{"\xff\xfe", "ab"}},
	}
	sp := llamaSplitter{maxDigits: 3}
	for _, tt := range tests {
		if got := splitPieces(sp, tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("split(%q) = %q, want %q", tt.text, got, tt.want)
		}
	}
}

// randomPretokText draws from the characters where the cl100k rules differ.
func randomPretokText(r *rand.Rand) string {
	atoms := []string{"a", "Z", "é", "日", "ß", "ſ", "K", "1", "²", "Ⅻ", "٣", " ", " ", "  ", "\t", "\n", "\r", "\r\n",
		"\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\u200b", "\u0301", "'", "'s", "'S", "'ll", "'Re", "'ve", "'x",
		".", ",", "!", "(", ")", "🙂", "👍🏽", "$", "_", "-", "=", "<|", "|>"}
	var b strings.Builder
	for range 1 + r.IntN(24) {
		b.WriteString(atoms[r.IntN(len(atoms))])
	}
	return b.String()
}

// TestLlamaSplitterMatchesRegexp2 checks the hand-written splitter against a
// real backtracking regex engine running the same pattern.
func TestLlamaSplitterMatchesRegexp2(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		digits  int
	}{{patternLlama3, 3}, {patternQwen2, 1}} {
		re, err := newRegexSplitter(tc.pattern)
		if err != nil {
			t.Fatal(err)
		}
		sp := llamaSplitter{maxDigits: tc.digits}
		r := rand.New(rand.NewPCG(3, uint64(tc.digits)))
		for range 5000 {
			text := randomPretokText(r)
			if got, want := splitPieces(sp, text), splitPieces(re, text); !slices.Equal(got, want) {
				t.Fatalf("digits %d: split(%q)\n got  %q\n want %q (regexp2)", tc.digits, text, got, want)
			}
		}
	}
}

func FuzzLlamaSplitter(f *testing.F) {
	f.Add("Hello, world! I'm 12345 \n\n  x")
	f.Add("\u00a0\u0085 ſ'S 日本 🙂")
	re, err := newRegexSplitter(patternLlama3)
	if err != nil {
		f.Fatal(err)
	}
	sp := llamaSplitter{maxDigits: 3}
	f.Fuzz(func(t *testing.T, s string) {
		got := splitPieces(sp, s)
		if strings.Join(got, "") != s {
			t.Fatalf("pieces %q do not cover %q", got, s)
		}
		if !utf8.ValidString(s) {
			return // regexp2 decodes invalid bytes differently
		}
		if strings.ContainsFunc(s, func(r rune) bool {
			return unicode.Is(unicode16Letters, r) || unicode.Is(unicode16Numbers, r)
		}) {
			return // regexp2 has Go's Unicode 15.0 classes (TestLlamaSplitterUnicode16)
		}
		if want := splitPieces(re, s); !slices.Equal(got, want) {
			t.Fatalf("split(%q)\n got  %q\n want %q (regexp2)", s, got, want)
		}
	})
}

// TestBPESmallMatchesHeap checks the allocation-free BPE loop for short words
// against the heap-based one on every pre-token of the reference corpus.
func TestBPESmallMatchesHeap(t *testing.T) {
	for _, model := range refModels {
		t.Run(model, func(t *testing.T) {
			tok := loadRef(t, model)
			exp := loadExpected(t, model)
			n := 0
			for _, c := range exp.Texts {
				tok.added.split(c.Text, func(seg string, a *hfAddedToken) {
					if a != nil {
						return
					}
					for _, w := range splitPieces(tok.splitters[0], seg) {
						if len(w) > smallWord {
							continue
						}
						n++
						if got, want := tok.model.encodeSmall(nil, w), tok.model.encodeHeap(nil, w); !slices.Equal(got, want) {
							t.Fatalf("word %q: small %v, heap %v", w, got, want)
						}
					}
				})
			}
			if n < 1000 {
				t.Errorf("checked %d words, want >= 1000", n)
			}
		})
	}
}

package tokenizer

import (
	"slices"
	"testing"
)

// TestLlamaSplitterUnicode16: HuggingFace's tokenizers (the Rust library
// vLLM runs; 0.23 matches \p{L} and \p{N} with Oniguruma's Unicode 16.0
// tables) classes the letters and digits added in Unicode 15.1 and 16.0
// (CJK Extension I, Egyptian hieroglyphs Extension A, Garay, Kirat Rai,
// Ol Onal, Sunuwar, Tulu-Tigalari...) as letters and numbers; Go's
// unicode package (15.0.0) does not know them, so the splitter took them
// for punctuation and cut the text elsewhere than the engine: "𐵐's" was
// "𐵐'" and "s", and the token ids, hence the block hashes, differed. The
// pieces below are the reference's (PreTokenizer.preTokenizeString of the
// Llama 3.1 and Qwen3 tokenizers, tokenizers 0.23.2).
func TestLlamaSplitterUnicode16(t *testing.T) {
	tests := []struct {
		text        string
		llama, qwen []string
	}{
		{"\U00010D50's", []string{"\U00010D50", "'s"}, nil},                                                         // Garay letter, a contraction
		{" \U00010D40\U00010D40", []string{" ", "\U00010D40\U00010D40"}, []string{" ", "\U00010D40", "\U00010D40"}}, // Garay digits
		{"a\U0002EBF0b", []string{"a\U0002EBF0b"}, nil},                                                             // CJK Extension I (Unicode 15.1)
		{"x\U00013460y", []string{"x\U00013460y"}, nil},                                                             // Egyptian hieroglyphs Extension A
		{"\U0001E5F1\U0001E5F2\U0001E5F3\U0001E5F4", []string{"\U0001E5F1\U0001E5F2\U0001E5F3", "\U0001E5F4"},
			[]string{"\U0001E5F1", "\U0001E5F2", "\U0001E5F3", "\U0001E5F4"}}, // Ol Onal digits
		{"\uA7CB\u1C89", []string{"\uA7CB\u1C89"}, nil}, // Latin and Cyrillic capitals
		{" \U00011380", []string{" \U00011380"}, nil},   // Tulu-Tigalari letter
	}
	for _, tt := range tests {
		if tt.qwen == nil {
			tt.qwen = tt.llama
		}
		if got := splitPieces(llamaSplitter{maxDigits: 3}, tt.text); !slices.Equal(got, tt.llama) {
			t.Errorf("Llama 3 split(%+q) = %+q, want %+q", tt.text, got, tt.llama)
		}
		if got := splitPieces(llamaSplitter{maxDigits: 1}, tt.text); !slices.Equal(got, tt.qwen) {
			t.Errorf("Qwen2 split(%+q) = %+q, want %+q", tt.text, got, tt.qwen)
		}
	}
}

// TestHFUnicode16 checks the ids of texts with Unicode 16.0 letters and
// digits against the reference (tokenizers 0.23.2; see
// TestLlamaSplitterUnicode16).
func TestHFUnicode16(t *testing.T) {
	tests := []struct {
		model, text string
		want        []uint32
	}{
		{"qwen3", "\U00010D50's", []uint32{123934, 113, 238, 594}},
		{"llama3_1", "\U00010D50's", []uint32{172, 238, 113, 238, 596}},
		{"llama3_1", " \U00010D40\U00010D40", []uint32{220, 172, 238, 113, 222, 172, 238, 113, 222}},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			tok := loadRef(t, tt.model)
			if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
				t.Errorf("Encode(%+q) = %v, want %v", tt.text, got, tt.want)
			}
		})
	}
}

// TestAddedSingleWordUnicode16: HuggingFace's AddedVocabulary takes a
// single_word token only where no word character (\w of Rust's regex
// crate, Unicode 16.0) touches it; isWordRune had Go's Unicode 15.0
// classes, so a letter, digit or mark new in Unicode 15.1 or 16.0 next to
// the token let it match where the reference does not. The expectations
// are tokenizers 0.23.2's on testdata/tiny.
func TestAddedSingleWordUnicode16(t *testing.T) {
	tok := loadTiny(t)
	mask := []uint32{'[', 'M', 'A', 'S', 'K', ']'}
	tests := []struct {
		text string
		want []uint32
	}{
		{"\U00010D50[MASK]", append([]uint32{0xF0, 0x90, 0xB5, 0x90}, mask...)},       // Garay letter
		{"[MASK]\U00010D40", append(slices.Clone(mask), 0xF0, 0x90, 0xB5, 0x80)},      // Garay digit
		{"x\U000113B8[MASK]", append([]uint32{'x', 0xF0, 0x91, 0x8E, 0xB8}, mask...)}, // Tulu-Tigalari vowel sign
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%+q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

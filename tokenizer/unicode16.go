package tokenizer

import "unicode"

// Go's unicode package has the tables of Unicode 15.0.0; HuggingFace's
// tokenizers (0.23, the library vLLM runs) matches the pre-tokenizer's
// \p{L} and \p{N} with Oniguruma's, Unicode 16.0.0. The letters and digits
// added in Unicode 15.1 and 16.0 are here, so that the cl100k splitter
// (ccAt) classes them as the engine does. They were read off the
// reference: every code point that Node's ICU (Unicode 17) has as a letter
// or number and Go has not, put to the Qwen3 pre-tokenizer of tokenizers
// 0.23.2 between two letters (one piece for a letter, three for a digit,
// two for anything else: the Unicode 17 additions, which it does not know
// either). TestLlamaSplitterUnicode16 checks a few against it.
var (
	// unicode16Letters: CJK Extension I (15.1); Latin, Cyrillic, Todhri,
	// Garay, Arabic Extended-C, Tulu-Tigalari, Sunuwar, Egyptian
	// hieroglyphs Extension A, Gurung Khema, Kirat Rai, Khitan and Ol Onal
	// letters (16.0).
	unicode16Letters = &unicode.RangeTable{
		R16: []unicode.Range16{
			{0x1C89, 0x1C8A, 1},
			{0xA7CB, 0xA7CD, 1},
			{0xA7DA, 0xA7DC, 1},
		},
		R32: []unicode.Range32{
			{0x105C0, 0x105F3, 1},
			{0x10D4A, 0x10D65, 1},
			{0x10D6F, 0x10D85, 1},
			{0x10EC2, 0x10EC4, 1},
			{0x11380, 0x11389, 1},
			{0x1138B, 0x1138B, 1},
			{0x1138E, 0x1138E, 1},
			{0x11390, 0x113B5, 1},
			{0x113B7, 0x113B7, 1},
			{0x113D1, 0x113D1, 1},
			{0x113D3, 0x113D3, 1},
			{0x11BC0, 0x11BE0, 1},
			{0x13460, 0x143FA, 1},
			{0x16100, 0x1611D, 1},
			{0x16D40, 0x16D6C, 1},
			{0x18CFF, 0x18CFF, 1},
			{0x1E5D0, 0x1E5ED, 1},
			{0x1E5F0, 0x1E5F0, 1},
			{0x2EBF0, 0x2EE5D, 1},
		},
	}
	// unicode16Numbers: the digits of Garay, Myanmar Extended-C, Sunuwar,
	// Gurung Khema, Kirat Rai, Ol Onal and the outlined digits of Symbols
	// for Legacy Computing Supplement (16.0).
	unicode16Numbers = &unicode.RangeTable{
		R32: []unicode.Range32{
			{0x10D40, 0x10D49, 1},
			{0x116D0, 0x116E3, 1},
			{0x11BF0, 0x11BF9, 1},
			{0x16130, 0x16139, 1},
			{0x16D70, 0x16D79, 1},
			{0x1CCF0, 0x1CCF9, 1},
			{0x1E5F1, 0x1E5FA, 1},
		},
	}
	// unicode16Word: the word characters (\w of Rust's regex crate:
	// Alphabetic, marks, decimal digits, connector punctuation, joiners)
	// added in Unicode 15.1 and 16.0, for isWordRune; read off the
	// reference likewise (a single_word added token after each candidate).
	unicode16Word = &unicode.RangeTable{
		R16: []unicode.Range16{
			{0x0897, 0x0897, 1},
			{0x1C89, 0x1C8A, 1},
			{0xA7CB, 0xA7CD, 1},
			{0xA7DA, 0xA7DC, 1},
		},
		R32: []unicode.Range32{
			{0x105C0, 0x105F3, 1},
			{0x10D40, 0x10D65, 1},
			{0x10D69, 0x10D6D, 1},
			{0x10D6F, 0x10D85, 1},
			{0x10EC2, 0x10EC4, 1},
			{0x10EFC, 0x10EFC, 1},
			{0x11380, 0x11389, 1},
			{0x1138B, 0x1138B, 1},
			{0x1138E, 0x1138E, 1},
			{0x11390, 0x113B5, 1},
			{0x113B7, 0x113C0, 1},
			{0x113C2, 0x113C2, 1},
			{0x113C5, 0x113C5, 1},
			{0x113C7, 0x113CA, 1},
			{0x113CC, 0x113D3, 1},
			{0x113E1, 0x113E2, 1},
			{0x116D0, 0x116E3, 1},
			{0x11BC0, 0x11BE0, 1},
			{0x11BF0, 0x11BF9, 1},
			{0x11F5A, 0x11F5A, 1},
			{0x13460, 0x143FA, 1},
			{0x16100, 0x16139, 1},
			{0x16D40, 0x16D6C, 1},
			{0x16D70, 0x16D79, 1},
			{0x18CFF, 0x18CFF, 1},
			{0x1CCF0, 0x1CCF9, 1},
			{0x1E5D0, 0x1E5FA, 1},
			{0x2EBF0, 0x2EE5D, 1},
		},
	}
)

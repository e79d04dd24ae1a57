package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Built-in tokenizer constants. They are part of the algorithm: changing any of
// them changes the token ids, and so the block hashes every emulated engine
// publishes.
const (
	// BuiltinVocabSize is the number of ids of the built-in tokenizer.
	BuiltinVocabSize = 131072
	// BuiltinFirstRegular is the first id of a regular (non-special) piece;
	// ids below it are reserved for special tokens.
	BuiltinFirstRegular = 16
	// Ids of the built-in tokenizer's special tokens.
	BuiltinEndOfText uint32 = 0 // <|endoftext|>
	BuiltinIMStart   uint32 = 1 // <|im_start|>
	BuiltinIMEnd     uint32 = 2 // <|im_end|>

	// Byte budgets of one chunk (a leading space is not counted).
	letterBudget = 5  // letters and combining marks
	digitBudget  = 3  // digits, as Llama 3 and GPT-4 group them
	otherBudget  = 3  // punctuation, symbols, emoji
	spaceBudget  = 16 // whitespace runs
)

var builtinSpecials = [...]string{ChatMLEndOfText, ChatMLStart, ChatMLEnd}

// Builtin returns the built-in tokenizer. It needs no files and is the default
// tokenizer of the emulated engine. The algorithm is fixed (ids are stable
// across processes, platforms and versions of kvroute):
//
//  1. The special tokens <|endoftext|>, <|im_start|> and <|im_end|> are
//     recognised anywhere in the text and get ids 0, 1 and 2.
//  2. The rest is cut, left to right, into runs of one character class:
//     letters (with combining marks), digits, whitespace, and everything else
//     (punctuation, symbols, emoji). A single space ' ' that ends a
//     whitespace run and is followed by a non-whitespace character (that does
//     not start a special token) is not part of the whitespace run but the
//     first byte of the next run, like the leading space of a GPT-style word
//     piece.
//  3. Each run is cut into chunks of whole runes from its start: as many runes
//     as fit in a byte budget (5 bytes of letters, 3 of digits, 3 of other
//     characters, 16 of whitespace; a leading space is not counted; at least
//     one rune).
//  4. The id of a chunk is 16 + FNV-1a-64(chunk bytes) mod (131072 - 16).
//
// Because every cut depends only on the text up to it and on the one
// character after it, two texts with a common prefix P get the same ids for
// every chunk that ends inside P except the last one or two (the last chunk
// may continue, a trailing space may move to the next word, and an
// incomplete special token is encoded as ordinary characters). On English
// prose this gives about 4 characters per token, like real BPE vocabularies.
//
// The ids are hashes, so Decode cannot recover the original text: it renders
// each regular id as a deterministic pseudo-word (a space and two syllables,
// sometimes a comma or full stop) of about the same length, so that generated
// tokens look like text of a realistic length. Special ids decode to their text.
//
// The tokenizer is stateless and safe for concurrent use.
func Builtin() Tokenizer { return builtin{} }

type builtin struct{}

// VocabSize returns BuiltinVocabSize.
func (builtin) VocabSize() int { return BuiltinVocabSize }

// EOS returns the id of <|im_end|>, the end of an assistant turn.
func (builtin) EOS() (uint32, bool) { return BuiltinIMEnd, true }

func (b builtin) Encode(text string) []uint32 {
	return b.AppendEncode(make([]uint32, 0, len(text)/4+4), text)
}

const (
	clsSpace = iota
	clsLetter
	clsDigit
	clsOther
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		switch {
		case c == ' ' || (c >= '\t' && c <= '\r'):
			t[c] = clsSpace
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			t[c] = clsLetter
		case c >= '0' && c <= '9':
			t[c] = clsDigit
		default:
			t[c] = clsOther
		}
	}
	return t
}()

// classAt returns the class and the byte size of the rune at s[i].
func classAt(s string, i int) (cls uint8, size int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1 // inlined: most text is ASCII
	}
	return classOfRune(s, i)
}

// classOfRune is classAt for a non-ASCII rune.
func classOfRune(s string, i int) (cls uint8, size int) {
	r, size := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r), unicode.IsMark(r):
		return clsLetter, size
	case unicode.IsNumber(r):
		return clsDigit, size
	case unicode.IsSpace(r):
		return clsSpace, size
	}
	return clsOther, size
}

// specialAt returns the id and length of the special token starting at s[i].
func specialAt(s string, i int) (id uint32, n int, ok bool) {
	if s[i] != '<' || !strings.HasPrefix(s[i:], "<|") {
		return 0, 0, false
	}
	for k, sp := range builtinSpecials {
		if strings.HasPrefix(s[i:], sp) {
			return uint32(k), len(sp), true
		}
	}
	return 0, 0, false
}

func budgetOf(cls uint8) int {
	switch cls {
	case clsLetter:
		return letterBudget
	case clsDigit:
		return digitBudget
	case clsSpace:
		return spaceBudget
	}
	return otherBudget
}

func builtinID(piece string) uint32 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(piece); i++ {
		h ^= uint64(piece[i])
		h *= prime64
	}
	return BuiltinFirstRegular + uint32(h%(BuiltinVocabSize-BuiltinFirstRegular))
}

// AppendEncode appends the ids of text to dst and returns the extended slice.
// ASCII characters are classed inline (classAt is not inlined): a third
// less time on English text (BenchmarkBuiltinEncode/ascii, 8.6 KB: 39.4 ->
// 25.8 us, medians of three side by side).
func (builtin) AppendEncode(dst []uint32, text string) []uint32 {
	i := 0
	for i < len(text) {
		if id, n, ok := specialAt(text, i); ok {
			dst = append(dst, id)
			i += n
			continue
		}
		start := i // start of the chunk, including a leading space
		cls, size := classAt(text, i)
		if cls == clsSpace {
			// Find the whitespace run [i, j).
			j := i + size
			for j < len(text) {
				c, sz := asciiClass[text[j]&0x7f], 1
				if text[j] >= utf8.RuneSelf {
					c, sz = classOfRune(text, j)
				}
				if c != clsSpace {
					break
				}
				j += sz
			}
			end := j
			if j < len(text) && text[j-1] == ' ' {
				if _, _, sp := specialAt(text, j); !sp {
					end = j - 1 // the last space leads the next word
				}
			}
			for i < end {
				k := i
				for k < end {
					sz := 1
					if text[k] >= utf8.RuneSelf {
						_, sz = classOfRune(text, k)
					}
					if k > i && k+sz-i > spaceBudget {
						break
					}
					k += sz
				}
				dst = append(dst, builtinID(text[i:k]))
				i = k
			}
			if end == j {
				continue
			}
			// A single leading space, then the run that follows it.
			start = end
			i = j
			cls, size = classAt(text, i)
		}
		// One chunk of a run of class cls starting at i (led by text[start:i]).
		budget := budgetOf(cls)
		k := i + size
		for k < len(text) {
			b := text[k]
			c, sz := asciiClass[b&0x7f], 1
			if b >= utf8.RuneSelf {
				c, sz = classOfRune(text, k)
			}
			if c != cls || k+sz-i > budget {
				break
			}
			if b == '<' {
				if _, _, sp := specialAt(text, k); sp {
					break
				}
			}
			k += sz
		}
		dst = append(dst, builtinID(text[start:k]))
		i = k
	}
	return dst
}

// split cuts text at its special tokens for a Cache: a segment between
// them encodes alone as it does in the text (see NewBuiltinCache).
func (builtin) split(text string, fn func(seg string, id uint32, special bool)) {
	start := 0
	for i := 0; i < len(text); {
		k := strings.Index(text[i:], "<|")
		if k < 0 {
			break
		}
		i += k
		id, n, ok := specialAt(text, i)
		if !ok {
			i++
			continue
		}
		if i > start {
			fn(text[start:i], 0, false)
		}
		fn("", id, true)
		i += n
		start = i
	}
	if start < len(text) {
		fn(text[start:], 0, false)
	}
}

// appendSegment encodes text between special tokens.
func (b builtin) appendSegment(dst []uint32, seg string) []uint32 {
	return b.AppendEncode(dst, seg)
}

const (
	consonants = "bcdfghklmnprstvwz"
	vowels     = "aeiou"
)

func (builtin) Decode(ids []uint32) string {
	var b strings.Builder
	b.Grow(5 * len(ids))
	for _, id := range ids {
		if id < BuiltinFirstRegular {
			if int(id) < len(builtinSpecials) {
				b.WriteString(builtinSpecials[id])
			}
			continue
		}
		if id >= BuiltinVocabSize {
			continue
		}
		r := id - BuiltinFirstRegular
		switch {
		case r%61 == 0:
			b.WriteByte('.')
			continue
		case r%53 == 0:
			b.WriteByte(',')
			continue
		}
		b.WriteByte(' ')
		for s := 0; s < 2; s++ {
			b.WriteByte(consonants[r%uint32(len(consonants))])
			r /= uint32(len(consonants))
			b.WriteByte(vowels[r%uint32(len(vowels))])
			r /= uint32(len(vowels))
		}
	}
	return b.String()
}

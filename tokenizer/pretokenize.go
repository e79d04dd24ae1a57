package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// splitter cuts a text into pre-tokens: it appends the end offsets of the
// pieces of s to dst (the pieces cover s without gaps).
type splitter interface {
	appendSplits(dst []int, s string) []int
}

// The pre-tokenizer patterns of Llama 3 (digits in groups of up to three) and
// Qwen2/Qwen3 (single digits), both derived from OpenAI's cl100k_base. They
// use a lookahead, which Go's regexp lacks; llamaSplitter implements them by
// hand and a test checks it against regexp2.
const (
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is the ByteLevel pre-tokenizer's own pattern (use_regex: true).
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// newSplitter returns the splitter for a Split pre-tokenizer's regex with
// behaviour Isolated: a hand-written one for the cl100k family, regexp2 for
// any other pattern.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case patternLlama3:
		return llamaSplitter{maxDigits: 3}, nil
	case patternQwen2:
		return llamaSplitter{maxDigits: 1}, nil
	}
	return newRegexSplitter(pattern)
}

// Character classes of the cl100k pattern family.
const (
	ccOther   = iota // [^\s\p{L}\p{N}]
	ccLetter         // \p{L}
	ccNumber         // \p{N}
	ccSpace          // \s other than \r and \n
	ccNewline        // \r or \n
)

var asciiCC = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			t[c] = ccNewline
		case unicode.IsSpace(r):
			t[c] = ccSpace
		case unicode.IsLetter(r):
			t[c] = ccLetter
		case unicode.IsNumber(r):
			t[c] = ccNumber
		default:
			t[c] = ccOther
		}
	}
	return t
}()

// ccAt returns the class, rune and size of the rune at s[i]. An invalid UTF-8
// byte is a one-byte ccOther. Letters and numbers are Unicode 16.0's, as
// the reference's (unicode16.go).
func ccAt(s string, i int) (cls uint8, r rune, size int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiCC[c], rune(c), 1
	}
	r, size = utf8.DecodeRuneInString(s[i:])
	switch {
	case size == 1: // invalid
		return ccOther, r, 1
	case unicode.IsLetter(r):
		return ccLetter, r, size
	case unicode.IsNumber(r):
		return ccNumber, r, size
	case unicode.IsSpace(r):
		return ccSpace, r, size
	case r < 0x1C89: // below the first rune Unicode 16 classes anew
	case unicode.Is(unicode16Letters, r):
		return ccLetter, r, size
	case unicode.Is(unicode16Numbers, r):
		return ccNumber, r, size
	}
	return ccOther, r, size
}

// llamaSplitter implements patternLlama3 (maxDigits 3) and patternQwen2
// (maxDigits 1) with the semantics of a backtracking regex engine: at each
// position the first alternative that matches wins.
type llamaSplitter struct{ maxDigits int }

func (p llamaSplitter) appendSplits(dst []int, s string) []int {
	for i := 0; i < len(s); {
		i = p.match(s, i)
		dst = append(dst, i)
	}
	return dst
}

// contraction returns the length of a case-insensitive 's|'t|'re|'ve|'m|'ll|'d
// at s[i] (s[i] == '\”), or 0.
func contraction(s string, i int) int {
	fold := func(j int) (rune, int) {
		if j >= len(s) {
			return 0, 0
		}
		r, n := utf8.DecodeRuneInString(s[j:])
		switch r {
		case 'ſ': // U+017F LATIN SMALL LETTER LONG S folds to 's'
			return 's', n
		case 'K': // U+212A KELVIN SIGN folds to 'k'
			return 'k', n
		}
		return unicode.ToLower(r), n
	}
	r1, n1 := fold(i + 1)
	switch r1 {
	case 's', 't', 'm', 'd':
		return 1 + n1
	case 'r', 'v':
		if r2, n2 := fold(i + 1 + n1); r2 == 'e' {
			return 1 + n1 + n2
		}
	case 'l':
		if r2, n2 := fold(i + 1 + n1); r2 == 'l' {
			return 1 + n1 + n2
		}
	}
	return 0
}

// run returns the end of the run of runes of class cls starting at i.
func runOf(s string, i int, cls uint8) int {
	for i < len(s) {
		c, _, n := ccAt(s, i)
		if c != cls {
			break
		}
		i += n
	}
	return i
}

// match returns the end of the pre-token starting at s[i].
func (p llamaSplitter) match(s string, i int) int {
	cls, r, size := ccAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if n := contraction(s, i); n > 0 {
			return i + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if cls == ccLetter {
		return runOf(s, i+size, ccLetter)
	}
	next := -1 // class of the following rune, -1 at the end
	if i+size < len(s) {
		c, _, _ := ccAt(s, i+size)
		next = int(c)
	}
	if (cls == ccOther || cls == ccSpace) && next == ccLetter {
		return runOf(s, i+size, ccLetter)
	}
	// \p{N}{1,k}
	if cls == ccNumber {
		j := i + size
		for k := 1; k < p.maxDigits && j < len(s); k++ {
			c, _, n := ccAt(s, j)
			if c != ccNumber {
				break
			}
			j += n
		}
		return j
	}
	// ' '?[^\s\p{L}\p{N}]+[\r\n]*
	if cls == ccOther || (r == ' ' && next == ccOther) {
		j := runOf(s, i+size, ccOther)
		return runOf(s, j, ccNewline)
	}
	// Whitespace: the run of \s (spaces and newlines) from i.
	j := i
	lastNL := -1
	for j < len(s) {
		c, _, n := ccAt(s, j)
		if c == ccNewline {
			lastNL = j
		} else if c != ccSpace {
			break
		}
		j += n
	}
	// \s*[\r\n]+
	if lastNL >= 0 {
		return lastNL + 1
	}
	// \s+(?!\S): all but the last whitespace rune, unless at the end of s.
	if j < len(s) {
		_, lastSize := utf8.DecodeLastRuneInString(s[i:j])
		if j-lastSize > i {
			return j - lastSize
		}
	}
	// \s+
	return j
}

// regexSplitter splits with an arbitrary regex (Split with behaviour Isolated):
// matches and the gaps between them are pieces.
type regexSplitter struct{ re *regexp2.Regexp }

func newRegexSplitter(pattern string) (regexSplitter, error) {
	re, err := regexp2.Compile(pattern)
	if err != nil {
		return regexSplitter{}, fmt.Errorf("compile pre-tokenizer pattern %q: %w", pattern, err)
	}
	return regexSplitter{re: re}, nil
}

func (p regexSplitter) appendSplits(dst []int, s string) []int {
	locs, err := p.re.FindAllStringIndex(s, -1)
	if err != nil { // only on a backtracking limit: keep the text whole
		return append(dst, len(s))
	}
	prev := 0
	for _, l := range locs {
		if l[0] > prev {
			dst = append(dst, l[0])
		}
		if l[1] > l[0] {
			dst = append(dst, l[1])
		}
		prev = l[1]
	}
	if prev < len(s) {
		dst = append(dst, len(s))
	}
	return dst
}

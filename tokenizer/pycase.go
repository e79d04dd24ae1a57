package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Python's str methods change case with Unicode's full case mappings
// (UnicodeData.txt and SpecialCasing.txt's unconditional mappings, which
// may change a character's length: "ß".upper() is "SS", "ﬁ".upper() "FI",
// "ŉ".upper() "ʼN", "İ".lower() "i̇", "ß".title() "Ss", "ǆ".title() "ǅ")
// and with the one conditional mapping that is not a language's,
// Final_Sigma ("ΌΣΟΣ".lower() is "όσος"). Go's unicode package and
// strings.ToUpper have the simple mappings alone, one rune to one.
// golang.org/x/text/cases has the full ones, but its Title starts words by
// its own rules (str.title starts one after any character that is not
// cased, "they're" as "They'Re"), and its final sigma looks at most 30
// case-ignorable characters ahead (Python: any number). So pyCase maps each
// rune alone with x/text's casers and decides, as CPython's
// unicodeobject.c does, which mapping a rune takes and whether a Σ is
// final. Its tables are Go's and x/text's (Unicode 15.0.0 with Go 1.26,
// Python 3.12's version).

// The mappings pyCase.appendRune applies.
const (
	caseUpper = iota
	caseLower
	caseTitle
)

// pyCase changes the case of strings as Python's str methods do. It is not
// safe for concurrent use (x/text's title caser keeps state); its zero
// value is ready to use.
type pyCase struct {
	casers [3]*cases.Caser // by caseUpper, caseLower, caseTitle; made on first use
}

// appendRune appends r in upper, lower (without Final_Sigma) or title case
// (caseUpper, caseLower, caseTitle), with its full mapping.
func (p *pyCase) appendRune(dst []byte, kind int, r rune) []byte {
	if r < utf8.RuneSelf {
		switch {
		case kind == caseLower && 'A' <= r && r <= 'Z':
			r += 'a' - 'A'
		case kind != caseLower && 'a' <= r && r <= 'z':
			r -= 'a' - 'A'
		}
		return append(dst, byte(r))
	}
	c := p.casers[kind]
	if c == nil {
		var cc cases.Caser
		switch kind {
		case caseUpper:
			cc = cases.Upper(language.Und)
		case caseLower:
			cc = cases.Lower(language.Und, cases.HandleFinalSigma(false))
		default:
			cc = cases.Title(language.Und)
		}
		c = &cc
		p.casers[kind] = c
	}
	var src [utf8.UTFMax]byte
	var out [32]byte // a full mapping is at most three runes
	c.Reset()
	n, _, err := c.Transform(out[:], src[:utf8.EncodeRune(src[:], r)], true)
	if err != nil {
		return utf8.AppendRune(dst, r)
	}
	return append(dst, out[:n]...)
}

// appendLower appends s[i:i+size], the rune r, in lower case: Σ as ς when
// it is final in s (pyFinalSigma), σ otherwise.
func (p *pyCase) appendLower(dst []byte, s string, i int, r rune) []byte {
	if r != 'Σ' {
		return p.appendRune(dst, caseLower, r)
	}
	if pyFinalSigma(s, i) {
		return append(dst, "ς"...)
	}
	return append(dst, "σ"...)
}

// upper is Python's str.upper.
func (p *pyCase) upper(s string) string {
	dst := make([]byte, 0, len(s))
	for _, r := range s {
		dst = p.appendRune(dst, caseUpper, r)
	}
	return string(dst)
}

// lower is Python's str.lower.
func (p *pyCase) lower(s string) string {
	dst := make([]byte, 0, len(s))
	for i, r := range s {
		dst = p.appendLower(dst, s, i, r)
	}
	return string(dst)
}

// title is Python's str.title: a character after a cased one (pyCased) in
// lower case, any other in title case.
func (p *pyCase) title(s string) string {
	dst := make([]byte, 0, len(s))
	prev := false
	for i, r := range s {
		if prev {
			dst = p.appendLower(dst, s, i, r)
		} else {
			dst = p.appendRune(dst, caseTitle, r)
		}
		prev = pyCased(r)
	}
	return string(dst)
}

// capitalize is Python's str.capitalize (3.8 and later): the first
// character in title case, the others in lower case.
func (p *pyCase) capitalize(s string) string {
	dst := make([]byte, 0, len(s))
	for i, r := range s {
		if i == 0 {
			dst = p.appendRune(dst, caseTitle, r)
		} else {
			dst = p.appendLower(dst, s, i, r)
		}
	}
	return string(dst)
}

// swapcase is Python's str.swapcase: an uppercase character (Unicode's
// Uppercase: Lu and Other_Uppercase) in lower case, a lowercase one (Ll
// and Other_Lowercase) in upper case, the others (titlecase letters too)
// as they are.
func (p *pyCase) swapcase(s string) string {
	dst := make([]byte, 0, len(s))
	for i, r := range s {
		switch {
		case unicode.In(r, unicode.Lu, unicode.Other_Uppercase):
			dst = p.appendLower(dst, s, i, r)
		case unicode.In(r, unicode.Ll, unicode.Other_Lowercase):
			dst = p.appendRune(dst, caseUpper, r)
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return string(dst)
}

// jinjaTitle is jinja2's title filter (do_title), which is not str.title:
// it splits s at the runs of '-', '(', '{', '[', '<' and white space
// (pyIsSpace, which its regular expression's \s matches), and writes each
// other piece's first character in upper case (not title case) and the
// rest of the piece lowered as a string of its own (its Σ final by what
// follows in that piece alone).
func (p *pyCase) jinjaTitle(s string) string {
	dst := make([]byte, 0, len(s))
	for s != "" {
		word := strings.TrimLeftFunc(s, jinjaTitleSep)
		dst = append(dst, s[:len(s)-len(word)]...)
		if end := strings.IndexFunc(word, jinjaTitleSep); end >= 0 {
			s, word = word[end:], word[:end]
		} else {
			s = ""
		}
		if word == "" {
			break
		}
		r, n := utf8.DecodeRuneInString(word)
		dst = p.appendRune(dst, caseUpper, r)
		rest := word[n:]
		for i, r := range rest {
			dst = p.appendLower(dst, rest, i, r)
		}
	}
	return string(dst)
}

// jinjaTitleSep reports whether r is in the character class jinja2's title
// filter splits words at, [-\s({\[<].
func jinjaTitleSep(r rune) bool {
	return r == '-' || r == '(' || r == '{' || r == '[' || r == '<' || pyIsSpace(r)
}

// pyCased reports whether r is cased (Unicode's Cased: Lu, Ll, Lt,
// Other_Uppercase and Other_Lowercase, as Python's str.title and final
// sigma tell it).
func pyCased(r rune) bool {
	return unicode.In(r, unicode.Lu, unicode.Ll, unicode.Lt, unicode.Other_Uppercase, unicode.Other_Lowercase)
}

// pyCaseIgnorable reports whether r is Unicode's Case_Ignorable: general
// category Mn, Me, Cf, Lm or Sk, or Word_Break MidLetter, MidNumLet or
// Single_Quote (WordBreakProperty.txt of Unicode 15.0.0, whose few
// characters Go's unicode package has no table of).
func pyCaseIgnorable(r rune) bool {
	switch r {
	case '\'', '.', ':', 0xb7, 0x387, 0x55f, 0x5f4, 0x2018, 0x2019, 0x2024, 0x2027, 0xfe13, 0xfe52, 0xfe55, 0xff07, 0xff0e, 0xff1a:
		return true
	}
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk)
}

// pyFinalSigma reports whether the Σ at s[i] is in Unicode's Final_Sigma
// context, as CPython's handle_capital_sigma tells it: a cased character
// before it, and none after it, past any case-ignorable characters (a
// character both cased and case-ignorable, such as U+0345, is passed).
func pyFinalSigma(s string, i int) bool {
	before := false
	for j := i; j > 0; {
		r, n := utf8.DecodeLastRuneInString(s[:j])
		j -= n
		if !pyCaseIgnorable(r) {
			before = pyCased(r)
			break
		}
	}
	if !before {
		return false
	}
	for _, r := range s[i+len("Σ"):] {
		if !pyCaseIgnorable(r) {
			return !pyCased(r)
		}
	}
	return true
}

package tokenizer

import (
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

var pyCaseFile = flag.String("pycase", "testdata/expected/pycase.json",
	"the expectations of TestPyCaseMatchesPython (testdata/npm/render_case.py)")

// pyCaseFuncs are the case mappings of pycase.go by the name of what they
// stand for, as render_case.py names Python's results.
var pyCaseFuncs = []struct {
	name string
	f    func(*pyCase, string) string
}{
	{"upper", (*pyCase).upper},
	{"lower", (*pyCase).lower},
	{"title", (*pyCase).title},
	{"capitalize", (*pyCase).capitalize},
	{"swapcase", (*pyCase).swapcase},
	{"upper_filter", (*pyCase).upper},
	{"lower_filter", (*pyCase).lower},
	{"capitalize_filter", (*pyCase).capitalize},
	{"title_filter", (*pyCase).jinjaTitle},
}

// TestPyCase: the case mappings of pycase.go on strings that show where
// Python's differ from Go's (full mappings, final sigma, titlecase
// digraphs, what str.title and jinja2's title take as a word). The wants
// are Python 3.11's (jinja2 3.1.6's for title_filter), pasted.
func TestPyCase(t *testing.T) {
	for _, tc := range []struct{ fn, s, want string }{
		{"upper", "ß", "SS"},
		{"upper", "ﬁ", "FI"},
		{"upper", "ŉ", "ʼN"},
		{"upper", "ΐ", "\u0399\u0308\u0301"},
		{"upper", "ᾳ", "ΑΙ"},
		{"upper", "ǆ ǅ Ǆ", "Ǆ Ǆ Ǆ"},
		{"upper", "ⓐ ⅰ ı i", "Ⓐ Ⅰ I I"},
		{"upper", "straße 𐐨", "STRASSE 𐐀"},
		{"lower", "İ", "i̇"},
		{"lower", "ΌΣΟΣ", "όσος"},
		{"lower", "ΣΑΣ Σ ΑΣ'Α ΑΣ' Α.Σ", "σας σ ασ'α ας' α.ς"},
		{"lower", "Α\u0301Σ\u0301 ΑΣͅ", "α\u0301ς\u0301 αςͅ"},
		{"lower", "ͅΣ", "ͅσ"},
		{"lower", "ẞ Ǆ ǅ Ⓐ Ⅰ", "ß ǆ ǆ ⓐ ⅰ"},
		{"title", "ß", "Ss"},
		{"title", "ǆemal ǉ", "ǅemal ǈ"},
		{"title", "ﬁne ŉ", "Fine ʼN"},
		{"title", "they're x-y 3rd hELLO", "They'Re X-Y 3Rd Hello"},
		{"title", "ⓐb ªb ʰb", "Ⓐb ªb ʰb"},
		{"title", "aΣ aΣb ΣΣ", "Aς Aσb Σς"},
		{"title", "ᾳ ᾀ", "ᾼ ᾈ"},
		{"capitalize", "ǆa", "ǅa"},
		{"capitalize", "ßA", "Ssa"},
		{"capitalize", "hELLO wORLD ΑΣ", "Hello world ας"},
		{"capitalize", "Σ", "Σ"},
		{"capitalize", "İI", "İi"},
		{"swapcase", "ß ǅ Σ aΣ ΑΣ", "SS ǅ σ Aς ας"},
		{"swapcase", "ⓐⒶ İ", "Ⓐⓐ i̇"},
		{"title_filter", "hELLO wORLD they're x-y 3rd", "Hello World They're X-Y 3rd"},
		{"title_filter", "ǆemal ß ﬁne", "Ǆemal SS FIne"},
		{"title_filter", "(ab)[cd]{ef}<gh>", "(Ab)[Cd]{Ef}<Gh>"},
		{"title_filter", "ΑΣ b ΑΣΑ", "Ασ B Ασα"},
		{"title_filter", "a\x1cb\u3000c\u0085d_e.f", "A\x1cB\u3000C\u0085D_e.f"},
		{"title_filter", "  --a", "  --A"},
	} {
		var f func(*pyCase, string) string
		for _, pf := range pyCaseFuncs {
			if pf.name == tc.fn {
				f = pf.f
			}
		}
		if got := f(new(pyCase), tc.s); got != tc.want {
			t.Errorf("%s(%q) = %q, want %q", tc.fn, tc.s, got, tc.want)
		}
	}
}

// TestPyCaseMatchesPython checks pycase.go against Python's results in
// -pycase (render_case.py's output): random strings (the fixture), or
// every code point alone and in contexts (a one-off run). Against Python
// 3.11.7 (Unicode 14.0.0) 5,000 random strings agree, and of every code
// point's 5,644,600 mappings 15 differ, all title() of U+10FC, U+A7F2 to
// U+A7F4 and U+AB69: modifier letters that Go's tables (Unicode 15.0.0,
// Python 3.12's version) have in Other_Lowercase, so cased, and Python
// 3.11's do not.
func TestPyCaseMatchesPython(t *testing.T) {
	data, err := os.ReadFile(*pyCaseFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Python, Unicode string
		Cases           []map[string]string
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var p pyCase
	bad, checked := 0, 0
	for _, c := range file.Cases {
		for _, pf := range pyCaseFuncs {
			want, ok := c[pf.name]
			if !ok {
				continue
			}
			checked++
			if got := pf.f(&p, c["s"]); got != want {
				if bad++; bad <= 20 {
					t.Errorf("%s(%q) = %q, want %q (%+q)", pf.name, c["s"], got, want, c["s"])
				}
			}
		}
	}
	t.Logf("%s: %d strings, %d mappings checked, %d differ (Python %s, Unicode %s)",
		*pyCaseFile, len(file.Cases), checked, bad, file.Python, file.Unicode)
	if bad > 0 {
		t.Errorf("%d of %d mappings differ from Python's", bad, checked)
	}
}

// FuzzPyCase checks what holds of Python's case mappings without Python
// (checked over every code point, and over render_case.py's 5,000 random
// strings for the others): valid UTF-8 out of anything; at most three
// runes out for each rune in; upper and lower idempotent; upper, lower,
// title, swapcase and jinja2's title of s+" "+s the mapping of s twice
// (a space is neither cased nor case-ignorable, so no context crosses
// it; title and capitalize are not idempotent in Python: "ΰΣ".title() is
// "Ϋ́ς", whose title is "Ϋ́Σ"); ASCII mapped as by Go's strings package;
// and jinja2's title keeping its separators.
func FuzzPyCase(f *testing.F) {
	for _, s := range []string{"", "ß", "ΌΣΟΣ", "aΣ\u0301b", "ǆemal they're 3rd", "İı", "ﬁ ŉ ΐ ᾳ", "ⓐb ʰΣ", "\xff\xfeΣ", "x-(y){z}<w>[v]", "ΰΣ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var p pyCase
		for _, pf := range pyCaseFuncs {
			got := pf.f(&p, s)
			if !utf8.ValidString(got) {
				t.Fatalf("%s(%q) = %q, not UTF-8", pf.name, s, got)
			}
			if utf8.RuneCountInString(got) > 3*utf8.RuneCountInString(s) {
				t.Errorf("%s(%q) = %q, more than three runes for one", pf.name, s, got)
			}
		}
		if !utf8.ValidString(s) {
			return
		}
		if up := p.upper(s); p.upper(up) != up {
			t.Errorf("upper(upper(%q)) = %q, want %q", s, p.upper(up), up)
		}
		if low := p.lower(s); p.lower(low) != low {
			t.Errorf("lower(lower(%q)) = %q, want %q", s, p.lower(low), low)
		}
		for _, pf := range pyCaseFuncs {
			if pf.name == "capitalize" || pf.name == "capitalize_filter" {
				continue
			}
			if got, want := pf.f(&p, s+" "+s), pf.f(&p, s)+" "+pf.f(&p, s); got != want {
				t.Errorf("%s(%q) = %q, want %q", pf.name, s+" "+s, got, want)
			}
		}
		if isASCII(s) {
			if got, want := p.upper(s), strings.ToUpper(s); got != want {
				t.Errorf("upper(%q) = %q, want %q", s, got, want)
			}
			if got, want := p.lower(s), strings.ToLower(s); got != want {
				t.Errorf("lower(%q) = %q, want %q", s, got, want)
			}
		}
		seps := func(s string) string {
			return strings.Map(func(r rune) rune {
				if jinjaTitleSep(r) {
					return r
				}
				return -1
			}, s)
		}
		if got, want := seps(p.jinjaTitle(s)), seps(s); got != want {
			t.Errorf("jinjaTitle(%q) = %q, separators %q, want %q", s, p.jinjaTitle(s), got, want)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

package tokenizer

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// TestPyRepr pins appendPyQuoted and pyStr on values whose Python repr
// was read off python3 (the jinja2 reference cases, jinja-semantics.json's
// "print" section, check them in templates).
func TestPyRepr(t *testing.T) {
	for _, tc := range []struct {
		v    jinja.Value
		want string
	}{
		{jinja.NewString("it's"), `"it's"`},
		{jinja.NewString(`say "hi"`), `'say "hi"'`},
		{jinja.NewString(`it's "x"`), `'it\'s "x"'`},
		{jinja.NewString("a\\b\n\t\r\x00\x1f\x7f\u0080\u00a0\u00ad é\u2028\u200b\ue000😀\U000e0001\U0010ffff"),
			`'a\\b\n\t\r\x00\x1f\x7f\x80\xa0\xad é\u2028\u200b\ue000😀\U000e0001\U0010ffff'`},
		{jinja.NewString("\xff"), "'\ufffd'"}, // not UTF-8: as U+FFFD
		{jinja.NewList([]jinja.Value{jinja.NewInt(1), jinja.NewString("a"), jinja.None(), jinja.NewFloat(2), jinja.NewBool(true), jinja.Undefined()}),
			"[1, 'a', None, 2.0, True, Undefined]"},
		{jinja.FromGoValue(map[string]any{"a": []any{}, "b": map[string]any{}}), "{'a': [], 'b': {}}"},
	} {
		if got := string(appendPyRepr(nil, tc.v, 0)); got != tc.want {
			t.Errorf("appendPyRepr(%v) = %s, want %s", tc.v, got, tc.want)
		}
	}
	// str() is the repr but of a string, an undefined value and a callable
	for _, tc := range []struct {
		v    jinja.Value
		want string
	}{
		{jinja.NewString("it's"), "it's"}, {jinja.Undefined(), ""}, {jinja.None(), "None"}, {jinja.NewFloat(1e20), "1e+20"},
		{jinja.NewList([]jinja.Value{jinja.NewString("it's")}), `["it's"]`},
	} {
		if got := pyStr(tc.v); got != tc.want {
			t.Errorf("pyStr(%v) = %s, want %s", tc.v, got, tc.want)
		}
	}
	// a list that holds itself (the Go engine's append) ends
	l := jinja.NewList(nil)
	l.AsList().Append(l)
	if got := pyStr(l); !strings.Contains(got, "[[...]]]") || len(got) != 2*maxReprDepth+5 {
		t.Errorf("pyStr of a list that holds itself = %.20q... (%d bytes)", got, len(got))
	}
}

// FuzzAppendPyQuoted checks that appendPyQuoted writes a Python string
// literal (as Python's repr chooses its quotes) that reads back as the
// string, with no character Python would escape left raw.
func FuzzAppendPyQuoted(f *testing.F) {
	for _, s := range []string{"", "a", "it's", `"`, `'"`, "\\", "\n\x00\x7f\u0085\u00a0é\u2028\U0001F600\U000e0001", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := string(appendPyQuoted(nil, s))
		want := string([]rune(s)) // each byte that is not UTF-8 as U+FFFD
		quote := byte('\'')
		if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
			quote = '"'
		}
		if len(q) < 2 || q[0] != quote || q[len(q)-1] != quote {
			t.Fatalf("appendPyQuoted(%q) = %s, want it in %c quotes", s, q, quote)
		}
		got, err := readPyLiteral(q[1:len(q)-1], quote)
		if err != nil || got != want {
			t.Fatalf("appendPyQuoted(%q) = %s, which reads back as %q (%v)", s, q, got, err)
		}
	})
}

// readPyLiteral reads the body of a Python string literal in quotes
// quote, as appendPyQuoted writes it: escapes \\, \', \", \t, \n, \r,
// \xhh, \uhhhh and \Uhhhhhhhh, each other character printable (as
// unicode.IsPrint) and not the quote.
func readPyLiteral(body string, quote byte) (string, error) {
	var b strings.Builder
	for i := 0; i < len(body); {
		r, size := utf8.DecodeRuneInString(body[i:])
		switch {
		case r == '\\':
			if i+1 == len(body) {
				return "", strconv.ErrSyntax
			}
			n := 0
			switch c := body[i+1]; c {
			case '\\', '\'', '"':
				b.WriteByte(c)
			case 't':
				b.WriteByte('\t')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 'x':
				n = 2
			case 'u':
				n = 4
			case 'U':
				n = 8
			default:
				return "", strconv.ErrSyntax
			}
			i += 2
			if n > 0 {
				if i+n > len(body) {
					return "", strconv.ErrSyntax
				}
				code, err := strconv.ParseUint(body[i:i+n], 16, 32)
				if err != nil || body[i:i+n] != strings.ToLower(body[i:i+n]) {
					return "", strconv.ErrSyntax
				}
				b.WriteRune(rune(code))
				i += n
			}
			continue
		case r == rune(quote) || !strconv.IsPrint(r):
			return "", strconv.ErrSyntax // raw where Python escapes it
		}
		b.WriteRune(r)
		i += size
	}
	return b.String(), nil
}

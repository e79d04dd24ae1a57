package tokenizer

import (
	"strings"
	"testing"
)

// TestStringMethodsMatchPython: the string methods pymethods.go rewrites
// (strip, lstrip, rstrip, split, title, capitalize, upper, lower,
// swapcase) render as jinja2's,
// which are Python's str methods. The wants are jinja2's renderings in
// render_chats.py's environment (python3, jinja2 3.1); "ERROR" is a
// rendering jinja2 refuses. Without the rewrite the Go engine's methods
// keep U+001C to U+001F, U+0085, U+00A0, U+2003 and U+3000 (strip), or
// all but space, tab, CR and LF (lstrip, rstrip), ignore split's maxsplit,
// leave title's and capitalize's other letters as they are, map case with
// Go's simple mappings ("ß".upper() "ß", "ΌΣΟΣ".lower() "όσοσ") and have no
// swapcase.
func TestStringMethodsMatchPython(t *testing.T) {
	const x = "\x1c\u3000 Hi \u00a0there\u2003\x1f\n\u0085"
	for _, tc := range []struct{ name, src, want string }{
		{"strip", "{{ x.strip() }}|{{ x.lstrip() }}|{{ x.rstrip() }}", "Hi \u00a0there|Hi \u00a0there\u2003\u001f\n\u0085|\u001c\u3000 Hi \u00a0there"},
		{"strip none", "{{ x.strip(none) }}|{{ x.lstrip(None) }}|{{ 'None x None'.rstrip(none) }}", "Hi \u00a0there|Hi \u00a0there\u2003\u001f\n\u0085|None x None"},
		{"strip chars", "{{ '\\nab\\n\\n'.strip('\\n') }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'hi!?'.rstrip('?!') }}", "ab|hixx|hi"},
		{"split", "{{ x.split() | tojson }}|{{ '  a  b c  '.split(None, 1) | tojson }}|{{ 'a</think>b</think>c'.split('</think>', 1) | tojson }}|{{ 'a,b,,c'.split(',') | tojson }}|{{ 'a b c'.split(maxsplit=1) | tojson }}|{{ 'a,b,c'.split(sep=',', maxsplit=0) | tojson }}|{{ ''.split() | tojson }}", "[\"Hi\", \"there\"]|[\"a\", \"b c  \"]|[\"a\", \"b</think>c\"]|[\"a\", \"b\", \"\", \"c\"]|[\"a\", \"b c\"]|[\"a,b,c\"]|[]"},
		{"chains", "{{ m['content'].strip().split()[1] }}|{{ (x ~ '!').strip() }}|{{ m.content.split('</think>')[-1].lstrip() }}|{% set y = m['content'].rstrip() %}{{ y ~ '.' }}|{{ [' a ', ' b '][1].strip() }}|{{ ' q '.strip() }}", "b|Hi \u00a0there\u2003\u001f\n\u0085!|b c\u3000|\u001c  a</think> b c.|b|q"},
		{"nested args", "{{ 'a-b-c'.split('-'.strip(), 1) | tojson }}|{{ m.content.replace('a', 'A').strip() }}", "[\"a\", \"b-c\"]|A</think> b c"},
		{"title capitalize", "{{ 'hELLO wORLD they\\'re x-y 3rd \u01c6emal'.title() }}|{{ 'hELLO wORLD'.capitalize() }}|{{ '\u01c6x'.capitalize() }}|{{ ''.title() }}", "Hello World They'Re X-Y 3Rd \u01c5emal|Hello world|\u01c5x|"},
		{"case", "{{ c.upper() }}|{{ c.lower() }}|{{ c.title() }}|{{ c.capitalize() }}|{{ c.swapcase() }}|{{ 'ǆa'.capitalize() }}",
			"HELLO SS FI THEY'RE 3RD-(ǄEMAL) ΌΣΟΣ İ ΑΣ B|hello ß ﬁ they're 3rd-(ǆemal) όσος i̇ ας b|Hello Ss Fi They'Re 3Rd-(ǅemal) Όσος İ Ας B|Hello ß ﬁ they're 3rd-(ǆemal) όσος i̇ ας b|Hello SS FI THEY'RE 3RD-(ǄEMAL) όσος i̇ ας B|ǅa"},
		{"case method argument", "{{ 'a'.upper(1) }}", "ERROR TypeError('str.upper() takes no arguments (1 given)')"},
		{"case method of none", "{{ none.upper() }}", "ERROR UndefinedError(\"'None' has no attribute 'upper'\")"},
		{"strip keyword", "{{ 'hi!?'.rstrip(chars='?!') }}", "ERROR TypeError('str.rstrip() takes no keyword arguments')"},
		{"split empty separator", "{{ 'a'.split('') }}", "ERROR ValueError('empty separator')"},
		{"method of none", "{{ none.strip() }}", "ERROR UndefinedError(\"'None' has no attribute 'strip'\")"},
		{"string literal dot", "{{ 'a.strip()' }}|{{ \"x\".strip() }}", "a.strip()|x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, err := NewChatTemplate(tc.src, "", "")
			if err != nil {
				t.Fatal(err)
			}
			got, err := ct.RenderAny(nil, ChatOptions{Vars: map[string]any{"x": x, "c": "hELLO ß ﬁ they're 3rd-(ǆemal) ΌΣΟΣ İ ΑΣ b",
				"m": map[string]any{"content": "\x1c  a</think> b c\u3000"}}})
			if strings.HasPrefix(tc.want, "ERROR") {
				if err == nil {
					t.Errorf("got %q, want an error like jinja2's %s", got, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestPyMethodsRewrite: the calls pyMethods rewrites, and what it leaves.
func TestPyMethodsRewrite(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{{ x.strip() }}", "{{ (x|kvroute_strip) }}"},
		{"{%- if m['content'].split('</think>', 1)[0].rstrip('\\n') %}", "{%- if ((m['content']|kvroute_split('</think>', 1))[0]|kvroute_rstrip('\\n')) %}"},
		{"{{ f(a).b.title() }}", "{{ (f(a).b|kvroute_title) }}"},
		{"{{ x.upper() ~ y.lower() ~ z.swapcase() }}", "{{ (x|kvroute_upper) ~ (y|kvroute_lower) ~ (z|kvroute_swapcase) }}"},
		{"{{ (a ~ b).strip() }}", "{{ ((a ~ b)|kvroute_strip) }}"},
		{"{{ 'x'.strip() }}", "{{ ('x'|kvroute_strip) }}"},
		{"{{ a[0](b).strip() }}", "{{ (a[0](b)|kvroute_strip) }}"},
		{"{{ x.split(y.strip()) }}", "{{ (x|kvroute_split((y|kvroute_strip))) }}"},
		{"{{ x.strip }}{{ x.zfill(3) }}{{ x . strip() }}{{ 'a.strip()' }}{{ !x.strip() }}", "{{ x.strip }}{{ x.zfill(3) }}{{ x . strip() }}{{ 'a.strip()' }}{{ !x.strip() }}"},
		{"{{ x .strip() }}{% if not a . b [0].strip() %}{% for c in d (e).split() %}{{ f ~ g.title() }}{{ [h.strip(), {'k': i.strip()}] }}", "{{ (x |kvroute_strip) }}{% if not (a . b [0]|kvroute_strip) %}{% for c in (d (e)|kvroute_split) %}{{ f ~ (g|kvroute_title) }}{{ [(h|kvroute_strip), {'k': (i|kvroute_strip)}] }}"},
		{"text x.strip() {# x.strip() #}", "text x.strip() {# x.strip() #}"},
		{"{% raw %}{{ x.strip() }}{% endraw %}{{ x.strip() }}", "{% raw %}{{ x.strip() }}{% endraw %}{{ x.strip() }}"},
		{"{{ x.strip( }}", "{{ x.strip( }}"},
	} {
		if got := pyMethods(tc.src); got != tc.want {
			t.Errorf("pyMethods(%q)\n got %q\nwant %q", tc.src, got, tc.want)
		}
	}
}

// FuzzPyMethods checks that rewriting the string methods never breaks a
// template that compiles, leaves one without such a call alone, and is
// idempotent (a rewritten call is a filter, not a call any more).
func FuzzPyMethods(f *testing.F) {
	for _, s := range []string{
		"{{ x.strip() }}", "{{ m['content'].split('</think>', 1)[-1].lstrip('\\n') }}", "{% set y = (a ~ b).rstrip() %}{{ y.title() }}",
		"{{ 'it\\'s'.capitalize() }}{{ \"a.strip()\" }}", "{# x.strip() #}{{ x.strip }}", "{{ x.strip( }}", ".strip() }}",
		"{{ f(a)[0](b).split(sep=',', maxsplit=1) }}", "{% raw %}{{ x.strip() }}{% endraw %}", "{{ x.split(y.strip(), z.split()[0]) | tojson }}",
		"{{ [1, 2].strip() }}{{ {'a': 1}.split() }}{{ 1.strip() }}{{ x .strip() }}", "{{ (x).strip().split() }}",
		"{{[0000]. A.strip()}}", "{{[].!A.strip()}}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyMethods(src)
		if !hasPyMethodCall(src) && out != src {
			t.Fatalf("pyMethods(%q) = %q, changed a template without a method call", src, out)
		}
		checkIdempotent(t, "pyMethods", pyMethods, src, out)
		checkStillCompiles(t, "pyMethods", src, out)
	})
}

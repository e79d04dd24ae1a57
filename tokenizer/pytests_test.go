package tokenizer

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// TestPyTestsMatchJinja2: jinja2's tests over tricky values (strings
// with and without cased letters, numbers, booleans, None, lists, dicts,
// an undefined variable u, a dict j = {"x": [1, "A"]}, a macro m, j.x and
// the undefined j.y) with and without arguments, bare or in parentheses,
// as "{{ (value) is test }}". Each want has a letter per value: T for
// True, F for False, E for an error. They are jinja2 3.1.6's, in
// transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols), printed by a script that renders each
// "{% macro m() %}{% endmacro %}{{ (value) is test }}" with j given.
// Not here: namespace(), a dict in the Go engine (see pytests.go).
func TestPyTestsMatchJinja2(t *testing.T) {
	values := []string{"\"abc\"", "\"ABC\"", "\"Abc\"", "\"123\"", "\"\"", "\"ß\"", "\"ǅ\"", "\"A1!\"", "\"ΣΑ\"", "\"1\"", "1", "0", "-3", "3.0", "2.5", "true", "false", "none", "[]", "[\"A\"]", "{}", "{\"a\": 1}", "u", "j", "m", "j.x", "j.y"}
	for _, tc := range []struct{ test, want string }{
		{"defined", "TTTTTTTTTTTTTTTTTTTTTTFTTTF"},
		{"undefined", "FFFFFFFFFFFFFFFFFFFFFFTFFFT"},
		{"none", "FFFFFFFFFFFFFFFFFTFFFFFFFFF"},
		{"boolean", "FFFFFFFFFFFFFFFTTFFFFFFFFFF"},
		{"true", "FFFFFFFFFFFFFFFTFFFFFFFFFFF"},
		{"false", "FFFFFFFFFFFFFFFFTFFFFFFFFFF"},
		{"integer", "FFFFFFFFFFTTTFFFFFFFFFFFFFF"},
		{"float", "FFFFFFFFFFFFFTTFFFFFFFFFFFF"},
		{"number", "FFFFFFFFFFTTTTTTTFFFFFFFFFF"},
		{"string", "TTTTTTTTTTFFFFFFFFFFFFFFFFF"},
		{"mapping", "FFFFFFFFFFFFFFFFFFFFTTFTFFF"},
		{"iterable", "TTTTTTTTTTFFFFFFFFTTTTTTFTT"},
		{"sequence", "TTTTTTTTTTFFFFFFFFTTTTTTFTT"},
		{"callable", "FFFFFFFFFFFFFFFFFFFFFFTFTFT"},
		{"upper", "FTFFFFFTTFFFFFFFFFFTFFFFFTF"},
		{"lower", "TFFFFTFFFFFFFFFFFFFFFTFFFFF"},
		{"odd", "EEEEEEEEEETFTTFTFEEEEEEEEEE"},
		{"even", "EEEEEEEEEEFTFFFFTEEEEEEEEEE"},
		{"divisibleby 3", "EEEEEEEEEEFTTTFFTEEEEEEEEEE"},
		{"divisibleby(2)", "EEEEEEEEEEFTFFFFTEEEEEEEEEE"},
		{"divisibleby 1.5", "EEEEEEEEEEFTTTFFTEEEEEEEEEE"},
		{"eq 1", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"eq 1.0", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"eq true", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"eq \"abc\"", "TFFFFFFFFFFFFFFFFFFFFFFFFFF"},
		{"eq(u)", "FFFFFFFFFFFFFFFFFFFFFFTFFFT"},
		{"eq [1, \"A\"]", "FFFFFFFFFFFFFFFFFFFFFFFFFTF"},
		{"ne 1", "TTTTTTTTTTFTTTTFTTTTTTTTTTT"},
		{"equalto 1", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"not eq 1", "TTTTTTTTTTFTTTTFTTTTTTTTTTT"},
		{"gt 1", "EEEEEEEEEEFFFTTFFEEEEEEEEEE"},
		{"ge 1", "EEEEEEEEEETFFTTTFEEEEEEEEEE"},
		{"lt 1", "EEEEEEEEEEFTTFFFTEEEEEEEEEE"},
		{"le 1", "EEEEEEEEEETTTFFTTEEEEEEEEEE"},
		{"gt \"b\"", "FFFFFTTFTFEEEEEEEEEEEEEEEEE"},
		{"lt \"Abd\"", "FTTTTFFTFTEEEEEEEEEEEEEEEEE"},
		{"lessthan 2", "EEEEEEEEEETTTFFTTEEEEEEEEEE"},
		{"greaterthan 0", "EEEEEEEEEETFFTTTFEEEEEEEEEE"},
		{"lt [1, \"B\"]", "EEEEEEEEEEEEEEEEEETEEEEEETE"},
		{"in [1, 2]", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"in [true]", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"in \"abc\"", "TFFFTFFFFFEEEEEEEEEEEEEEEEE"},
		{"in {\"a\": 1}", "FFFFFFFFFFFFFFFFFFEEEEFEFEF"},
		{"in [\"abc\", \"A1!\"]", "TFFFFFFTFFFFFFFFFFFFFFFFFFF"},
		{"in u", "FFFFFFFFFFFFFFFFFFFFFFFFFFF"},
		{"in j.x", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"in j[\"x\"]", "FFFFFFFFFFTFFFFTFFFFFFFFFFF"},
		{"sameas 1", "FFFFFFFFFFTFFFFFFFFFFFFFFFF"},
		{"sameas none", "FFFFFFFFFFFFFFFFFTFFFFFFFFF"},
		{"sameas true", "FFFFFFFFFFFFFFFTFFFFFFFFFFF"},
		{"not upper", "TFTTTTTFFTTTTTTTTTTFTTTTTFT"},
		{"not string", "FFFFFFFFFFTTTTTTTTTTTTTTTTT"},
		{"not in \"abc\"", "FTTTFTTTTTEEEEEEEEEEEEEEEEE"},
	} {
		var got strings.Builder
		for _, v := range values {
			got.WriteByte(renderTest(t, "{% macro m() %}{% endmacro %}{{ ("+v+") is "+tc.test+" }}"))
		}
		if got.String() != tc.want {
			t.Errorf("is %s: got %s, want %s (values %v)", tc.test, got.String(), tc.want, values)
		}
	}
}

// renderTest renders src, a template writing one test's result, with j
// as TestPyTestsMatchJinja2 gives it: 'T', 'F' or 'E' for an error.
func renderTest(t *testing.T, src string) byte {
	t.Helper()
	tmpl, err := NewChatTemplate(src, "", "")
	if err != nil {
		return 'E'
	}
	out, err := tmpl.RenderJSON([]byte(`[]`), ChatOptions{JSONVars: map[string]json.RawMessage{"j": json.RawMessage(`{"x": [1, "A"]}`)}})
	switch {
	case err != nil:
		return 'E'
	case out == "True":
		return 'T'
	case out == "False":
		return 'F'
	}
	t.Fatalf("%s: rendered %q", src, out)
	return 0
}

// TestPyTestsPrecedence: a test binds to the operand before it as
// jinja2's parser binds it (as a filter does), its bare argument is one
// primary with its attributes and subscripts, and "is not" negates. The
// wants are jinja2 3.1.6's renderings, as TestPyTestsMatchJinja2's.
func TestPyTestsPrecedence(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"\"a\" ~ 1 is string", "aFalse"},
		{"1 ~ \"a\" is number", "1False"},
		{"not u is defined", "True"},
		{"u is defined and u", "False"},
		{"u is not defined or x", "True"},
		{"\"y\" if u is string else \"n\"", "n"},
		{"-1 is number", "True"},
		{"- j.x[0] is eq(-1)", "True"},
		{"- j.x[0] is eq -1", "error"},
		{"2 - 1 is number", "1"},
		{"(2) - j.x[0] is number", "1"},
		{"[-1.5 is float, 1 is defined]", "[True, True]"},
		{"[1, 2, 3]|select(\"odd\")|list", "[1, 3]"},
		{"j.x|first is odd", "True"},
		{"\"ab\"|upper is upper", "True"},
		{"j.x is not none", "True"},
		{"j.x[1] is in \"xAx\"", "True"},
		{"4 is divisibleby j.x[0] + 1", "2"},
		{"j is mapping and j.x is sequence", "True"},
		{"(j.x|length) is eq 2", "True"},
		{"j . x [0] is eq 1", "True"},
		{"loopx is undefined", "True"},
		{"3 is gt 2 is true", "True"},
	} {
		src := "{{ " + tc.expr + " }}"
		tmpl, err := NewChatTemplate(src, "", "")
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		got, err := tmpl.RenderJSON([]byte(`[]`), ChatOptions{JSONVars: map[string]json.RawMessage{"j": json.RawMessage(`{"x": [1, "A"]}`)}})
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("%s: got %q (%v), want %q", src, got, err, tc.want)
		}
	}
}

// testNameRE matches what follows a word "is": a test's name.
var testNameRE = regexp.MustCompile(`()is\s*(not\s+)?([A-Za-z0-9_]*)`)

// FuzzPyTests checks that rewriting tests never breaks a template that
// compiles, leaves one without "is" alone, and is idempotent.
func FuzzPyTests(f *testing.F) {
	for _, s := range []string{
		"{{ x is upper }}", "{% if m.content is string %}{{ m.content }}{% elif m.content is not none %}x{% endif %}",
		"{{ loop.index is divisibleby 3 }}{{ x is sameas none }}{{ x is in [1, 2] }}{{ x is eq(1) }}",
		"{{ a ~ b is string }}{{ not x is defined }}{{ 'y' if x is odd else 'n' }}", "{{ x.is }}{{ this }}{{ 'is upper' }}",
		"{{ x is divisibleby }}", "{{ x is eq y.z[0](1) . w }}", "{{ x is unknown }}{{ x is a.b }}", "{{ x is eq 'a' \"b\" }}",
		"{% raw %}{{ x is upper }}{% endraw %}", "{{ x is in", "{{ x is eq 1e5 }}{{ x is eq 1_0.5 }}", "{{ x is not not }}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyTests(src)
		if !strings.Contains(src, "is") && out != src {
			t.Fatalf("pyTests(%q) = %q, changed a template without a test", src, out)
		}
		checkIdempotent(t, "pyTests", pyTests, src, out)
		if _, err := jinja.Compile(src); err == nil {
			if _, err := NewChatTemplate(src, "", ""); err != nil {
				t.Fatalf("NewChatTemplate(%q): %v", src, err)
			}
		}
		// A template that mixes tests it rewrites with others, or one
		// whose syntax around a test jinja2 refuses ("{{ 0!is string is
		// defined }}": no chained tests, no "!"), so that a test is left
		// as it was, may not compile any more: NewChatTemplate then
		// compiles it without the rewrite (above).
		tests := testNameRE.FindAllStringSubmatch(src, -1)
		for _, m := range tests {
			if _, ok := pyTestFuncs[m[3]]; !ok {
				return
			}
		}
		if strings.Count(out, "|"+pyTestPrefix)+strings.Count(out, "|"+pyTestNotPrefix) < len(tests) {
			return
		}
		checkStillCompiles(t, "pyTests", src, out)
	})
}

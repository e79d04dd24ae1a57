package tokenizer

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// TestChatTemplateToJSONMatchesPython checks the tojson filter against
// transformers' (Python's json.dumps with ensure_ascii=False): the wants
// are jinja2's renderings in render_chats.py's environment.
func TestChatTemplateToJSONMatchesPython(t *testing.T) {
	for _, tc := range []struct {
		name, src, x, want string
	}{
		{"float", "{{ x | tojson }}", `{"f": 2.0, "g": 1e6, "h": 1e16, "i": 1.5e-5, "j": 0.0001, "k": -0.0, "l": 123456789.125, "m": 1e22, "n": 3, "o": 0.1, "p": 1e15}`, "{\"f\": 2.0, \"g\": 1000000.0, \"h\": 1e+16, \"i\": 1.5e-05, \"j\": 0.0001, \"k\": -0.0, \"l\": 123456789.125, \"m\": 1e+22, \"n\": 3, \"o\": 0.1, \"p\": 1000000000000000.0}"},
		{"indent keeps key order", "{{ x | tojson(indent=4) }}", `{"type": "function", "function": {"name": "get_weather", "description": "a <b> & c \u2028 \"q\"\n", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "x": [], "y": {}}}}`, "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"a <b> & c \u2028 \\\"q\\\"\\n\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n                }\n            },\n            \"required\": [\n                \"city\"\n            ],\n            \"x\": [],\n            \"y\": {}\n        }\n    }\n}"},
		{"separators and sort_keys", "{{ x | tojson(separators=(',', ':'), sort_keys=true) }}", `{"b": [1, 2.5], "a": {"d": null, "c": true}}`, "{\"a\":{\"c\":true,\"d\":null},\"b\":[1,2.5]}"},
		{"ensure_ascii", "{{ x | tojson(ensure_ascii=true) }}", `{"s": "\u00e9\ud83d\ude00\u0001\t\u007f"}`, "{\"s\": \"\\u00e9\\ud83d\\ude00\\u0001\\t\\u007f\"}"},
		{"indent 0 and a string indent", "{{ x|tojson(indent=0) }}{{ x | tojson(indent='\t') }}", `[1, {"a": [], "b": 1.0}]`, "[\n1,\n{\n\"a\": [],\n\"b\": 1.0\n}\n][\n\t1,\n\t{\n\t\t\"a\": [],\n\t\t\"b\": 1.0\n\t}\n]"},
		{"a string literal is not a filter", "{{ \"a | tojson\" }}{{ x |tojson }}", `"<\u2028>"`, "a | tojson\"<\u2028>\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, err := NewChatTemplate(tc.src, "", "")
			if err != nil {
				t.Fatal(err)
			}
			got, err := ct.Render(nil, ChatOptions{JSONVars: map[string]json.RawMessage{"x": json.RawMessage(tc.x)}})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestAppendPyFloat(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1, "1.0"}, {-2.5, "-2.5"}, {0.1, "0.1"},
		{1e-4, "0.0001"}, {1.5e-5, "1.5e-05"}, {1e15, "1000000000000000.0"}, {1e16, "1e+16"},
		{1.2345678901234567e19, "1.2345678901234567e+19"}, {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
		{123456.789, "123456.789"}, {math.NaN(), "NaN"}, {math.Inf(1), "Infinity"}, {math.Inf(-1), "-Infinity"},
	} {
		if got := string(appendPyFloat(nil, tc.f)); got != tc.want {
			t.Errorf("appendPyFloat(%v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}

func FuzzAppendPyFloat(f *testing.F) {
	for _, x := range []float64{0, 1, 2.5, 1e16, 1e-5, 123456789.125, 5e-324} {
		f.Add(x)
	}
	f.Fuzz(func(t *testing.T, x float64) {
		s := string(appendPyFloat(nil, x))
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		back, err := strconv.ParseFloat(s, 64)
		if err != nil || back != x || math.Signbit(back) != math.Signbit(x) {
			t.Fatalf("appendPyFloat(%v) = %q, reads back as %v (%v)", x, s, back, err)
		}
		if !strings.ContainsAny(s, ".e") {
			t.Fatalf("appendPyFloat(%v) = %q, which reads as an integer", x, s)
		}
	})
}

// FuzzPyFilters checks that renaming the filters of pyFilterNames never
// breaks a template that compiles, and leaves one without them alone.
func FuzzPyFilters(f *testing.F) {
	for _, s := range []string{
		"{{ x | tojson }}", "{{ x|tojson(indent=4) }}", "{% set y = x | tojson %}{{ y }}",
		"{{ 'a | tojson' }}{{ \"|tojson\" }}", "{# x | tojson #}{{ x | tojsonx }}", "{{ x | tojson", "|tojson }}",
		"{% for t in tools %}{{- t | tojson(indent=4) }}{% endfor %}", "{{ x | tojson | safe }}", "{% raw %}{{ x | tojson }}{% endraw %}",
		"{{ x | string }}{% if x is string %}{{ x|stringify }}{% endif %}", "{{ x | tojson | string | tojson }}",
		"{{ '<|eot_id|>' + m['content'] | trim + '<|eot_id|>' }}", "{% set c = x|trim('\\n') %}{{ c | trimmed }}",
		"{{ m.role | capitalize }}{{ x|upper|lower }}{% if x is upper %}{{ x | title }}{% endif %}", "{{ 'a|title' }}{{ x|titles }}",
		"{{ x | join(', ') }}{{ x|join(attribute='a.0') }}{% set s = x | join %}{{ x|joined }}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyFilters(src)
		if !hasPyFilterName(src) && out != src {
			t.Fatalf("pyFilters(%q) = %q, changed a template without a filter of pyFilterNames", src, out)
		}
		checkStillCompiles(t, "pyFilters", src, out)
	})
}

// TestChatTemplateStringMatchesPython checks the string filter against
// jinja2's (Python's str()) in Qwen3-Coder's way of writing tool call
// arguments; the want is jinja2's rendering in render_chats.py's
// environment.
func TestChatTemplateStringMatchesPython(t *testing.T) {
	const src = "{% for k, v in x|items %}{% set v = v | tojson | safe if v is mapping or (v is sequence and v is not string) else v | string %}" +
		"{{ k }}={{ v }};{% endfor %}{{ nothing | string }}|{{ x.f|string }}"
	const x = `{"a": 2.0, "b": null, "c": true, "d": 3, "e": "s", "f": 1e6, "g": 0.5, "h": [1, 2.0], "i": {"j": 1e16}}`
	const want = `a=2.0;b=None;c=True;d=3;e=s;f=1000000.0;g=0.5;h=[1, 2.0];i={"j": 1e+16};|1000000.0`
	checkRender(t, src, map[string]string{"x": x}, want)
}

// checkStillCompiles fails t when template src compiles and out, what
// rewrite name made of it, does not; it reports whether src compiles.
func checkStillCompiles(t *testing.T, name, src, out string) bool {
	t.Helper()
	if _, err := jinja.Compile(src); err != nil {
		return false
	}
	if _, err := jinja.Compile(out); err != nil {
		t.Fatalf("%s(%q) = %q, which does not compile: %v", name, src, out, err)
	}
	return true
}

// checkIdempotent fails t when rewrite (named name) changes out, what it
// made of src.
func checkIdempotent(t *testing.T, name string, rewrite func(string) string, src, out string) {
	t.Helper()
	if again := rewrite(out); again != out {
		t.Fatalf("%s(%q) = %q, then %q", name, src, out, again)
	}
}

// checkRender renders template src with the variables vars (JSON texts)
// and checks it gives want.
func checkRender(t *testing.T, src string, vars map[string]string, want string) {
	t.Helper()
	ct, err := NewChatTemplate(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	jv := make(map[string]json.RawMessage, len(vars))
	for k, v := range vars {
		jv[k] = json.RawMessage(v)
	}
	got, err := ct.Render(nil, ChatOptions{JSONVars: jv})
	if err != nil || got != want {
		t.Errorf("got  %q (%v)\nwant %q", got, err, want)
	}
}

// TestChatTemplateTrimMatchesPython checks the trim filter against
// jinja2's (Python's str.strip): without chars it strips the separators
// U+001C to U+001F too, which Go's unicode.IsSpace (the Go engine's trim)
// leaves; Llama 3.x's templates trim every message's content. The want is
// jinja2's rendering in render_chats.py's environment.
func TestChatTemplateTrimMatchesPython(t *testing.T) {
	const src = "{{ x | trim }}|{{ x|trim(\"\x1c\") }}|{{ x | trim(chars=none) }}|{{ n | trim }}|{{ f|trim }}|{{ u | trim }}|"
	const x = `"\u001c\u001f Hi\u3000\u001e\u00a0\u000b\u001d"`
	const want = "Hi|\x1f Hi\u3000\x1e\u00a0\v\x1d|Hi|None|2.0||"
	checkRender(t, src, map[string]string{"x": x, "n": "null", "f": "2.0"}, want)
}

// TestChatTemplateCaseFiltersMatchPython checks the upper, lower, title
// and capitalize filters against jinja2's: Python's full case mappings
// and final sigma, jinja2's own title (words split at white space, '-',
// '(', '{', '[' and '<', their first letter in upper case), and str() of
// what is not a string. The Go engine's filters map case with Go's
// simple mappings ("ß"|upper: "ß"), start title's words after anything
// but a letter or digit ("They'Re", "3Rd") and write None as "". The want
// is jinja2's rendering in render_chats.py's environment.
func TestChatTemplateCaseFiltersMatchPython(t *testing.T) {
	const src = "{{ x|upper }}|{{ x|lower }}|{{ x|title }}|{{ x|capitalize }}|{{ n|upper }}|{{ f|title }}|{{ u|lower }}|{{ x | upper | lower }}|{{ 'ǆa'|capitalize }}"
	const x = `"hELLO ß ﬁ they're 3rd-(ǆemal) ΌΣΟΣ İ ΑΣ b"`
	const want = "HELLO SS FI THEY'RE 3RD-(\u01c4EMAL) \u038c\u03a3\u039f\u03a3 \u0130 \u0391\u03a3 B|hello \u00df \ufb01 they're 3rd-(\u01c6emal) \u03cc\u03c3\u03bf\u03c2 i\u0307 \u03b1\u03c2 b|Hello SS FI They're 3rd-(\u01c4emal) \u038c\u03c3\u03bf\u03c2 \u0130 \u0391\u03c3 B|Hello \u00df \ufb01 they're 3rd-(\u01c6emal) \u03cc\u03c3\u03bf\u03c2 i\u0307 \u03b1\u03c2 b|NONE|2.0||hello ss fi they're 3rd-(\u01c6emal) \u03cc\u03c3\u03bf\u03c2 i\u0307 \u03b1\u03c2 b|\u01c5a"
	checkRender(t, src, map[string]string{"x": x, "n": "null", "f": "2.0"}, want)
	ct, err := NewChatTemplate("{{ x|upper(1) }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ct.Render(nil, ChatOptions{JSONVars: map[string]json.RawMessage{"x": json.RawMessage(x)}}); err == nil {
		t.Errorf("x|upper(1) = %q, want an error like jinja2's TypeError('do_upper() takes 1 positional argument but 2 were given')", got)
	}
}

// TestToJSONFilterRaw: the filter is renamed in a template that mentions
// "raw" in its text or names, and not in one with a {% raw %} block.
func TestToJSONFilterRaw(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{{ raw_args | tojson }} drawn", "{{ raw_args | " + tojsonName + " }} drawn"},
		{"{% raw %}{{ x | tojson }}{% endraw %}{{ y | tojson }}", "{% raw %}{{ x | tojson }}{% endraw %}{{ y | tojson }}"},
		{"{%- raw -%}{{ x | tojson }}{%- endraw %}", "{%- raw -%}{{ x | tojson }}{%- endraw %}"},
	} {
		if got := pyFilters(tc.src); got != tc.want {
			t.Errorf("pyFilters(%q) = %q, want %q", tc.src, got, tc.want)
		}
	}
}

// TestToolCallArgumentsOutOfRange: a tool call's arguments with a number
// too large for a float are rendered as json.loads reads them, inf, which
// tojson writes Infinity (they were a string, written "1E400" with its
// quotes); the want is jinja2's rendering in render_chats.py's environment.
func TestToolCallArgumentsOutOfRange(t *testing.T) {
	ct, err := NewChatTemplate("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}{% endfor %}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := `[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{\"big\": 1E400, \"neg\": -1e999, \"tiny\": 1e-400, \"n\": 5}"}}]}]`
	const want = `{"big": Infinity, "neg": -Infinity, "tiny": 0.0, "n": 5};`
	if got, err := ct.RenderJSON([]byte(msgs), ChatOptions{}); err != nil || got != want {
		t.Errorf("got  %q (%v)\nwant %q", got, err, want)
	}
}

// TestFilterBlocksMatchJinja2: {% filter %} blocks apply the same
// Python-exact filters as | does (pyFilterBlocks), with arguments and
// chains, nested and in loops, with jinja2's whitespace control. The
// expected renderings are jinja2 3.1.6's, in transformers'
// environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// tojson as json.dumps(ensure_ascii=False)), rendered with x = 'a"b<é'.
func TestFilterBlocksMatchJinja2(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{% filter upper %}ß and straße{% endfilter %}", "SS AND STRASSE"},
		{"{% filter title %}they're x-ray{% endfilter %}", "They're X-Ray"},
		{"{% filter capitalize %}ǆa ÉCOLE{% endfilter %}", "ǅa école"},
		{"{% filter lower %}ΌΣΟΣ{% endfilter %}", "όσος"},
		{"[{% filter trim %}\x1c hi \x1f{% endfilter %}]", "[hi]"},
		{"{% filter tojson %}{{ x }}{% endfilter %}", "\"a\\\"b<é\""},
		{"{% filter upper|trim %}  ab\x1c  {% endfilter %}", "AB"},
		{"{% filter replace('a', 'b') %}aaa{% endfilter %}", "bbb"},
		{"a\n{% filter upper %}\nx\n{% endfilter %}\nb", "a\nX\nb"},
		{"a\n  {%- filter upper -%}\n  x\n  {%- endfilter -%}\n  b", "aXb"},
		{"a\n  {% filter upper %}\n  x\n  {% endfilter %}\n  b\n", "a\n  X\n  b"},
		{"a {% filter upper -%}  x  {%- endfilter %} b", "a X b"},
		{"{% filter upper %}a{% filter lower %}B{% endfilter %}c{% endfilter %}", "ABC"},
		{"{% for m in ['a', 'b'] %}\n{% filter upper %}\n{{ m }}\n{% endfilter %}\n{% endfor %}", "A\nB\n"},
		{"{% filter indent(2) %}a\nb{% endfilter %}", "a\n  b"},
		{"{%- if true %}\n{% filter upper %}{{ 'x' }}{% endfilter %}\n{% endif %}\nz", "Xz"},
		{"{% filter upper %}{% endfilter %}|{% filter lower %}{{ 'Q' }}\n{% endfilter %}|", "|q\n|"},
	} {
		tmpl, err := NewChatTemplate(tc.src, "", "")
		if err != nil {
			t.Errorf("%q: %v", tc.src, err)
			continue
		}
		got, err := tmpl.Render(nil, ChatOptions{Vars: map[string]any{"x": `a"b<é`}})
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q (%v), want %q", tc.src, got, err, tc.want)
		}
	}
}

// FuzzPyFilterBlocks checks that rewriting filter blocks and block sets
// never breaks a template that compiles, leaves one without an endfilter
// or endset alone, and is idempotent (no block is left to rewrite).
func FuzzPyFilterBlocks(f *testing.F) {
	for _, s := range []string{
		"{% filter upper %}x{% endfilter %}", "{%- filter upper|trim -%}\n x {%- endfilter -%}\n", "{% filter indent(2) %}a\nb{% endfilter %}",
		"{% filter upper %}{% filter lower %}X{% endfilter %}{% endfilter %}", "{% filter upper %}x", "x{% endfilter %}",
		"{% filter 'a' %}x{% endfilter %}", "{{ '{% filter upper %}' }}{% endfilter %}", "{% raw %}{% filter upper %}x{% endfilter %}{% endraw %}",
		"{% for m in messages %}{% filter tojson %}{{ m }}{% endfilter %}{% endfor %}", "{% filter upper +%}\nx\n{%+ endfilter +%}\ny",
		"{# {% filter upper %} #}{% endfilter %}", "{%filter upper%}x{%endfilter%}",
		"{% set x %}a{% endset %}", "{%- set ns.x | trim -%}\n a {%- endset +%}", "{% set x = 1 %}{% set y %}{% set x = 2 %}{% endset %}",
		"{% set 'a' %}x{% endset %}", "{% set x | %}x{% endset %}", "{% set x %}{% filter upper %}a{% endset %}{% endfilter %}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyFilterBlocks(src)
		if !strings.Contains(src, "endfilter") && !strings.Contains(src, "endset") && out != src {
			t.Fatalf("pyFilterBlocks(%q) = %q, changed a template without an endfilter or endset", src, out)
		}
		checkIdempotent(t, "pyFilterBlocks", pyFilterBlocks, src, out)
		checkStillCompiles(t, "pyFilterBlocks", src, out)
	})
}

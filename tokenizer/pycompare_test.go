package tokenizer

import (
	"strings"
	"testing"
)

// TestPyComparesRewrite: the comparisons pyCompares rewrites, with the
// operands jinja2's grammar gives them, the loops' iterables and the
// attribute assignments it guards, and what it leaves as it is. (That
// they then render as jinja2 does is TestJinjaSemanticsMatchJinja2's
// "compare" section.)
func TestPyComparesRewrite(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{{ a == b }}", "{{ ((a)|kvroute_cmp('==', (b))) }}"},
		{"{%- if m.role != 'user' -%}", "{%- if ((m.role)|kvroute_cmp('!=', ('user'))) -%}"},
		{"{{ a < b <= c }}", "{{ ((a)|kvroute_cmp('<', (b), '<=', (c))) }}"},
		{"{{ not a in b and c not in d }}", "{{ not ((a)|kvroute_cmp('in', (b))) and ((c)|kvroute_cmp('not in', (d))) }}"},
		{"{{ x|length + 1 > y ~ 'z' }}", "{{ ((x|length + 1)|kvroute_cmp('>', (((y)|kvroute_cat(('z')))))) }}"},
		{"{{ a is eq 1 == b is defined }}", "{{ ((a is eq 1)|kvroute_cmp('==', (b is defined))) }}"},
		{"{{ 'y' if a == 1 else 'n' }}", "{{ 'y' if ((a)|kvroute_cmp('==', (1))) else 'n' }}"},
		{"{% for m in ms if m.role == 'tool' %}", "{% for m in (ms)|kvroute_iter if ((m.role)|kvroute_cmp('==', ('tool'))) %}"},
		{"{% for k, v in d.items() %}{% set ns.x = loop.index0 >= 2 %}", "{% for k, v in (d.items())|kvroute_iter %}{% set ns.x = (((loop.index0)|kvroute_cmp('>=', (2))))|kvroute_setattr(ns) %}"},
		{"{{ [a == 1, {'k': f(b != 2)}, x[c in d]] }}", "{{ ([((a)|kvroute_cmp('==', (1))), {'k': f(((b)|kvroute_cmp('!=', (2))))}, x[((c)|kvroute_cmp('in', (d)))]])|kvroute_string }}"},
		{"{{ (a == b) == c }}", "{{ (((((a)|kvroute_cmp('==', (b)))))|kvroute_cmp('==', (c))) }}"},
		{"{{ -x[0] == -1 }}", "{{ ((-x[0])|kvroute_cmp('==', (-1))) }}"},
		{"{% call(a, b) m(x == 1, y=z in w) %}", "{% call(a, b) m(((x)|kvroute_cmp('==', (1))), y=((z)|kvroute_cmp('in', (w)))) %}"},
		// left alone: no comparison, a string, a comment, a for loop's
		// "in" (its iterable goes through kvroute_iter), a macro's
		// defaults, text jinja2 does not parse, {% raw %}
		{"{{ 'a' }}{% for x in y %}{{ 'a == b' }}{# a == b #}a == b{% macro m(a=1 == 2) %}", "{{ 'a' }}{% for x in (y)|kvroute_iter %}{{ 'a == b' }}{# a == b #}a == b{% macro m(a=1 == 2) %}"},
		// prints and ~ of what the Go engine may write otherwise than
		// str(), and those it writes alike (strings, integers, booleans)
		{"{{ a }}{{- m['content'] -}}{{ 2.0 }}{{ none }}{{ x if y else 'z' }}{{ -1 }}{{ a or 'b' }}{{ x | first }}{{ a.strip() }}", "{{ (a)|kvroute_string }}{{- (m['content'])|kvroute_string -}}{{ (2.0)|kvroute_string }}{{ (none)|kvroute_string }}{{ (x if y else 'z')|kvroute_string }}{{ (-1)|kvroute_string }}{{ (a or 'b')|kvroute_string }}{{ (x | first)|kvroute_string }}{{ (a.strip())|kvroute_string }}"},
		{"{{ 'a' 'b' }}{{ 1 }}{{ true }}{{ '<s>' + m.role + '\n' }}{{ x + 'a' + y }}{{ x | tojson }}{{ x|trim|upper }}{{ x | length }}{{ not x }}{{ a == b }}{{ x is defined }}{{ 'a' if x }}{{ 'a' if x else 1 }}{{ ('a') }}{{ x ~ 1 }}",
			"{{ 'a' 'b' }}{{ 1 }}{{ true }}{{ '<s>' + m.role + '\n' }}{{ x + 'a' + y }}{{ x | tojson }}{{ x|trim|upper }}{{ x | length }}{{ not x }}{{ ((a)|kvroute_cmp('==', (b))) }}{{ x is defined }}{{ 'a' if x }}{{ 'a' if x else 1 }}{{ ('a') }}{{ ((x)|kvroute_cat((1))) }}"},
		{"{{ x + 1 }}{{ 'a' + x - 1 }}{{ x * 'a' }}{{ (1, 2) }}{{ [1] }}{{ x|default('') }}{{ x|join(', ') }}{{ f() }}",
			"{{ (x + 1)|kvroute_string }}{{ ('a' + x - 1)|kvroute_string }}{{ (x * 'a')|kvroute_string }}{{ ((1, 2))|kvroute_string }}{{ ([1])|kvroute_string }}{{ (x|default(''))|kvroute_string }}{{ x|join(', ') }}{{ (f())|kvroute_string }}"},
		{"{{ kvroute_lb_0() }}{{ kvroute_wb_1(x, y) }}{{ kvroute_fb_2()|upper }}{{ kvroute_lb_0().x }}{{ kvroute_x() }}",
			"{{ kvroute_lb_0() }}{{ kvroute_wb_1(x, y) }}{{ kvroute_fb_2()|upper }}{{ (kvroute_lb_0().x)|kvroute_string }}{{ (kvroute_x())|kvroute_string }}"},
		{"{% set s = 'a' ~ x ~ 1 + 2 %}{{ 'a' ~ 1 ~ true ~ ('b' ~ 'c') }}{{- a ~ b -}}{% if x ~ y %}{% endif %}",
			"{% set s = (('a')|kvroute_cat((x), (1))) + 2 %}{{ 'a' ~ 1 ~ true ~ ('b' ~ 'c') }}{{- ((a)|kvroute_cat((b))) -}}{% if ((x)|kvroute_cat((y))) %}{% endif %}"},
		{"{{ x is defined if y else z == 1 }}{{ a == }}{{ a ! b == c }}", "{{ x is defined if y else z == 1 }}{{ a == }}{{ a ! b == c }}"},
		{"{% raw %}{{ a == b }}{% endraw %}{{ a == b }}", "{% raw %}{{ a == b }}{% endraw %}{{ a == b }}"},
	} {
		if got := pyCompares(tc.src); got != tc.want {
			t.Errorf("pyCompares(%q)\n got %q\nwant %q", tc.src, got, tc.want)
		}
	}
}

// FuzzPyCompares checks that rewriting comparisons never breaks a
// template that compiles, leaves one without a comparison alone, and is
// idempotent (a rewritten comparison is a filter with its operators as
// strings).
func FuzzPyCompares(f *testing.F) {
	for _, s := range []string{
		"{{ a == b }}", "{% if m.role != 'user' and not loop.last %}x{% endif %}", "{{ a < b <= c > d }}",
		"{% for m in ms if m.role in ['a', 'b'] %}{{ m.x not in y }}{% endfor %}", "{% set ns.x = a|length >= 2 %}",
		"{{ 'y' if a == 1 else 'n' }}", "{{ [a == 1, {'k': f(b != 2)}] }}", "{% macro m(a, b=1 == 2) %}{% endmacro %}",
		"{{ x is defined if y else z == 1 }}", "{{ a == }}", "{% raw %}{{ a == b }}{% endraw %}", "{{ a is eq 1 == b is defined }}",
		"{{ -x[0] == -1 }}{{ x[1:2] == y[::-1] }}", "{{ f(*a, **b) == g(c=1) }}", "{{ a ~ b == c | d(e) is f }}",
		"{%- if a == 1 -%}{{- b != 2 -}}{%+ endif %}", "{{ 'a' 'b' == \"ab\" }}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyCompares(src)
		if !mayRewrite(src) && out != src {
			t.Fatalf("pyCompares(%q) = %q, changed a template without a comparison, a print or a ~", src, out)
		}
		if out != src && !strings.Contains(out, compareName) && !strings.Contains(out, iterName) && !strings.Contains(out, setAttrName) &&
			!strings.Contains(out, stringName) && !strings.Contains(out, catName) {
			t.Fatalf("pyCompares(%q) = %q, changed it without rewriting a comparison, a loop, an assignment, a print or a ~", src, out)
		}
		checkIdempotent(t, "pyCompares", pyCompares, src, out)
		checkStillCompiles(t, "pyCompares", src, out)
	})
}

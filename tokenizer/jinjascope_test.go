package tokenizer

import (
	"strings"
	"testing"
)

// TestPyLoopBodiesRewrite: the loops pyLoopBodies renders the body of in
// a macro (an iteration may read what the one before assigned), and those
// it leaves. (That they then render as jinja2 does is
// TestJinjaSemanticsMatchJinja2's "scoping" section.)
func TestPyLoopBodiesRewrite(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{% for i in x %}{{ y }}{% set y = i %}{% endfor %}",
			"{% for i in x %}{% macro kvroute_lb_0() %}{{ y }}{% set y = i %}{% endmacro %}{{ kvroute_lb_0() }}{% endfor %}"},
		{"{%- for i in x -%}\n {% set y = y ~ i %}\n{%- else %}e{% endfor %}",
			"{%- for i in x -%}{% macro kvroute_lb_0() -%}\n {% set y = y ~ i %}\n{%- endmacro %}{{ kvroute_lb_0() }}{%- else %}e{% endfor %}"},
		{"{% for a in x %}{% for b in a %}{{ y }}{% set y = b %}{% endfor %}{% if a %}{% set z = a %}{% endif %}{{ z }}{% endfor %}",
			"{% for a in x %}{% macro kvroute_lb_0() %}{% for b in a %}{% macro kvroute_lb_1() %}{{ y }}{% set y = b %}{% endmacro %}{{ kvroute_lb_1() }}{% endfor %}{% if a %}{% set z = a %}{% endif %}{{ z }}{% endmacro %}{{ kvroute_lb_0() }}{% endfor %}"},
		{"{% for i in x %}{% set y = i %}{% else -%}\n{% set y = 1 %}{{ y }}{%- endfor %}",
			"{% for i in x %}{% set y = i %}{% else -%}{% macro kvroute_lb_0() -%}\n{% set y = 1 %}{{ y }}{%- endmacro %}{{ kvroute_lb_0() }}{%- endfor %}"},
		{"{% for a in x %}{% for b in a %}{{ z }}{% endfor %}{% set z = a %}{% endfor %}",
			"{% for a in x %}{% macro kvroute_lb_0() %}{% for b in a %}{{ z }}{% endfor %}{% set z = a %}{% endmacro %}{{ kvroute_lb_0() }}{% endfor %}"},
		// left alone: each variable assigned before it is read (in every
		// branch of an if), no assignment but a namespace's, an assignment
		// in a macro of the body or in the else part, break and continue,
		// recursive, unmatched tags, {% raw %} (an else part without an
		// assignment too)
		{"{% for i in x %}{% set y = i %}{{ y }}{% set y = y + 1 %}{% endfor %}", "{% for i in x %}{% set y = i %}{{ y }}{% set y = y + 1 %}{% endfor %}"},
		{"{% for i in x %}{% if i %}{% set y = 1 %}{% elif i == 2 %}{% set y = 2 %}{% else %}{% set y = 3 %}{% endif %}{{ y }}{% endfor %}",
			"{% for i in x %}{% if i %}{% set y = 1 %}{% elif i == 2 %}{% set y = 2 %}{% else %}{% set y = 3 %}{% endif %}{{ y }}{% endfor %}"},
		{"{% for i in x %}{{ y }}{% set ns.y = i %}{% endfor %}", "{% for i in x %}{{ y }}{% set ns.y = i %}{% endfor %}"},
		{"{% for i in x %}{% macro m() %}{{ y }}{% set y = i %}{% endmacro %}{% else %}{{ y }}{% endfor %}",
			"{% for i in x %}{% macro m() %}{{ y }}{% set y = i %}{% endmacro %}{% else %}{{ y }}{% endfor %}"},
		{"{% for i in x %}{{ y }}{% set y = i %}{% if y %}{% break %}{% endif %}{% endfor %}", "{% for i in x %}{{ y }}{% set y = i %}{% if y %}{% break %}{% endif %}{% endfor %}"},
		{"{% for i in x recursive %}{{ y }}{% set y = i %}{% endfor %}", "{% for i in x recursive %}{{ y }}{% set y = i %}{% endfor %}"},
		{"{% for i in x %}{{ y }}{% set y = i %}{% endif %}{% endfor %}", "{% for i in x %}{{ y }}{% set y = i %}{% endif %}{% endfor %}"},
		{"{% raw %}{% endraw %}{% for i in x %}{{ y }}{% set y = i %}{% endfor %}", "{% raw %}{% endraw %}{% for i in x %}{{ y }}{% set y = i %}{% endfor %}"},
	} {
		if got := pyLoopBodies(tc.src); got != tc.want {
			t.Errorf("pyLoopBodies(%q)\n got %q\nwant %q", tc.src, got, tc.want)
		}
	}
}

// FuzzPyLoopBodies checks that rendering loop bodies in macros never
// breaks a template that compiles, leaves one without a loop or an
// assignment alone, and is idempotent (a body's assignments are a
// macro's).
func FuzzPyLoopBodies(f *testing.F) {
	for _, s := range []string{
		"{% for i in x %}{% set y = i %}{{ y }}{% endfor %}", "{%- for i in x -%}\n {% set y = y ~ i %}\n{%- else %}e{% endfor %}",
		"{% for i in x %}{{ y }}{% set y, z = i, 1 %}{% if z %}{% set w = 1 %}{% else %}{{ w }}{% endif %}{% endfor %}",
		"{% for a in x %}{% for b in a %}{% set y = b %}{% endfor %}{% if a %}{% set z = a %}{% endif %}{% endfor %}",
		"{% for i in x %}{% set ns.y = i %}{% endfor %}", "{% for i in x %}{% set y = i %}{% break %}{% endfor %}",
		"{% for i in x recursive %}{% set y = i %}{% endfor %}", "{% for i in x %}{% set y = i %}{% endif %}{% endfor %}",
		"{% for i in x %}{% set y %}a{% endset %}{% filter upper %}{% set z = 1 %}{% endfilter %}{% endfor %}",
		"{% for i in x %}{% set y = i %}", "{% set y = 1 %}{% endfor %}", "{% for i in x +%}\n{% set y = i %}\n{%+ endfor +%}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyLoopBodies(src)
		if (!strings.Contains(src, "endfor") || !strings.Contains(src, "set")) && out != src {
			t.Fatalf("pyLoopBodies(%q) = %q, changed a template without a loop or an assignment", src, out)
		}
		checkIdempotent(t, "pyLoopBodies", pyLoopBodies, src, out)
		checkStillCompiles(t, "pyLoopBodies", src, out)
	})
}

// TestPyWithBlocksRewrite: the {% with %} blocks pyWithBlocks rewrites as
// macros, and those it leaves.
func TestPyWithBlocksRewrite(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{% with a = 1, b = f(x, y) == 2 %}{{ a }}{% endwith %}",
			"{% macro kvroute_wb_0(a, b) %}{{ a }}{% endmacro %}{{ kvroute_wb_0(1, f(x, y) == 2) }}{# #}"},
		{"{%- with -%}\n x {%- endwith +%}\n", "{%- macro kvroute_wb_0() -%}\n x {%- endmacro %}{{ kvroute_wb_0() }}{# +#}\n"},
		{"{% with a = 1 %}{% with b = a %}{{ b }}{% endwith %}{% endwith %}",
			"{% macro kvroute_wb_0(a) %}{% macro kvroute_wb_1(b) %}{{ b }}{% endmacro %}{{ kvroute_wb_1(a) }}{# #}{% endmacro %}{{ kvroute_wb_0(1) }}{# #}"},
		// left alone: a target that is not a name, a missing value,
		// unmatched tags, {% raw %}
		{"{% with a.b = 1 %}x{% endwith %}{% with a %}x{% endwith %}{% with a == 1 %}x{% endwith %}",
			"{% with a.b = 1 %}x{% endwith %}{% with a %}x{% endwith %}{% with a == 1 %}x{% endwith %}"},
		{"{% with a = 1 %}x", "{% with a = 1 %}x"},
		{"{% raw %}{% endraw %}{% with a = 1 %}x{% endwith %}", "{% raw %}{% endraw %}{% with a = 1 %}x{% endwith %}"},
	} {
		if got := pyWithBlocks(tc.src); got != tc.want {
			t.Errorf("pyWithBlocks(%q)\n got %q\nwant %q", tc.src, got, tc.want)
		}
	}
}

// FuzzPyWithBlocks checks that rewriting {% with %} blocks leaves a
// template without an endwith alone, is idempotent, and makes what it
// rewrites compile (the Go engine compiles no template with a with
// block).
func FuzzPyWithBlocks(f *testing.F) {
	for _, s := range []string{
		"{% with a = 1, b = f(x, y) == 2 %}{{ a }}{% endwith %}", "{%- with -%}\n x {%- endwith +%}\n",
		"{% with a = 1 %}{% with b = a %}{{ b }}{% endwith %}{% endwith %}", "{% with a.b = 1 %}x{% endwith %}",
		"{% with a = 1 %}x", "x{% endwith %}", "{% with a = 'x,y=z', b = [1, {'k': 2}] %}{% set a = 2 %}{% endwith %}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := pyWithBlocks(src)
		if !strings.Contains(src, "endwith") && out != src {
			t.Fatalf("pyWithBlocks(%q) = %q, changed a template without an endwith", src, out)
		}
		checkIdempotent(t, "pyWithBlocks", pyWithBlocks, src, out)
		checkStillCompiles(t, "pyWithBlocks", src, out)
	})
}

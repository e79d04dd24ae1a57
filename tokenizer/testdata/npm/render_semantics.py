"""Renders small templates that tell jinja2's semantics from the Go
engine's, writing expected/jinja-semantics.json for
TestJinjaSemanticsMatchJinja2 (jinja2cases_test.go): for each case, its
template, its variables (JSON), and jinja2's rendering in render_chats.py's
environment (transformers' apply_chat_template one) or the error it raises
("Type: message").

The cases, by section:
  scoping   which blocks keep an assignment in their body ({% filter %},
            block sets, for loops, macros, call blocks) and which do not
            ({% if %});

Usage: python3 render_semantics.py <testdata dir>
"""
import json
import sys

import jinja2

from render_chats import environment

SCOPING = [
    "{% set x = 1 %}{% filter upper %}{% set x = 2 %}in{{ x }}{% endfilter %}{{ x }}",
    "{% filter upper %}{% set x = 2 %}{% endfilter %}{{ x }}",
    "{% set x = 1 %}{% filter upper %}{{ x }}{% set x = 2 %}{{ x }}{% endfilter %}{{ x }}",
    "{% set x = 1 %}{% filter replace('1', 'one') | upper %}{{ x }}{% set x = 2 %}{% endfilter %}{{ x }}",
    "{% set ns = namespace(a=1) %}{% filter upper %}{% set ns.a = 2 %}{% endfilter %}{{ ns.a }}",
    "{% for i in [1, 2] %}{% filter upper %}{% set x = i %}{% endfilter %}{{ x }}{% endfor %}",
    "{% set x = 1 %}{% for i in [1, 2] %}{% filter upper %}{{ x }}{% set x = i %}{{ x }}{% endfilter %}{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}{% filter upper %}a{{ loop.index }}{% endfilter %}{% endfor %}",
    "{% set x = 1 %}{% filter upper %}{% filter lower %}{% set x = 3 %}{% endfilter %}{{ x }}{% endfilter %}{{ x }}",
    "{% set x = 1 %}{% set y %}{% set x = 2 %}in{{ x }}{% endset %}{{ y }}{{ x }}",
    "{% set x = 1 %}{% set y | upper %}{% set x = 2 %}in{{ x }}{% endset %}{{ y }}{{ x }}",
    "{% set x = 1 %}{% set y|trim|upper %}  a{{ x }}{% set x = 2 %}  {% endset %}[{{ y }}]{{ x }}",
    "{% set ns = namespace(a=1) %}{% set ns.a %}b{% endset %}{{ ns.a }}",
    "{% for i in [1, 2] %}{% set y %}{% set x = i %}{% endset %}{{ x }}{% endfor %}",
    "a\n{% set y %}\nb\n{% endset %}\nc{{ y }}",
    "a\n  {%- set y -%}\n  b\n  {%- endset -%}\n  c{{ y }}",
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}",
    "{% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}",
    "{% set x = 1 %}{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}{% set x = 2 %}{{ x }}{% endcall %}{{ x }}",
]

SECTIONS = {"scoping": SCOPING}


def render(env, src, variables):
    try:
        return {"prompt": env.from_string(src).render(**variables)}
    except Exception as e:  # jinja2's and Python's errors alike
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    d = sys.argv[1]
    env = environment()
    cases = []
    for section, templates in SECTIONS.items():
        for i, case in enumerate(templates):
            src, variables = (case, {}) if isinstance(case, str) else case
            cases.append({"name": f"{section}/{i}", "template": src, "vars": variables, **render(env, src, variables)})
    out = {"renderer": f"jinja2 {jinja2.__version__} (transformers apply_chat_template environment)", "cases": cases}
    with open(f"{d}/expected/jinja-semantics.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"render_semantics.py: wrote {d}/expected/jinja-semantics.json: {len(cases)} cases")


if __name__ == "__main__":
    main()

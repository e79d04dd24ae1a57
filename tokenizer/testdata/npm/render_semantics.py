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
  special   the special tokens of a tokenizer_config.json ("config") as
            transformers 4.x passes them to the template
            (render_chats.py's special_tokens_map), under the keyword
            arguments ("vars"), which win;

Usage: python3 render_semantics.py <testdata dir>
"""
import json
import sys

import jinja2

from render_chats import environment, special_tokens_map

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

# The special tokens transformers gives a template (render_chats.py's
# special_tokens_map of a tokenizer_config.json) under apply_chat_template's
# keyword arguments, which win: (tokenizer_config.json, kwargs), rendered
# with SPECIAL_TEMPLATE as the config's chat_template.
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                 "additional_special_tokens", "image_token", "audio_token")
SPECIAL_TEMPLATE = ("{% macro show(v) %}{% if v is defined %}{{ v | tojson }}{% else %}-{% endif %}{% endmacro %}" +
                    "".join(f"{n}={{{{ show({n}) }}}};" for n in SPECIAL_NAMES))
SPECIAL_TOKENS = [
    ({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
      "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}, {}),
    ({"bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": False, "normalized": True},
      "eos_token": {"__type": "AddedToken", "content": "<｜end▁of▁sentence｜>"}, "pad_token": {"content": "<pad>"}, "unk_token": None}, {}),
    ({"bos_token": "", "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
      "additional_special_tokens": [], "extra_special_tokens": {"image_token": "<image>", "audio_token": {"content": "<audio>"}}}, {}),
    ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, {"bos_token": "X", "pad_token": None, "sep_token": "S"}),
    ({"extra_special_tokens": {"pad_token": "<p>", "image_token": ""}, "pad_token": "<pad>", "eos_token": "</s>"}, {}),
    ({}, {}),
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
    for i, (cfg, kwargs) in enumerate(SPECIAL_TOKENS):
        variables = special_tokens_map(cfg) | kwargs  # transformers: {**self.special_tokens_map, **kwargs}
        cases.append({"name": f"special/{i}", "template": SPECIAL_TEMPLATE, "config": cfg, "vars": kwargs,
                      **render(env, SPECIAL_TEMPLATE, variables)})
    out = {"renderer": f"jinja2 {jinja2.__version__} (transformers apply_chat_template environment)", "cases": cases}
    with open(f"{d}/expected/jinja-semantics.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"render_semantics.py: wrote {d}/expected/jinja-semantics.json: {len(cases)} cases")


if __name__ == "__main__":
    main()

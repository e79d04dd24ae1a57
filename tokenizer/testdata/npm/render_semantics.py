"""Renders small templates that tell jinja2's semantics from the Go
engine's, writing expected/jinja-semantics.json for
TestJinjaSemanticsMatchJinja2 (jinja2cases_test.go): for each case, its
template, its variables (JSON), and jinja2's rendering in render_chats.py's
environment (transformers' apply_chat_template one) or the error it raises
("Type: message").

The cases, by section:
  scoping   which blocks keep an assignment in their body ({% filter %},
            block sets, {% with %}, for loops, macros, call blocks) and
            which do not ({% if %}), and a loop's iterations, each of which starts from
            the variables around the loop;
  compare   comparisons (==, !=, <, ..., in, not in, chains) of every kind
            of value, errors included;
  namespace namespace() as jinja2's Namespace, not a mapping (errors
            included); what a for loop cannot iterate; attribute
            assignments; the items and list filters and the dict methods
            keys, values, items and get;
  print     what {{ }}, ~ and the string and join filters write of a
            value: Python's str() (a float's repr, None, a list's and a
            dict's repr with their strings in Python's quotes, a
            namespace), of literals and of a request's values (a null
            content, tool call arguments);
  special   the special tokens of a tokenizer_config.json ("config") as
            transformers 4.x passes them to the template
            (render_chats.py's special_tokens_map), with a
            special_tokens_map.json ("special_tokens_map") read over it
            (with_special_tokens_map), under the keyword arguments
            ("vars"), which win;

Usage: python3 render_semantics.py <testdata dir>
"""
import json
import sys

import jinja2

from render_chats import environment, special_tokens_map, with_special_tokens_map

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
    # {% with %}: values from around the block, a frame of its own
    "{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}",
    "{% with %}{% set x = 1 %}{{ x }}{% endwith %}{{ x is defined }}",
    "{% with a = [1, 2] | length, c = {'k': (1, 2)} %}{{ a }}{% set a = 3 %}{{ a }}{{ c.k | length }}{% endwith %}",
    "{% for i in [1, 2] %}{% with j = i * 2 %}{{ j }}{{ loop.index }}{% endwith %}{% endfor %}",
    "a\n{% with x = 1 %}\n  {{ x }}\n{% endwith %}\nb|a\n  {%- with x = 2 -%}\n  {{ x }}\n  {%- endwith -%}\n  b",
    "{% with a = 1 %}{% with b = a + 1 %}{{ a }}{{ b }}{% endwith %}{{ b is defined }}{% endwith %}",
    # each iteration of a loop starts from the variables around the loop
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}{{ x is defined }}{% set x = i %}{% endfor %}",
    "{% for i in [1, 2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}",
    "{% for i in [1, 2] %}{% for k in [1, 2] %}{{ y is defined }}{% set y = k %}{% endfor %}{{ y is defined }}{% set y = 5 %}{{ y }}{% endfor %}",
    "{% for i in [1, 2] %}{% if i == 1 %}{% set x = 'a' %}{% endif %}{{ x }};{% endfor %}",
    "{% for i in [1, 2, 3] %}{{ i }}{% set x = i %}{% if i == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for i in [] %}{% set x = 1 %}{% else %}{{ x is defined }}{% set x = 2 %}{{ x }}{% endfor %}",
    "{% for i in [] %}{% else %}{% set x = 2 %}{% endfor %}{{ x is defined }}",
    "{% set x = 1 %}{% for i in [] %}{% else -%}\n  {% set x = 2 %}{{ x }}\n{%- endfor %}{{ x }}",
    "{% set x = 0 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }};{% endfor %}{{ x }}",
    "{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% set y = ns.n %}{{ y }};{% endfor %}{{ ns.n }}",
    "{% for i in [1, 2] %}{% set y %}{{ y is defined }}{{ i }}{% endset %}{{ y }}{% endfor %}",
    "{% for i in [1, 2] -%}\n  {% set x = i %}\n  {{ x }}\n{%- endfor %}|",
    "{% for m in ['a', 'b'] %}\n  {%- set c = m | upper %}\n  {{- c ~ loop.index }}\n{% endfor %}|",
    "{% for i in [1, 2] %}{% set x = loop.index %}{{ x }}{{ loop.last }}{% else %}none{% endfor %}",
    "a\n{% for i in [1, 2] %}\n  {% set x = i %}\n  {{ x }}\n  {% endfor %}\nb",
    "{% set x = 1 %}{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}{% set x = 2 %}{{ x }}{% endcall %}{{ x }}",
]

# Comparisons: Python's ==, !=, <, <=, >, >=, in and not in, chained, of
# every kind of value a template sees (j and n are variables, u undefined).
COMPARE_VARS = {"j": {"x": [1, "A"], "f": 2.0, "t": True, "s": "10"}, "n": None}
COMPARE = [
    "{{ 1 == 1.0 }}|{{ true == 1 }}|{{ false == 0 }}|{{ 1 == '1' }}|{{ none == none }}|{{ n == none }}|{{ [1, 2] == [1.0, 2] }}",
    "{{ {'a': 1} == {'a': true} }}|{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1.0} }}|{{ u == u }}|{{ u == none }}|{{ 'a' != 1 }}|{{ j.f == 2 }}|{{ j.t == 1 }}",
    "{{ j.x == [1, 'A'] }}|{{ j == {'x': [1.0, 'A'], 'f': 2, 't': 1, 's': '10'} }}|{{ j.x != [true, 'A'] }}|{{ 'a' == 'a' }}|{{ '' == none }}|{{ 0 == '' }}|{{ [] == {} }}",
    "{{ 1 in [1.0] }}|{{ true in [1] }}|{{ 2.0 in j.x }}|{{ 'x' in j }}|{{ 'y' not in j }}|{{ 'b' in 'abc' }}|{{ [1] in [[1.0]] }}|{{ none in [none] }}",
    "{{ 1 in u }}|{{ u in [1] }}|{{ u in {} }}|{{ none in {'a': 1} }}|{{ 1 not in [true] }}",
    "{{ 1 in 'abc' }}",
    "{{ [1] in {} }}",
    "{{ 1 in 5 }}",
    "{{ 'a' not in 5 }}",
    "{{ '10' < '9' }}|{{ j.s < '9' }}|{{ 'B' < 'a' }}|{{ 'é' > 'z' }}|{{ 1 < 1.5 }}|{{ true < 2 }}|{{ false >= 0 }}|{{ [1, 2] < [1, 3] }}|{{ [1] < [1, 0] }}",
    "{{ 1 < 2 < 3 }}|{{ 3 > 2 > 1 }}|{{ 1 == 1 == 1.0 }}|{{ (1 < 2) < 3 }}|{{ 1 < 3 > 2 }}|{{ 2 > 1 < 3 }}|{{ 1 == 2 < 'a' }}",
    "{{ 1 < 'a' }}",
    "{{ none < 1 }}",
    "{{ u < 1 }}",
    "{{ {} < {} }}",
    "{{ not 1 == 2 }}|{{ 1 + 1 == 2 }}|{{ 'a' ~ 'b' == 'ab' }}|{{ -1 == -1.0 }}|{{ 2 == 2 if true else 3 }}|{{ 1 == 1 and 2 != 2 or 3 >= 3 }}",
    "{% for x in [1, 2, 3, 2.0, true] if x != 2 %}{{ x }}{% endfor %}|{% for x in [1, 2] if x in [2.0] %}{{ x }}{% endfor %}",
    "{% set y = 1 == 1.0 %}{{ y }}|{% if j.t == 1 %}T{% elif j.t == 2 %}2{% else %}F{% endif %}|{{ [1 == 1.0, {'k': true == 1}] }}",
    "{{ j.x[0] == j.t }}|{{ j['x'][1] in 'xAx' }}|{{ (j.x | length) == 2.0 }}|{{ j.x | select('eq', 1) | list == [1] }}",
    "{% macro m(a, b=1 == 1.0) %}{{ a == b }}{% endmacro %}{{ m(true) }}|{{ 1 is eq 1.0 }}|{{ 1 is in [1.0] }}|{{ 1 is not eq true }}",
    "{% macro m(a, b) %}{{ a }}{{ b }}{{ caller(a) }}{% endmacro %}{% call(x) m(true == 1, [1] == [true]) %}{{ x == 1.0 }}{% endcall %}",
    "{{ 'a' if 1 == 1.0 else 'b' }}|{{ 1 == 1 is true }}|{{ 1 == 1 is sameas true }}|{{ 0 == false == (1 == 2) }}",
]

# namespace(): a Namespace object, not a mapping; iterating what Python
# cannot iterate; attribute assignments; the items and list filters and the
# dict methods keys, values, items and get, which tell a namespace from a
# mapping.
# (keyword arguments in name order: kvroute's namespace() gets them as a Go
# map, and keeps them in that order, which ns|string shows)
NS = "{% set ns = namespace(a='q', x=1) %}"
NAMESPACE = [
    NS + "{{ ns is mapping }}|{{ ns is iterable }}|{{ ns is sequence }}|{{ ns is callable }}|{{ ns is defined }}|{{ ns is string }}|{{ ns is none }}",
    NS + "{{ ns.x }}|{{ ns['a'] }}|{{ ns.q is defined }}|{{ ns['q'] is defined }}|{% set ns.x = ns.x + 1 %}{{ ns.x }}",
    NS + "{{ ns | string }}|{{ ns | upper }}|{{ ns is upper }}|{{ ns == ns }}|{{ namespace() == namespace() }}|{{ ns is sameas ns }}|{{ ns != ns }}",
    NS + "{{ ns in [ns] }}|{{ ns in [namespace(a='q', x=1)] }}|{{ ns in {'x': 1} }}|{{ ns | default(1) | string }}",
    NS + "{{ ns | items | list }}",
    NS + "{% for k, v in ns | items %}{{ k }}{% endfor %}",
    NS + "{{ ns | list }}",
    NS + "{{ ns.keys() }}",
    NS + "{{ ns.items() }}",
    NS + "{{ ns.get('x') }}",
    NS + "{{ ns | tojson }}",
    NS + "{{ [ns] | tojson }}",
    NS + "{{ 'x' in ns }}",
    NS + "{{ 'x' not in ns }}",
    NS + "{% for k in ns %}{{ k }}{% endfor %}",
    "{% set ns = namespace({'b': 2}) %}{{ ns.b }}|{{ namespace([['c', 3]]).c }}|{{ namespace({'d': 4}, d=5).d }}|{{ namespace() | string }}",
    "{{ namespace(1) }}",
    "{% set ns = namespace() %}{{ namespace(ns) }}",
    "{% set ns = namespace(found=false) %}{% for m in [1, 2, 3] %}{% if m == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}",
    "{% set d = {} %}{% set d.x = 1 %}{{ d.x }}",
    "{% set s = 'ab' %}{% set s.x = 1 %}",
    "{% for x in none %}a{% endfor %}",
    "{% for x in 5 %}a{% endfor %}",
    "{% for x in true %}a{% endfor %}",
    "{% for x in u %}a{% else %}E{% endfor %}|{% for c in 'ab' %}{{ c }}{% endfor %}|{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}|{% for x in [] %}{% else %}e{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}|{% for x in [1, 2, 3] if x is odd %}{{ x }}{% endfor %}|{% for x in 'a', 'b' %}{{ x }}{% endfor %}",
    "{{ u | list }}|{{ 'ab' | list }}|{{ {'a': 1, 'b': 2} | list }}|{{ [1, 2] | list }}|{{ u | items | list }}|{{ {'a': 1} | items | list | length }}",
    "{{ none | list }}",
    "{{ 5 | list }}",
    "{{ none | items | list }}",
    "{{ [1] | items | list }}",
    "{{ {'a': 1}.get('a') }}|{{ {'a': 1}.get('b') is none }}|{{ {'a': 1}.get('b', 2) }}|{{ {'1': 1}.get(1) is none }}|{{ {'a': 1}.keys() | list }}|{{ {'a': 1}.values() | list }}|{{ {'a': 1, 'b': 2}.items() | list | length }}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}|{{ j.get('x') | tojson }}|{{ j.get('y', 'd') }}",
    "{{ {'a': 1}.get() }}",
    "{{ {'a': 1}.get(key='a') }}",
    "{{ none.get('a') }}",
    "{{ 'ab'.items() }}",
]

# What {{ }}, ~ and the string and join filters write: Python's str() of
# each kind of value (j and msgs are variables, n is None, u undefined).
# (The Go engine lexes no exponent in a number literal, 1e20, and ends a
# tag at the first "}}", {{ {'a': {}} }}: neither is in these templates.)
PRINT_VARS = {
    "j": {"f": 2.0, "e": 1e20, "m": 1e-05, "g": 0.1, "n": None, "t": True, "i": 3, "l": [1, "a", None, 2.5],
          "d": {"a": 1, "b": [{"c": None}], "e": {}}, "s": "it's", "q": 'say "hi"', "both": "it's \"x\"",
          "esc": "a\\b\n\t\r\x00\x1f\x7f\x80\xa0\xad é\u2028\u200b\ue000\U0001F600\U000E0001\U0010FFFF"},
    "n": None,
    "msgs": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 2.0, "y": "it's", "z": [1e-05, None, True], "w": 10}}}]}],
}
PRINT = [
    "{{ j.f }}|{{ j.e }}|{{ j.m }}|{{ j.g }}|{{ j.n }}|{{ n }}|{{ j.t }}|{{ j.i }}|{{ none }}|{{ 2.0 }}|{{ 0.1 + 0.2 }}|{{ 1 / 2 }}|{{ -0.0 }}|{{ 100.0 * 1000000000000000 }}",
    "{{ j.l }}|{{ j.d }}|{{ [1, 'a', none] }}|{{ {'a': 1} }}|{{ [[], {}, [{}]] }}|{{ [true, false, -0.0, j.e, j.m, 123456789.0] }}|{{ {'a': {'b': [1.0]} } }}",
    "{{ [j.s] }}|{{ [j.q] }}|{{ [j.both] }}|{{ {'k': j.esc} }}|{{ j.s }}|{{ {j.s: j.q} }}|{{ ['', \"'\", '\"', '\\\\'] }}",
    "{{ [u] }}|{{ u }}|{{ {'a': u} }}|{{ u ~ 'x' }}|{{ j.missing }}|{{ [j.missing] }}",
    "{{ 1 ~ 2.0 ~ none ~ [1.5] ~ u }}|{{ j.f ~ '' }}|{{ 'x' ~ n }}|{{ j.l ~ j.d }}|{% set s = j.f ~ j.n %}{{ s }}|{{ ('a' ~ j.f) | length }}|{{ 'a' ~ 1 ~ true }}",
    "{{ j.l | string }}|{{ j.d | string }}|{{ [j.s] | string }}|{{ n | string }}|{{ j.f | string | length }}|{{ {'k': [j.esc]} | string }}",
    "{{ 'a' ~ j.f * 2 }}|{{ 'a' + j.f ~ 'b' }}|{{ j.f ~ j.f == '2.02.0' }}",
    "{% set ns = namespace(a=j.f, b=[n]) %}{{ ns }}|{{ [ns] }}|{{ ns | string }}|{{ {'ns': ns} }}",
    "{% for m in msgs %}[{{ m.content }}]{% for c in m.tool_calls %}{{ c.function.arguments }}|{{ c.function }}|"
    "{% for k, v in c.function.arguments | items %}{{ k }}={{ v }};{% endfor %}{% endfor %}{% endfor %}",
    "{{ n if true else 'x' }}|{{ n or j.f }}|{{ j.f if false }}|{{ -j.f }}|{{ j.f * 2 }}|{{ j.l[3] }}|{{ j.l | first }}|{{ j.l | last }}|{{ j.d.b[0] }}|{{ j.t and j.f }}",
    "{% macro m(x) %}{{ x }}{% endmacro %}{{ m(j.f) }}|{{ m(n) }}|{% filter upper %}{{ j.d }}{% endfilter %}|{% set b %}{{ j.l }}{% endset %}{{ b }}|{{ j.t }}{{ 1 == 1.0 }}{{ j.i is odd }}{{ j.l | length }}",
    # join: str(d).join(map(str, value)), of an attribute's values
    "{{ [none, 2.0, 'a', [1], {'k': none}] | join(', ') }}|{{ 'abc'|join('-') }}|{{ {'a': 1, 'b': 2}|join }}|{{ u|join }}|{{ [1, 2]|join(d=' + ') }}"
    "|{{ [1, 2]|join(3) }}|{{ [1, 2]|join(none) }}|{{ [true, false]|join }}|{{ j.l | join('/') }}|{{ msgs[0].tool_calls[0].function.arguments.z | join(', ') }}",
    "{{ [{'n': 1.0}, {'n': none}, {}] | join(',', attribute='n') }}|{{ [[1, 2], [3, 4]]|join(',', attribute='1') }}|{{ [[1, 2], [3, 4]]|join(',', attribute=1) }}"
    "|{{ [{'a': {'b': 2.0} }]|join(attribute='a.b') }}|{{ ['a', 'b']|join(',', 'x') }}|{{ ['ab', 'cd']|join(',', attribute='0') }}|{{ [[1, 2]]|join(attribute=-1) }}"
    "|{{ [{'1': 'x'}]|join(attribute='1') }}|{{ [{'a': none}]|join(attribute='a.b') }}|{% set ns = namespace(a=1) %}{{ [ns]|join }}|{{ [ns]|join(attribute='a') }}",
    "{{ none|join }}",
    "{{ 5|join }}",
    "{% set ns = namespace(a=1) %}{{ ns|join }}",
    "{{ [{}]|join(attribute='a.b') }}",
    "{{ [1]|join(',', d='x') }}",
]

# The special tokens transformers gives a template (render_chats.py's
# special_tokens_map of a tokenizer_config.json, with a
# special_tokens_map.json read over it as with_special_tokens_map reads it)
# under apply_chat_template's keyword arguments, which win:
# (tokenizer_config.json, kwargs[, special_tokens_map.json]), rendered with
# SPECIAL_TEMPLATE as the config's chat_template.
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
    # a special_tokens_map.json beside a config without added_tokens_decoder:
    # its tokens win, its additional_special_tokens are appended
    ({"bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>"}, "unk_token": "<unk>", "mask_token": "<m>",
      "additional_special_tokens": ["<a>", {"__type": "AddedToken", "content": "<b>"}]}, {},
     {"bos_token": {"content": "<|begin|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
      "eos_token": "<|end|>", "unk_token": None, "pad_token": "<pad>", "image_token": "<img>",
      "additional_special_tokens": ["<a>", {"content": "<b>"}, "<c>", {"content": "<d>"}, {"content": "<d>"}, "<c>"]}),
    # beside one with added_tokens_decoder it is not read
    ({"added_tokens_decoder": {}, "bos_token": "<s>", "eos_token": "</s>"}, {},
     {"bos_token": "<other>", "eos_token": {"content": "<e>"}, "pad_token": "<p>", "additional_special_tokens": ["<x>"]}),
    ({"additional_special_tokens": ["<a>"], "pad_token": "<p>", "eos_token": "</s>"}, {"sep_token": "K"},
     {"additional_special_tokens": None, "sep_token": {"content": "<sep>"}, "mask_token": "", "cls_token": "<cls>"}),
    ({"extra_special_tokens": {"image_token": "<image>"}, "eos_token": "</s>", "additional_special_tokens": ["<a>"]}, {},
     {"image_token": "<other>", "eos_token": "<eos2>", "additional_special_tokens": [], "audio_token": {"content": "<au>"}}),
    ({"bos_token": "<s>"}, {}, {"additional_special_tokens": ["<a>", "<a>", {"content": "<a>"}], "bos_token": None}),
]

SECTIONS = {"scoping": SCOPING, "compare": [(c, COMPARE_VARS) for c in COMPARE],
            "namespace": [(c, COMPARE_VARS) for c in NAMESPACE], "print": [(c, PRINT_VARS) for c in PRINT]}


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
    for i, (cfg, kwargs, *stm) in enumerate(SPECIAL_TOKENS):
        stm = stm[0] if stm else None
        # transformers: {**self.special_tokens_map, **kwargs}
        variables = special_tokens_map(with_special_tokens_map(cfg, stm)) | kwargs
        case = {"name": f"special/{i}", "template": SPECIAL_TEMPLATE, "config": cfg, "vars": kwargs}
        if stm is not None:
            case["special_tokens_map"] = stm
        cases.append(case | render(env, SPECIAL_TEMPLATE, variables))
    out = {"renderer": f"jinja2 {jinja2.__version__} (transformers apply_chat_template environment)", "cases": cases}
    with open(f"{d}/expected/jinja-semantics.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"render_semantics.py: wrote {d}/expected/jinja-semantics.json: {len(cases)} cases")


if __name__ == "__main__":
    main()

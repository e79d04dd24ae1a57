"""Renders the test conversations with each model's chat template exactly as
HuggingFace transformers' apply_chat_template does (jinja2 sandboxed
environment, trim_blocks and lstrip_blocks, its tojson, raise_exception and
strftime_now), writing expected/<model>-prompts.json.

Usage: python3 render_chats.py <testdata dir> <model>...
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_name(t):
    if t is None:
        return ""
    return t if isinstance(t, str) else t.get("content", "")


def main():
    d = sys.argv[1]
    chats = json.load(open(f"{d}/expected/chats-input.json", encoding="utf-8"))
    env = environment()
    for model in sys.argv[2:]:
        cfg = json.load(open(f"{d}/{model}/tokenizer_config.json", encoding="utf-8"))
        tmpl = env.from_string(cfg["chat_template"])
        prompts = []
        for c in chats:
            kw = {"tools": None, "documents": None}  # apply_chat_template always passes both
            for k in ("enable_thinking", "tools"):
                if k in c:
                    kw[k] = c[k]
            prompts.append(tmpl.render(
                messages=c["messages"],
                add_generation_prompt=c["add_generation_prompt"],
                bos_token=token_name(cfg.get("bos_token")),
                eos_token=token_name(cfg.get("eos_token")),
                **kw,
            ))
        out = {"renderer": f"jinja2 {jinja2.__version__} (transformers apply_chat_template environment)", "prompts": prompts}
        with open(f"{d}/expected/{model}-prompts.json", "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"render_chats.py: wrote {d}/expected/{model}-prompts.json: {len(prompts)} prompts")


if __name__ == "__main__":
    main()

"""Renders the test conversations with each model's chat template exactly as
HuggingFace transformers' apply_chat_template does (jinja2 sandboxed
environment, trim_blocks and lstrip_blocks, its tojson, raise_exception and
strftime_now, the tokenizer's special tokens as variables), writing expected/<model>-prompts.json: a prompt, or
{"error": message} for a conversation the template refuses.

strftime_now formats FIXTURE_NOW, not datetime.now() as in transformers:
Llama 3.2's template writes "Today Date: " + strftime_now("%d %b %Y"), and
the expectations must not change with the day they are generated on. The
files record the instant ("strftime_now"), and the Go tests render with it.

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


# The clock of the fixtures' strftime_now: a day of one digit, so that %d's
# zero padding shows, in a month whose abbreviation is not its name.
FIXTURE_NOW = datetime(2024, 9, 5, 13, 4, 5)


def environment(now=None):
    """transformers' apply_chat_template environment; strftime_now formats
    now (a datetime), or datetime.now() when it is None, as transformers'."""
    def strftime_now(fmt):
        return (now or datetime.now()).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_name(t):
    if t is None:
        return ""
    if isinstance(t, AddedToken):
        return t.content
    return t if isinstance(t, str) else t.get("content", "")


class AddedToken:
    """tokenizers' AddedToken as transformers' special_tokens_map.json merge
    compares it: equal to another AddedToken of the same content (its Rust
    PartialEq), to no str and no dict (pyo3's __richcmp__ gives
    NotImplemented for them)."""

    def __init__(self, content, **_):
        self.content = content

    def __eq__(self, other):
        return self.content == other.content if isinstance(other, AddedToken) else NotImplemented


def with_special_tokens_map(cfg, stm):
    """tokenizer_config.json cfg with special_tokens_map.json stm read over
    it as transformers 4.x's PreTrainedTokenizerBase._from_pretrained reads
    it: only when cfg has no added_tokens_decoder (its legacy branch); each
    entry then replaces cfg's, an object as its AddedToken, but a list of
    additional_special_tokens, whose tokens are appended to cfg's list
    (or []) unless it holds them already (as `in` tells: a str an equal
    str, an AddedToken one of the same content). (This reads transformers'
    source; transformers itself is not run here.)"""
    if stm is None or "added_tokens_decoder" in cfg:
        return cfg
    cfg = dict(cfg)
    for key, value in stm.items():
        if isinstance(value, dict):
            value = AddedToken(**value)
        elif key == "additional_special_tokens" and isinstance(value, list):
            merged = list(cfg.pop("additional_special_tokens", []) or [])
            for token in value:
                if isinstance(token, dict):
                    token = AddedToken(**token)
                if token not in merged:
                    merged.append(token)
            value = merged
        cfg[key] = value
    return cfg


# transformers 4.x's SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES (vLLM
# requires transformers < 5).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                  "additional_special_tokens")


def special_tokens_map(cfg):
    """The special_tokens_map of a tokenizer loaded from tokenizer_config.json
    cfg, as transformers 4.x builds it: its SPECIAL_TOKENS_ATTRIBUTES, then
    the names of extra_special_tokens (model-specific tokens, which
    _set_model_specific_special_tokens appends to them), each as a string
    (an AddedToken's content; additional_special_tokens as a list of them),
    and only those that are set and not empty ("if attr_value")."""
    names = list(SPECIAL_TOKENS)
    values = {k: cfg.get(k) for k in names}
    extra = cfg.get("extra_special_tokens") or {}
    if isinstance(extra, dict):
        for k, v in extra.items():
            if k not in names:
                names.append(k)
            values[k] = v
    out = {}
    for k in names:
        v = values[k]
        if isinstance(v, list):
            v = [token_name(t) for t in v]
        elif v is not None:
            v = token_name(v)
        if v:
            out[k] = v
    return out


def main():
    d = sys.argv[1]
    chats = json.load(open(f"{d}/expected/chats-input.json", encoding="utf-8"))
    env = environment(FIXTURE_NOW)
    for model in sys.argv[2:]:
        cfg = json.load(open(f"{d}/{model}/tokenizer_config.json", encoding="utf-8"))
        tmpl = env.from_string(cfg["chat_template"])
        prompts = []
        for c in chats:
            kw = {"tools": None, "documents": None}  # apply_chat_template always passes both
            for k in ("enable_thinking", "tools"):
                if k in c:
                    kw[k] = c[k]
            try:
                prompts.append(tmpl.render(
                    messages=c["messages"],
                    add_generation_prompt=c["add_generation_prompt"],
                    **(special_tokens_map(cfg) | kw),  # transformers: {**self.special_tokens_map, **kwargs}
                ))
            except jinja2.TemplateError as e:  # Llama 3.2's: one tool call per message
                prompts.append({"error": str(e)})
        out = {"renderer": f"jinja2 {jinja2.__version__} (transformers apply_chat_template environment)",
               "strftime_now": FIXTURE_NOW.isoformat(), "prompts": prompts}
        with open(f"{d}/expected/{model}-prompts.json", "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"render_chats.py: wrote {d}/expected/{model}-prompts.json: {len(prompts)} prompts")


if __name__ == "__main__":
    main()

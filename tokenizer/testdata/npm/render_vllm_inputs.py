"""Renders chat requests with tools and tool calls the way a vLLM server
(main, December 2026) hands them to a chat template, writing
expected/vllm-inputs.json for TestRenderJSONMatchesVLLMInputs.

What it reproduces, in its own code, from vLLM's serving path:
  - the request's "tools" validated by pydantic models with the fields of
    vLLM's FunctionDefinition and ChatCompletionToolsParam (defaults, strict
    and defer_loading dumped only when set, a tool's defer_loading copied
    to its function, other keys accepted but not dumped) and passed as
    [tool.model_dump() ...];
  - each assistant tool call as pydantic validates it against the openai
    package's TypedDicts within vLLM's extra="allow" request model (keys
    in the TypedDicts' field order, id, function: arguments, name, type,
    other keys after);
  - a system message's Claude Code billing header line dropped (a text
    part or string starting with "x-anthropic-billing-header" loses its
    first line, and goes when nothing follows);
  - the messages as vLLM's ConversationMessage has them: a request
    message's "reasoning_content" read as its "reasoning" when that is
    absent (ChatCompletionRequest's before-validator), an assistant's
    reasoning given as both "reasoning" and "reasoning_content", content
    as a string for templates that take strings (null is ""), tool call
    arguments sent as a JSON string decoded (invalid: {}), an empty
    tool_calls list dropped;
  - the request's "documents" and "reasoning_effort" passed as template
    variables (request fields, which win over chat_template_kwargs), and
    with a reasoning_effort enable_thinking (false for "none") unless the
    kwargs set it (ChatCompletionRequest.build_chat_params);
  - chat_template_kwargs as vLLM's OnlineRenderer.preprocess_chat and
    merge_kwargs (vllm/renderers/params.py) merge them: their "tools"
    over the request's (passed as the client wrote them), values None or
    "auto" dropped, a chat template of the request's own refused
    (template_kwargs);
  - transformers' apply_chat_template, which always defines "tools" and
    "documents" (None when the request has none) and passes the
    tokenizer's special tokens under the kwargs (render_chats.py's
    special_tokens_map; none for the inline templates), in render_chats.py's
    jinja2 environment, its strftime_now at render_chats.py's FIXTURE_NOW
    (recorded as "strftime_now").

Usage: python3 render_vllm_inputs.py <testdata dir>
Needs jinja2 and pydantic (v2).
"""
import copy
import json
import sys
from typing import Any, Literal

from typing_extensions import Required, TypedDict

import jinja2
import pydantic
from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

from render_chats import FIXTURE_NOW, environment, special_tokens_map


class Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class Function(Base):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        d = {k: v for k, v in handler(self).items() if k in type(self).model_fields}
        for k in ("strict", "defer_loading"):
            if getattr(self, k) is None:
                d.pop(k, None)
        return d


class Tool(Base):
    type: Literal["function"] = "function"
    function: Function
    defer_loading: bool | None = None

    @model_validator(mode="after")
    def _defer(self):
        if self.defer_loading is not None and self.function.defer_loading is None:
            self.function.defer_loading = self.defer_loading
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        d = {k: v for k, v in handler(self).items() if k in type(self).model_fields}
        if self.defer_loading is None:
            d.pop("defer_loading", None)
        return d


class CallFunction(TypedDict, total=False):
    arguments: Required[str]
    name: Required[str]


class ToolCall(TypedDict, total=False):
    id: Required[str]
    function: Required[CallFunction]
    type: Required[Literal["function"]]


class Calls(Base):
    calls: list[ToolCall]


def validated_calls(calls):
    return [dict(c) for c in Calls(calls=calls).calls]


def tool_dicts(req, exclude_none_choice):
    tools = req.get("tools")
    if tools is None or (req.get("tool_choice") == "none" and exclude_none_choice):
        return None
    return [Tool.model_validate(t).model_dump() for t in tools]


BILLING = "x-anthropic-billing-header"


def text_parts(content, role):
    """content as a list of text strings (these cases have text only)."""
    if content is None:
        return []
    parts = [content] if isinstance(content, str) else [p if isinstance(p, str) else p.get("text") for p in content]
    if role == "system":
        kept = []
        for t in parts:
            if isinstance(t, str) and t.startswith(BILLING):
                t = t.partition("\n")[2]
                if not t:
                    continue
            kept.append(t)
        parts = kept
    return [t for t in parts if t]


def conversation(req):
    out = []
    for msg in copy.deepcopy(req["messages"]):
        rc = msg.pop("reasoning_content", None)
        if rc is not None and msg.get("reasoning") is None:
            msg["reasoning"] = rc
        role = msg["role"]
        content = msg.get("content")
        m = {"role": role, "content": "\n".join(text_parts(content, role))}
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                m["tool_calls"] = validated_calls(msg["tool_calls"])
            if msg.get("reasoning") is not None:
                m["reasoning"] = msg["reasoning"]
                m["reasoning_content"] = msg["reasoning"]
        elif role == "tool" and "tool_call_id" in msg:
            m["tool_call_id"] = msg["tool_call_id"]
        for k in ("name", "task"):
            if isinstance(msg.get(k), str):
                m[k] = msg[k]
        if role == "developer":
            m["tools"] = msg.get("tools")
        out.append(m)
    for m in out:
        calls = m.get("tool_calls")
        if m["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del m["tool_calls"]
            continue
        for c in calls:
            args = c["function"].get("arguments")
            if isinstance(args, str):
                try:
                    c["function"]["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    c["function"]["arguments"] = {}
            elif not isinstance(args, (dict, list)):
                c["function"]["arguments"] = {}
    return out


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}

TOOLS = [
    {"function": {"name": "get_time"}},
    {"x-extra": 1, "function": {"strict": True, "x-fn": 2, "parameters": WEATHER, "name": "get_weather", "description": "Weather, in °C."}, "type": "function"},
    {"type": "function", "defer_loading": True, "function": {"name": "search", "description": None}},
]

CASES = [
    {"name": "tool defaults", "request": {
        "messages": [{"role": "user", "content": "What time is it?"}], "tools": TOOLS}},
    {"name": "tool call string arguments", "request": {
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Zürich for 3 days?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Zürich\",\"days\":3}"}},
                {"index": 1, "id": "c2", "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12 °C"},
            {"role": "tool", "tool_call_id": "c2", "content": "09:00"}],
        "tools": TOOLS}},
    {"name": "client reasoning_content", "request": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Call the weather tool.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "20 °C"}],
        "tools": TOOLS}},
    {"name": "reasoning wins over reasoning_content", "request": {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "reasoning": "greet", "reasoning_content": "ignored"},
            {"role": "user", "content": "Again"},
            {"role": "assistant", "content": "Hello again.", "reasoning_content": "greet again"}]}},
    {"name": "no tools", "request": {"messages": [{"role": "user", "content": "Hi"}]}},
    {"name": "reasoning_effort none", "request": {
        "messages": [{"role": "user", "content": "2+2?"}], "reasoning_effort": "none"}},
    {"name": "reasoning_effort high, kwargs enable_thinking", "request": {
        "messages": [{"role": "user", "content": "2+2?"}], "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}}},
    {"name": "claude code billing header", "request": {
        "messages": [
            {"role": "system", "content": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;"},
                {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
                {"type": "text", "text": "x-anthropic-billing-header: cch=1;\nKeep this line."}]},
            {"role": "system", "content": "x-anthropic-billing-header: cch=2;\nSecond system message."},
            {"role": "user", "content": "x-anthropic-billing-header: kept in a user message"}]}},
    {"name": "documents", "request": {
        "messages": [{"role": "user", "content": "What does the manual say?"}],
        "documents": [{"title": "Manual", "text": "Press the red button."}, {"text": "Übrigens: 2 Knöpfe.", "title": "FAQ"}],
        "chat_template_kwargs": {"documents": [{"title": "ignored", "text": "the request's documents win"}]}}},
]

# Tools whose JSON Schemas have floats, empty objects and lists, and text
# that is not ASCII: Llama 3.1-style templates write each with
# tojson(indent=4).
UNITS = {"type": "function", "function": {"name": "convert", "description": "Unit conversion — °C/°F.", "parameters": {
    "type": "object", "properties": {"value": {"type": "number", "minimum": -273.15, "maximum": 1000.0, "multipleOf": 1e-05},
                                     "from": {"type": "string", "enum": ["°C", "°F"]}, "options": {"type": "object", "properties": {}},
                                     "tags": {"type": "array", "items": {}, "default": []}},
    "required": ["value", "from"]}}}

CASES += [
    # Llama 3.2: the tools in the system message (tools_in_user_message
    # false), a tool call whose arguments have floats, lists and objects,
    # a tool result that is JSON text (written with tojson, as a string).
    {"name": "llama tools in the system message", "request": {
        "messages": [
            {"role": "system", "content": "  You convert units.  "},
            {"role": "user", "content": "100 °F in °C?"},
            {"role": "assistant", "content": "Converting.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "convert",
                 "arguments": "{\"value\": 100.0, \"from\": \"°F\", \"options\": {\"round\": 2, \"exact\": false}, \"tags\": [\"a\", 1.5, null]}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"celsius\": 37.78}"}],
        "tools": [UNITS, TOOLS[0]],
        "chat_template_kwargs": {"tools_in_user_message": False}}},
    # The ipython role (a client's own name for tool results), a date
    # given as date_string, a tool call's empty arguments (vLLM: {}), a
    # tool result as text parts.
    {"name": "llama ipython role and date_string", "request": {
        "messages": [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
            {"role": "ipython", "content": "09:00"},
            {"role": "assistant", "content": "It is 09:00."},
            {"role": "user", "content": "And now?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "09:01"}, {"type": "text", "text": "UTC"}]}],
        "tools": [TOOLS[0]],
        "chat_template_kwargs": {"date_string": "26 Jul 2024"}}},
    # Tools given as the template's custom_tools (as the client wrote
    # them: no request model dump) instead of the request's.
    {"name": "llama custom_tools", "request": {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Convert 5 °C."}],
        "chat_template_kwargs": {"custom_tools": [{"function": {"parameters": {"type": "object"}, "name": "convert"}, "type": "function"}]}}},
    # Content with white space Python's str.strip removes and Go's
    # unicode.IsSpace does not (U+001C to U+001F), and some both do:
    # Llama 3.x's templates trim each message.
    {"name": "python white space", "request": {
        "messages": [
            {"role": "system", "content": "\x1c\u3000Be brief.\x1f\n"},
            {"role": "user", "content": "\x1eHi\u00a0\x1d"},
            {"role": "assistant", "content": "Hello.\x1f"},
            {"role": "user", "content": "\x0b\x1cAgain"}]}},
    # Assistant messages whose tool_calls are null or empty (vLLM: none,
    # so Llama 3.2 writes their content), a tool call's arguments with a
    # repeated key and escapes, a tool result that is null and names its
    # tool.
    {"name": "llama tool call edge cases", "request": {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Sure.", "tool_calls": None},
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "Ok.", "tool_calls": []},
            {"role": "user", "content": "Time, really?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "id": "c9", "function": {"arguments": "{\"tz\": \"UTC\", \"q\": \"caf\\u00e9 \\ud83d\\ude00 \\\"x\\\"\", \"tz\": \"CET\", \"n\": -0, \"e\": 1E2}", "name": "get_time"}}]},
            {"role": "tool", "tool_call_id": "c9", "name": "get_time", "content": None}],
        "tools": [TOOLS[0]]}},
    # Tools and no user message to put them in: Llama 3.2's template
    # refuses it (vLLM's 400).
    {"name": "llama tools without a user message", "request": {
        "messages": [{"role": "system", "content": "Be brief."}], "tools": [TOOLS[0]]}},
]

# chat_template_kwargs against the request's own fields, as vLLM merges
# them (merge_kwargs: the kwargs over the request's tools, None and "auto"
# values dropped) or refuses them.
CASES += [
    # The kwargs' tools win over the request's, and the template sees them
    # as the client wrote them (no "type", an unknown key kept): vLLM puts
    # the request's model_dump under the kwargs.
    {"name": "kwargs tools over request tools", "request": {
        "messages": [{"role": "user", "content": "Look up kvroute."}],
        "tools": TOOLS,
        "chat_template_kwargs": {"tools": [{"function": {"x-fn": 1, "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]}}},
    # Null and "auto" kwargs are unset: the request's tools stay, the
    # template does not see enable_thinking, and Llama 3.2 writes today's
    # date, not "auto".
    {"name": "kwargs null and auto unset", "request": {
        "messages": [{"role": "user", "content": "What time is it?"}],
        "tools": [TOOLS[0]],
        "chat_template_kwargs": {"tools": None, "enable_thinking": None, "date_string": "auto", "reasoning_effort": "auto"}}},
    # A chat template of the request's own: refused (400) by a vLLM server
    # without --trust-request-chat-template.
    {"name": "kwargs chat_template", "request": {
        "messages": [{"role": "user", "content": "Hi"}],
        "chat_template_kwargs": {"chat_template": "{{ messages[0].content }}"}}},
    {"name": "request chat_template", "request": {
        "messages": [{"role": "user", "content": "Hi"}],
        "chat_template": "{{ messages[0].content }}"}},
    # Kwargs naming an argument vLLM passes itself: Python's TypeError, a 400.
    {"name": "kwargs messages", "request": {
        "messages": [{"role": "user", "content": "Hi"}],
        "chat_template_kwargs": {"messages": [{"role": "user", "content": "Bye"}]}}},
]

# Templates of no fixture model: what a template sees of the variables
# transformers always passes.
INLINE = {
    "vars": "{{ tools is defined }} {{ tools is none }} {{ documents is defined }} {{ documents is none }}|"
            "{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "thinking": "{{ enable_thinking is defined }}/{{ enable_thinking }}/{{ reasoning_effort | default('unset') }}|"
                "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    # Python's str methods, which the Go engine has its own of
    # (pymethods.go): the "python white space" case's separators.
    "methods": "{% for m in messages %}{{ m.role.capitalize() }}: [{{ m.content.strip() }}] [{{ m.content.lstrip() }}] [{{ m.content.rstrip() }}] "
               "{{ m.content.split() | tojson }} {{ m.content.split(none, 1) | tojson }}\n{% endfor %}",
    "documents": "{% if documents %}{% for d in documents %}<doc {{ loop.index0 }}>{{ d.title }}: {{ d.text }}</doc>"
                 "{{ d | tojson }}\n{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
}


UNSET = (None, "auto")  # vLLM's merge_kwargs drops these values


def template_kwargs(req):
    """The variables vLLM gives the template besides the messages and
    add_generation_prompt, and the error it refuses the request with
    (None if it does not): OnlineRenderer.preprocess_chat puts the request's
    tools (model_dump) under the request's chat_template_kwargs, which
    ChatCompletionRequest.build_chat_params has merged the request's
    documents and reasoning_effort over; merge_kwargs drops values that
    are None or "auto"; a chat template of the request's own is refused
    (validate_chat_template, without --trust-request-chat-template); a
    "conversation" kwarg is apply_chat_template's own argument (and
    "messages" the template's: the render's TypeError)."""
    raw = req.get("chat_template_kwargs") or {}
    if req.get("chat_template") is not None or raw.get("chat_template") is not None:
        return None, ("Chat template is passed with request, but --trust-request-chat-template "
                      "is not set. Refused request with untrusted chat template.")
    if raw.get("conversation") not in UNSET:
        return None, "apply_chat_template() got multiple values for keyword argument 'conversation'"
    kwargs = {k: v for k, v in raw.items()
              if v not in UNSET and k not in ("add_generation_prompt", "continue_final_message")}
    if "tools" not in kwargs:
        kwargs["tools"] = tool_dicts(req, False)  # the request's, under the kwargs' own (as given)
    if req.get("documents") is not None:
        kwargs["documents"] = req["documents"]
    effort = req.get("reasoning_effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" not in raw:
            kwargs["enable_thinking"] = effort != "none"
    return kwargs, None


def main():
    d = sys.argv[1]
    env = environment(FIXTURE_NOW)
    templates = {}
    for model in ("qwen3", "llama3", "llama3_1", "llama3_2", "deepseek_v3"):
        cfg = json.load(open(f"{d}/{model}/tokenizer_config.json", encoding="utf-8"))
        templates[model] = (env.from_string(cfg["chat_template"]), special_tokens_map(cfg))
    for name, src in INLINE.items():
        templates[name] = (env.from_string(src), {})
    cases = []
    for c in CASES:
        req = c["request"]
        conv = conversation(req)
        kwargs, refused = template_kwargs(req)
        prompts = {}
        for name, (tmpl, special) in templates.items():
            if refused:
                prompts[name] = {"error": refused}
                continue
            # transformers: the kwargs over the special tokens
            ctx = special | {k: v for k, v in kwargs.items() if k not in ("tools", "documents")}
            try:
                prompts[name] = {"prompt": tmpl.render(messages=conv, tools=kwargs.get("tools"), documents=kwargs.get("documents"),
                                                       add_generation_prompt=True, **ctx)}
            except jinja2.TemplateError as e:
                prompts[name] = {"error": str(e)}
            except TypeError as e:  # what vLLM reports as a 400 too
                prompts[name] = {"error": str(e)}
        cases.append({"name": c["name"], "request": req, "prompts": prompts})
    out = {
        "renderer": f"jinja2 {jinja2.__version__}, pydantic {pydantic.VERSION} (render_vllm_inputs.py)",
        "strftime_now": FIXTURE_NOW.isoformat(),
        "inline_templates": INLINE,
        "cases": cases,
    }
    with open(f"{d}/expected/vllm-inputs.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"render_vllm_inputs.py: wrote {d}/expected/vllm-inputs.json: {len(cases)} requests")


if __name__ == "__main__":
    main()

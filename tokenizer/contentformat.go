package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"
)

// vLLM hands a chat template each message's content in one of two forms,
// chosen from the template's source (chat_utils.py, _detect_content_format,
// with --chat-template-content-format auto): "openai" when the template
// loops over a message's content ({% for part in message['content'] %},
// where message is the variable of a loop over messages or over a variable
// assigned from it), and "string" otherwise. In the string form the content
// is always a string: the text of its parts joined with "\n", parts whose
// text is empty or null dropped, and "" for a message without content.
// Templates written for string content (Qwen3, Llama 3.x, DeepSeek-V3)
// fail on a list of parts or render its Python repr, so RenderJSON makes
// the same conversion for them.
//
// vLLM walks the template's syntax tree; these expressions find the same
// loops and assignments in its source text.
var (
	// {% set x = y %}, {% set x = y[1:] %}, {% set x = y | f %}
	setVarRE = regexp.MustCompile(`\{%-?\s*set\s+(\w+)\s*=\s*(\w+)\s*(?:\[[^\]]*:[^\]]*\]\s*)?(?:\||-?%\}|\bis\b)`)
	// {% for x in y %}, {% for x in y[::-1] %}, {% for x in y | f %}
	forVarRE = regexp.MustCompile(`\{%-?\s*for\s+(\w+)\s+in\s+(\w+)\s*(?:\[[^\]]*:[^\]]*\]\s*)?(?:\||-?%\}|\bif\b|\brecursive\b)`)
	// {% for x in y.content ... %}, {% for x in y['content'] ... %}
	forContentRE = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(\w+)\s*(?:\.\s*content\b|\[\s*(?:'content'|"content")\s*\])`)
)

// stringContent reports whether vLLM renders the chat template source with
// string content (see above): no loop over a message's content.
func stringContent(source string) bool {
	messages := map[string]bool{"messages": true}
	for changed := true; changed; { // the variables assigned from messages, transitively
		changed = false
		for _, m := range setVarRE.FindAllStringSubmatch(source, -1) {
			if messages[m[2]] && !messages[m[1]] {
				messages[m[1]], changed = true, true
			}
		}
	}
	message := map[string]bool{}
	for _, m := range forVarRE.FindAllStringSubmatch(source, -1) {
		if messages[m[2]] {
			message[m[1]] = true
		}
	}
	for _, m := range forContentRE.FindAllStringSubmatch(source, -1) {
		if message[m[1]] {
			return false
		}
	}
	return true
}

// textPartKey names the member holding the text of a content part of type
// typ that vLLM reads as text in string content (chat_utils.py's
// MM_PARSER_MAP): "text", "input_text" and "output_text" by their "text",
// "refusal" and "thinking" by the member of that name, "tool_reference"
// (a deferred tool) by its "name"; or "" for a part that is not text.
func textPartKey(typ string) string {
	switch typ {
	case "text", "input_text", "output_text":
		return "text"
	case "refusal", "thinking":
		return typ
	case "tool_reference":
		return "name"
	}
	return ""
}

// ErrNotText is the error (wrapped) of a message content part that is not
// text (an image, audio, a part of an unknown type): rendering it needs
// the model's placeholder for it, or the engine refuses it.
var ErrNotText = errors.New("not a text part")

// StringContent reads content, the raw JSON of a chat message's
// "content", as vLLM gives it to a chat template that takes string content
// (such as the ChatML one, RenderChatML), as RenderJSON does for such a
// template (stringContents): a string as it is, null or nothing as "", a
// list of parts as the text of those read as text joined with "\n". A part
// that is not text is an error (errors.Is ErrNotText), and so is a value
// of another type.
func StringContent(content json.RawMessage) (string, error) {
	if len(content) == 0 {
		return "", nil
	}
	v, err := valueFromJSON(content)
	if err != nil {
		return "", fmt.Errorf("tokenizer: content: %w", err)
	}
	switch {
	case v.IsNone():
		return "", nil
	case v.IsString():
		return v.AsString(), nil
	case !v.IsList():
		return "", errors.New("tokenizer: content is not a string, a list of parts or null")
	}
	text, err := partsText(v.AsList())
	if err != nil {
		return "", fmt.Errorf("tokenizer: %w", err)
	}
	return text, nil
}

// stringContents gives each message of messages (a list) string content as
// vLLM does for a template that takes strings: a list of parts becomes the
// text of its text parts (partsText); null or no content "". A part that is
// not text (an image) is an error (ErrNotText): rendering it needs the
// model's placeholder for it.
func stringContents(messages jinja.Value) error {
	for i, m := range messages.AsList().Items {
		if !m.IsDict() {
			continue // the template decides what to make of it
		}
		msg := m.AsDict()
		content, ok := msg.Get("content")
		switch {
		case !ok || content.IsNone():
			msg.Set("content", jinja.NewString(""))
			continue
		case !content.IsList():
			continue
		}
		text, err := partsText(content.AsList())
		if err != nil {
			return fmt.Errorf("messages[%d].%w", i, err)
		}
		msg.Set("content", jinja.NewString(text))
	}
	return nil
}

// openaiContents gives each message of messages (a list) its content as
// vLLM gives it to a template that loops over a message's parts (the
// "openai" content format, chat_utils.py's _parse_chat_message_content
// with wrap_dicts): always a list of parts, each part read as text a
// {"type": "text", "text": ...} (a plain string part too; a "text" or
// "refusal" part with no text dropped), a tool_reference part
// {"type": "tool_reference", "name": ...}; a string content is one text
// part, null or no content an empty list. A tool message whose parts are
// all text gets their texts joined with "\n" as a string, as vLLM does for
// templates that only take strings there. A part that is not text is an
// error (ErrNotText), as on a text-only model.
func openaiContents(messages jinja.Value) error {
	for i, m := range messages.AsList().Items {
		if !m.IsDict() {
			continue // the template decides what to make of it
		}
		msg := m.AsDict()
		content, _ := msg.Get("content")
		var parts []jinja.Value
		switch {
		case content.IsUndefined(), content.IsNone():
		case content.IsString():
			parts = []jinja.Value{newTextPart(content)}
		case content.IsList():
			var err error
			if parts, err = wrapParts(content.AsList()); err != nil {
				return fmt.Errorf("messages[%d].%w", i, err)
			}
		default:
			continue // not a chat request vLLM accepts; the template decides
		}
		if role, _ := msg.Get("role"); role.IsString() && role.AsString() == "tool" && allText(parts) {
			texts := make([]string, len(parts))
			for j, p := range parts {
				if t, _ := p.AsDict().Get("text"); t.IsString() {
					texts[j] = t.AsString()
				}
			}
			msg.Set("content", jinja.NewString(strings.Join(texts, "\n")))
			continue
		}
		msg.Set("content", jinja.NewList(parts))
	}
	return nil
}

// textPart reads part j of a message's content, an object: its type and
// the member holding its text (textPartKey), or ErrNotText.
func textPart(j int, p jinja.Value) (typ jinja.Value, key string, err error) {
	if p.IsDict() {
		typ, _ = p.AsDict().Get("type")
	}
	if typ.IsString() {
		key = textPartKey(typ.AsString())
	}
	if key == "" {
		return typ, "", fmt.Errorf("content[%d]: %w", j, ErrNotText)
	}
	return typ, key, nil
}

// wrapParts is a message's content parts as vLLM gives them to a template
// that loops over them (openaiContents).
func wrapParts(list *jinja.List) ([]jinja.Value, error) {
	parts := make([]jinja.Value, 0, len(list.Items))
	for j, p := range list.Items {
		if p.IsString() {
			parts = append(parts, newTextPart(p))
			continue
		}
		typ, key, err := textPart(j, p)
		if err != nil {
			return nil, err
		}
		v, ok := p.AsDict().Get(key)
		if !ok || v.IsUndefined() {
			v = jinja.None()
		}
		switch t := typ.AsString(); {
		case t == "tool_reference":
			d := jinja.NewDict()
			d.AsDict().Set("type", typ)
			d.AsDict().Set("name", v)
			parts = append(parts, d)
		case v.IsNone() && (t == "text" || t == "refusal"):
			// vLLM skips these with a warning
		default:
			parts = append(parts, newTextPart(v))
		}
	}
	return parts, nil
}

// newTextPart is {"type": "text", "text": text}.
func newTextPart(text jinja.Value) jinja.Value {
	d := jinja.NewDict()
	d.AsDict().Set("type", jinja.NewString("text"))
	d.AsDict().Set("text", text)
	return d
}

// allText reports whether every part is a text part.
func allText(parts []jinja.Value) bool {
	for _, p := range parts {
		if t, _ := p.AsDict().Get("type"); !t.IsString() || t.AsString() != "text" {
			return false
		}
	}
	return true
}

// partsText is the text of a message's content parts as vLLM reads them
// for a template that takes strings: the text of the parts read as text
// (textPartKey) and of parts that are plain strings, joined with "\n",
// those with empty or null text dropped. A part that is not text is an
// error (ErrNotText).
func partsText(parts *jinja.List) (string, error) {
	var b strings.Builder
	for j, p := range parts.Items {
		if p.IsString() { // a part may be a plain string
			if p.AsString() != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(p.AsString())
			}
			continue
		}
		_, key, err := textPart(j, p)
		if err != nil {
			return "", err
		}
		text, _ := p.AsDict().Get(key)
		switch {
		case text.IsUndefined(), text.IsNone():
			continue
		case !text.IsString():
			return "", fmt.Errorf("content[%d].%s is not a string", j, key)
		case text.AsString() == "":
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(text.AsString())
	}
	return b.String(), nil
}

// vLLM also reshapes two parts of a chat request before its template sees
// them (and drops a system message's Claude Code billing header line,
// stripBillingHeaders), and RenderJSON does the same:
//
//   - an assistant message's tool calls: each call's keys come in the
//     order of the openai package's TypedDict that vLLM's request model
//     validates it with, {"id", "function": {"arguments", "name", ...},
//     "type", ...} (other keys after, as sent), whatever the order a
//     client sent them in (OpenAI's SDK sends id, type, function: name,
//     arguments); a function's "arguments", which OpenAI clients send as a
//     JSON string, is decoded (an invalid one becomes {}, a value neither
//     a string, an object nor an array {}), and an empty "tool_calls" list
//     is removed (chat_utils.py, _postprocess_messages);
//   - the request's "tools" (ChatOptions.JSONVars["tools"]): each tool is
//     its request model's model_dump (ChatCompletionToolsParam and
//     FunctionDefinition, vLLM main of December 2026), whose keys come in
//     the model's order with its defaults filled in: {"type": "function",
//     "function": {"name", "description": null, "parameters": null,
//     "strict" and "defer_loading" when set}, "defer_loading" when set}. A
//     tool's defer_loading is also its function's when that has none; a
//     tool's or a function's other keys are dropped (both models'
//     serializers keep only their fields, though they accept others).
//
// Templates render both with tojson, so a request's key order and whether
// it spelled a default out would otherwise change the prompt's tokens.

// toolCallArguments puts each assistant tool call's keys in vLLM's order
// and decodes its arguments in messages (a list), and drops empty
// tool_calls lists.
func toolCallArguments(messages jinja.Value) {
	for _, m := range messages.AsList().Items {
		if !m.IsDict() {
			continue
		}
		msg := m.AsDict()
		role, _ := msg.Get("role")
		calls, ok := msg.Get("tool_calls")
		if !role.IsString() || role.AsString() != "assistant" || !ok || !calls.IsList() {
			continue
		}
		if calls.AsList().Len() == 0 {
			deleteKey(msg, "tool_calls")
			continue
		}
		items := calls.AsList().Items
		for i, c := range items {
			if !c.IsDict() {
				continue
			}
			c = keysFirst(c.AsDict(), "id", "function", "type")
			items[i] = c
			fn, _ := c.AsDict().Get("function")
			if !fn.IsDict() {
				continue
			}
			fn = keysFirst(fn.AsDict(), "arguments", "name")
			c.AsDict().Set("function", fn)
			args, _ := fn.AsDict().Get("arguments")
			switch {
			case args.IsString():
				v, err := valueFromJSON([]byte(args.AsString()))
				if err != nil {
					v = jinja.NewDict()
				}
				fn.AsDict().Set("arguments", v)
			case !args.IsDict() && !args.IsList():
				fn.AsDict().Set("arguments", jinja.NewDict())
			}
		}
	}
}

// keysFirst returns a copy of d with the keys first that it has, in that
// order, then its other keys in their order: a dict as pydantic validates
// it against a TypedDict whose fields are first (extra keys kept, as
// vLLM's request model allows them).
func keysFirst(d *jinja.Dict, first ...string) jinja.Value {
	out := jinja.NewDict()
	o := out.AsDict()
	for _, k := range first {
		if v, ok := d.Get(k); ok {
			o.Set(k, v)
		}
	}
	for _, k := range d.Keys {
		if !o.Has(k) {
			o.Set(k, d.Data[k])
		}
	}
	return out
}

// deleteKey removes key from d.
func deleteKey(d *jinja.Dict, key string) {
	if _, ok := d.Data[key]; !ok {
		return
	}
	delete(d.Data, key)
	for i, k := range d.Keys {
		if k == key {
			d.Keys = append(d.Keys[:i], d.Keys[i+1:]...)
			return
		}
	}
}

// dumpTools returns tools (a list) as vLLM's request model dumps it (see
// above). A value of another shape is left as it is (vLLM refuses such a
// request).
func dumpTools(tools jinja.Value) jinja.Value {
	if !tools.IsList() {
		return tools
	}
	out := make([]jinja.Value, len(tools.AsList().Items))
	for i, t := range tools.AsList().Items {
		out[i] = t
		if !t.IsDict() {
			continue
		}
		in := t.AsDict()
		fn, _ := in.Get("function")
		if !fn.IsDict() {
			continue
		}
		defer_, _ := in.Get("defer_loading")
		tool := jinja.NewDict()
		typ, ok := in.Get("type")
		if !ok {
			typ = jinja.NewString("function")
		}
		tool.AsDict().Set("type", typ)
		tool.AsDict().Set("function", dumpFunction(fn.AsDict(), defer_))
		if !defer_.IsUndefined() && !defer_.IsNone() {
			tool.AsDict().Set("defer_loading", defer_)
		}
		out[i] = tool
	}
	return jinja.NewList(out)
}

// dumpFunction returns a tool's function (in) as FunctionDefinition dumps
// it: name, description and parameters (null when missing), strict when
// set, defer_loading when set (its own, else the tool's, toolDefer); its
// other keys are dropped.
func dumpFunction(in *jinja.Dict, toolDefer jinja.Value) jinja.Value {
	fn := jinja.NewDict()
	f := fn.AsDict()
	if v, ok := in.Get("name"); ok { // required: vLLM refuses a tool without
		f.Set("name", v)
	}
	for _, k := range []string{"description", "parameters"} {
		v, ok := in.Get(k)
		if !ok {
			v = jinja.None()
		}
		f.Set(k, v)
	}
	if v, ok := in.Get("strict"); ok && !v.IsNone() {
		f.Set("strict", v)
	}
	defer_, _ := in.Get("defer_loading")
	if defer_.IsUndefined() || defer_.IsNone() {
		defer_ = toolDefer
	}
	if !defer_.IsUndefined() && !defer_.IsNone() {
		f.Set("defer_loading", defer_)
	}
	return fn
}

// conversationMessages rebuilds each message of messages (a list) with only the
// keys vLLM's ConversationMessage keeps, in its order (chat_utils.py,
// _parse_chat_message_content): role, content, then for an assistant
// tool_calls (unless null) and its reasoning as both "reasoning" and
// "reasoning_content"; for a tool message tool_call_id; name and task when
// they are strings; for a developer message tools. An assistant's
// reasoning is its "reasoning", or when that is null or absent its
// "reasoning_content" (the deprecated name, which vLLM's
// ChatCompletionRequest renames before validation since vLLM PR 42664,
// May 2026: clients such as LiteLLM and the Vercel AI SDK send it).
// Whatever else a client sends in a message vLLM's template never sees.
func conversationMessages(messages jinja.Value) {
	items := messages.AsList().Items
	for i, m := range items {
		if !m.IsDict() {
			continue
		}
		in := m.AsDict()
		out := jinja.NewDict()
		o := out.AsDict()
		role, hasRole := in.Get("role")
		if hasRole {
			o.Set("role", role)
		}
		if c, ok := in.Get("content"); ok {
			o.Set("content", c)
		}
		r := ""
		if role.IsString() {
			r = role.AsString()
		}
		switch r {
		case "assistant":
			if v, ok := in.Get("tool_calls"); ok && !v.IsNone() {
				o.Set("tool_calls", v)
			}
			v, ok := in.Get("reasoning")
			if !ok || v.IsNone() {
				v, ok = in.Get("reasoning_content") // the deprecated name, still accepted
			}
			if ok && !v.IsNone() {
				o.Set("reasoning", v)
				o.Set("reasoning_content", v)
			}
		case "tool":
			if v, ok := in.Get("tool_call_id"); ok {
				o.Set("tool_call_id", v)
			}
		}
		for _, k := range []string{"name", "task"} {
			if v, ok := in.Get(k); ok && v.IsString() {
				o.Set(k, v)
			}
		}
		if r == "developer" {
			v, ok := in.Get("tools")
			if !ok {
				v = jinja.None()
			}
			o.Set("tools", v)
		}
		items[i] = out
	}
}

// billingHeader starts the line Claude Code puts first in its system
// prompt, whose cch value changes with every request.
const billingHeader = "x-anthropic-billing-header"

// stripBillingHeaders drops that line from the system messages of
// messages (a list) as vLLM does before rendering (chat_utils.py,
// _strip_claude_code_billing_header): in a system message's content, a
// string or a text part that starts with it loses its first line, and
// is dropped when nothing follows. Gateways that turn Claude Code's
// Anthropic requests into chat completions keep the line; were it
// rendered, no prompt would match another from it on.
func stripBillingHeaders(messages jinja.Value) {
	for _, m := range messages.AsList().Items {
		if !m.IsDict() {
			continue
		}
		msg := m.AsDict()
		if role, _ := msg.Get("role"); !role.IsString() || role.AsString() != "system" {
			continue
		}
		content, _ := msg.Get("content")
		switch {
		case content.IsString():
			if text, ok := strings.CutPrefix(content.AsString(), billingHeader); ok {
				_, rest, _ := strings.Cut(text, "\n")
				parts := []jinja.Value{}
				if rest != "" {
					parts = append(parts, jinja.NewString(rest))
				}
				msg.Set("content", jinja.NewList(parts)) // as vLLM: the string is a part of a list now
			}
		case content.IsList():
			msg.Set("content", stripBillingParts(content.AsList()))
		}
	}
}

// stripBillingParts returns parts without the billing header line (see
// stripBillingHeaders).
func stripBillingParts(parts *jinja.List) jinja.Value {
	out := make([]jinja.Value, 0, len(parts.Items))
	for _, p := range parts.Items {
		var text jinja.Value
		switch {
		case p.IsString():
			text = p
		case p.IsDict():
			if typ, _ := p.AsDict().Get("type"); typ.IsString() && typ.AsString() == "text" {
				text, _ = p.AsDict().Get("text")
			}
		}
		if !text.IsString() || !strings.HasPrefix(text.AsString(), billingHeader) {
			out = append(out, p)
			continue
		}
		_, rest, _ := strings.Cut(text.AsString(), "\n")
		switch {
		case rest == "":
		case p.IsString():
			out = append(out, jinja.NewString(rest))
		default:
			d := jinja.NewDict()
			for _, k := range p.AsDict().Keys {
				d.AsDict().Set(k, p.AsDict().Data[k])
			}
			d.AsDict().Set("text", jinja.NewString(rest))
			out = append(out, d)
		}
	}
	return jinja.NewList(out)
}

package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// ChatTemplate is a compiled HuggingFace chat template (the Jinja source of
// tokenizer_config.json's chat_template), rendered the way transformers'
// apply_chat_template does: trim_blocks and lstrip_blocks on, with the
// variables messages, add_generation_prompt, the tokenizer's special
// tokens (bos_token, eos_token and, from a tokenizer_config.json, unk_token,
// sep_token, pad_token, cls_token, mask_token, additional_special_tokens
// and those extra_special_tokens names; each only when it is set and not
// empty, as transformers' special_tokens_map), and
// tools and documents, None unless given (transformers always passes both,
// so a template's "tools is defined" is true without tools), and
// strftime_now formatting ChatOptions.Now (default: the time of the
// render, as transformers' datetime.now()). It is
// rendered by github.com/ardanlabs/jinja, a pure-Go Jinja engine made for chat
// templates. A ChatTemplate is safe for concurrent use.
type ChatTemplate struct {
	tmpl *jinja.Template
	// tokens are the special tokens' variables, by name (see
	// specialTokens), those the template's source names.
	tokens map[string]jinja.Value
	// stringContent: vLLM gives this template string content (see
	// stringContents), not lists of parts.
	stringContent bool
	// toolUse is the template named "tool_use" of a tokenizer_config.json
	// that names its templates (this one being "default"), rendered instead
	// of this one when the tools are not None, as transformers'
	// get_chat_template picks it (vLLM passes the tools, None for none);
	// toolUseErr is the error compiling it. Both nil when there is none.
	toolUse    *ChatTemplate
	toolUseErr error
	// filters are the Python-exact filters the compiled template calls,
	// which each render passes: the comparisons, loops, attribute
	// assignments and concatenations pyCompares rewrote (pyCompareVars,
	// namespaceVars, pyCatVars), the namespace global (namespaceVars),
	// the string methods pyMethods rewrote (pyMethodVars), the tests
	// pyTests rewrote (pyTestVars) and the case filters pyFilters renamed
	// (prefixedFilterVars), only those whose names the rewritten source
	// has (a template with tests uses a few of jinja2's ~90 test
	// filters). (The prints pyCompares rewrote call pyString, which every
	// render passes with tojson and trim.)
	filters []namedFilter
}

// namedFilter is a filter a render passes as a variable.
type namedFilter struct {
	name string
	f    jinja.Value
}

// usedFilters appends to dst the filters of vars whose names src has, in
// name order.
func usedFilters(dst []namedFilter, src string, vars map[string]jinja.Value) []namedFilter {
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if strings.Contains(src, k) {
			dst = append(dst, namedFilter{k, vars[k]})
		}
	}
	return dst
}

// NewChatTemplate compiles a chat template; bos and eos are the values of the
// bos_token and eos_token variables, "" for a token the tokenizer does not
// have, which leaves the variable undefined (transformers passes only the
// special tokens that are set and not empty).
func NewChatTemplate(source, bos, eos string) (*ChatTemplate, error) {
	src := jinjaTrimGuard(pyLoopBodies(pyWithBlocks(pyFilterBlocks(source))))
	// The rewrites, each left out in turn when the Go engine cannot
	// compile what they make: its own comparisons, string methods or
	// tests rather than none.
	var t *jinja.Template
	var out string
	var err error
	var methods, tests bool
	bases := []string{pyCompares(src)}
	if bases[0] != src {
		bases = append(bases, src)
	}
try:
	for _, base := range bases {
		withMethods := pyMethods(base)
		for _, try := range [][2]string{{pyTests(withMethods), withMethods}, {withMethods, withMethods}, {pyTests(base), base}, {base, base}} {
			out = pyFilters(try[0])
			if t, err = jinja.Compile(out); err == nil {
				methods, tests = try[1] != base, try[0] != try[1]
				break try
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: chat template: %w", err)
	}
	var filters []namedFilter
	if strings.Contains(out, compareName) {
		filters = usedFilters(filters, out, pyCompareVars)
	}
	filters = usedFilters(filters, out, pyCatVars)
	filters = usedFilters(filters, out, namespaceVars)
	if methods {
		filters = usedFilters(filters, out, pyMethodVars)
	}
	if tests {
		filters = usedFilters(filters, out, pyTestVars)
	}
	if strings.Contains(out, filterPrefix) {
		filters = usedFilters(filters, out, prefixedFilterVars)
	}
	tokens := make(map[string]jinja.Value, 2)
	if bos != "" {
		tokens["bos_token"] = jinja.NewString(bos)
	}
	if eos != "" {
		tokens["eos_token"] = jinja.NewString(eos)
	}
	return &ChatTemplate{tmpl: t, tokens: tokens, stringContent: stringContent(source), filters: filters}, nil
}

// ChatOptions are the optional inputs of a chat template rendering.
type ChatOptions struct {
	// AddGenerationPrompt appends the header of an assistant turn. Default false.
	AddGenerationPrompt bool
	// Vars are extra template variables (for example enable_thinking, tools,
	// date_string). They override the special tokens (bos_token, ...), as
	// transformers' apply_chat_template keyword arguments, and so vLLM's
	// chat_template_kwargs, do. Maps in them
	// are seen with sorted keys; use JSONVars to keep a request's key order.
	// Default none.
	Vars map[string]any
	// JSONVars are extra template variables as raw JSON (for example a
	// request's "tools"), decoded keeping object key order, as Python does:
	// tojson output, and so the prompt, depends on it. "tools" is given
	// the shape vLLM's request model gives it (contentformat.go: keys in
	// the model's order, defaults filled in), unless ToolsAsGiven.
	// Default none.
	JSONVars map[string]json.RawMessage
	// ToolsAsGiven gives the template JSONVars' "tools" as they are: a
	// request's chat_template_kwargs tools, which vLLM passes on as the
	// client wrote them (ChatRequest.Vars), not through its request model.
	ToolsAsGiven bool
	// Now is the instant the template's strftime_now formats (Llama 3.1
	// to 3.3 write "Today Date: " + strftime_now("%d %b %Y") in their
	// system header). Default (zero): time.Now(), the local time when the
	// template is rendered, as transformers' datetime.now(): an engine
	// that renders the same request on another day (across midnight, or
	// in another time zone) writes another date, and so other tokens from
	// there on. A "date_string" variable, which those templates take
	// instead when it is given (vLLM: chat_template_kwargs), pins it.
	Now time.Time
}

// Render renders msgs.
func (c *ChatTemplate) Render(msgs []Message, opts ChatOptions) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	return c.RenderAny(list, opts)
}

// RenderAny renders messages given as generic values (maps with "role",
// "content" and whatever else the template reads, such as "tool_calls" or
// "reasoning_content"). Map keys are seen sorted; RenderJSON keeps the order
// of a request's JSON.
func (c *ChatTemplate) RenderAny(messages []any, opts ChatOptions) (string, error) {
	c, err := c.pick(opts)
	if err != nil {
		return "", err
	}
	return c.render(jinja.FromGoValue(messages), opts)
}

// pick returns the template that renders a request with opts: the
// "tool_use" one when there is one and the request has tools (see
// ChatTemplate.toolUse), otherwise c.
func (c *ChatTemplate) pick(opts ChatOptions) (*ChatTemplate, error) {
	if c.toolUse == nil && c.toolUseErr == nil || !hasTools(opts) {
		return c, nil
	}
	if c.toolUseErr != nil {
		return nil, c.toolUseErr
	}
	return c.toolUse, nil
}

// hasTools reports whether opts give the template tools, as transformers'
// get_chat_template tests them to pick "tool_use": a "tools" variable that
// is not null (tools is not None), an empty list included. JSONVars' wins,
// as in render. (vLLM passes None for a request without tools and refuses
// one whose tools are an empty list.)
func hasTools(opts ChatOptions) bool {
	if raw, ok := opts.JSONVars["tools"]; ok {
		raw = bytes.TrimSpace(raw)
		return len(raw) > 0 && string(raw) != "null"
	}
	v, ok := opts.Vars["tools"]
	if !ok || v == nil {
		return false
	}
	if rv := reflect.ValueOf(v); (rv.Kind() == reflect.Slice || rv.Kind() == reflect.Map || rv.Kind() == reflect.Pointer) && rv.IsNil() {
		return false // a typed nil is None too
	}
	return true
}

// RenderJSON renders the raw JSON array of messages of an OpenAI-style chat
// request, keeping object key order as Python's json and jinja2 do (what a
// vLLM server renders). As vLLM does, it gives a template that does not
// loop over a message's content parts (most text models' templates) each
// message's content as a string: the text parts joined with "\n" (empty
// ones dropped), "" for null; a part that is not text is then an error.
// A template that loops over the parts gets them as vLLM gives them
// (openaiContents): a list of {"type": "text", "text": ...} parts (and
// tool_reference parts), a tool message of text parts as one string.
// An assistant message's tool call arguments sent as a JSON string are
// decoded, a system message's Claude Code billing header line is dropped,
// and each message keeps only the keys vLLM's ConversationMessage has, as
// vLLM does (contentformat.go).
func (c *ChatTemplate) RenderJSON(messages json.RawMessage, opts ChatOptions) (string, error) {
	c, err := c.pick(opts)
	if err != nil {
		return "", err
	}
	v, err := valueFromJSON(messages)
	if err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: messages: %w", err)
	}
	if !v.IsList() {
		return "", errors.New("tokenizer: render chat template: messages is not a JSON array")
	}
	stripBillingHeaders(v)
	contents := openaiContents
	if c.stringContent {
		contents = stringContents
	}
	if err := contents(v); err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: %w", err)
	}
	conversationMessages(v)
	toolCallArguments(v)
	return c.render(v, opts)
}

func (c *ChatTemplate) render(messages jinja.Value, opts ChatOptions) (string, error) {
	data := make(map[string]jinja.Value, len(c.tokens)+len(c.filters)+len(opts.Vars)+len(opts.JSONVars)+8)
	for k, v := range c.tokens { // under the kwargs, as transformers' {**self.special_tokens_map, **kwargs}
		if v.IsList() { // additional_special_tokens: the Go engine's append would change it for every render
			v = jinja.NewList(slices.Clone(v.AsList().Items))
		}
		data[k] = v
	}
	data["messages"] = messages
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	data[strftimeName] = strftimeNow(now) // a variable of that name wins, as in jinja2
	for k, v := range opts.Vars {
		data[k] = jinja.FromGoValue(v)
	}
	for k, raw := range opts.JSONVars {
		v, err := valueFromJSON(raw)
		if err != nil {
			return "", fmt.Errorf("tokenizer: render chat template: variable %s: %w", k, err)
		}
		if k == "tools" && !opts.ToolsAsGiven {
			v = dumpTools(v)
		}
		data[k] = v
	}
	for _, k := range []string{"tools", "documents"} {
		if _, ok := data[k]; !ok {
			data[k] = jinja.None() // transformers' apply_chat_template always passes both
		}
	}
	data[tojsonName] = pyToJSON // the template's tojson, string and trim filters (pyfilters.go)
	data[stringName] = pyString
	data[trimName] = pyTrim
	for _, f := range c.filters { // string methods, tests, case filters
		data[f.name] = f.f
	}
	out, err := c.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: %w", err)
	}
	return out, nil
}

// valueFromJSON decodes one JSON value into a template value, keeping the
// key order of objects and integers as integers.
func valueFromJSON(data []byte) (jinja.Value, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := d.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("trailing data after the JSON value")
	}
	return v, nil
}

const maxJSONDepth = 200

func decodeValue(d *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), errors.New("JSON nested too deep")
	}
	tok, err := d.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			var items []jinja.Value
			for d.More() {
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			if _, err := d.Token(); err != nil { // ]
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		case '{':
			obj := jinja.NewDict()
			dict := obj.AsDict()
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, ok := kt.(string)
				if !ok {
					return jinja.Undefined(), fmt.Errorf("object key %v is not a string", kt)
				}
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				dict.Set(key, v)
			}
			if _, err := d.Token(); err != nil { // }
				return jinja.Undefined(), err
			}
			return obj, nil
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", t)
	case json.Number:
		return numberValue(t), nil
	default:
		return jinja.FromGoValue(t), nil // nil, bool, string
	}
}

// numberValue is a JSON number as Python's json.loads reads it: an integer
// as an int, anything else as a float, one too large for a float64 as
// ±inf (which tojson writes Infinity), not as a string. (An integer past
// int64 becomes a float: Python keeps its digits.)
func numberValue(n json.Number) jinja.Value {
	if !strings.ContainsAny(string(n), ".eE") {
		if i, err := n.Int64(); err == nil {
			return jinja.NewInt(i)
		}
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.NewString(string(n))
	}
	return jinja.NewFloat(f)
}

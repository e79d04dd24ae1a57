package tokenizer

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestStringContent: a template is given string content unless it loops
// over a message's content, the message being the variable of a loop over
// messages or over a variable assigned from it (vLLM's
// _detect_content_format).
func TestStringContent(t *testing.T) {
	for _, tc := range []struct {
		source string
		want   bool
	}{
		{`{% for message in messages %}{{ message.content }}{% endfor %}`, true},
		{`{% for message in messages %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endfor %}`, false},
		{`{%- for message in messages -%}{%- for part in message['content'] | selectattr('type', 'equalto', 'text') -%}{{ part.text }}{%- endfor -%}{%- endfor -%}`, false},
		{`{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m["content"] %}{{ c }}{% endfor %}{% endfor %}`, false},
		{`{% for m in messages[::-1] %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}`, false},
		// A loop over the content of something that is not a message.
		{`{% for tool in tools %}{% for c in tool.content %}{{ c }}{% endfor %}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}`, true},
		{`{% set first = messages[0] %}{% for c in first.content %}{{ c }}{% endfor %}`, true},
		{`{% for m in messages %}{% for call in m.tool_calls %}{{ call }}{% endfor %}{% endfor %}`, true},
	} {
		if got := stringContent(tc.source); got != tc.want {
			t.Errorf("stringContent(%s) = %v, want %v", tc.source, got, tc.want)
		}
	}
}

// TestRenderJSONStringContent: a template that takes string content
// renders a message given as text parts as the parts' texts joined with
// "\n" (empty or null ones dropped, the parts vLLM reads as text
// included), and null content as "", as vLLM renders them; a template
// that loops over the parts gets them as they are.
func TestRenderJSONStringContent(t *testing.T) {
	str, err := NewChatTemplate(`{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	parts, err := NewChatTemplate(`{% for m in messages %}[{{ m.role }}:{% for p in m.content %}<{{ p.text }}>{% endfor %}]{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tmpl     *ChatTemplate
		messages string
		want     string
	}{
		{str, `[{"role":"user","content":"alpha\nbeta"}]`, "[user:alpha\nbeta]"},
		{str, `[{"role":"user","content":[{"type":"text","text":"alpha"},{"type":"text","text":"beta"}]}]`, "[user:alpha\nbeta]"},
		{str, `[{"role":"user","content":[{"type":"text","text":""},{"type":"input_text","text":"alpha"},{"type":"text","text":null},{"type":"text"},{"type":"refusal","refusal":"beta"}]}]`, "[user:alpha\nbeta]"},
		{str, `[{"role":"user","content":["alpha","",{"type":"text","text":"beta"}]}]`, "[user:alpha\nbeta]"},
		// A deferred tool's reference is its name, as vLLM reads it.
		{str, `[{"role":"tool","content":[{"type":"tool_reference","name":"alpha"},{"type":"tool_reference"},{"type":"thinking","thinking":"beta"},{"type":"output_text","text":"gamma"}]}]`, "[tool:alpha\nbeta\ngamma]"},
		{str, `[{"role":"assistant","content":null},{"role":"user"},{"role":"user","content":[]}]`, "[assistant:][user:][user:]"},
		{parts, `[{"role":"user","content":[{"type":"text","text":"alpha"},{"type":"text","text":"beta"}]}]`, "[user:<alpha><beta>]"},
	} {
		got, err := tc.tmpl.RenderJSON([]byte(tc.messages), ChatOptions{})
		if err != nil {
			t.Fatalf("RenderJSON(%s): %v", tc.messages, err)
		}
		if got != tc.want {
			t.Errorf("RenderJSON(%s) = %q, want %q", tc.messages, got, tc.want)
		}
	}
	for _, bad := range []string{
		`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`,
		`[{"role":"user","content":[{"type":"text","text":5}]}]`,
		`[{"role":"user","content":[5]}]`,
	} {
		if _, err := str.RenderJSON([]byte(bad), ChatOptions{}); err == nil || !strings.Contains(err.Error(), "messages[0].content[0]") {
			t.Errorf("RenderJSON(%s): got error %v, want one naming messages[0].content[0]", bad, err)
		}
	}
}

// TestRenderJSONOpenAIContent: a template that loops over a message's
// parts gets them as vLLM gives them (chat_utils.py, wrap_dicts): text-like
// parts as {"type": "text", "text": ...}, a string content as one such
// part, null content as no parts, a tool message of text parts as one
// string, a tool_reference part kept with its name.
func TestRenderJSONOpenAIContent(t *testing.T) {
	tmpl, err := NewChatTemplate(`{% for m in messages %}[{{ m.role }}:{% if m.content is string %}"{{ m.content }}"{% else %}{% for p in m.content %}<{{ p.type }}:{{ p.text if p.type == 'text' else p.name }}>{% endfor %}{% endif %}]{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ messages, want string }{
		{`[{"role":"user","content":"alpha"}]`, "[user:<text:alpha>]"},
		{`[{"role":"user","content":["alpha",{"type":"input_text","text":"beta"},{"type":"refusal","refusal":"gamma"},{"type":"thinking","thinking":"delta"},{"type":"output_text","text":""}]}]`,
			"[user:<text:alpha><text:beta><text:gamma><text:delta><text:>]"},
		{`[{"role":"user","content":[{"type":"text","text":null},{"type":"text"},{"type":"refusal"},{"type":"text","text":"alpha"}]}]`, "[user:<text:alpha>]"},
		{`[{"role":"assistant","content":null},{"role":"user"}]`, "[assistant:][user:]"},
		{`[{"role":"tool","content":[{"type":"text","text":"alpha"},{"type":"input_text","text":"beta"}]}]`, `[tool:"alpha` + "\n" + `beta"]`},
		{`[{"role":"tool","content":[]}]`, `[tool:""]`},
		{`[{"role":"tool","content":[{"type":"text","text":"alpha"},{"type":"tool_reference","name":"search"}]}]`, "[tool:<text:alpha><tool_reference:search>]"},
	} {
		got, err := tmpl.RenderJSON([]byte(tc.messages), ChatOptions{})
		if err != nil {
			t.Fatalf("RenderJSON(%s): %v", tc.messages, err)
		}
		if got != tc.want {
			t.Errorf("RenderJSON(%s) = %q, want %q", tc.messages, got, tc.want)
		}
	}
	bad := `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]`
	if _, err := tmpl.RenderJSON([]byte(bad), ChatOptions{}); !errors.Is(err, ErrNotText) || !strings.Contains(err.Error(), "messages[0].content[1]") {
		t.Errorf("RenderJSON(%s): got error %v, want ErrNotText naming messages[0].content[1]", bad, err)
	}
}

// TestStringContentParts: StringContent reads a message's content as RenderJSON
// gives it to a template that takes strings, and says which part is not
// text.
func TestStringContentParts(t *testing.T) {
	for _, tc := range []struct{ content, want string }{
		{`"a"`, "a"},
		{`null`, ""},
		{``, ""},
		{`[]`, ""},
		{`[{"type":"input_text","text":"b"},"c",{"type":"refusal","refusal":null},{"type":"tool_reference","name":"d"},{"type":"thinking","thinking":""}]`, "b\nc\nd"},
	} {
		if got, err := StringContent([]byte(tc.content)); err != nil || got != tc.want {
			t.Errorf("StringContent(%s): got %q, %v; want %q", tc.content, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		content string
		want    string
		notText bool
	}{
		{`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]`, "content[1]", true},
		{`[{"type":"video"}]`, "content[0]", true},
		{`[{"type":"text","text":7}]`, "content[0].text is not a string", false},
		{`7`, "content is not a string", false},
		{`[{"type":"text"`, "content", false},
	} {
		_, err := StringContent([]byte(tc.content))
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrNotText) != tc.notText {
			t.Errorf("StringContent(%s): got error %v, want one naming %s (ErrNotText %v)", tc.content, err, tc.want, tc.notText)
		}
	}
}

// TestRenderJSONToolsAsVLLM: tool call arguments sent as a JSON string (as
// OpenAI clients send them) are rendered as the decoded value, and tools
// as vLLM's request model dumps them (keys in its order, defaults filled
// in), whatever the request's key order: templates render both with
// tojson, and vLLM renders them so.
func TestRenderJSONToolsAsVLLM(t *testing.T) {
	tmpl, err := NewChatTemplate(`{{ tools | tojson }}|{% for m in messages %}{{ m.role }}{% if m.tool_calls is defined %}:{% for c in m.tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}{% endif %}|{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	canonical := `[{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}, {"type": "function", "function": {"name": "g", "description": "d", "parameters": {"b": 1, "a": 2}, "strict": true}}]`
	for _, tc := range []struct {
		tools, messages, want string
	}{
		{`[{"function":{"name":"f"}},{"x":1,"function":{"strict":true,"x-extra":2,"parameters":{"b":1,"a":2},"name":"g","description":"d"},"type":"function"}]`,
			`[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"city\":\"Z\u00fcrich\",\"days\":3}"}},{"function":{"name":"f","arguments":"not json"}},{"function":{"name":"f","arguments":null}},{"function":{"name":"f","arguments":"[1]"}}]},{"role":"assistant","content":"x","tool_calls":[]}]`,
			canonical + `|user|assistant:{"city": "Zürich", "days": 3};{};{};[1];|assistant|`},
		// strict and defer_loading: dumped only when set, after parameters;
		// a tool's defer_loading is also its function's.
		{`[{"defer_loading":true,"function":{"strict":false,"name":"s"}},` +
			`{"function":{"name":"t","defer_loading":false},"defer_loading":true},` +
			`{"function":{"name":"u","defer_loading":null,"strict":null},"defer_loading":null}]`,
			`[]`,
			`[{"type": "function", "function": {"name": "s", "description": null, "parameters": null, "strict": false, "defer_loading": true}, "defer_loading": true}, ` +
				`{"type": "function", "function": {"name": "t", "description": null, "parameters": null, "defer_loading": false}, "defer_loading": true}, ` +
				`{"type": "function", "function": {"name": "u", "description": null, "parameters": null}}]|`},
	} {
		got, err := tmpl.RenderJSON([]byte(tc.messages), ChatOptions{JSONVars: map[string]json.RawMessage{"tools": json.RawMessage(tc.tools)}})
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("RenderJSON:\n got %s\nwant %s", got, tc.want)
		}
	}
}

// TestRenderJSONConversationKeys: a template sees of each message only the
// keys vLLM's ConversationMessage keeps, in its order: extra keys are gone,
// an assistant's "reasoning" is also its "reasoning_content", a client's
// "reasoning_content" is its reasoning when it has no "reasoning" (vLLM
// renames it; it was dropped here, so Qwen3's <think> block of a tool-call
// turn was missing), a null tool_calls is gone, a tool call's keys come in
// the order of the TypedDict vLLM validates it with (function: arguments,
// name; they came as sent, and a template that writes a call with tojson
// rendered another prompt).
func TestRenderJSONConversationKeys(t *testing.T) {
	tmpl, err := NewChatTemplate(`{% for m in messages %}{{ m | tojson + '\n' }}{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	messages := `[{"content":"be brief","role":"system","extra":1},` +
		`{"role":"user","content":"hi","name":"ann","task":5},` +
		`{"role":"assistant","content":"x","reasoning_content":"old","tool_calls":null},` +
		`{"reasoning":"r","role":"assistant","content":"y","tool_calls":[{"function":{"name":"f","arguments":{}}}]},` +
		`{"role":"assistant","content":"z","reasoning":null,"reasoning_content":"rc"},` +
		`{"role":"assistant","content":"w","reasoning":"","reasoning_content":"lost"},` +
		`{"role":"user","content":"u","reasoning_content":"not an assistant's"},` +
		`{"role":"tool","tool_call_id":"c1","content":"ok","id":"z"},` +
		`{"role":"developer","content":"d"}]`
	want := `{"role": "system", "content": "be brief"}
{"role": "user", "content": "hi", "name": "ann"}
{"role": "assistant", "content": "x", "reasoning": "old", "reasoning_content": "old"}
{"role": "assistant", "content": "y", "tool_calls": [{"function": {"arguments": {}, "name": "f"}}], "reasoning": "r", "reasoning_content": "r"}
{"role": "assistant", "content": "z", "reasoning": "rc", "reasoning_content": "rc"}
{"role": "assistant", "content": "w", "reasoning": "", "reasoning_content": ""}
{"role": "user", "content": "u"}
{"role": "tool", "content": "ok", "tool_call_id": "c1"}
{"role": "developer", "content": "d", "tools": null}
`
	got, err := tmpl.RenderJSON([]byte(messages), ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("RenderJSON:\n got %s\nwant %s", got, want)
	}
}

// TestRenderJSONBillingHeader: a system message's Claude Code billing
// header line (its cch changes with every request) is gone, as vLLM drops
// it, for a template that loops over the parts too: a part or string that
// starts with it loses its first line, or goes when nothing follows; a
// user message keeps it. (The string-content templates are checked
// against jinja2 in TestRenderJSONMatchesVLLMInputs.)
func TestRenderJSONBillingHeader(t *testing.T) {
	tmpl, err := NewChatTemplate(`{% for m in messages %}{{ m.role }}:{% for p in m.content %}[{{ p.type }}|{{ p.text }}]{% endfor %};{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := `[{"role":"system","content":"x-anthropic-billing-header: cch=1;"},` +
		`{"role":"system","content":["x-anthropic-billing-header: a\nb",{"type":"text","text":"x-anthropic-billing-header: c\nd","cache_control":{}},{"type":"text","text":"e"}]},` +
		`{"role":"user","content":"x-anthropic-billing-header: u"}]`
	const want = `system:;system:[text|b][text|d][text|e];user:[text|x-anthropic-billing-header: u];`
	if got, err := tmpl.RenderJSON([]byte(msgs), ChatOptions{}); err != nil || got != want {
		t.Errorf("RenderJSON = %q, %v\nwant %q", got, err, want)
	}
}

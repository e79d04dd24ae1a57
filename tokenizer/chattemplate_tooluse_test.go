package tokenizer

import (
	"encoding/json"
	"testing"
)

// TestChatTemplateToolUse: a tokenizer_config.json may name its chat
// templates (Hermes 2 Pro and Hermes 3, Command R: a "default" and a
// "tool_use" one). transformers' get_chat_template, which vLLM calls with
// the request's tools (None when it has none), takes "tool_use" when there
// are tools and "default" otherwise; the tokenizer always rendered
// "default", so a request with tools got another prompt (and other block
// hashes) than the engine's.
func TestChatTemplateToolUse(t *testing.T) {
	config := `{"chat_template": [
		{"name": "default", "template": "D{% for m in messages %}[{{ m.content }}]{% endfor %}"},
		{"name": "tool_use", "template": "T{{ tools | length }}{% for m in messages %}[{{ m.content }}]{% endfor %}"}
	]}`
	tok, err := Load(mustRead(t, "testdata/tiny/tokenizer.json"), []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := tok.ChatTemplate()
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	tools := json.RawMessage(`[{"type": "function", "function": {"name": "f", "parameters": {}}}]`)
	for _, tt := range []struct {
		name string
		opts ChatOptions
		want string
	}{
		{"no tools", ChatOptions{}, "D[hi]"},
		{"tools", ChatOptions{JSONVars: map[string]json.RawMessage{"tools": tools}}, "T1[hi]"},
		{"tools null", ChatOptions{JSONVars: map[string]json.RawMessage{"tools": json.RawMessage("null")}}, "D[hi]"},
		// transformers tests "tools is not None": an empty list is tools
		// (it was taken as none here).
		{"tools empty", ChatOptions{JSONVars: map[string]json.RawMessage{"tools": json.RawMessage("[]")}}, "T0[hi]"},
		{"tools as a Go value", ChatOptions{Vars: map[string]any{"tools": []any{map[string]any{"type": "function"}}}}, "T1[hi]"},
		{"tools an empty Go list", ChatOptions{Vars: map[string]any{"tools": []any{}}}, "T0[hi]"},
		{"tools a nil Go list", ChatOptions{Vars: map[string]any{"tools": []any(nil)}}, "D[hi]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tmpl.RenderJSON(msgs, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("RenderJSON = %q, want %q", got, tt.want)
			}
			if got, err := tmpl.Render([]Message{{Role: "user", Content: "hi"}}, tt.opts); err != nil || got != tt.want {
				t.Errorf("Render = %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}

// TestChatTemplateToolsDefined: transformers' apply_chat_template passes
// tools and documents to every rendering, None when the request has none,
// so "tools is defined" is true; the tokenizer left them undefined, and a
// template that tests "tools is defined" (rather than "is not none")
// rendered another prompt than vLLM's for every request without tools.
// The want is jinja2's rendering (render_vllm_inputs.py's "vars" template).
func TestChatTemplateToolsDefined(t *testing.T) {
	tmpl, err := NewChatTemplate(`{{ tools is defined }} {{ tools is none }} {{ documents is defined }} {{ documents is none }}|{% if tools is defined %}T{% endif %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	for _, tt := range []struct {
		name string
		opts ChatOptions
		want string
	}{
		{"none", ChatOptions{}, "True True True True|T"},
		{"tools", ChatOptions{JSONVars: map[string]json.RawMessage{"tools": json.RawMessage(`[{"type": "function", "function": {"name": "f"}}]`)}}, "True False True True|T"},
		{"documents", ChatOptions{Vars: map[string]any{"documents": []any{map[string]any{"title": "a", "text": "b"}}}}, "True True True False|T"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tmpl.RenderJSON(msgs, tt.opts)
			if err != nil || got != tt.want {
				t.Errorf("RenderJSON = %q, %v, want %q", got, err, tt.want)
			}
			if got, err := tmpl.Render([]Message{{Role: "user", Content: "hi"}}, tt.opts); err != nil || got != tt.want {
				t.Errorf("Render = %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}

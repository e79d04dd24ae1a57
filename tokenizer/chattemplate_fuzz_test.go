package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
)

// fuzzTemplates are chat templates of the shapes real models ship: ChatML
// (Qwen), Llama 3's header form with a system-message split and trim, and
// one that walks tool calls and dumps them with tojson, and one that
// calls Python's string methods (pymethods.go), and one with jinja2's
// tests and a filter block (pytests.go, pyFilterBlocks), and one with a
// namespace, comparisons, a block set and dict methods (namespace.go,
// pycompare.go), and one that prints and joins whole values (pystr.go,
// pyJoin). Clients choose the messages, so rendering them must fail
// cleanly or succeed, never panic.
var fuzzTemplates = []string{
	"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}" +
		"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
	"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}" +
		"{% set system_message = messages[0]['content'] | trim %}{% else %}{% set loop_messages = messages %}{% set system_message = '' %}{% endif %}" +
		"{% if system_message %}{{ '<|start_header_id|>system<|end_header_id|>\n\n' + system_message + '<|eot_id|>' }}{% endif %}" +
		"{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}" +
		"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}" +
		"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}" +
		"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
	"{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% elif m.content %}" +
		"{% for part in m.content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}" +
		"{% if m.tool_calls %}{% for call in m.tool_calls %}<call>{{ call.function.name }} {{ call.function.arguments | tojson }}</call>{% endfor %}{% endif %}\n" +
		"{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}",
	"{% for t in tools %}{{ t | tojson(indent=4) }}{{ t | tojson(separators=(',', ':'), sort_keys=true, ensure_ascii=true) }}{% endfor %}" +
		"{% for m in messages %}{{ m | tojson(indent='  ') }}{% endfor %}",
	"{% for m in messages %}{{ m.role.capitalize() }}{{ m.content.strip() }}{{ m.content.rstrip('\n').lstrip() }}" +
		"{{ m.content.split(none, 1) | tojson }}{{ m.content.split('</think>')[-1].title() }}{% endfor %}",
	"{% for m in messages %}{% if m.content is string and m.content is not upper %}{%- filter upper|trim %} {{ m.content }}\n{% endfilter %}" +
		"{% elif m.content is sequence %}{{ m.content | length is divisibleby 2 }}{% endif %}{{ m.role is in ['user', 'assistant'] }}" +
		"{{ m.tool_calls is defined and m.tool_calls | length is gt 0 }}{% endfor %}",
	"{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'user' and m.content is string %}{% set ns.found = true %}" +
		"{% set ns.n = ns.n + 1 %}{% endif %}{% if m.content is mapping %}{{ m.content | items | list | length }}{% endif %}{% set x %}{% set y = m %}{% endset %}" +
		"{% endfor %}{{ ns.found }}{{ ns.n != 1 }}{{ ns is mapping }}{% for k, v in (messages[0] or {}).items() %}{{ k }}{{ v.get('a') }}{% endfor %}",
	"{{ messages }}{% for m in messages %}{{ m.content ~ m.role ~ m.tool_calls }}{{ m.content }}{{ m | string }}{% endfor %}{{ tools }}" +
		"{{ messages | join(', ', attribute='role') }}{% for m in messages %}{{ m.content | join('|') }}{{ m.tool_calls | join(attribute='function.arguments') }}{% endfor %}",
}

// FuzzRenderJSON renders client-chosen messages (and a tools variable)
// through each template. Whatever renders holds every user message's
// text, for the ChatML template, verbatim (but a system message's Claude
// Code billing header line).
func FuzzRenderJSON(f *testing.F) {
	f.Add([]byte(`[{"role": "system", "content": " be brief "}, {"role": "user", "content": "hi {{ 7*7 }} {% raw %}"}]`), []byte(`[{"type": "function"}]`))
	f.Add([]byte(`[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}, {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": [2]}}}]}]`), []byte(`null`))
	f.Add([]byte(`[{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]`), []byte(`{}`))
	f.Add([]byte(`[{"role": 5, "content": {"nested": [[[]]]}}]`), []byte(`"s"`))
	f.Add([]byte(`[]`), []byte(`[]`))
	f.Add([]byte(`[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\": 2.0, \"y\": 1e300, \"z\": [-0.0, 5e-324]}"}}]}]`),
		[]byte(`[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"t": {"type": "number", "minimum": 0.0, "maximum": 2e6}}}}}]`))
	f.Add([]byte(`[{"role": "assistant", "content": "a", "reasoning": null, "reasoning_content": "r", "tool_calls": []}, {"role": "user", "content": "b", "reasoning_content": 1}]`),
		[]byte(`[{"defer_loading": true, "x": 1, "function": {"name": "f", "defer_loading": null, "strict": true}}, {"function": {"defer_loading": false}, "defer_loading": "y"}, {"function": 3}]`))
	f.Add([]byte(`[{"role": "system", "content": ["x-anthropic-billing-header: a\nb", {"type": "text", "text": "x-anthropic-billing-header"}, 3]}, {"role": "system", "content": "x-anthropic-billing-header"}]`), []byte(`null`))
	tmpls := make([]*ChatTemplate, len(fuzzTemplates))
	for i, src := range fuzzTemplates {
		t, err := NewChatTemplate(src, "<s>", "</s>")
		if err != nil {
			f.Fatalf("template %d: %v", i, err)
		}
		tmpls[i] = t
	}
	f.Fuzz(func(t *testing.T, messages, tools []byte) {
		var vars map[string]json.RawMessage
		if json.Valid(tools) {
			vars = map[string]json.RawMessage{"tools": tools}
		}
		for i, tmpl := range tmpls {
			out, err := tmpl.RenderJSON(messages, ChatOptions{AddGenerationPrompt: true, JSONVars: vars})
			if err != nil || i != 0 {
				continue
			}
			var msgs []map[string]any // exact keys, the last of duplicates (as valueFromJSON)
			if json.Unmarshal(messages, &msgs) != nil {
				continue
			}
			for _, m := range msgs {
				s, ok := m["content"].(string)
				if role, _ := m["role"].(string); ok && role == "system" {
					if rest, found := strings.CutPrefix(s, billingHeader); found {
						_, s, _ = strings.Cut(rest, "\n") // its first line is dropped, as vLLM drops it
					}
				}
				if ok && !strings.Contains(out, s) {
					t.Fatalf("ChatML rendering lost a message's content %q:\n%s", s, out)
				}
			}
		}
	})
}

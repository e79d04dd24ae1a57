package tokenizer

import (
	"fmt"

	"github.com/ardanlabs/jinja"
)

// ChatTemplate is a compiled HuggingFace chat template (the Jinja source of
// tokenizer_config.json's chat_template), rendered the way transformers'
// apply_chat_template does: trim_blocks and lstrip_blocks on, with the
// variables messages, add_generation_prompt, bos_token and eos_token. It is
// rendered by github.com/ardanlabs/jinja, a pure-Go Jinja engine made for chat
// templates. A ChatTemplate is safe for concurrent use.
type ChatTemplate struct {
	tmpl     *jinja.Template
	bos, eos string
}

// NewChatTemplate compiles a chat template; bos and eos are the values of the
// bos_token and eos_token variables.
func NewChatTemplate(source, bos, eos string) (*ChatTemplate, error) {
	t, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: chat template: %w", err)
	}
	return &ChatTemplate{tmpl: t, bos: bos, eos: eos}, nil
}

// ChatOptions are the optional inputs of a chat template rendering.
type ChatOptions struct {
	// AddGenerationPrompt appends the header of an assistant turn. Default false.
	AddGenerationPrompt bool
	// Vars are extra template variables (for example enable_thinking, tools,
	// date_string). They may override bos_token and eos_token. Default none.
	Vars map[string]any
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
// "reasoning_content"), as decoded from a request's JSON.
func (c *ChatTemplate) RenderAny(messages []any, opts ChatOptions) (string, error) {
	data := map[string]any{
		"messages":              messages,
		"add_generation_prompt": opts.AddGenerationPrompt,
		"bos_token":             c.bos,
		"eos_token":             c.eos,
	}
	for k, v := range opts.Vars {
		data[k] = v
	}
	out, err := c.tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: %w", err)
	}
	return out, nil
}

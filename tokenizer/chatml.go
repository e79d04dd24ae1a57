package tokenizer

import "strings"

// ChatML special tokens, as used by the built-in chat template and by Qwen models.
const (
	ChatMLStart     = "<|im_start|>"
	ChatMLEnd       = "<|im_end|>"
	ChatMLEndOfText = "<|endoftext|>"
)

// RenderChatML renders msgs with the ChatML template, the built-in chat
// template of the emulated engine:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n     (once per message)
//	<|im_start|>assistant\n                       (when addGenerationPrompt)
//
// Every message ends with the special token <|im_end|> followed by a newline,
// so the rendering of a conversation is a text prefix of the rendering of any
// continuation of it.
func RenderChatML(msgs []Message, addGenerationPrompt bool) string {
	n := 0
	for _, m := range msgs {
		n += len(ChatMLStart) + len(m.Role) + 1 + len(m.Content) + len(ChatMLEnd) + 1
	}
	if addGenerationPrompt {
		n += len(ChatMLStart) + len("assistant\n")
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString(ChatMLStart)
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString(ChatMLEnd)
		b.WriteByte('\n')
	}
	if addGenerationPrompt {
		b.WriteString(ChatMLStart)
		b.WriteString("assistant\n")
	}
	return b.String()
}

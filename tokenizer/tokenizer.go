package tokenizer

import "errors"

// ErrNoChatTemplate is returned by ChatTemplate when the tokenizer has none.
var ErrNoChatTemplate = errors.New("tokenizer: no chat template")

// Tokenizer turns text into token ids and back.
//
// Implementations in this package are safe for concurrent use.
type Tokenizer interface {
	// Encode returns the token ids of text. Special tokens written in the text
	// (for example "<|im_start|>") are recognised and encoded as their single id.
	Encode(text string) []uint32
	// Decode returns the text of ids. Ids the tokenizer does not know are skipped.
	Decode(ids []uint32) string
}

// Message is one chat message: its role ("system", "user", "assistant", "tool")
// and its text.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Optional capabilities of a Tokenizer, found by type assertion. Builtin, *HF
// and *Cache have all three (Builtin's chat template is RenderChatML, used by
// RenderChat).
type (
	// Vocab reports the number of token ids.
	Vocab interface{ VocabSize() int }
	// EOSer reports the end-of-sequence token, if there is one.
	EOSer interface{ EOS() (uint32, bool) }
	// Templater gives the model's chat template.
	Templater interface {
		ChatTemplate() (*ChatTemplate, error)
	}
)

var (
	_ Vocab     = builtin{}
	_ EOSer     = builtin{}
	_ Tokenizer = (*HF)(nil)
	_ Vocab     = (*HF)(nil)
	_ EOSer     = (*HF)(nil)
	_ Templater = (*HF)(nil)
	_ Vocab     = (*Cache)(nil)
	_ EOSer     = (*Cache)(nil)
	_ Templater = (*Cache)(nil)
)

// TemplateOf returns tok's chat template, or nil when it has none (Builtin,
// or a tokenizer.json without tokenizer_config.json's chat_template). It
// fails only when the template does not compile.
func TemplateOf(tok Tokenizer) (*ChatTemplate, error) {
	t, ok := tok.(Templater)
	if !ok {
		return nil, nil
	}
	tmpl, err := t.ChatTemplate()
	if errors.Is(err, ErrNoChatTemplate) {
		return nil, nil
	}
	return tmpl, err
}

// RenderChat renders msgs to a prompt with tok's chat template when it has one
// (an *HF or a *Cache from tokenizer_config.json), and with RenderChatML
// otherwise (Builtin, or a tokenizer.json without a template).
func RenderChat(tok Tokenizer, msgs []Message, addGenerationPrompt bool) (string, error) {
	tmpl, err := TemplateOf(tok)
	switch {
	case err != nil:
		return "", err
	case tmpl != nil:
		return tmpl.Render(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
	}
	return RenderChatML(msgs, addGenerationPrompt), nil
}

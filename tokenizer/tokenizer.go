package tokenizer

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

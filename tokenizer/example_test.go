package tokenizer_test

import (
	"fmt"

	"github.com/kvroute/kvroute/tokenizer"
)

func Example() {
	tok := tokenizer.Builtin()
	prompt := tokenizer.RenderChatML([]tokenizer.Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "What is a KV cache?"},
	}, true)
	ids := tok.Encode(prompt)
	fmt.Println(len(prompt), "bytes,", len(ids), "tokens")
	fmt.Println(ids[:3])
	// Output:
	// 127 bytes, 29 tokens
	// [1 99753 67912]
}

// A HuggingFace tokenizer: load tokenizer.json and tokenizer_config.json,
// render a conversation with the model's chat template, and tokenize it
// through a Cache so the next turn only tokenizes its new messages.
func ExampleLoadDir() {
	tok, err := tokenizer.LoadDir("testdata/tiny") // a hand-made byte-level BPE
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tok.Encode("hello world"))

	tmpl, err := tok.ChatTemplate()
	if err != nil {
		fmt.Println(err)
		return
	}
	msgs := []tokenizer.Message{{Role: "user", Content: "hello world"}}
	prompt, err := tmpl.Render(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%q\n", prompt)

	cache := tokenizer.NewCache(tok, tokenizer.CacheConfig{MinSegmentBytes: 8})
	fmt.Println(cache.Encode(prompt))
	// Output:
	// [259 264]
	// "<|user|>user: hello world</s>\n<|user|>assistant:"
	// [302 117 115 101 114 58 32 259 264 301 10 302 97 115 115 105 115 116 97 110 116 58]
}

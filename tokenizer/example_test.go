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

package openai_test

import (
	"fmt"

	"github.com/kvroute/kvroute/openai"
)

func ExampleParseRequest() {
	body := []byte(`{"model":"llama","stream":true,"max_tokens":64,
		"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`)
	ri, err := openai.ParseRequest(openai.KindChat, body)
	if err != nil {
		panic(err)
	}
	fmt.Println(ri.Model, ri.Stream, ri.MaxTokens, ri.Messages)
	fmt.Printf("%q\n", ri.Prompt)

	_, err = openai.ParseRequest(openai.KindChat, []byte(`{"model":"llama","messages":[]}`))
	fmt.Println(err)
	// Output:
	// llama true 64 2
	// "6:system,Be brief.\x00\x004:user,Hi\x00\x00"
	// "messages" must not be empty
}

package emulator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

func Example() {
	prof, _ := engine.LookupProfile("tiny")
	srv, err := emulator.New(emulator.Config{Model: "tiny", Engine: engine.Config{Profile: prof}, Speed: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	defer func() { hs.Close(); cancel(); <-done }()

	resp, err := http.Post(hs.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"tiny","prompt":"Hello","max_tokens":3,"seed":1}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var c openai.Completion
	_ = json.NewDecoder(resp.Body).Decode(&c)
	fmt.Println(c.Object, *c.Choices[0].FinishReason, c.Usage.CompletionTokens)
	// Output: text_completion length 3
}

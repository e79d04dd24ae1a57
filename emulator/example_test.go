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

// ExampleNewDP runs two data-parallel ranks behind one endpoint and pins a
// request to rank 1 with vLLM's X-data-parallel-rank header.
func ExampleNewDP() {
	prof, _ := engine.LookupProfile("tiny")
	dp, err := emulator.NewDP(emulator.Config{Model: "tiny", Engine: engine.Config{Profile: prof}, Speed: 100}, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.Run(ctx) }()
	hs := httptest.NewServer(dp.Handler())
	defer func() { hs.Close(); cancel(); <-done }()

	for _, rank := range []string{"1", "2"} {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/completions",
			strings.NewReader(`{"model":"tiny","prompt":"Hello","max_tokens":3}`))
		req.Header.Set(emulator.HeaderDataParallelRank, rank)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		var body struct {
			Error *struct{ Message string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if body.Error != nil {
			fmt.Println(resp.StatusCode, body.Error.Message)
		} else {
			fmt.Println(resp.StatusCode)
		}
	}
	// Output:
	// 200
	// 400 data_parallel_rank 2 is out of range [0, 2).
}

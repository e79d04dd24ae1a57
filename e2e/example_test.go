package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

// Example puts the routing proxy, with precise mode on, in front of one
// emulated engine and sends the same prompt twice: the second time the
// engine serves the prompt from its prefix cache and says so.
func Example() {
	prof, _ := engine.LookupProfile("tiny")
	eng, _ := emulator.New(emulator.Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 100})
	hs := httptest.NewServer(eng.Handler())
	defer hs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	engDone, proxyDone := make(chan error, 1), make(chan error, 1)
	defer func() { // stop both and wait for them
		cancel()
		<-engDone
		<-proxyDone
	}()
	go func() { engDone <- eng.Run(ctx) }()

	p, err := proxy.New(proxy.Options{NewPicker: policy.New, Config: config.Config{Models: []config.Model{{
		Name:      "m",
		Endpoints: []config.Endpoint{{ID: "engine-0", URL: hs.URL}},
		Signals:   config.Signals{ScrapeInterval: 50 * time.Millisecond},
		Precise:   config.Precise{Tokenizer: config.BuiltinTokenizer},
	}}}})
	if err != nil {
		fmt.Println(err)
		proxyDone <- err
		return
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { proxyDone <- p.Serve(ctx, ln) }()

	body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("Tell me about caches. ", 20) + `"}]}`
	for i := range 2 {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			fmt.Println(err)
			return
		}
		var out struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		fmt.Printf("request %d: status %d, prompt served from cache: %v\n", i+1, resp.StatusCode, out.Usage.PromptTokensDetails.CachedTokens > 0)
	}
	// Output:
	// request 1: status 200, prompt served from cache: false
	// request 2: status 200, prompt served from cache: true
}

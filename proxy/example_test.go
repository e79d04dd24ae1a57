package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

func Example() {
	// An engine that answers every completion the same way.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	defer engine.Close()

	cfg := config.Config{
		Models: []config.Model{{
			Name:      "llama",
			Endpoints: []config.Endpoint{{ID: "gpu-0", URL: engine.URL}},
			Policy:    config.Policy{Name: "least_request"},
		}},
		HealthCheck: config.HealthCheck{Disabled: true},
	}
	p, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New})
	if err != nil {
		panic(err)
	}
	// cmd/kvroute runs p.Serve(ctx, listener); any http.Server works too.
	srv := httptest.NewServer(p)
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))

	resp, _ = http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-9","messages":[{"role":"user","content":"hello"}]}`))
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(resp.StatusCode, " ", string(body))
	// Output:
	// 200 {"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}
	// 404 {"error":{"message":"The model `gpt-9` does not exist.","type":"not_found_error","param":"model","code":"model_not_found"}}
}

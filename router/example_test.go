package router_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// A router for one model over two endpoints with the default policy: a
// second request sharing the first one's prompt goes where the first went
// (704 of its 725 tokens cached: its 22 full 128-character blocks), and the
// decision log explains it, with the figures kv-aware left to the log.
func Example() {
	p, err := policy.New(policy.Default, nil, 1)
	if err != nil {
		panic(err)
	}
	r, err := router.New(router.Config{
		Model:       "llama",
		Endpoints:   []kvroute.Endpoint{{ID: "a", URL: "http://10.0.0.1:8000"}, {ID: "b", URL: "http://10.0.0.2:8000"}},
		Picker:      p,
		DecisionLog: 8,
	})
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prompt := strings.Repeat("You are a careful assistant. ", 100)
	var first string
	for i, id := range []string{"r1", "r2"} {
		f, err := r.Route(now, &kvroute.Request{ID: id, Model: "llama", Prompt: prompt, PromptTokens: len(prompt) / 4}, nil)
		if err != nil {
			panic(err)
		}
		if i == 0 {
			first = f.Endpoint.ID
		} else {
			fmt.Println("same endpoint:", f.Endpoint.ID == first, "cached tokens:", f.CachedTokens())
		}
		r.FirstToken(now, f)
		r.Done(now, f, kvroute.Outcome{TTFT: 40 * time.Millisecond})
		now = now.Add(time.Second)
	}
	last := r.Decisions(1)[0]
	fmt.Println(last.RequestID, last.Decision.Reason)
	// Output:
	// same endpoint: true cached tokens: 704
	// r2 affinity: est 6.4 ms (queue 0.0 + prefill 6.4), 704/725 tokens cached
}

package bench_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

func Example() {
	// A tiny OpenAI-compatible server that streams two tokens.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		openai.SetHeaders(w.Header())
		sse := openai.NewSSEWriter(w)
		sse.Data([]byte(`{"choices":[{"index":0,"delta":{"content":"Hello"}}]}`))
		sse.Data([]byte(`{"choices":[{"index":0,"delta":{"content":" world"}}]}`))
		sse.Data([]byte(`{"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":2,"total_tokens":18,"prompt_tokens_details":{"cached_tokens":0}}}`))
		sse.Done()
		_ = sse.Flush()
	}))
	defer srv.Close()

	w, err := workload.Generate("sysprompt", workload.Options{Seed: 1, Requests: 5,
		Params: map[string]float64{"system_len": 8, "user_len": 8, "output_len": 2}})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := bench.Run(context.Background(), bench.Config{URL: srv.URL, Model: "tiny"}, w.Requests)
	if err != nil {
		fmt.Println(err)
		return
	}
	row := res.Summary(report.SummaryOptions{Name: "example", OracleHitRate: -1})
	fmt.Println(row.Requests, row.Completed, row.OutputTokens, row.HitRate)
	// Output: 5 5 10 0
}

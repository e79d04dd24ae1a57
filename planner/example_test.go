package planner_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/planner"
)

func ExamplePlan() {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		panic(err)
	}
	// 20 requests/s of 800-token prompts, half of the tokens in 8 shared
	// prefixes, 60-token answers.
	w, err := planner.Summary{Rate: 20, Duration: 30 * time.Second, PromptMean: 800, OutputMean: 60, SharedFraction: 0.5, Zipf: 1}.Workload(1)
	if err != nil {
		panic(err)
	}
	res, err := planner.Plan(context.Background(), planner.Input{
		Profile: prof, Workload: w, Seed: 1,
		SLO: planner.SLO{TTFT: planner.Target{Quantile: 0.99, Limit: 300 * time.Millisecond},
			TPOT: planner.Target{Quantile: 0.99, Limit: 50 * time.Millisecond}},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("compute bound:", res.Bounds.Compute.Need, "engine(s)")
	fmt.Println("aggregated:", res.Aggregated.Engines, res.Aggregated.Method, "meets:", res.Aggregated.Meets)
	fmt.Println("disaggregated:", res.Disaggregated.Ratio(), res.Disaggregated.Method)
	fmt.Println("cheapest:", res.Cheapest)
	// Output:
	// compute bound: 1 engine(s)
	// aggregated: 1 simulated meets: true
	// disaggregated: 1:1 simulated
	// cheapest: aggregated
}

func ExampleSummary_Workload() {
	w, err := planner.Summary{Rate: 10, Duration: time.Minute, PromptMean: 2000, OutputMean: 200,
		SharedFraction: 0.6, HotPrefixes: 4, Zipf: 1}.Workload(42)
	if err != nil {
		panic(err)
	}
	r := w.Requests[0]
	fmt.Println(r.Segments[0].Len, "shared tokens +", r.PromptLen-r.Segments[0].Len, "own tokens")
	// Output:
	// 1200 shared tokens + 228 own tokens
}

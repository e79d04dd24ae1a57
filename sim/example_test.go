package sim_test

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

// Simulate a small chat workload on three toy engines with two policies and
// compare their prefix-cache hit rates with the oracle bound.
func Example() {
	w, err := workload.Generate("chat", workload.Options{
		Seed:     1,
		Requests: 200,
		Arrivals: workload.Arrivals{Rate: 20},
		Params:   map[string]float64{"system_len": 96, "user_len": 40, "reply_len": 24, "max_len": 700},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fleet, _ := sim.ParseFleet("3xtiny", "")
	for _, policy := range []string{"kv-aware", "round_robin"} {
		res, err := sim.Run(context.Background(), sim.Config{Fleet: fleet, Policy: policy, Seed: 1}, w.Requests)
		if err != nil {
			fmt.Println(err)
			return
		}
		row := res.Row(0)
		fmt.Printf("%s: %d/%d completed, hit rate below the oracle bound: %v\n",
			row.Name, row.Completed, row.Requests, row.HitRate <= row.OracleHitRate)
	}
	// Output:
	// kv-aware: 200/200 completed, hit rate below the oracle bound: true
	// round_robin: 200/200 completed, hit rate below the oracle bound: true
}

package disagg_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
)

// A 32k-token prompt on an idle pool of one prefill and one decode node
// joined by 400 Gb/s RDMA: the plan disaggregates and explains why.
func Example() {
	prof, _ := engine.LookupProfile("llama-3.1-8b-h100")
	pl, err := disagg.NewPlanner(disagg.Config{Profile: prof,
		Links: disagg.UniformLinks(disagg.Link{Name: "rdma", Gbps: 400})})
	if err != nil {
		fmt.Println(err)
		return
	}
	p := &kvroute.Endpoint{ID: "p0", Role: kvroute.RolePrefill}
	d := &kvroute.Endpoint{ID: "d0", Role: kvroute.RoleDecode}
	cands := []kvroute.Candidate{{Endpoint: p, Healthy: true}, {Endpoint: d, Healthy: true}}
	req := &kvroute.Request{ID: "r1", PromptTokens: 32768, MaxTokens: 256}
	plan := pl.Plan(time.Unix(0, 0), req, cands)
	fmt.Println(plan.Disaggregated, plan.Prefill.ID, "->", plan.Decode.ID, plan.Rule)
	fmt.Printf("transfer %.1f GB over %s: %v\n", float64(plan.Transfer.Bytes)/1e9, plan.Transfer.Link.Name, plan.Transfer.Total().Round(time.Millisecond))
	// Output:
	// true p0 -> d0 cost
	// transfer 4.3 GB over rdma: 86ms
}

// The transfer time of papers.md 4.6's example: 8k tokens of Llama-3.1-8B.
func ExampleLink_Duration() {
	prof, _ := engine.LookupProfile("llama-3.1-8b-h100")
	bytes := disagg.ShapeOf(prof).Bytes(8192)
	for _, l := range []disagg.Link{{Name: "rdma", Gbps: 400}, {Name: "tcp", Gbps: 100}} {
		fmt.Printf("%s: %.2f GB in %v\n", l.Name, float64(bytes)/1e9, l.Duration(bytes).Round(100*time.Microsecond))
	}
	// Output:
	// rdma: 1.07 GB in 21.5ms
	// tcp: 1.07 GB in 85.9ms
}

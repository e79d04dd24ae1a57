package demo

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/workload"
)

// WorkloadMixed is the demo's default workload: multi-turn chat sessions,
// users behind a few long shared system prompts, and a burst on one hot
// prefix, merged into one stream.
const WorkloadMixed = "mixed"

// WorkloadNames lists the workloads Config.Workload accepts: mixed and
// every generator of package workload.
func WorkloadNames() []string {
	return append([]string{WorkloadMixed}, workload.GeneratorNames()...)
}

// part is one generator's share of the mixed workload.
type part struct {
	gen    string
	share  float64
	params map[string]float64
}

// mixedParts are sized for the demo's small KV caches: each part's shared
// prefixes fit the fleet's cache when routed by affinity, not when spread.
func mixedParts(dur time.Duration, rate float64) []part {
	burst := max(8, int(rate*dur.Seconds()*0.12))
	return []part{
		{gen: "chat", share: 0.45, params: map[string]float64{
			"system_len": 600, "user_len": 120, "reply_len": 60, "think_s": 4, "turns": 5, "max_len": 6000,
		}},
		{gen: "sysprompt", share: 0.35, params: map[string]float64{
			"prompts": 6, "system_len": 3000, "user_len": 120, "output_len": 60,
		}},
		{gen: "storm", share: 0.20, params: map[string]float64{
			"prefixes": 40, "prefix_len": 1500, "hot_len": 4000, "suffix_len": 80, "output_len": 40,
			"burst": float64(burst), "burst_at_s": dur.Seconds() * 0.45, "burst_s": 2,
		}},
	}
}

// buildWorkload generates the named workload for one phase of length dur at
// rate requests per second. The same arguments give the same requests.
func buildWorkload(name string, dur time.Duration, rate float64, seed uint64) (*workload.Workload, error) {
	var parts []part
	switch name {
	case WorkloadMixed:
		parts = mixedParts(dur, rate)
	default:
		if !slices.Contains(workload.GeneratorNames(), name) {
			return nil, fmt.Errorf("demo: unknown workload %q (want one of %s)", name, strings.Join(WorkloadNames(), ", "))
		}
		parts = []part{{gen: name, share: 1}}
	}
	w := &workload.Workload{Name: name}
	for i, p := range parts {
		r := rate * p.share
		g, err := workload.Generate(p.gen, workload.Options{
			Seed:     seed + uint64(i)*7919,
			Requests: int(r*dur.Seconds()*1.5) + 10,
			Duration: dur,
			Arrivals: workload.Arrivals{Rate: r},
			Params:   p.params,
		})
		if err != nil {
			return nil, fmt.Errorf("demo: workload %s: %w", p.gen, err)
		}
		for _, req := range g.Requests {
			req.ID = p.gen + "-" + req.ID
			if req.Session != "" {
				req.Session = p.gen + "-" + req.Session
			}
			w.Requests = append(w.Requests, req)
		}
	}
	slices.SortStableFunc(w.Requests, func(a, b workload.Request) int {
		return cmp.Compare(a.Arrival, b.Arrival)
	})
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("demo: workload: %w", err)
	}
	return w, nil
}

package report_test

import (
	"os"
	"time"

	"github.com/kvroute/kvroute/report"
)

func Example() {
	c := report.NewCollector()
	for i := range 4 {
		c.Add(report.Sample{
			ID: "r", Engine: []string{"e0", "e1"}[i%2], Arrival: time.Duration(i) * time.Second,
			TTFT: time.Duration(i+1) * 100 * time.Millisecond, E2E: time.Duration(i+1) * time.Second,
			PromptTokens: 1000, CachedTokens: 500, OutputTokens: 11,
		})
	}
	c.Add(report.Sample{ID: "bad", Arrival: 4 * time.Second, E2E: time.Millisecond, Err: "connect"})
	row := c.Summary(report.SummaryOptions{Name: "kv-aware", SLO: report.SLO{TTFT: 250 * time.Millisecond}, OracleHitRate: 0.6})
	rep := &report.Report{Title: "example", Source: "sim", Workload: "demo", SLO: report.SLO{TTFT: 250 * time.Millisecond}, Rows: []report.Row{row}}
	rep.WriteTable(os.Stdout)
	// Output:
	// example
	// workload: demo   slo: ttft<=250ms
	// name      reqs  ok  err  rej   ttft50   ttft90   ttft99   tpot50   tpot99  e2e50  e2e99  req/s  tok/s  good/s  good%  hit%  oracle%  imbal  preempt
	// kv-aware     5   4    1    0  200.0ms  400.0ms  400.0ms  180.0ms  360.0ms  2.00s  4.00s   0.57      6    0.29   40.0  50.0     60.0   1.00        0
	// errors kv-aware: connect=1
}

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/report"
)

func TestFormats(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		want string
	}{
		{0.0669, "66.9"}, {0.99949, "999.5"}, {0.9996, "1.00 s"}, {4.8812, "4.88 s"},
		{25.384, "25.38 s"}, {99.996, "100 s"}, {107.2, "107 s"},
	} {
		if got := seconds(tc.s); got != tc.want {
			t.Errorf("seconds(%v) = %q, want %q", tc.s, got, tc.want)
		}
	}
	for _, tc := range []struct {
		m    float64
		want string
	}{
		{-0.0612, "-6%"}, {0.031, "+3%"}, {0.001, "+0%"}, {0, "0%"}, {-0.001, "0%"}, {-0.445, "-45%"},
	} {
		if got := percent(tc.m); got != tc.want {
			t.Errorf("percent(%v) = %q, want %q", tc.m, got, tc.want)
		}
	}
}

func TestFromReport(t *testing.T) {
	rep := &report.Report{Params: map[string]string{"ttft_bound_p99_ms": "46.9"}}
	for i, p := range policies {
		rep.Rows = append(rep.Rows, report.Row{
			Name:          p,
			TTFT:          report.Dist{P99: time.Duration(100+10*i) * time.Millisecond},
			ThroughputRPS: 100 - float64(i),
		})
	}
	rep.Rows[3].TTFT.P99 = 80 * time.Millisecond // llm-d the best baseline
	res, err := fromReport(rep)
	if err != nil {
		t.Fatal(err)
	}
	got := tableRow("chat 100/s", res)
	want := "| chat 100/s | 100.0 | 110.0 | 120.0 | 80.0 | 140.0 | 150.0 | 160.0 | 170.0 | +25% (worse) | 46.9 |"
	if got != want {
		t.Errorf("row\n got %s\nwant %s", got, want)
	}
	if best, i := res.bestRPS(); best != 99 || policies[i] != "round_robin" {
		t.Errorf("bestRPS = %v %d, want 99 and round_robin's index", best, i)
	}

	rep.Rows = rep.Rows[:len(rep.Rows)-1]
	if _, err := fromReport(rep); err == nil || !strings.Contains(err.Error(), "kubeai-chwbl") {
		t.Errorf("a report without a policy's row: err %v", err)
	}
	rep.Rows = append(rep.Rows, report.Row{Name: "kubeai-chwbl"})
	delete(rep.Params, "ttft_bound_p99_ms")
	if _, err := fromReport(rep); err == nil {
		t.Error("a report without the bound: no error")
	}
}

func TestParseSeeds(t *testing.T) {
	s, err := parseSeeds("1, 2,3")
	if err != nil || len(s) != 3 || s[0] != 1 || s[2] != 3 {
		t.Errorf("parseSeeds: %v %v", s, err)
	}
	if _, err := parseSeeds("1,x"); err == nil {
		t.Error(`parseSeeds("1,x"): no error`)
	}
}

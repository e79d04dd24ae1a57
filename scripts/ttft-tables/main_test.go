package main

import (
	"math"
	"slices"
	"strconv"
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
	for _, tc := range []struct {
		in   string
		want []uint64
	}{
		{"1, 2,3", []uint64{1, 2, 3}},
		{"1-4", []uint64{1, 2, 3, 4}},
		{"7,2-3, 9 - 9", []uint64{7, 2, 3, 9}},
		{"18446744073709551614-18446744073709551615", []uint64{18446744073709551614, 18446744073709551615}},
	} {
		got, err := parseSeeds(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseSeeds(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"1,x", "", "4-2", "1-", "-3", "1-2-3", "0-10000"} {
		if _, err := parseSeeds(in); err == nil {
			t.Errorf("parseSeeds(%q): no error", in)
		}
	}
}

func TestSummarize(t *testing.T) {
	// kv-aware against a best baseline of 1 s: 0.9 s and 1.1 s, margins -10%
	// and +10%; bounds 0.5 and 0.9 s leave 50% and 10% to gain.
	mk := func(kv, bound float64) *result {
		return &result{p99: []float64{kv, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0}, bound: bound}
	}
	s, ok := summarize([]*result{mk(0.9, 0.5), nil, mk(1.1, 0.9)})
	if !ok || len(s.each) != 2 {
		t.Fatalf("summarize: ok %v, %d results, want 2", ok, len(s.each))
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(s.mean, 0) || !near(s.se, 0.1) || !near(s.room, 0.3) {
		t.Errorf("summarize: mean %v se %v room %v, want 0, 0.1 and 0.3", s.mean, s.se, s.room)
	}
	if got := strings.Join(s.each, " "); got != "-10% +10%" {
		t.Errorf("each seed's margin %q, want \"-10%% +10%%\"", got)
	}
	if _, ok := summarize([]*result{nil}); ok {
		t.Error("summarize of no results: ok")
	}
	if s, _ := summarize([]*result{mk(0.8, 0.5)}); s.se != 0 {
		t.Errorf("one seed: standard error %v, want 0", s.se)
	}
}

// FuzzParseSeeds: any --seeds value is refused with an error or read into
// seeds that print back to a list the parser reads the same way.
func FuzzParseSeeds(f *testing.F) {
	for _, s := range []string{"1", "1,2,3", "5-8", "7, 2-3", "4-2", "x", "", "0-9999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		seeds, err := parseSeeds(s)
		if err != nil {
			return
		}
		if len(seeds) == 0 {
			t.Fatalf("parseSeeds(%q): no seeds and no error", s)
		}
		parts := make([]string, len(seeds))
		for i, v := range seeds {
			parts[i] = strconv.FormatUint(v, 10)
		}
		again, err := parseSeeds(strings.Join(parts, ","))
		if err != nil || !slices.Equal(again, seeds) {
			t.Fatalf("parseSeeds(%q) = %v; printed back: %v, %v", s, seeds, again, err)
		}
	})
}

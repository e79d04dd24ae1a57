package demo

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/report"
)

// TestLiveLine: the live line shows the row's figures as the table
// formats them, and its columns stay put when the phase runs over its
// time (the overtime used to push every column after it to the right).
func TestLiveLine(t *testing.T) {
	r := report.Row{Requests: 420, HitRate: 0.7291}
	r.TTFT.N, r.TTFT.P50, r.TTFT.P99 = 420, 20900*time.Microsecond, 160500*time.Microsecond
	lines := []string{
		liveLine(1, 2, "kv-aware", 5*time.Second, 30*time.Second, r),
		liveLine(1, 2, "kv-aware", 31*time.Second, 30*time.Second, r),
		liveLine(2, 2, "round_robin", 42*time.Second, 30*time.Second, report.Row{HitRate: -1}),
	}
	for _, l := range lines[:2] {
		for _, want := range []string{"420 requests", "TTFT p50 20.9ms", "p99 160.5ms", "prefix hit rate  72.9%"} {
			if !strings.Contains(l, want) {
				t.Errorf("line %q lacks %q", l, want)
			}
		}
	}
	if want := "30s/30s +1s "; !strings.Contains(lines[1], want) {
		t.Errorf("overtime line %q lacks %q", lines[1], want)
	}
	if want := "30s/30s +12s]"; !strings.Contains(lines[2], want) {
		t.Errorf("overtime line %q lacks %q", lines[2], want)
	}
	if want := "0 requests  TTFT p50     -  p99     -  prefix hit rate     -"; !strings.HasSuffix(lines[2], want) {
		t.Errorf("empty row's line %q, want it to end %q", lines[2], want)
	}
	col := strings.Index(lines[0], "] ")
	for _, l := range lines[1:] {
		if got := strings.Index(l, "] "); got != col {
			t.Errorf("line %q: columns start at %d, want %d as in %q", l, got, col, lines[0])
		}
	}
}

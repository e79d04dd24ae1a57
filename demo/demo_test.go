package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/report"
)

func TestRunCompares(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet for a few seconds")
	}
	var out bytes.Buffer
	dir := t.TempDir()
	res, err := Run(context.Background(), Config{Engines: 2, Duration: 4 * time.Second, Rate: 8, Out: dir, Stdout: &out})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if got := len(res.Report.Rows); got != 2 {
		t.Fatalf("rows = %d, want 2 (kv-aware, round_robin)\n%s", got, out.String())
	}
	for i, want := range []string{"kv-aware", "round_robin"} {
		row := res.Report.Rows[i]
		if row.Name != want {
			t.Errorf("row %d = %q, want %q", i, row.Name, want)
		}
		if row.Completed == 0 || row.ErrorCount() > 0 {
			t.Errorf("%s: %d completed, %d errors (%v), want all done", want, row.Completed, row.ErrorCount(), row.Errors)
		}
	}
	// Every phase's live line, though the phases (2 s) are shorter than
	// the 5 s between lines when the output is not a terminal.
	for _, want := range []string{"dashboard:", "admin token:", "[1/2 kv-aware", "[2/2 round_robin", "ttft50", "report files in " + dir} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "report.json")); err != nil {
		t.Errorf("report.json: %v", err)
	}
	// A phase's last live line shows the figures of its row in the table:
	// the same requests, TTFT percentiles and hit rate, from the same
	// samples (not the router's histogram, whose bucket estimate of the
	// p99 was tens of percent off the table's).
	for i, pol := range []string{"kv-aware", "round_robin"} {
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d/2 %s +[^\]]*\] +(\d+) requests  TTFT p50 +(\S+)  p99 +(\S+)  prefix hit rate +(\S+)$`,
			i+1, regexp.QuoteMeta(pol)))
		m := re.FindAllStringSubmatch(out.String(), -1)
		if len(m) == 0 {
			t.Errorf("%s: no live line in the expected form:\n%s", pol, out.String())
			continue
		}
		last, row := m[len(m)-1], res.Report.Rows[i]
		got := fmt.Sprintf("%s requests, TTFT p50 %s p99 %s, hit rate %s", last[1], last[2], last[3], last[4])
		want := fmt.Sprintf("%d requests, TTFT p50 %s p99 %s, hit rate %.1f%%", row.Requests,
			report.FormatDuration(row.TTFT.P50), report.FormatDuration(row.TTFT.P99), 100*row.HitRate)
		if got != want {
			t.Errorf("%s: last live line says %s, the table %s:\n%s", pol, got, want, out.String())
		}
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var res *Result
	go func() {
		var err error
		res, err = Run(ctx, Config{Engines: 2, Duration: time.Minute, Out: t.TempDir(), OnReady: func(u string) { ready <- u }})
		done <- err
	}()
	<-ready
	time.Sleep(time.Second)
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
		if len(res.Report.Rows) != 0 {
			t.Errorf("rows = %d, want none (the first policy was cut short)", len(res.Report.Rows))
		}
		t.Logf("stopped in %v", time.Since(start))
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of the cancel")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"defaults", Config{}, ""},
		{"engines", Config{Engines: -1}, "engines"},
		{"profile", Config{Profile: "gpt-9"}, "profile"},
		{"workload", Config{Workload: "nope"}, "workload"},
		{"policy", Config{Policy: "nope"}, "policy \"nope\""},
		{"compare", Config{Compare: []string{"round_robin", "bogus"}}, "policy \"bogus\""},
		{"token", Config{AdminToken: "short"}, "admin token"},
		{"duration", Config{Duration: time.Millisecond}, "duration"},
		// NaN passed "<= 0 || > 1000": the engines ran at speed NaN.
		{"speed NaN", Config{Speed: math.NaN()}, "speed"},
		{"rate NaN", Config{Rate: math.NaN()}, "rate"},
		// Below emulator.MinSpeed the demo passed Validate and failed
		// later, when the emulator refused it (exit status 1).
		{"speed tiny", Config{Speed: 0.0001}, "speed"},
		// 2e9 blocks passed and the runtime died out of memory.
		{"blocks huge", Config{Blocks: 2000000000}, "blocks: 2000000000 is above 262144"},
		{"speed min", Config{Speed: 0.001}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cfg
			c.applyDefaults()
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

func TestBuildWorkload(t *testing.T) {
	a, err := buildWorkload(WorkloadMixed, 20*time.Second, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := buildWorkload(WorkloadMixed, 20*time.Second, 10, 1)
	if len(a.Requests) == 0 || len(a.Requests) != len(b.Requests) {
		t.Fatalf("requests = %d and %d, want the same non-zero count", len(a.Requests), len(b.Requests))
	}
	kinds := map[string]int{}
	for i, r := range a.Requests {
		if r.ID != b.Requests[i].ID || r.Arrival != b.Requests[i].Arrival {
			t.Fatalf("request %d differs between equal seeds", i)
		}
		kinds[strings.SplitN(r.ID, "-", 2)[0]]++
	}
	for _, k := range []string{"chat", "sysprompt", "storm"} {
		if kinds[k] == 0 {
			t.Errorf("no %s requests in the mixed workload (%v)", k, kinds)
		}
	}
	if got := a.Span(); got > 20*time.Second {
		t.Errorf("span = %v, want within the 20s phase", got)
	}
	if _, err := buildWorkload("nope", time.Second, 1, 1); err == nil {
		t.Error("unknown workload: got nil error")
	}
}

func ExampleWorkloadNames() {
	fmt.Println(WorkloadNames()[0])
	// Output: mixed
}

// TestRunLingerKeepsFleetLive checks that with Linger (kvroute demo --keep)
// the dashboard's fleet stays live after the run: the last phase's router
// keeps scraping the engines, instead of every endpoint turning stale the
// moment the run ends.
func TestRunLingerKeepsFleetLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet for a few seconds")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Config{Engines: 2, Duration: 2 * time.Second, Rate: 4, NoCompare: true, Linger: true,
			Out: t.TempDir(), OnReady: func(u string) { ready <- u }})
		done <- err
	}()
	url := <-ready
	type endpoint struct {
		ID    string   `json:"id"`
		Stale bool     `json:"stale"`
		Age   *float64 `json:"signal_age_ms"`
	}
	var st struct {
		Models []struct {
			Endpoints []endpoint `json:"endpoints"`
		} `json:"models"`
		Run struct {
			Done bool `json:"done"`
		} `json:"run"`
	}
	get := func() {
		t.Helper()
		resp, err := http.Get(url + "api/state")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for get(); !st.Run.Done; get() {
		if time.Now().After(deadline) {
			t.Fatal("the run did not finish")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // well past the router's stale_after (1s)
	// Live signals are scraped anew; a torn-down fleet's never are. (On a
	// loaded machine one scrape can come late, hence the retries.)
	live := func() bool {
		for _, e := range st.Models[0].Endpoints {
			if e.Stale || e.Age == nil || *e.Age > 2000 {
				return false
			}
		}
		return true
	}
	get()
	if len(st.Models) != 1 || len(st.Models[0].Endpoints) != 2 {
		t.Fatalf("state after the run: %+v, want the fleet", st.Models)
	}
	for retry := time.Now().Add(20 * time.Second); !live() && time.Now().Before(retry); get() {
		time.Sleep(250 * time.Millisecond)
	}
	for _, e := range st.Models[0].Endpoints {
		age := "never"
		if e.Age != nil {
			age = fmt.Sprintf("%.0f ms", *e.Age)
		}
		if e.Stale || e.Age == nil || *e.Age > 2000 {
			t.Errorf("%s 3s after the run: stale %v, signal age %s; want live signals while the dashboard lingers", e.ID, e.Stale, age)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the cancel")
	}
}

// TestRunLeavesNoEmptyTempDir: a run that writes no report (its address
// is taken, or it is interrupted before a policy finished) removes the
// temporary report directory it made, instead of leaving an empty
// kvroute-demo-* directory behind on every failed or Ctrl-C'd start.
func TestRunLeavesNoEmptyTempDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Run(context.Background(), Config{Engines: 1, Listen: ln.Addr().String()}); err == nil ||
		!strings.Contains(err.Error(), "listen") {
		t.Fatalf("Run on a taken address = %v, want a listen error", err)
	}
	ents, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left in TMPDIR after a failed start: %s", e.Name())
	}

	if testing.Short() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := Run(ctx, Config{Engines: 1, Duration: time.Minute, OnReady: func(string) { cancel() }})
	if err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	if res.Dir != "" || len(res.Files) != 0 {
		t.Errorf("interrupted run: Dir %q, files %q; want none (no policy finished)", res.Dir, res.Files)
	}
	if ents, _ = os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("left in TMPDIR after an interrupted run: %s", ents[0].Name())
	}
}

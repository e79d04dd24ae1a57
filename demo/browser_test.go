package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kvroute/kvroute/internal/browsertest"
)

// TestDashboardInBrowser drives the dashboard of a running demo fleet in
// real headless Chromium: the page loads and shows every endpoint, its
// figures change over time, a decision opens with its candidates, the
// policy switch is refused without the admin token and works with it,
// and the comparison appears when the run ends. It saves a screenshot in
// $KVROUTE_SCREENSHOT_DIR (or the test's temporary directory).
func TestDashboardInBrowser(t *testing.T) {
	browsertest.Require(t) // before the set-up
	const engines = 4
	const token = "browser-test-admin-token"
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second) // generous: the waits below are bounds, not assertions on speed
	defer cancel()

	bctx, cancelBrowser := browsertest.Start(t, ctx, 1440, 1000)

	var jsErrs []string
	var mu sync.Mutex
	err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok && e.ExceptionDetails != nil {
			mu.Lock()
			jsErrs = append(jsErrs, e.ExceptionDetails.Text)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}

	// The demo starts once Chromium runs, so that the page sees the first
	// phase from its start.
	// The demo: two 12 s phases (kv-aware, then round_robin), kept up after
	// the run so that the page can show the comparison.
	demoCtx, stopDemo := context.WithCancel(ctx)
	defer stopDemo()
	urlc := make(chan string, 1)
	var (
		wg     sync.WaitGroup
		res    *Result
		runErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, runErr = Run(demoCtx, Config{
			Engines: engines, Duration: 24 * time.Second, Rate: 8, AdminToken: token, Linger: true,
			Out: t.TempDir(), OnReady: func(u string) { urlc <- u },
		})
	}()
	var url string
	select {
	case url = <-urlc:
	case <-ctx.Done():
		t.Fatal("the demo did not start")
	}

	// The switch is submitted the way the button does, without clicking
	// at its coordinates: the page re-renders as data arrives, and on a
	// loaded machine a click could land where the button was a moment ago.
	// The policy is chosen in the same evaluation: the page sets the
	// select to the router's policy when a state poll finds it changed, so
	// a poll between choosing and submitting (the first switch's, on a
	// loaded machine) would submit the policy the router already has.
	submitPolicy := func(policy string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.getElementById('policy-select').value = %q; `+
			`document.getElementById('policy-form').requestSubmit(document.getElementById('policy-apply'))`, policy))
	}
	t0 := time.Now()
	wait := func(what, expr string, timeout time.Duration) {
		t.Helper()
		defer func() { t.Logf("%5.1fs %s", time.Since(t0).Seconds(), what) }()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(timeout))); err != nil {
			page, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 2000)`))
			t.Fatalf("%s: %v (%s)\npage text:\n%s", what, err, expr, page)
		}
	}
	text := func(sel string) string {
		t.Helper()
		// Read it in one evaluation: the page re-renders its tables every
		// second, so a node found by one protocol call may be gone by the next.
		q, _ := json.Marshal(sel)
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%s) || {innerText: "<missing>"}).innerText`, q)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}

	// The page loads and shows every endpoint.
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("navigate %s: %v", url, err)
	}
	wait("every endpoint in the fleet table", fmt.Sprintf(`document.querySelectorAll('#fleet tbody tr[data-endpoint]').length === %d`, engines), 30*time.Second)
	for i := range engines {
		// On a loaded machine an engine may miss a health check: the row must
		// show the endpoint and its state, whatever that is.
		got := text(fmt.Sprintf(`#fleet tbody tr[data-endpoint="engine-%d"]`, i))
		if !strings.Contains(got, fmt.Sprintf("engine-%d", i)) || !strings.Contains(got, "both") ||
			!(strings.Contains(got, "healthy") || strings.Contains(got, "failing checks") || strings.Contains(got, "ejected")) {
			t.Errorf("engine-%d row = %q, want its id, role and health", i, got)
		}
	}

	// The policy switch is refused without the token, and works with it
	// (early in the first phase, so that the phase does not end meanwhile).
	if err := chromedp.Do(bctx,
		chromedp.Clear(chromedp.CSS("#admin-token")),
		submitPolicy("least_request"),
	); err != nil {
		t.Fatalf("switch without token: %v", err)
	}
	wait("the refusal", `document.getElementById('policy-result').classList.contains('err')`, 30*time.Second)
	if got := text("#policy-result"); !strings.Contains(got, "401") {
		t.Errorf("refusal = %q, want the admin API's 401", got)
	}
	before := statePolicy(t, url)
	if before != "kv-aware" && before != "round_robin" {
		t.Errorf("policy after a refused switch = %q, want it unchanged", before)
	}
	if err := chromedp.Do(bctx,
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.getElementById('admin-token').value = %q`, token), chromedp.EvalIgnoreExceptions),
		submitPolicy("least_request"),
	); err != nil {
		t.Fatalf("switch with token: %v", err)
	}
	wait("the switch", `document.getElementById('policy-result').classList.contains('ok')`, 30*time.Second)
	if got := statePolicy(t, url); got != "least_request" {
		t.Errorf("router policy after the switch = %q, want least_request", got)
	}
	wait("the page shows the new policy", `document.getElementById('current-policy').textContent === 'least_request'`, 30*time.Second)
	// Switch back to the running phase's policy, so that its row in the
	// comparison is that policy's.
	before = phasePolicy(t, url)
	if err := chromedp.Do(bctx, submitPolicy(before)); err != nil {
		t.Fatalf("switch back: %v", err)
	}
	wait("the switch back", fmt.Sprintf(`document.getElementById('policy-result').textContent.includes('to %s')`, before), 30*time.Second)

	// Values change over time: the request count moves and the charts draw.
	wait("requests answered", `Number(document.getElementById('tile-requests').textContent.replace(/,/g, '')) > 0`, 30*time.Second)
	wait("the throughput chart draws a line", `document.querySelectorAll('#chart-rps path[data-series]').length > 0`, 30*time.Second)
	// The request count moves while the run lasts, and the charts gain a
	// point every second (also after it).
	first := text("#tile-requests")
	path, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#chart-rps path[data-series]').getAttribute('d')`))
	if err != nil {
		t.Fatal(err)
	}
	wait("the figures change", fmt.Sprintf(`document.getElementById('tile-requests').textContent !== %q || `+
		`document.querySelector('#chart-rps path[data-series]').getAttribute('d') !== %q`, first, path), 10*time.Second)
	wait("the load chart draws every endpoint", fmt.Sprintf(`document.querySelectorAll('#chart-load path[data-series]').length === %d`, engines), 30*time.Second)

	// A decision can be opened: its candidates and score parts show.
	wait("decisions in the feed", `document.querySelectorAll('#decisions tbody tr[data-seq]').length > 0`, 30*time.Second)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](`document.querySelector('#decisions tbody tr[data-seq]').click()`)); err != nil {
		t.Fatalf("click a decision: %v", err)
	}
	wait("the decision's candidates", fmt.Sprintf(`document.querySelectorAll('#detail-candidates tbody tr').length === %d`, engines), 30*time.Second)
	dir := os.Getenv("KVROUTE_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	saveScreenshot(t, bctx, filepath.Join(dir, "dashboard-live.png"))
	detail := text("#decision-detail")
	// The policy that made it is the first phase's, or on a loaded machine,
	// where getting here can take longer than that phase, the second's, or
	// least_request, switched to above, when the feed has no newer decision
	// yet; kv-aware's score parts include the queue estimate.
	want := []string{"Decision #", "engine-0", "engine-3", "round_robin"}
	switch {
	case strings.Contains(detail, "kv-aware"):
		want = []string{"Decision #", "engine-0", "engine-3", "kv-aware", "queue_ms"}
	case strings.Contains(detail, "least_request"):
		want = []string{"Decision #", "engine-0", "engine-3", "least_request", "in_flight"}
	}
	for _, w := range want {
		if !strings.Contains(detail, w) {
			t.Errorf("decision detail lacks %q:\n%s", w, detail)
		}
	}

	// The run ends: the comparison of both policies appears. The second
	// phase first answers its last requests: on a starved machine
	// (2026-12-05, a fuzzer on both cores beside CI) they were still 12 in
	// flight at 54 s, so the bound is wide.
	wait("the policy comparison", `document.querySelectorAll('#compare tbody tr[data-policy]').length === 2`, 150*time.Second)
	if got := text("#compare"); !strings.Contains(got, "kv-aware") || !strings.Contains(got, "round_robin") {
		t.Errorf("comparison = %q, want kv-aware and round_robin rows", got)
	}
	// Reopen a decision for the picture.
	_, _ = chromedp.Run(bctx, chromedp.Evaluate[any](`document.querySelector('#decisions tbody tr[data-seq]').click()`))
	wait("the new decision's candidates", `document.querySelector('#decision-detail h3') !== null && document.querySelector('#decision-detail h3').textContent.includes(document.querySelector('#decisions tbody tr.selected').dataset.seq)`, 30*time.Second)
	if got := text("#decision-detail"); strings.Contains(got, "kv-aware") {
		t.Errorf("newest decision = %q, want one of the second phase (not kv-aware)", got)
	}

	saveScreenshot(t, bctx, filepath.Join(dir, "dashboard.png"))

	mu.Lock()
	if len(jsErrs) > 0 {
		t.Errorf("JavaScript exceptions: %q", jsErrs)
	}
	mu.Unlock()

	cancelBrowser()
	t.Logf("%5.1fs browser closed", time.Since(t0).Seconds())
	stopDemo()
	wg.Wait()
	t.Logf("%5.1fs demo stopped", time.Since(t0).Seconds())
	if runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
	if res == nil || len(res.Report.Rows) != 2 {
		t.Fatalf("Run result = %+v, want two rows", res)
	}
}

// statePolicy reads the router's current policy from the dashboard's API.
func statePolicy(t *testing.T, url string) string {
	t.Helper()
	st := readState(t, url)
	if len(st.Models) == 0 {
		t.Fatal("state: no models")
	}
	return st.Models[0].Policy
}

// phasePolicy reads the demo phase's own policy from the dashboard's API.
func phasePolicy(t *testing.T, url string) string {
	t.Helper()
	st := readState(t, url)
	if st.Run == nil || st.Run.Policy == "" {
		t.Fatal("state: no demo run")
	}
	return st.Run.Policy
}

type pageState struct {
	Models []struct {
		Policy string `json:"policy"`
	} `json:"models"`
	Run *struct {
		Policy string `json:"policy"`
	} `json:"run"`
}

func readState(t *testing.T, url string) pageState {
	t.Helper()
	resp, err := http.Get(url + "api/state")
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	defer resp.Body.Close()
	var st pageState
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("state: %v", err)
	}
	return st
}

// saveScreenshot writes a full-page PNG of the tab to path.
func saveScreenshot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

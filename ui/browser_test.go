package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/browsertest"
	"github.com/kvroute/kvroute/report"
)

// TestPageInBrowser loads the page in headless Chromium in front of two
// models whose pools share an endpoint ID, with no traffic yet, and checks
// what a fresh `kvroute serve` shows: the charts' y axes are labelled with
// distinct values (not 0, 0, 1, 1, 1 for an empty range), and the load
// chart draws the shown model's endpoints only, following the model picker.
func TestPageInBrowser(t *testing.T) {
	browsertest.Require(t) // before the set-up
	m1 := newModelRouter(t, "m1", "a", "b")
	m2 := newPolicyRouter(t, "m2", "least_request", "a")
	var many []string // a big fleet: its load chart's legend cannot show every endpoint
	for i := range 16 {
		many = append(many, fmt.Sprintf("engine-%02d", i))
	}
	m3 := newModelRouter(t, "m3", many...)
	for i := range 3 { // in flight on m1 only
		if _, err := m1.Route(time.Now(), &kvroute.Request{ID: fmt.Sprint("r", i), Model: "m1", Prompt: strings.Repeat("x ", 50), PromptTokens: 50}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The clock jumps a minute ahead mid-test: a stretch without chart points.
	var skew atomic.Int64
	var done atomic.Bool // the run: phase 3 past its time, then done
	rows := []report.Row{{Name: "kv-aware", Requests: 9, Completed: 9}, {Name: "round_robin", Requests: 9, Completed: 9}, {Name: "least_request", Requests: 9, Completed: 9}}
	for i := range rows {
		rows[i].TTFT.P50 = time.Duration(i+1) * 100 * time.Millisecond
		rows[i].TTFT.P99 = time.Duration(i+1) * 300 * time.Millisecond
		rows[i].HitRate = 0.5 - 0.1*float64(i)
	}
	d, err := New(Options{
		Source:      multiSource{m1, m2, m3},
		SampleEvery: 200 * time.Millisecond,
		Now:         func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
		Run: func() RunState {
			if !done.Load() {
				return RunState{Title: "test", Workload: "mixed", Phase: 3, Phases: 3, Policy: "least_request", Rows: rows[:2]}
			}
			return RunState{Title: "test", Workload: "mixed", Phase: 3, Phases: 3, Policy: "least_request", Done: true, Rows: rows}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	bctx, page := browse(t, d)
	var (
		mu     sync.Mutex
		jsErrs []string
	)
	if err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok && e.ExceptionDetails != nil {
			mu.Lock()
			jsErrs = append(jsErrs, e.ExceptionDetails.Text+" "+fmt.Sprint(e.ExceptionDetails.Exception))
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	wait := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			page, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 1500)`))
			t.Fatalf("%s: %v (%s)\npage text:\n%s", what, err, expr, page)
		}
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	wait("the fleet of m1", `document.querySelectorAll('#fleet tbody tr[data-endpoint]').length === 2`)
	wait("the load chart draws", `document.querySelectorAll('#chart-load path[data-series]').length > 0`)

	// A decision's detail: m1's endpoints were never scraped, and their
	// signal age (null) reads "never", not an age of 0 ms, beside the
	// stale mark.
	wait("the decision feed", `document.querySelectorAll('#decisions tbody tr[data-key]').length === 3`)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`document.querySelector('#decisions tbody tr[data-key]').click()`)); err != nil {
		t.Fatal(err)
	}
	wait("the decision's detail", `document.querySelectorAll('#decision-detail tbody tr, #decision-detail tr').length > 2`)
	ages, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('#decision-detail tr')).filter((tr) => tr.cells.length === 7 && tr.cells[0].tagName === 'TD').map((tr) => tr.cells[6].textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ages) != 2 || ages[0] != "neverstale" || ages[1] != "neverstale" {
		t.Errorf("decision detail signal ages = %q, want \"never\" and the stale mark for both candidates", ages)
	}

	// The y-axis labels: the texts right-aligned at the axis (x = 40).
	yTicks := func(chart string) []string {
		t.Helper()
		got, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](fmt.Sprintf(
			`Array.from(document.querySelectorAll('#%s text')).filter((e) => e.getAttribute('x') === '40').map((e) => e.textContent)`, chart)))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, chart := range []string{"chart-ttft", "chart-rps", "chart-hit", "chart-load"} {
		ticks := yTicks(chart)
		if len(ticks) != 5 {
			t.Errorf("%s: y ticks = %q, want 5", chart, ticks)
			continue
		}
		seen := map[string]bool{}
		for _, tk := range ticks {
			if seen[tk] || strings.Contains(tk, "NaN") || strings.Contains(tk, "undefined") {
				t.Errorf("%s: y ticks = %q, want 5 distinct numbers", chart, ticks)
				break
			}
			seen[tk] = true
		}
	}
	if got := yTicks("chart-ttft"); len(got) == 5 && got[0] != "0ms" {
		t.Errorf("TTFT y ticks = %q, want them from 0ms", got)
	}

	series := func() string {
		t.Helper()
		got, err := chromedp.Run(bctx, chromedp.Evaluate[string](
			`Array.from(document.querySelectorAll('#chart-load path[data-series]')).map((p) => p.dataset.series).join(',')`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := series(); got != "a,b" {
		t.Errorf("load chart of m1 draws %q, want a,b", got)
	}
	// A minute without points: the lines break there instead of joining
	// the points on both sides.
	skew.Store(int64(time.Minute))
	wait("the load line breaks at the gap", `(document.querySelector('#chart-load path[data-series="a"]').getAttribute('d').match(/M/g) || []).length === 2`)

	// A run starting now: its mark's label, at the right edge, stays inside
	// the charts and clear of their legends.
	d.Mark(time.Now().Add(time.Duration(skew.Load())), "sglang-cache-aware")
	wait("the mark", `document.querySelectorAll('#chart-load text.mark-label').length === 1`)
	bad, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('svg.chart')).flatMap((svg) => {
		const out = [];
		const legend = Array.from(svg.querySelectorAll('text')).filter((e) => e.getAttribute('y') === '14').map((e) => e.getBBox());
		for (const m of svg.querySelectorAll('text.mark-label')) {
			const b = m.getBBox();
			if (b.x < 0 || b.x + b.width > 560) out.push(svg.id + ': the mark label leaves the chart');
			for (const l of legend) {
				if (b.x < l.x + l.width && l.x < b.x + b.width && b.y < l.y + l.height && l.y < b.y + b.height) out.push(svg.id + ': the mark label covers the legend');
			}
		}
		return out;
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Errorf("chart marks: %q", bad)
	}

	// The last phase past its time: the banner says what it waits for,
	// not "0 s left".
	wait("the banner", `document.getElementById('run-banner').textContent.includes('phase 3/3')`)
	if got, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('run-banner').textContent`)); err != nil || strings.Contains(got, "0 s left") {
		t.Errorf("banner past the phase's time = %q (%v), want no \"0 s left\"", got, err)
	}
	done.Store(true)

	// The comparison's bar charts: the policies' names under the bars do
	// not run into each other.
	wait("the comparison", `document.querySelectorAll('#compare tbody tr[data-policy]').length === 3`)
	overlaps, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#compare-bars svg')).flatMap((svg) => {
		const names = Array.from(svg.querySelectorAll('text')).filter((e) => e.getAttribute('y') === '144').map((e) => [e.textContent, e.getBBox()]);
		const out = [];
		for (let i = 1; i < names.length; i++) if (names[i-1][1].x + names[i-1][1].width > names[i][1].x) out.push(names[i-1][0] + ' / ' + names[i][0]);
		return out;
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if len(overlaps) > 0 {
		t.Errorf("bar chart names overlap: %q", overlaps)
	}
	// The other model: its own endpoint a, idle.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](
		`(() => { const s = document.getElementById('model-select'); s.value = 'm2'; s.dispatchEvent(new Event('change')); })()`)); err != nil {
		t.Fatal(err)
	}
	wait("the fleet of m2", `document.querySelectorAll('#fleet tbody tr[data-endpoint]').length === 1`)
	// The policy switch offers m2's policy, not m1's.
	if pol, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('policy-select').value`)); err != nil || pol != "least_request" {
		t.Errorf("policy switch for m2 shows %q (%v), want m2's least_request", pol, err)
	}
	if got := series(); got != "a" {
		t.Errorf("load chart of m2 draws %q, want a", got)
	}
	// m2's "a" is idle: its line lies on the zero axis, not at m1's load.
	ys, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#chart-load path[data-series="a"]').getAttribute('d')`))
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range strings.FieldsFunc(ys, func(r rune) bool { return r == 'M' || r == 'L' }) {
		if f := strings.Fields(seg); len(f) == 2 && f[1] != "174.0" { // y0 = CH.h - CH.b
			t.Errorf("load chart of m2, endpoint a: path %q, want every point at 0 (y 174.0)", ys)
			break
		}
	}
	// A big fleet: the load chart's legend stays inside the chart.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](
		`(() => { const s = document.getElementById('model-select'); s.value = 'm3'; s.dispatchEvent(new Event('change')); })()`)); err != nil {
		t.Fatal(err)
	}
	wait("the fleet of m3", `document.querySelectorAll('#fleet tbody tr[data-endpoint]').length === 16`)
	outside, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#chart-load text')).filter((e) => e.getAttribute('y') === '14').filter((e) => { const b = e.getBBox(); return b.x < 46 || b.x + b.width > 560; }).map((e) => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if len(outside) > 0 {
		t.Errorf("load chart legend outside the plot: %q", outside)
	}

	// A phone-sized window: the page does not scroll sideways (wide tables
	// scroll inside their cards).
	if _, err := chromedp.Run(bctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	wait("the page re-renders", `document.querySelectorAll('#fleet tbody tr[data-endpoint]').length === 16`)
	time.Sleep(1500 * time.Millisecond) // a poll or two at the new size
	widths, err := chromedp.Run(bctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(widths) == 2 && widths[0] > widths[1] {
		t.Errorf("at 390 px the page is %d px wide: it scrolls sideways", widths[0])
	}

	mu.Lock()
	defer mu.Unlock()
	if len(jsErrs) > 0 {
		t.Errorf("JavaScript exceptions: %q", jsErrs)
	}
}

// browse serves d and starts a headless browser for at most two minutes;
// both stop when the test ends. It returns the browser's context and the
// URL of d's page.
func browse(t *testing.T, d http.Handler) (bctx context.Context, page string) {
	t.Helper()
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	bctx, _ = browsertest.Start(t, ctx, 1280, 900)
	return bctx, srv.URL + "/ui/"
}

// TestLockedPageInBrowser: the state API refuses the page until it has the
// admin token. With a token configured (401) the page says it is locked and
// asks for it, then shows the fleet once it is typed in; with none (403) it
// says the state is closed.
func TestLockedPageInBrowser(t *testing.T) {
	browsertest.Require(t)
	const token = "secret-token-0123456789"
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	bctx, _ := browsertest.Start(t, ctx, 1280, 900)
	for _, admin := range []bool{true, false} {
		d, err := New(Options{
			Source:       fakeSource{newModelRouter(t, "m1", "a", "b")},
			AdminEnabled: admin,
			Authorize:    func(r *http.Request) bool { return admin && r.Header.Get("Authorization") == "Bearer "+token },
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(d)
		defer srv.Close()
		wait := func(what, expr string) {
			t.Helper()
			if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
				page, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 1500)`))
				t.Fatalf("admin %v: %s: %v (%s)\npage text:\n%s", admin, what, err, expr, page)
			}
		}
		if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/ui/")); err != nil {
			t.Fatalf("navigate: %v", err)
		}
		if !admin {
			wait("the page says the state is closed", `document.getElementById('updated').textContent.startsWith('closed:')`)
			continue
		}
		wait("the page asks for the token", `document.getElementById('updated').textContent.startsWith('locked:')`)
		if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#fleet tbody tr[data-endpoint]').length`)); err != nil || n != 0 {
			t.Fatalf("locked page shows %d fleet rows (%v), want none", n, err)
		}
		if err := chromedp.Do(bctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.getElementById('admin-token').value = %q`, token), chromedp.EvalIgnoreExceptions)); err != nil {
			t.Fatal(err)
		}
		wait("the fleet once the token is given", `document.querySelectorAll('#fleet tbody tr[data-endpoint]').length === 2`)
	}
}

// TestEmptyPoolInBrowser: the page in front of a pool without endpoints (a
// discovered model with none ready) is live, with an empty fleet table,
// not "disconnected" by a script error on the state's endpoints.
func TestEmptyPoolInBrowser(t *testing.T) {
	browsertest.Require(t)
	bctx, page := browse(t, emptyPoolDashboard(t))
	if err := chromedp.Do(bctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	const live = `document.getElementById('updated').textContent.startsWith('live')`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](live, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		page, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('updated').textContent`))
		t.Fatalf("the page is not live: %v; it says %q", err, page)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#fleet tbody tr[data-endpoint]').length`)); err != nil || n != 0 {
		t.Errorf("fleet rows: got %d (%v), want 0", n, err)
	}
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/openai"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"
)

// The chaos test: `kvroute serve` in front of four `kvroute engine`
// processes under a steady load of streaming and non-streaming chat
// requests with shared prefixes, while engines are killed (SIGKILL, then
// restarted empty on the same port), hung (SIGSTOP past the upstream
// timeout, then SIGCONT), scraped through a /metrics that fails, and
// restarted one by one. Every client request is classified; the router's
// /metrics and /debug/endpoints are checked against what happened.
//
//	KVROUTE_CHAOS=1 go test -run TestChaos -v ./e2e
//
// It builds the binary once and takes about two minutes.

// Chaos configuration: the router's timeouts and health settings, which
// the checks below derive their bounds from.
const (
	chaosUpstreamHeader = 3 * time.Second
	chaosDial           = time.Second
	chaosHCInterval     = 500 * time.Millisecond
	chaosHCTimeout      = 400 * time.Millisecond
	chaosHCUnhealthy    = 2
	chaosFailThreshold  = 3
	chaosStop           = 4 * chaosUpstreamHeader // how long an engine stays stopped
	chaosWorkers        = 10
	chaosPrefixes       = 12
)

// chaosMaxRequest bounds every request's time (see the check).
const chaosMaxRequest = chaosDial + 2*chaosUpstreamHeader + 2*time.Second

func TestChaos(t *testing.T) {
	if os.Getenv("KVROUTE_CHAOS") != "1" {
		t.Skip("fault injection under load with real processes; set KVROUTE_CHAOS=1 to run it (about 2 minutes)")
	}
	bin := filepath.Join(t.TempDir(), "kvroute")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kvroute")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// With active health checks and passive ejection, then with passive
	// ejection alone (health_check.disabled), the way some fleets run.
	t.Run("health_checks", func(t *testing.T) { runChaos(t, bin, true) })
	t.Run("passive_only", func(t *testing.T) { runChaos(t, bin, false) })
}

func runChaos(t *testing.T, bin string, activeHC bool) {
	dir := t.TempDir()

	// Four engines; e2's metrics are scraped through a switch the test
	// flips (the emulator has no flag to fail its /metrics).
	engines := make([]*chaosEngine, 4)
	for i := range engines {
		engines[i] = &chaosEngine{t: t, bin: bin, id: fmt.Sprintf("e%d", i), port: freeport.Consecutive(t, 1), logDir: dir}
		engines[i].start()
		t.Cleanup(engines[i].kill)
	}
	mswitch := &metricsSwitch{target: "http://" + engines[2].addr() + "/metrics"}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	msrv := &http.Server{Handler: mswitch}
	go func() { _ = msrv.Serve(mln) }()
	t.Cleanup(func() { msrv.Close() })
	for _, e := range engines {
		e.awaitUp()
	}

	rport := freeport.Consecutive(t, 1)
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	var eps strings.Builder
	for i, e := range engines {
		fmt.Fprintf(&eps, "      - id: %s\n        url: http://%s\n", e.id, e.addr())
		if i == 2 {
			fmt.Fprintf(&eps, "        signals:\n          metrics_url: http://%s/metrics\n", mln.Addr())
		}
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:%d
models:
  - name: %s
    endpoints:
%s    policy:
      name: kv-aware
      seed: 7
    router:
      stale_after: 1s
      fail_threshold: %d
      base_ejection: 1s
      max_ejection: 8s
    signals:
      scrape_interval: 100ms
      scrape_timeout: 500ms
timeouts:
  dial: %s
  upstream_header: %s
  shutdown: 5s
retry:
  attempts: 2
health_check:
  disabled: %v
  interval: %s
  timeout: %s
  healthy_threshold: 1
  unhealthy_threshold: %d
debug:
  enabled: true
log:
  level: warn
`, rport, model, eps.String(), chaosFailThreshold, chaosDial, chaosUpstreamHeader, !activeHC, chaosHCInterval, chaosHCTimeout, chaosHCUnhealthy)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	rlog, err := os.Create(filepath.Join(dir, "router.log"))
	if err != nil {
		t.Fatal(err)
	}
	rcmd := exec.Command(bin, "serve", "--config", cfgPath)
	rcmd.Stdout, rcmd.Stderr = rlog, rlog
	if err := rcmd.Start(); err != nil {
		t.Fatal(err)
	}
	rdone := make(chan struct{})
	go func() { _ = rcmd.Wait(); close(rdone) }()
	t.Cleanup(func() {
		_ = rcmd.Process.Kill()
		<-rdone
		rlog.Close()
		if t.Failed() {
			data, _ := os.ReadFile(rlog.Name())
			log, _, _ := strings.Cut(string(data), "SIGQUIT: quit") // not the goroutine dump
			t.Logf("router log (%d bytes), last lines:\n%s", len(log), lastLines(log, 40))
		}
	})
	r := &chaosRouter{t: t, url: fmt.Sprintf("http://127.0.0.1:%d", rport)}
	r.awaitUp(10 * time.Second)
	r.awaitAllHealthy(10 * time.Second)

	// Let the router's connection pools and goroutines settle with a little
	// traffic before the baseline.
	warmLoad := newChaosLoad(r.url)
	warm := warmLoad.start(t, chaosWorkers)
	time.Sleep(3 * time.Second)
	warm()
	warmLoad.client.CloseIdleConnections() // the router's server side of them goes too
	time.Sleep(time.Second)
	gBefore, sockBefore := r.gauge("go_goroutines", nil), sockets(rcmd.Process.Pid)
	reqBefore := r.sumCounter("kvroute_requests_total", nil)
	codesBefore := r.counterBy("kvroute_requests_total", "code")
	streamErrsBefore := r.sumCounter("kvroute_upstream_stream_errors_total", nil)
	t.Logf("baseline: go_goroutines %.0f, open sockets %d, requests so far %.0f", gBefore, sockBefore, reqBefore)

	lg := newChaosLoad(r.url)
	stop := lg.start(t, chaosWorkers)
	t0 := time.Now()
	mark := func(what string) { lg.mark(what); t.Logf("[%5.1fs] %s", time.Since(t0).Seconds(), what) }
	time.Sleep(5 * time.Second)

	// 1. SIGKILL e1, restart it empty on the same port.
	e1 := engines[1]
	mark(fmt.Sprintf("SIGKILL e1 with %d requests in flight", r.awaitInFlight("e1", 2, 10*time.Second)))
	killAt := time.Now()
	e1.signal(syscall.SIGKILL)
	e1.wait()
	ejectKill := r.awaitHealth("e1", false, 15*time.Second)
	mark(fmt.Sprintf("e1 out of rotation after %v", ejectKill.Round(time.Millisecond)))
	if v := r.gauge("kvroute_endpoint_healthy", map[string]string{"endpoint": "e1"}); v != 0 {
		t.Errorf("kvroute_endpoint_healthy{endpoint=e1} = %v while /debug/endpoints says unhealthy", v)
	}
	time.Sleep(4*time.Second - time.Since(killAt))
	e1.start()
	restartAt := time.Now()
	mark("e1 restarted (empty cache)")
	readmitKill := lg.awaitServed(t, "e1", restartAt, 30*time.Second)
	mark(fmt.Sprintf("e1 serves again %v after its restart", readmitKill.Round(time.Millisecond)))
	time.Sleep(6 * time.Second)
	affinity := lg.endpointCache("e1", restartAt, time.Now())
	mark(fmt.Sprintf("after restart e1 served %d requests: %s", affinity.n, affinity))

	// 2. SIGSTOP e3 for longer than the upstream header timeout.
	e3 := engines[3]
	mark(fmt.Sprintf("SIGSTOP e3 with %d requests in flight", r.awaitInFlight("e3", 2, 10*time.Second)))
	stopAt := time.Now()
	e3.signal(syscall.SIGSTOP)
	ejectHang := r.awaitHealth("e3", false, 15*time.Second)
	mark(fmt.Sprintf("e3 out of rotation after %v", ejectHang.Round(time.Millisecond)))
	time.Sleep(chaosStop - time.Since(stopAt))
	e3.signal(syscall.SIGCONT)
	contAt := time.Now()
	mark(fmt.Sprintf("SIGCONT e3 (stopped %v)", time.Since(stopAt).Round(time.Millisecond)))
	readmitHang := lg.awaitServed(t, "e3", contAt, 30*time.Second)
	mark(fmt.Sprintf("e3 serves again %v after SIGCONT", readmitHang.Round(time.Millisecond)))
	time.Sleep(3 * time.Second)

	// 3. e2's /metrics fails; routing goes on, the signals age.
	mark("e2 /metrics fails (503)")
	mswitch.fail.Store(true)
	var staleAfter time.Duration
	failAt := time.Now()
	eventually(t, 10*time.Second, "e2's signals reported failing", func() (bool, string) {
		st := r.endpoint("e2")
		return st.Signals.ConsecutiveErrors >= 3, fmt.Sprintf("e2 consecutive scrape errors %d", st.Signals.ConsecutiveErrors)
	})
	staleAfter = time.Since(failAt)
	time.Sleep(4 * time.Second)
	st := r.endpoint("e2")
	e2 := map[string]string{"endpoint": "e2"}
	if v := r.gauge("kvroute_endpoint_signal_stale", e2); v != 1 {
		t.Errorf("kvroute_endpoint_signal_stale{endpoint=e2} = %v with its scrapes failing for 4 s, want 1", v)
	}
	if v := r.gauge("kvroute_endpoint_healthy", e2); v != 1 {
		t.Errorf("kvroute_endpoint_healthy{endpoint=e2} = %v with only its scrapes failing, want 1", v)
	}
	for _, id := range []string{"e0", "e1", "e3"} {
		if v := r.gauge("kvroute_endpoint_signal_stale", map[string]string{"endpoint": id}); v != 0 {
			t.Errorf("kvroute_endpoint_signal_stale{endpoint=%s} = %v, want 0 (only e2's scrapes fail)", id, v)
		}
	}
	servedWhileStale := lg.count("e2", failAt.Add(time.Second), time.Now())
	mark(fmt.Sprintf("e2 failing scrapes seen after %v; healthy=%v, scrape errors %d (%q), served %d requests meanwhile",
		staleAfter.Round(time.Millisecond), st.Healthy, st.Signals.ConsecutiveErrors, st.Signals.LastError, servedWhileStale))
	if !st.Healthy {
		t.Errorf("e2 with failing /metrics: healthy = false, want true (a scrape failure is not an engine failure)")
	}
	if servedWhileStale == 0 {
		t.Errorf("e2 with failing /metrics got no request in 3 s: stale signals took it out of routing")
	}
	mswitch.fail.Store(false)
	mark("e2 /metrics back")
	eventually(t, 10*time.Second, "e2's signals fresh again", func() (bool, string) {
		v := r.gauge("kvroute_endpoint_signal_stale", e2)
		return v == 0, fmt.Sprintf("stale = %v", v)
	})
	time.Sleep(2 * time.Second)

	// 4. Rolling restart: SIGTERM (drain), wait for exit, start, wait
	// until the router routes to it again, next.
	mark("rolling restart")
	var rolling []time.Duration
	for _, e := range engines {
		e.signal(syscall.SIGTERM)
		e.wait()
		e.start()
		d := r.awaitHealth(e.id, true, 30*time.Second)
		rolling = append(rolling, d)
		// Wait for the router to actually send it traffic before the next.
		since := time.Now()
		eventually(t, 15*time.Second, e.id+" gets traffic after its restart", func() (bool, string) {
			n := lg.count(e.id, since, time.Now())
			return n > 0, fmt.Sprintf("%d requests", n)
		})
	}
	mark(fmt.Sprintf("rolling restart done; each engine healthy in %v", rolling))
	time.Sleep(3 * time.Second)
	stop()
	mark("load stopped")

	// Checks.
	sum := lg.summary()
	t.Logf("requests sent %d: %s", sum.sent, sum)
	for _, b := range sum.bad {
		t.Errorf("bad answer: %s", b)
	}
	// No request may outlast the router's bounds: a dial, the wait for
	// headers, a response silent for at most upstream_header, and a retry,
	// with slack for a loaded machine. Requests take about half a second.
	if len(sum.slow) > 0 {
		t.Errorf("%d requests took longer than %v (dial + 2 x upstream_header + 2s) while an engine hung for %v; the slowest:",
			len(sum.slow), chaosMaxRequest, chaosStop)
		for _, s := range sum.slow[:min(len(sum.slow), 8)] {
			t.Logf("  %s", s)
		}
	}

	// The router's books: every client request counted once, by status.
	time.Sleep(500 * time.Millisecond)
	reqAfter := r.sumCounter("kvroute_requests_total", nil)
	if got, want := reqAfter-reqBefore, float64(sum.sent); got != want {
		t.Errorf("kvroute_requests_total grew by %.0f, want %.0f (one per client request)", got, want)
	}
	byStatus := r.counterBy("kvroute_requests_total", "code")
	for code, n := range byStatus {
		n -= codesBefore[code]
		client := sum.byStatus[code]
		if n != float64(client) {
			t.Errorf("kvroute_requests_total{code=%s} grew by %.0f, the clients got %d", code, n, client)
		}
	}
	if got, want := r.sumCounter("kvroute_upstream_stream_errors_total", nil)-streamErrsBefore, sum.sseErrorTotal(); got != float64(want) {
		t.Errorf("kvroute_upstream_stream_errors_total grew by %.0f, the clients got %d streams ended by an error event", got, want)
	}
	for _, f := range sum.failures {
		if strings.Contains(f, "connect: connection refused") {
			t.Errorf("a connect error reached the client instead of being retried: %s", f)
		}
	}
	retries := r.counterBy("kvroute_retries_total", "reason")
	retriesByEP := r.counterBy("kvroute_retries_total", "endpoint")
	ejections := r.counterBy("kvroute_ejections_total", "endpoint")
	ejectKind := r.counterBy("kvroute_ejections_total", "kind")
	streamErrs := r.counterBy("kvroute_upstream_stream_errors_total", "endpoint")
	t.Logf("router: retries %v by endpoint %v; ejections %v %v; stream errors %v", retries, retriesByEP, ejections, ejectKind, streamErrs)
	if retriesByEP["e1"] == 0 {
		t.Errorf("no retry away from the killed e1: kvroute_retries_total{endpoint=e1} = 0")
	}
	for _, id := range []string{"e1", "e3"} {
		if ejections[id] == 0 {
			t.Errorf("kvroute_ejections_total{endpoint=%s} = 0, want at least 1", id)
		}
	}
	for id, v := range r.gaugesBy("kvroute_inflight_requests", "endpoint") {
		if v != 0 {
			t.Errorf("kvroute_inflight_requests{endpoint=%s} = %v after the load stopped, want 0", id, v)
		}
	}
	passive := map[string]float64{}
	active := map[string]float64{}
	if f := r.families()["kvroute_ejections_total"]; f != nil {
		for _, m := range f.samples {
			if m.labels["kind"] == "passive" {
				passive[m.labels["endpoint"]] += m.value
			} else {
				active[m.labels["endpoint"]] += m.value
			}
		}
	}
	for _, id := range []string{"e1", "e3"} {
		if activeHC && active[id] == 0 {
			t.Errorf("kvroute_ejections_total{endpoint=%s,kind=active} = 0: the health checks never took it out", id)
		}
		if !activeHC && active[id] != 0 {
			t.Errorf("kvroute_ejections_total{endpoint=%s,kind=active} = %v with health checks disabled", id, active[id])
		}
	}
	for _, st := range r.endpoints() {
		if float64(st.Ejections) != passive[st.ID] {
			t.Errorf("/debug/endpoints: %s ejections %d, kvroute_ejections_total{kind=passive} %v", st.ID, st.Ejections, passive[st.ID])
		}
		if !st.Healthy {
			t.Errorf("/debug/endpoints: %s unhealthy at the end", st.ID)
		}
		if st.Signals.InFlight != 0 {
			t.Errorf("/debug/endpoints: %s in_flight %d at the end, want 0", st.ID, st.Signals.InFlight)
		}
	}

	// No goroutine or connection leak: the router settles back near its
	// baseline once the load is gone (idle keep-alive connections to the
	// engines account for a few).
	var gAfter float64
	deadline := time.Now().Add(20 * time.Second)
	for {
		lg.client.CloseIdleConnections()
		gAfter = r.gauge("go_goroutines", nil)
		if gAfter <= gBefore+20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	sockAfter := sockets(rcmd.Process.Pid)
	t.Logf("go_goroutines: before %.0f, after %.0f; open sockets before %d, after %d (each idle upstream connection holds 2 goroutines)",
		gBefore, gAfter, sockBefore, sockAfter)
	if gAfter > gBefore+20 {
		t.Errorf("router go_goroutines %.0f after the run, %.0f before: leak", gAfter, gBefore)
	}
	// What the router's goroutines are doing now: SIGQUIT makes the Go
	// runtime print every stack and exit (the router is not used again).
	_ = rcmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-rdone:
		data, _ := os.ReadFile(rlog.Name())
		t.Logf("router goroutines at the end, by the function they wait in:\n%s", goroutineSummary(string(data)))
	case <-time.After(5 * time.Second):
	}

	t.Logf("SUMMARY sent=%d ok=%d failed=%v sse_errors=%v retried(router)=%v eject: kill %v hang %v; readmit: kill %v hang %v; e1 after restart: %s",
		sum.sent, sum.ok, sum.failed, sum.sseErrors, retries, ejectKill.Round(time.Millisecond), ejectHang.Round(time.Millisecond),
		readmitKill.Round(time.Millisecond), readmitHang.Round(time.Millisecond), affinity)
	// Generous bounds: the health checks' (unhealthy_threshold checks of
	// interval + timeout) or passive ejection's (fail_threshold failures,
	// each a refused connection or an upstream_header timeout), plus 2 s.
	killBound, hangBound := 2*time.Second, chaosUpstreamHeader+2*time.Second
	if activeHC {
		hcBound := (chaosHCInterval+chaosHCTimeout)*chaosHCUnhealthy + 2*time.Second
		killBound, hangBound = min(killBound, hcBound), min(hangBound, hcBound)
	}
	if ejectKill > killBound {
		t.Errorf("killed e1 left rotation after %v, want within %v", ejectKill, killBound)
	}
	if ejectHang > hangBound {
		t.Errorf("hung e3 left rotation after %v, want within %v", ejectHang, hangBound)
	}
}

// awaitServed waits for a successful answer from endpoint to a request
// sent after since, and returns how long after since it came.
func (l *chaosLoad) awaitServed(t *testing.T, endpoint string, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	var at time.Time
	eventually(t, within, endpoint+" serves again", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, r := range l.results {
			if r.endpoint == endpoint && r.class == "ok" && !r.start.Before(since) && (at.IsZero() || r.end.Before(at)) {
				at = r.end
			}
		}
		return !at.IsZero(), "no answer yet"
	})
	return at.Sub(since)
}

// goroutineSummary counts the goroutines of a Go traceback by their
// state and the first frame outside the runtime.
func goroutineSummary(dump string) string {
	counts := map[string]int{}
	blocks := strings.Split(dump, "\ngoroutine ")
	for _, b := range blocks[1:] {
		lines := strings.Split(b, "\n")
		state := lines[0]
		if i := strings.Index(state, "["); i >= 0 {
			state = strings.TrimSuffix(state[i+1:], "]:")
			state, _, _ = strings.Cut(state, ",")
		}
		fn := "?"
		for _, l := range lines[1:] {
			if l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "runtime.") || strings.HasPrefix(l, "internal/") ||
				strings.HasPrefix(l, "sync.") || strings.HasPrefix(l, "net.") || strings.HasPrefix(l, "created by") {
				continue
			}
			fn = l
			if i := strings.LastIndex(l, "("); i > 0 {
				fn = l[:i]
			}
			break
		}
		counts[state+" "+fn]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %3d %s\n", counts[k], k)
	}
	return b.String()
}

// sockets counts the open sockets of process pid (-1 if unknown).
func sockets(pid int) int {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// chaosEngine is one `kvroute engine` process on a fixed port.
type chaosEngine struct {
	t      *testing.T
	bin    string
	id     string
	port   int
	logDir string

	mu   sync.Mutex // guards cmd and done
	cmd  *exec.Cmd
	done chan struct{}
	gen  int
}

func (e *chaosEngine) addr() string { return fmt.Sprintf("127.0.0.1:%d", e.port) }

func (e *chaosEngine) start() {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gen++
	logf, err := os.Create(filepath.Join(e.logDir, fmt.Sprintf("%s.%d.log", e.id, e.gen)))
	if err != nil {
		e.t.Fatal(err)
	}
	// The port may linger for a moment after the old process died.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", e.addr())
		if err == nil {
			ln.Close()
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: port %d still busy: %v", e.id, e.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd := exec.Command(e.bin, "engine", "--model", model, "--profile", "llama-3.1-8b-h100", "--speed", "1",
		"--kv-blocks", "4096", "--listen", e.addr(), "--shutdown-timeout", "5s", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	e.cmd, e.done = cmd, done
}

func (e *chaosEngine) awaitUp() {
	e.t.Helper()
	eventually(e.t, 10*time.Second, e.id+" up", func() (bool, string) {
		resp, err := http.Get("http://" + e.addr() + "/health")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
}

func (e *chaosEngine) signal(s syscall.Signal) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd != nil && e.cmd.Process != nil {
		_ = e.cmd.Process.Signal(s)
	}
}

func (e *chaosEngine) wait() {
	e.mu.Lock()
	done := e.done
	e.mu.Unlock()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		e.t.Errorf("%s did not exit within 15 s; killing it", e.id)
		e.kill()
	}
}

// kill ends the process for good (a stopped one too).
func (e *chaosEngine) kill() {
	e.mu.Lock()
	cmd, done := e.cmd, e.done
	e.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-done
}

// metricsSwitch passes GET /metrics on to an engine, or answers 503.
type metricsSwitch struct {
	target string
	fail   atomic.Bool
}

func (m *metricsSwitch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.fail.Load() {
		http.Error(w, "metrics switched off by the chaos test", http.StatusServiceUnavailable)
		return
	}
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, m.target, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// chaosRouter reads the router's /metrics and /debug/endpoints.
type chaosRouter struct {
	t   *testing.T
	url string
}

func (r *chaosRouter) awaitUp(within time.Duration) {
	eventually(r.t, within, "router up", func() (bool, string) {
		resp, err := http.Get(r.url + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
}

type chaosEndpoint struct {
	ID           string    `json:"id"`
	Healthy      bool      `json:"healthy"`
	ActiveOK     bool      `json:"active_ok"`
	EjectedUntil time.Time `json:"ejected_until"`
	Ejections    int       `json:"ejections"`
	Signals      struct {
		ConsecutiveErrors int    `json:"consecutive_errors"`
		LastError         string `json:"last_error"`
		InFlight          int    `json:"in_flight"`
	} `json:"signals"`
}

func (r *chaosRouter) endpoints() []chaosEndpoint {
	r.t.Helper()
	resp, err := http.Get(r.url + "/debug/endpoints")
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]struct {
		Endpoints []chaosEndpoint `json:"endpoints"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		r.t.Fatalf("/debug/endpoints: %v", err)
	}
	return out[model].Endpoints
}

func (r *chaosRouter) endpoint(id string) chaosEndpoint {
	for _, e := range r.endpoints() {
		if e.ID == id {
			return e
		}
	}
	r.t.Fatalf("/debug/endpoints: no %s", id)
	return chaosEndpoint{}
}

func (r *chaosRouter) awaitAllHealthy(within time.Duration) {
	eventually(r.t, within, "all endpoints healthy", func() (bool, string) {
		for _, e := range r.endpoints() {
			if !e.Healthy {
				return false, e.ID + " unhealthy"
			}
		}
		return true, ""
	})
}

// awaitHealth waits until /debug/endpoints shows id healthy (or not) and
// returns how long that took.
func (r *chaosRouter) awaitHealth(id string, healthy bool, within time.Duration) time.Duration {
	r.t.Helper()
	start := time.Now()
	eventually(r.t, within, fmt.Sprintf("%s healthy=%v", id, healthy), func() (bool, string) {
		e := r.endpoint(id)
		return e.Healthy == healthy, fmt.Sprintf("%+v", e)
	})
	return time.Since(start)
}

// awaitInFlight waits until the router holds at least n requests open to
// id (so that a fault hits requests in progress) and returns how many.
func (r *chaosRouter) awaitInFlight(id string, n int, within time.Duration) int {
	r.t.Helper()
	var got int
	eventually(r.t, within, fmt.Sprintf("%d requests in flight to %s", n, id), func() (bool, string) {
		got = r.endpoint(id).Signals.InFlight
		return got >= n, fmt.Sprintf("%d in flight", got)
	})
	return got
}

func (r *chaosRouter) families() map[string]*dtoFamily {
	r.t.Helper()
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		r.t.Fatalf("router /metrics: %v", err)
	}
	out := make(map[string]*dtoFamily, len(fams))
	for name, f := range fams {
		df := &dtoFamily{}
		for _, m := range f.GetMetric() {
			s := dtoSample{labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.value = m.GetGauge().GetValue()
			case m.Untyped != nil:
				s.value = m.GetUntyped().GetValue()
			}
			df.samples = append(df.samples, s)
		}
		out[name] = df
	}
	return out
}

type dtoFamily struct{ samples []dtoSample }

type dtoSample struct {
	labels map[string]string
	value  float64
}

func (r *chaosRouter) sumCounter(name string, match map[string]string) float64 {
	f := r.families()[name]
	if f == nil {
		return 0
	}
	var s float64
next:
	for _, m := range f.samples {
		for k, v := range match {
			if m.labels[k] != v {
				continue next
			}
		}
		s += m.value
	}
	return s
}

func (r *chaosRouter) gauge(name string, match map[string]string) float64 {
	return r.sumCounter(name, match)
}

func (r *chaosRouter) counterBy(name, label string) map[string]float64 {
	out := map[string]float64{}
	if f := r.families()[name]; f != nil {
		for _, m := range f.samples {
			out[m.labels[label]] += m.value
		}
	}
	return out
}

func (r *chaosRouter) gaugesBy(name, label string) map[string]float64 {
	return r.counterBy(name, label)
}

// chaosLoad is the client side: closed-loop workers sending chat requests
// that share a few long system prompts, half of them streamed.
type chaosLoad struct {
	url    string
	client *http.Client

	mu      sync.Mutex // guards results and marks
	results []chaosResult
	marks   []string
}

// chaosResult is one client request's outcome.
type chaosResult struct {
	start, end time.Time
	stream     bool
	status     int
	endpoint   string
	// class: ok, http_<status> (an error answer), sse_error_<code> (a
	// stream ended by an error event), or bad:<why> (lost, truncated,
	// malformed).
	class  string
	detail string
	cached int // the engine's cached_tokens (-1 unknown)
	prompt int
}

func newChaosLoad(url string) *chaosLoad {
	// No client timeout: the router's own timeouts must end every request;
	// the watchdog below reports any that runs past a minute.
	return &chaosLoad{url: url, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

func (l *chaosLoad) mark(what string) {
	l.mu.Lock()
	l.marks = append(l.marks, what)
	l.mu.Unlock()
}

// start runs n workers until the returned function is called, which waits
// for them; the test's end calls it too, so that a step that fails the test
// does not leave them sending requests into the next test.
func (l *chaosLoad) start(t testing.TB, n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w)+1, 99))
			for i := 0; ctx.Err() == nil; i++ {
				p := rng.IntN(chaosPrefixes)
				stream := rng.IntN(2) == 0
				body := chatBody(text(uint64(1000+p), 350), fmt.Sprintf("worker %d question %d: %s", w, i, text(rng.Uint64(), 12)),
					20+rng.IntN(60), stream)
				res := l.do(body, stream)
				l.mu.Lock()
				l.results = append(l.results, res)
				l.mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// do sends one request and classifies its answer. The request is not tied
// to the load's context: stopping the load lets requests in flight finish.
func (l *chaosLoad) do(body string, stream bool) chaosResult {
	res := chaosResult{start: time.Now(), stream: stream, cached: -1}
	defer func() { res.end = time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		res.class, res.detail = "bad:transport", err.Error()
		res.end = time.Now()
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.endpoint = resp.Header.Get("X-Kvroute-Endpoint")
	data, rerr := io.ReadAll(resp.Body)
	res.end = time.Now()
	if rerr != nil {
		res.class, res.detail = "bad:read", fmt.Sprintf("status %d, %d bytes then %v", resp.StatusCode, len(data), rerr)
		return res
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		switch {
		case json.Unmarshal(data, &e) != nil || e.Error == nil || e.Error.Message == "":
			res.class, res.detail = fmt.Sprintf("bad:error_body_%d", resp.StatusCode), string(data)
		case resp.StatusCode != 502 && resp.StatusCode != 503 && resp.StatusCode != 504:
			res.class, res.detail = fmt.Sprintf("bad:status_%d", resp.StatusCode), e.Error.Message
		default:
			res.class, res.detail = fmt.Sprintf("http_%d", resp.StatusCode), e.Error.Message
		}
		return res
	}
	if !stream {
		var out struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage *openai.Usage `json:"usage"`
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) == 0 || out.Choices[0].FinishReason == "" || out.Usage == nil {
			res.class, res.detail = "bad:truncated_200", fmt.Sprintf("%v: %q", err, tail(data, 200))
			return res
		}
		res.class = "ok"
		res.prompt, res.cached = out.Usage.PromptTokens, out.Usage.CachedTokens()
		return res
	}
	// A stream must end with [DONE] after either a finished choice and the
	// usage chunk, or an error event.
	var done, finished bool
	var errEvent string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		payload := strings.TrimPrefix(line, "data: ")
		if payload == "[DONE]" {
			done = true
			continue
		}
		var chunk struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *openai.Usage `json:"usage"`
			Error *struct {
				Message string `json:"message"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(payload), &chunk); err != nil {
			res.class, res.detail = "bad:sse_garbage", payload
			return res
		}
		if chunk.Error != nil {
			errEvent = fmt.Sprintf("%v: %s", chunk.Error.Code, chunk.Error.Message)
			res.class = fmt.Sprintf("sse_error_%v", chunk.Error.Code)
		}
		for _, c := range chunk.Choices {
			if c.FinishReason != nil && *c.FinishReason != "" {
				finished = true
			}
		}
		if chunk.Usage != nil {
			res.prompt = chunk.Usage.PromptTokens
			if c := chunk.Usage.CachedTokens(); c >= 0 {
				res.cached = c
			}
		}
	}
	switch {
	case !done:
		res.class, res.detail = "bad:stream_without_done", fmt.Sprintf("error event %q, tail %q", errEvent, tail(data, 200))
	case errEvent != "":
		res.detail = errEvent
	case !finished || res.prompt == 0:
		res.class, res.detail = "bad:stream_incomplete", fmt.Sprintf("finished %v usage %v: %q", finished, res.prompt != 0, tail(data, 200))
	default:
		res.class = "ok"
	}
	return res
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// count is how many successful requests endpoint served that started in
// [from, to).
func (l *chaosLoad) count(endpoint string, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.results {
		if r.endpoint == endpoint && r.class == "ok" && !r.start.Before(from) && r.start.Before(to) {
			n++
		}
	}
	return n
}

// cacheStats is what one endpoint's answers said about its prefix cache.
type cacheStats struct {
	n, hits, cold int // answers; with cached tokens >= half the prompt; with none
	firstHit      int // index of the first answer with a hit (-1 none)
}

func (c cacheStats) String() string {
	return fmt.Sprintf("%d cold, %d warm (first warm answer: #%d)", c.cold, c.hits, c.firstHit)
}

func (l *chaosLoad) endpointCache(endpoint string, from, to time.Time) cacheStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rs []chaosResult
	for _, r := range l.results {
		if r.endpoint == endpoint && r.class == "ok" && !r.start.Before(from) && r.start.Before(to) {
			rs = append(rs, r)
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].start.Before(rs[j].start) })
	c := cacheStats{n: len(rs), firstHit: -1}
	for i, r := range rs {
		switch {
		case r.cached*2 >= r.prompt && r.prompt > 0:
			c.hits++
			if c.firstHit < 0 {
				c.firstHit = i
			}
		case r.cached <= 0:
			c.cold++
		}
	}
	return c
}

// chaosSummary counts the load's outcomes.
type chaosSummary struct {
	sent, ok  int
	failed    map[string]int // http_<status>
	sseErrors map[string]int // sse_error_<code>
	bad       []string
	slow      []string
	failures  []string       // descriptions of the error answers
	byStatus  map[string]int // the status every request got
	maxDur    time.Duration
}

func (s chaosSummary) String() string {
	return fmt.Sprintf("ok %d, error answers %v, streams ended by an error event %v, bad %d, slowest %v",
		s.ok, s.failed, s.sseErrors, len(s.bad), s.maxDur.Round(time.Millisecond))
}

func (s chaosSummary) sseErrorTotal() int {
	n := 0
	for _, v := range s.sseErrors {
		n += v
	}
	return n
}

func (l *chaosLoad) summary() chaosSummary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := chaosSummary{sent: len(l.results), failed: map[string]int{}, sseErrors: map[string]int{}, byStatus: map[string]int{}}
	limit := chaosMaxRequest
	rs := slices.Clone(l.results)
	sort.Slice(rs, func(i, j int) bool { return rs[i].end.Sub(rs[i].start) > rs[j].end.Sub(rs[j].start) })
	for _, r := range rs {
		d := r.end.Sub(r.start)
		s.maxDur = max(s.maxDur, d)
		desc := fmt.Sprintf("%s stream=%v status=%d endpoint=%q took %v at %s: %s", r.class, r.stream, r.status, r.endpoint,
			d.Round(time.Millisecond), r.start.Format("15:04:05.000"), r.detail)
		if d > limit {
			s.slow = append(s.slow, desc)
		}
		if r.status != 0 {
			s.byStatus[strconv.Itoa(r.status)]++
		}
		switch {
		case r.class == "ok":
			s.ok++
		case strings.HasPrefix(r.class, "http_"):
			s.failed[strings.TrimPrefix(r.class, "http_")]++
			s.failures = append(s.failures, desc)
		case strings.HasPrefix(r.class, "sse_error_"):
			s.sseErrors[strings.TrimPrefix(r.class, "sse_error_")]++
		default:
			s.bad = append(s.bad, desc)
		}
	}
	return s
}

package proxy

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// queueingPicker sheds with the "queue" action for its first n calls, then
// picks the first healthy candidate; with n < 0 it always queues.
type queueingPicker struct {
	n     int64
	calls atomic.Int64
}

func (q *queueingPicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	if c := q.calls.Add(1); q.n < 0 || c <= q.n {
		d := kvroute.None("queueing", policy.OverloadQueue+": every endpoint over its cap")
		d.Shed = true
		return d
	}
	return firstHealthy.Pick(now, req, cands)
}

func TestQueueHoldsThenRoutes(t *testing.T) {
	engine := httptest.NewServer(statusHandler(http.StatusOK))
	t.Cleanup(engine.Close)
	for _, tt := range []struct {
		name      string
		sheds     int64
		want      int
		wantCalls int64 // at least
	}{
		{"drains", 3, http.StatusOK, 4},
		{"never drains", -1, http.StatusTooManyRequests, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			qp := &queueingPicker{n: tt.sheds}
			cfg := testConfig("queueing", engine.URL)
			cfg.Retry.QueueWait = queueWaitFor(tt.want)
			tp := newTestProxyWith(t, cfg, onePicker(qp))
			resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hello"}`)
			body := readAll(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("status: got %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			if tt.want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			if got := qp.calls.Load(); got < tt.wantCalls {
				t.Fatalf("picker calls: got %d, want at least %d", got, tt.wantCalls)
			}
			if got := tp.metric(t, tp.metrics.queued, "m"); got != 1 {
				t.Fatalf("kvroute_queued_requests_total: got %v, want 1", got)
			}
		})
	}
}

// queueWaitFor is the queue_wait of a case that expects status want: a
// request that must wait it out gets 500 ms, long enough for the second
// try the case counts (at 100 ms a loaded machine let it run out after
// the first); one that must be routed after three sheds gets a minute, as
// the pauses between its tries (10 + 20 + 40 ms) outlasted 100 ms on a
// loaded machine.
func queueWaitFor(want int) time.Duration {
	if want == http.StatusTooManyRequests {
		return 500 * time.Millisecond
	}
	return time.Minute
}

// TestQueueOnDisaggregatedPool: the queue escape hatch holds a P/D
// request the prefill policy sheds, then places it on both pools.
func TestQueueOnDisaggregatedPool(t *testing.T) {
	ps, pbodies := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, dbodies := pdEngine(t, kvroute.RoleDecode, "nixl")
	for _, tt := range []struct {
		name  string
		sheds int64
		want  int
		legs  int // prefill legs the engines saw after this case
	}{
		{"drains", 3, http.StatusOK, 1},
		{"never drains", -1, http.StatusTooManyRequests, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			qp := &queueingPicker{n: tt.sheds}
			cfg := pdTestConfig("queueing", "nixl", ps.URL, ds.URL)
			cfg.Retry.QueueWait = queueWaitFor(tt.want)
			tp := newTestProxyWith(t, cfg, onePicker(qp))
			resp := tp.post(t, PathCompletions, `{"model":"tiny","prompt":"held until the prefill pool drains","max_tokens":2}`)
			body := readAll(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("status: got %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			if tt.want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			if got := qp.calls.Load(); got < 2 {
				t.Fatalf("picker calls: got %d, want the request routed again after queueing", got)
			}
			if got := tp.metric(t, tp.metrics.queued, "tiny"); got != 1 {
				t.Fatalf("kvroute_queued_requests_total: got %v, want 1", got)
			}
			if n, m := len(pbodies()), len(dbodies()); n != tt.legs || m != tt.legs {
				t.Fatalf("engine legs: %d prefill, %d decode; want %d each", n, m, tt.legs)
			}
		})
	}
}

// gatePicker sheds every request with the "queue" action until the test
// opens the gate for one more, and counts its calls per prompt.
type gatePicker struct {
	mu    sync.Mutex
	calls map[string]int
	open  int
}

func (g *gatePicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	g.mu.Lock()
	g.calls[req.Prompt]++
	admit := g.open > 0
	if admit {
		g.open--
	}
	g.mu.Unlock()
	if !admit {
		d := kvroute.None("gate", policy.OverloadQueue+": every endpoint over its cap")
		d.Shed = true
		return d
	}
	return firstHealthy.Pick(now, req, cands)
}

func (g *gatePicker) callsOf(prompt string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[prompt]
}

func (g *gatePicker) admit() {
	g.mu.Lock()
	g.open++
	g.mu.Unlock()
}

// TestQueueFirstComeFirstServed: held requests wait in line. One arriving
// while another is held does not route at all while the first waits (it
// used to poll on its own, from a shorter pause than the earlier one's, and
// so usually took the first free slot: later requests overtook earlier
// ones, which then ran out of queue_wait; later still it routed once on
// arrival, see TestQueueNoOvertaking), and room goes to the first. A waiter
// whose client goes away leaves the line.
func TestQueueFirstComeFirstServed(t *testing.T) {
	g := &gatePicker{calls: map[string]int{}}
	tp := newQueueProxy(t, "gate", g, time.Minute)
	// On failure the held requests end with the test, not with queue_wait.
	base, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)

	type result struct {
		status int
		err    error
	}
	send := func(ctx context.Context, prompt string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tp.srv.URL+PathCompletions,
				strings.NewReader(`{"model":"m","prompt":"`+prompt+`"}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ch <- result{err: err}
				return
			}
			resp.Body.Close()
			ch <- result{status: resp.StatusCode}
		}()
		return ch
	}

	first := send(base, "first")
	waitFor(t, "the first request routed again from the queue", func() bool { return g.callsOf("first") >= 2 })
	goneCtx, gone := context.WithCancel(base)
	defer gone()
	leaver := send(goneCtx, "leaver")
	waitFor(t, "the leaver queued", func() bool { return tp.metric(t, tp.metrics.queued, "m") == 2 })
	second := send(base, "second")
	waitFor(t, "the second queued", func() bool { return tp.metric(t, tp.metrics.queued, "m") == 3 })
	// The head goes on routing again; those behind it do not.
	n := g.callsOf("first")
	waitFor(t, "the first request routed again twice more", func() bool { return g.callsOf("first") >= n+2 })
	if c, d := g.callsOf("leaver"), g.callsOf("second"); c != 0 || d != 0 {
		t.Fatalf("requests behind the head routed %d and %d times, want 0 (they joined the line on arrival)", c, d)
	}
	gone()
	if r := recv(t, "the leaver's answer", leaver); r.err == nil {
		t.Fatalf("leaver: got status %d, want its request cancelled", r.status)
	}
	// The client sees its cancel at once; the proxy takes the leaver out
	// of line a moment later. Until then it could become the head.
	waitFor(t, "the leaver out of line", func() bool { return tp.pools["m"].line.waiting() == 2 })

	g.admit()
	if r := recv(t, "the first request's answer", first); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("first: got %d, %v; want 200", r.status, r.err)
	}
	// The second is the head now and routes again at once.
	waitFor(t, "the second routed", func() bool { return g.callsOf("second") >= 1 })
	g.admit()
	if r := recv(t, "the second request's answer", second); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("second: got %d, %v; want 200", r.status, r.err)
	}
	if c := g.callsOf("leaver"); c != 0 {
		t.Fatalf("the leaver routed %d times, want 0", c)
	}
	if n := tp.pools["m"].line.waiting(); n != 0 {
		t.Fatalf("%d requests still in line", n)
	}
}

// TestQueueWaitRunsOut: a request still shed when retry.queue_wait runs
// out gets 429 with Retry-After and an error that says it waited.
func TestQueueWaitRunsOut(t *testing.T) {
	qp := &queueingPicker{n: -1}
	tp := newQueueProxy(t, "queueing", qp, 50*time.Millisecond)
	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hello"}`)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("got %d, Retry-After %q (%s); want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if e.Error.Code != "overloaded" || !strings.Contains(e.Error.Message, "waited 50ms in the router's queue") {
		t.Fatalf("error %+v: want code overloaded and a message saying the request waited 50ms", e.Error)
	}
	if n := tp.pools["m"].line.waiting(); n != 0 {
		t.Fatalf("%d requests still in line", n)
	}
}

// TestQueueDrainDeadline: a request held in the queue when the drain
// deadline passes gets the 503 every other request then in progress gets,
// not a 429 that says the fleet is overloaded, and is counted so.
func TestQueueDrainDeadline(t *testing.T) {
	qp := &queueingPicker{n: -1}
	tp := newQueueProxy(t, "queueing", qp, time.Minute)
	// As Serve does: every request's context descends from one that the
	// drain deadline cancels with errShutdown.
	base, stopAll := context.WithCancelCause(context.Background())
	srv := httptest.NewUnstartedServer(tp.Proxy)
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	srv.Start()
	t.Cleanup(srv.Close)
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(srv.URL+PathCompletions, "application/json", strings.NewReader(`{"model":"m","prompt":"hello"}`))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	waitFor(t, "the request queued", func() bool { return tp.metric(t, tp.metrics.queued, "m") == 1 })
	stopAll(errShutdown)
	resp := recv(t, "the answer", done)
	if resp == nil {
		return
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Fatalf("got %d (%s), want 503 saying the router is shutting down", resp.StatusCode, body)
	}
	// Counted as answered (503), not as its client's (499): the router
	// ended it.
	waitFor(t, "the request accounted for", func() bool {
		return tp.metric(t, tp.metrics.requests, "m", "", "503")+tp.metric(t, tp.metrics.requests, "m", "", "499") == 1
	})
	if got := tp.metric(t, tp.metrics.requests, "m", "", "503"); got != 1 {
		t.Errorf("kvroute_requests_total{code=503}: got %v, want 1 (499: %v)", got, tp.metric(t, tp.metrics.requests, "m", "", "499"))
	}
}

// TestQueueTenantsTakeTurns: the line serves tenants in turn. A request
// of one tenant held behind another tenant's burst waits for one more of
// the burst, not for all of it.
func TestQueueTenantsTakeTurns(t *testing.T) {
	g := &gatePicker{calls: map[string]int{}}
	tp := newQueueProxy(t, "gate", g, time.Minute)
	base, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	answers := map[string]chan int{}
	send := func(prompt, user string) {
		ch := make(chan int, 1)
		answers[prompt] = ch
		go func() {
			req, _ := http.NewRequestWithContext(base, http.MethodPost, tp.srv.URL+PathCompletions,
				strings.NewReader(`{"model":"m","prompt":"`+prompt+`","user":"`+user+`"}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ch <- 0
				return
			}
			resp.Body.Close()
			ch <- resp.StatusCode
		}()
		n := len(answers)
		waitFor(t, prompt+" queued", func() bool { return tp.metric(t, tp.metrics.queued, "m") == float64(n) })
	}
	for _, p := range []string{"a1", "a2", "a3", "a4"} {
		send(p, "tenant-a")
	}
	send("b1", "tenant-b")
	var order []string
	for range 5 {
		g.admit()
		// Whichever routes now is the head: the one answered.
		got := ""
		waitFor(t, "a request served", func() bool {
			for p, ch := range answers {
				select {
				case code := <-ch:
					if code != http.StatusOK {
						t.Fatalf("%s: got %d, want 200", p, code)
					}
					got = p
					delete(answers, p)
					return true
				default:
				}
			}
			return false
		})
		order = append(order, got)
	}
	if want := []string{"a1", "a2", "b1", "a3", "a4"}; !slices.Equal(order, want) {
		t.Fatalf("served in order %v, want %v", order, want)
	}
}

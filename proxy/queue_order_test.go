package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// slotPicker models a fleet with room for one request: it places a
// request on the first healthy candidate when none it placed is in flight
// (by request ID, until the router releases it), and else sheds it with
// the "queue" action. It counts its calls per prompt.
type slotPicker struct {
	mu       sync.Mutex
	inflight map[string]bool // by request ID
	calls    map[string]int  // by prompt
}

var _ kvroute.Releaser = (*slotPicker)(nil)

func newSlotPicker() *slotPicker {
	return &slotPicker{inflight: map[string]bool{}, calls: map[string]int{}}
}

func (s *slotPicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[req.Prompt]++
	if len(s.inflight) > 0 {
		d := kvroute.None("slot", policy.OverloadQueue+": every endpoint over its cap")
		d.Shed = true
		return d
	}
	d := firstHealthy.Pick(now, req, cands)
	if d.Index >= 0 {
		s.inflight[req.ID] = true
	}
	return d
}

// Release frees the request's room (on a P/D pool it is called for each
// leg; the first frees it).
func (s *slotPicker) Release(_ time.Time, req *kvroute.Request, _ string) {
	s.mu.Lock()
	delete(s.inflight, req.ID)
	s.mu.Unlock()
}

func (s *slotPicker) callsOf(prompt string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[prompt]
}

// heldEngine is an engine that takes each request whose prompt is one of
// prompts, says so on arrived and holds it until release[prompt] is
// closed; then answers with reply.
type heldEngine struct {
	*httptest.Server
	arrived chan string
	release map[string]chan struct{}
}

func newHeldEngine(t *testing.T, reply func(w http.ResponseWriter), prompts ...string) *heldEngine {
	t.Helper()
	e := &heldEngine{arrived: make(chan string, len(prompts)), release: map[string]chan struct{}{}}
	for _, p := range prompts {
		e.release[p] = make(chan struct{})
	}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Prompt string }
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		ch, ok := e.release[body.Prompt]
		if !ok {
			http.Error(w, "unexpected prompt "+body.Prompt, http.StatusBadRequest)
			return
		}
		e.arrived <- body.Prompt
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
		reply(w)
	}))
	t.Cleanup(e.Close)
	return e
}

// answer is a client's view of one request.
type answer struct {
	status int
	body   string
	err    error
}

// sendTo posts a completion of prompt for model to the proxy at base, in
// the background.
func sendTo(ctx context.Context, base, model, prompt string) <-chan answer {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+PathCompletions,
		strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)))
	return send(req)
}

// send does req in the background; its answer comes on the channel
// returned.
func send(req *http.Request) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- answer{status: resp.StatusCode, body: string(b), err: err}
	}()
	return ch
}

// checkNoOvertaking is the scenario of the queue-overtaking tests on model
// served by tp, whose only (prefill) engine is eng: X fills the fleet's
// room; A then B are held in the router's queue; X ends, freeing the room;
// C arrives. C must join the line behind A and B, not route (and be
// placed at once when the room is still free, overtaking them); the engine
// then gets A, B, C in that order.
func checkNoOvertaking(t *testing.T, tp *testProxy, sp *slotPicker, eng *heldEngine, model string) {
	t.Helper()
	// On failure the held requests end with the test, not with queue_wait.
	base, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	t.Cleanup(func() { // unblock the engine before its server closes
		for _, ch := range eng.release {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	})
	send := func(prompt string) <-chan answer { return sendTo(base, tp.srv.URL, model, prompt) }
	queued := func() float64 { return tp.metric(t, tp.metrics.queued, model) }
	ok := func(name string, ch <-chan answer) {
		t.Helper()
		if a := recv(t, name+"'s answer", ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("%s: got %d %s (%v), want 200", name, a.status, a.body, a.err)
		}
	}

	x := send("X")
	if got := recv(t, "X at the engine", eng.arrived); got != "X" {
		t.Fatalf("engine: got %q, want X", got)
	}
	a := send("A")
	waitFor(t, "A held", func() bool { return queued() == 1 })
	b := send("B")
	waitFor(t, "B held", func() bool { return queued() == 2 })
	close(eng.release["X"])
	ok("X", x)
	// The room is free (or A, the head of the line, took it): C arrives.
	c := send("C")
	waitFor(t, "C held or routed", func() bool { return queued() == 3 || sp.callsOf("C") > 0 })
	if n := sp.callsOf("C"); n != 0 {
		t.Fatalf("C was routed on arrival while A and B waited in line, overtaking them: its policy calls: got %d, want 0", n)
	}
	if n := tp.pools[model].line.waiting(); n < 2 {
		t.Fatalf("requests in line: got %d, want B and C at least", n)
	}
	for _, want := range []string{"A", "B", "C"} {
		got := recv(t, want+" at the engine", eng.arrived)
		if got != want {
			t.Fatalf("the engine got %s before %s: got %s, want %s", got, want, got, want)
		}
		close(eng.release[got])
	}
	ok("A", a)
	ok("B", b)
	ok("C", c)
	if n := tp.pools[model].line.waiting(); n != 0 {
		t.Fatalf("requests in line: got %d, want 0", n)
	}
}

// TestQueueNoOvertaking: a request arriving while others are held in the
// router's queue joins the line behind them, even when the room that
// just freed would take it at once (it used to be routed on arrival and
// overtake them).
func TestQueueNoOvertaking(t *testing.T) {
	eng := newHeldEngine(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	}, "X", "A", "B", "C")
	sp := newSlotPicker()
	cfg := testConfig("slot", eng.URL)
	cfg.Retry.QueueWait = time.Minute
	tp := newTestProxyWith(t, cfg, onePicker(sp))
	checkNoOvertaking(t, tp, sp, eng, "m")
}

// TestQueueNoOvertakingDisaggregated: the same on a P/D pool, whose
// prefill policy sheds (and whose room is the prefill engine's).
func TestQueueNoOvertakingDisaggregated(t *testing.T) {
	prefill := newHeldEngine(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-p","choices":[{"index":0,"text":"","finish_reason":"length"}],"kv_transfer_params":{"remote_engine_id":"p0","remote_block_ids":[1]}}`)
	}, "X", "A", "B", "C")
	decode := httptest.NewServer(okHandler("d0"))
	t.Cleanup(decode.Close)
	sp := newSlotPicker()
	cfg := pdTestConfig("slot", "nixl", prefill.URL, decode.URL)
	cfg.Retry.QueueWait = time.Minute
	tp := newTestProxyWith(t, cfg, onePicker(sp))
	checkNoOvertaking(t, tp, sp, prefill, "tiny")
}

// TestQueueBehindWaitRunsOut: a request that joined the line behind a
// held one, and whose queue_wait ran out, gets 429 saying how long it
// waited, as the held one does.
func TestQueueBehindWaitRunsOut(t *testing.T) {
	qp := &queueingPicker{n: -1}
	tp := newQueueProxy(t, "queueing", qp, 200*time.Millisecond)
	first := sendTo(context.Background(), tp.srv.URL, "m", "first")
	waitFor(t, "the first held", func() bool { return tp.metric(t, tp.metrics.queued, "m") == 1 })
	second := sendTo(context.Background(), tp.srv.URL, "m", "second")
	for _, name := range []string{"first", "second"} {
		ch := first
		if name == "second" {
			ch = second
		}
		a := recv(t, name+"'s answer", ch)
		if a.err != nil || a.status != http.StatusTooManyRequests || !strings.Contains(a.body, "waited 200ms in the router's queue") {
			t.Fatalf("%s: got %d %s (%v), want 429 saying it waited 200ms", name, a.status, a.body, a.err)
		}
	}
	if n := tp.pools["m"].line.waiting(); n != 0 {
		t.Fatalf("requests in line: got %d, want 0", n)
	}
}

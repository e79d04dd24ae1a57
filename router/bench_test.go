package router

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/cputime"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/signals"
)

// BenchmarkDecisionKVAware64 is the whole decision of `kvroute serve` with
// the default policy, over 64 endpoints, for 32 KiB prompts of sessions
// sharing a 4 KiB system prompt: prefix hashing, index matches, signal
// views, kv-aware's Pick, the decision log, the dispatch record and Done.
// It reports the p50 and p99 of single decisions (Route) in wall time
// (p50-ns, p99-ns), the same of the completion events that follow each
// (FirstToken and Done: done-p50-ns, done-p99-ns) and of the two together
// (step-p50-ns, step-p99-ns), and the mean thread CPU time of a whole step
// (see opTimer), at steady state: the
// timed decisions follow benchWarmUp untimed ones, by when the indexes,
// the signal views and the decision log have grown to the size the load
// keeps them at (the first few thousand decisions grow them into fresh
// memory, each first touch of a page a fault: on the VMs we measure on
// they made a p99 of 130 us). Every 100 decisions (100 ms) the engines
// are scraped, untimed (scrape). With no load on the
// fleet, kv-aware keeps every session on the system prompt's holder; 16
// sessions fit its approximate index (each decision refreshes its own
// entries), 64 do not (each decision inserts and evicts about 224 blocks:
// the index's worst case).
//
// The loaded case is a fleet at work: 256 sessions, each request in flight
// for the next 128 decisions (two per endpoint), so the load spreads the
// sessions over the endpoints and each endpoint's index holds its own; a
// decision there also pays for the first token and completion of the
// request leaving the window.
func BenchmarkDecisionKVAware64(b *testing.B) {
	for _, sessions := range []int{16, 64} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) { benchDecision(b, sessions, 0) })
	}
	b.Run("loaded/sessions=256/inflight=128", func(b *testing.B) { benchDecision(b, 256, 128) })
	// Requests for 8 LoRA adapters, engines of 4 slots reporting one
	// running each (kv-aware's adapterView and adapterCost on every Pick).
	b.Run("adapters=8/sessions=64/inflight=128", func(b *testing.B) { benchDecisionWith(b, 64, 128, 8) })
}

// benchDecision times decisionLoop's decisions.
func benchDecision(b *testing.B, sessions, inflight int) { benchDecisionWith(b, sessions, inflight, 0) }

// benchDecisionWith is benchDecision for requests naming adapters LoRA
// adapters in turn (0: none).
func benchDecisionWith(b *testing.B, sessions, inflight, adapters int) {
	_, step := decisionLoopWith(b, sessions, inflight, adapters, nil)
	for range benchWarmUp {
		step(nil)
	}
	// The timers' buffers (8 MB each) are allocated before the collection,
	// not after: allocated after it, one took the heap past the collector's
	// goal at once (sessions=16: 5 -> 13 MB), and the cycle it started
	// marked for 3.6 ms through the first few hundred timed decisions,
	// which were 2-3% of them and so the p99.
	var tm stepTimers
	tm.init()
	runtime.GC() // as testing does before a benchmark: the warm-up's garbage is not the timed run's
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	tm.step.begin()
	for b.Loop() {
		step(&tm)
	}
	tm.step.report(b, "step-")
	tm.done.report(b, "done-")
	tm.route.report(b, "")
}

// stepTimers time decisionLoop's steps: each whole, and its decision and
// its completion events apart. The decision is what a request waits for
// before it is sent; the completion events are other requests' (their first
// token and end), recorded on their own goroutines, each a short hold of
// the lock the decision takes.
type stepTimers struct {
	step, route, done opTimer
}

func (tm *stepTimers) init() {
	tm.step.init()
	tm.route.init()
	tm.done.init()
}

// scrape does what the router's scrape loops would have done by now at the
// default interval (100 ms, a decision being 1 ms): every endpoint
// observed, reporting as running what the router holds in flight there.
// Each observation trims the view's log of the router's own dispatches;
// without any, the logs would grow toward their cap through the run.
// With adapters, each engine also reports (vllm:lora_requests_info) 4
// slots and one of the adapters running.
func scrape(r *Router, now time.Time, adapters []string) {
	for i, e := range r.eps {
		v := e.view
		m := signals.Metrics{Flavor: signals.FlavorVLLM, Have: signals.HasWaiting | signals.HasRunning,
			Running: float64(v.Snapshot().InFlight)}
		if len(adapters) > 0 {
			m.Have |= signals.HasLoRA
			m.LoRARunning, m.MaxLoRA = adapters[i%len(adapters):i%len(adapters)+1], 4
		}
		v.Observe(now, m)
	}
}

// benchWarmUp is how many untimed decisions benchDecision makes first.
const benchWarmUp = 20000

// decisionLoop returns one decision of BenchmarkDecisionKVAware64's loop
// (TestRouteAllocs counts its allocations): a router over 64 endpoints
// with the default policy and a decision log routes 32 KiB prompts of
// sessions round-robin, each request in flight for the next inflight
// decisions (0: its first token and end are recorded at once), 1 ms
// apart, the engines scraped every 100 ms.
func decisionLoop(tb testing.TB, sessions, inflight int) (step func(*stepTimers)) {
	_, step = decisionLoopWith(tb, sessions, inflight, 0, nil)
	return step
}

// decisionLoopWith is decisionLoop with the default policy's params, and
// the router.
// With timers, a step times itself into them (nil: untimed).
func decisionLoopWith(tb testing.TB, sessions, inflight, adapters int, params map[string]any) (*Router, func(*stepTimers)) {
	p, err := policy.New(policy.Default, params, 1)
	if err != nil {
		tb.Fatal(err)
	}
	r, err := New(Config{Model: "m", Endpoints: eps(64), Policy: policy.Default, Picker: p, DecisionLog: 256})
	if err != nil {
		tb.Fatal(err)
	}
	system := strings.Repeat("You are a careful assistant for the rules of the game. ", 4<<10/56)
	prompts := make([]string, sessions)
	for i := range prompts {
		prompts[i] = (system + fmt.Sprintf("session %d: ", i) + strings.Repeat("the quick brown fox jumps over the lazy dog ", 32<<10/44))[:32<<10]
	}
	now := t0
	reqs := make([]kvroute.Request, max(len(prompts), inflight+1))
	flights := make([]*Flight, len(reqs))
	reqIDs := make([]string, len(reqs))
	for i := range reqIDs {
		reqIDs[i] = fmt.Sprint(i)
	}
	names := make([]string, adapters)
	for k := range names {
		names[k] = fmt.Sprintf("adapter-%d", k)
	}
	adapter := func(i int) string {
		if adapters == 0 {
			return ""
		}
		return names[i%adapters]
	}
	i := 0
	finish := func(f *Flight) {
		r.FirstToken(now, f)
		r.Done(now, f, kvroute.Outcome{TTFT: 50 * time.Millisecond, PromptTokens: 8192, CachedTokens: -1})
	}
	return r, func(tm *stepTimers) {
		var began, routeStart, routeEnd time.Time
		if tm != nil {
			began = time.Now()
		}
		slot := i % len(reqs)
		req := &reqs[slot]
		old := flights[slot] // routed len(reqs) decisions ago (inflight > 0)
		flights[slot] = nil
		if old != nil {
			finish(old)
		}
		*req = kvroute.Request{ID: reqIDs[slot], Model: "m", Adapter: adapter(i), Prompt: prompts[i%len(prompts)], PromptTokens: 8192, MaxTokens: 128}
		if tm != nil {
			routeStart = time.Now()
		}
		f, err := r.Route(now, req, nil)
		if tm != nil {
			routeEnd = time.Now()
		}
		if err != nil {
			tb.Fatal(err)
		}
		if inflight > 0 {
			flights[slot] = f
		} else {
			finish(f)
		}
		if tm != nil {
			end := time.Now()
			tm.step.add(end.Sub(began))
			tm.route.add(routeEnd.Sub(routeStart))
			tm.done.add(routeStart.Sub(began) + end.Sub(routeEnd))
		}
		now = now.Add(time.Millisecond)
		i++
		if i%100 == 0 {
			scrape(r, now, names)
		}
	}
}

// opTimer times single operations of a benchmark in wall time and reports
// their p50 and p99 (p50-ns, p99-ns), and the thread's CPU time over all
// of them per operation (cpu-ns/op, on Linux). The caller locks its
// goroutine to its thread. benchDecision and BenchmarkMachineTail share
// it, so that the two time the same way.
//
// An operation's window reads only the wall clock (vDSO, no system call).
// It used to read the thread's CPU clock too, at each start and stop: on
// the PVM guests we measure on that is a system call of about 1.2 us, a
// switch to the host, and the operation after it found its caches and
// TLB colder: the decision's p50 rose by 1 us and its p99 by 20-25 us
// (sessions=16: 50-54 -> 74-77 us). It did not separate the machine's
// tail from the code's either: the host takes the CPU away unseen by the
// guest (no steal time), so the thread's CPU time counted those gaps too.
type opTimer struct {
	lat   []time.Duration
	t     time.Time     // wall time at start
	cpu   time.Duration // thread CPU time at begin
	began bool
}

func (tm *opTimer) init() {
	tm.lat = make([]time.Duration, 0, 1<<20)
}

// begin starts the run: the thread's CPU time is counted from here.
func (tm *opTimer) begin() { tm.cpu, tm.began = cputime.Thread(), true }

// start begins timing one operation.
func (tm *opTimer) start() { tm.t = time.Now() }

// stop ends the operation start began.
func (tm *opTimer) stop() { tm.add(time.Since(tm.t)) }

// add records an operation timed by the caller (the first 1<<20 are kept).
func (tm *opTimer) add(d time.Duration) {
	if len(tm.lat) < cap(tm.lat) {
		tm.lat = append(tm.lat, d)
	}
}

// report reports the p50 and p99 as prefix+"p50-ns" and prefix+"p99-ns",
// and the CPU time per operation since begin, if it was called.
func (tm *opTimer) report(b *testing.B, prefix string) {
	lat := tm.lat
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), prefix+"p99-ns")
	if !tm.began {
		return
	}
	if cpu := cputime.Thread() - tm.cpu; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkMachineTail is the control for BenchmarkDecisionKVAware64's
// tail: it times, with the same opTimer, a pure CPU loop (FNV-1a over a
// counter: no memory traffic, no allocation, nothing shared) calibrated to
// take about 5, 10 and 20 us, the range of the decision's p50. Whatever
// p99 the loop shows is the machine's, not the code's. On the 2-core PVM
// guests we measure on, a thread spinning on a CPU loses it about 2,400
// times a second for a median 35 us (p90 40-60 us), 6% of its time, to
// the host: /proc/stat shows no steal time and the guest's own interrupts
// are far fewer. An operation of T us is then interrupted in about
// T x 0.24% of its calls, so past ~4 us its p99 is an interrupted call:
// T plus a gap. Compare a decision's p99 with the loop's of the same p50.
func BenchmarkMachineTail(b *testing.B) {
	perIter := calibrateSpin()
	for _, us := range []int{5, 10, 20} {
		b.Run(fmt.Sprintf("op=%dus", us), func(b *testing.B) {
			n := max(1, int(float64(us)*1000/perIter))
			var tm opTimer
			tm.init()
			runtime.GC() // as benchDecision: no cycle runs through the loop
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			var sink uint64
			tm.begin()
			for b.Loop() {
				tm.start()
				sink += spin(n)
				tm.stop()
			}
			tm.report(b, "")
			spinSink = sink
		})
	}
}

var spinSink uint64

// spin runs n rounds of FNV-1a over a counter and returns the hash.
//
//go:noinline
func spin(n int) uint64 {
	h := uint64(14695981039346656037)
	for i := range n {
		h ^= uint64(i)
		h *= 1099511628211
	}
	return h
}

// calibrateSpin returns spin's time per round in ns: the fastest of a few
// runs of about a millisecond, so that a preempted run does not count.
func calibrateSpin() float64 {
	const n = 1 << 18
	best := time.Duration(1<<63 - 1)
	for range 20 {
		t := time.Now()
		spinSink += spin(n)
		best = min(best, time.Since(t))
	}
	return float64(best.Nanoseconds()) / n
}

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
)

// BenchmarkDecisionKVAware64 is the whole decision of `kvroute serve` with
// the default policy, over 64 endpoints, for 32 KiB prompts of sessions
// sharing a 4 KiB system prompt: prefix hashing, index matches, signal
// views, kv-aware's Pick, the decision log, the dispatch record and Done.
// It reports the p50 and p99 of single decisions, in wall time and (on
// Linux) in thread CPU time: on a shared machine the wall time's tail is
// mostly waiting for a core, which the CPU time leaves out (a decision
// whose wall time is far above its CPU time was descheduled, not slow).
// With no load on the
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
}

// benchDecision routes requests of sessions round-robin; each stays in
// flight for the next inflight decisions (0: released at once).
func benchDecision(b *testing.B, sessions, inflight int) {
	p, err := policy.New(policy.Default, nil, 1)
	if err != nil {
		b.Fatal(err)
	}
	r, err := New(Config{Model: "m", Endpoints: eps(64), Policy: policy.Default, Picker: p, DecisionLog: 256})
	if err != nil {
		b.Fatal(err)
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
	var tm opTimer
	tm.init()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		slot := i % len(reqs)
		req := &reqs[slot]
		old := flights[slot] // routed len(reqs) decisions ago (inflight > 0)
		flights[slot] = nil
		tm.start()
		if old != nil {
			r.FirstToken(now, old)
			r.Done(now, old, kvroute.Outcome{TTFT: 50 * time.Millisecond, PromptTokens: 8192, CachedTokens: -1})
		}
		*req = kvroute.Request{ID: reqIDs[slot], Model: "m", Prompt: prompts[i%len(prompts)], PromptTokens: 8192, MaxTokens: 128}
		f, err := r.Route(now, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		if inflight > 0 {
			flights[slot] = f
		} else {
			r.FirstToken(now, f)
			r.Done(now, f, kvroute.Outcome{TTFT: 50 * time.Millisecond, PromptTokens: 8192, CachedTokens: -1})
		}
		tm.stop()
		now = now.Add(time.Millisecond)
		i++
	}
	tm.report(b)
}

// opTimer times single operations of a benchmark, in wall time and in the
// thread's CPU time, and reports their p50 and p99 (p50-ns, p99-ns,
// cpu-p50-ns, cpu-p99-ns). The caller locks its goroutine to its thread.
// benchDecision and BenchmarkMachineTail share it, so that the two time
// the same way.
type opTimer struct {
	lat, cpu []time.Duration
	c        time.Duration // thread CPU time at start
	t        time.Time     // wall time at start
}

func (tm *opTimer) init() {
	tm.lat = make([]time.Duration, 0, 1<<20)
	tm.cpu = make([]time.Duration, 0, 1<<20)
}

// start begins timing one operation.
func (tm *opTimer) start() {
	tm.c = cputime.Thread()
	tm.t = time.Now()
}

// stop ends the operation start began (the first 1<<20 are kept).
func (tm *opTimer) stop() {
	if len(tm.lat) < cap(tm.lat) {
		tm.lat = append(tm.lat, time.Since(tm.t))
		tm.cpu = append(tm.cpu, cputime.Thread()-tm.c)
	}
}

func (tm *opTimer) report(b *testing.B) {
	lat, cpu := tm.lat, tm.cpu
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), "p99-ns")
	if slices.Sort(cpu); cpu[len(cpu)-1] > 0 {
		b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds()), "cpu-p50-ns")
		b.ReportMetric(float64(cpu[min(len(cpu)-1, len(cpu)*99/100)].Nanoseconds()), "cpu-p99-ns")
	}
}

// BenchmarkMachineTail is the control for BenchmarkDecisionKVAware64's
// tail: it times, with the same opTimer, a pure CPU loop (FNV-1a over a
// counter: no memory traffic, no allocation, nothing shared) calibrated to
// take about 5, 10 and 20 us, the range of the decision's p50. Whatever
// p99 the loop shows is the machine's, not the code's: on a small VM,
// while a CPU is busy the running thread loses some tens of microseconds
// about once per timer tick (1 ms at 1000 Hz), so an operation of T us is
// interrupted in about T/1000 of its calls, and once that passes 1% (T
// above ~10 us) the p99 is an interrupted call. Compare a decision's p99
// with the loop's of the same p50.
func BenchmarkMachineTail(b *testing.B) {
	perIter := calibrateSpin()
	for _, us := range []int{5, 10, 20} {
		b.Run(fmt.Sprintf("op=%dus", us), func(b *testing.B) {
			n := max(1, int(float64(us)*1000/perIter))
			var tm opTimer
			tm.init()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			var sink uint64
			for b.Loop() {
				tm.start()
				sink += spin(n)
				tm.stop()
			}
			tm.report(b)
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

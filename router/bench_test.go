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
	lat := make([]time.Duration, 0, 1<<20)
	cpu := make([]time.Duration, 0, 1<<20)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		slot := i % len(reqs)
		req := &reqs[slot]
		old := flights[slot] // routed len(reqs) decisions ago (inflight > 0)
		flights[slot] = nil
		c := cputime.Thread()
		t := time.Now()
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
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t))
			cpu = append(cpu, cputime.Thread()-c)
		}
		now = now.Add(time.Millisecond)
		i++
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), "p99-ns")
	if slices.Sort(cpu); cpu[len(cpu)-1] > 0 {
		b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds()), "cpu-p50-ns")
		b.ReportMetric(float64(cpu[min(len(cpu)-1, len(cpu)*99/100)].Nanoseconds()), "cpu-p99-ns")
	}
}

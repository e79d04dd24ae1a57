package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/workload"
)

// TestClockOverflowIsAnError: a rate scale or a KV link that pushes virtual
// time past what time.Duration holds ends the run with an error; it used to
// wrap the clock negative and panic indexing the utilisation timeline.
func TestClockOverflowIsAnError(t *testing.T) {
	reqs := smallChat(t, 40, 20, 1)
	pd := Fleet{{Count: 1, Profile: "tiny", NumGPUBlocks: 256, Role: "prefill"}, {Count: 1, Profile: "tiny", NumGPUBlocks: 256, Role: "decode"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"rate scale", Config{Fleet: tinyFleet(2), RateScale: 1e-12}, "rate scale"},
		{"link too slow", Config{Fleet: pd, PD: PDConfig{Mode: disagg.ModeAlways,
			Links: disagg.UniformLinks(disagg.Link{Name: "slow", Gbps: 1e-300})}}, "below"},
		{"link setup beyond the clock", Config{Fleet: pd, PD: PDConfig{Mode: disagg.ModeAlways,
			Links: disagg.UniformLinks(disagg.Link{Name: "far", Gbps: 400, Setup: 200 * 365 * 24 * time.Hour})}}, "clock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.cfg, reqs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestTimelineCoarsens: a run far longer than its arrivals' span keeps a
// bounded timeline, with the busy time and samples it was given.
func TestTimelineCoarsens(t *testing.T) {
	tl := newTimeline(time.Second, 0, 2)
	tl.addBusy(0, 0, 1500*time.Millisecond)
	tl.sample(1, 500*time.Millisecond, 0.5, 3)
	far := 10 * maxTimelineBuckets * time.Second
	tl.addBusy(1, far, 3*time.Second)
	tl.sample(1, far, 0.25, 1)
	if n := len(tl.busy); n > maxTimelineBuckets {
		t.Fatalf("%d buckets, want at most %d", n, maxTimelineBuckets)
	}
	if tl.step != 16*time.Second {
		t.Errorf("step %v, want 16s (doubled until %v fits in %d buckets)", tl.step, far, maxTimelineBuckets)
	}
	var busy [2]time.Duration
	var samples [2]int32
	for b := range tl.busy {
		for e := range 2 {
			busy[e] += tl.busy[b][e]
			samples[e] += tl.samples[b][e]
		}
	}
	if busy != [2]time.Duration{1500 * time.Millisecond, 3 * time.Second} || samples != [2]int32{0, 2} {
		t.Errorf("busy %v, samples %v; want [1.5s 3s] and [0 2]", busy, samples)
	}
	if got := tl.busy[0][0]; got != 1500*time.Millisecond {
		t.Errorf("first bucket busy %v, want 1.5s", got)
	}
	if got := tl.kv[0][1] / float64(tl.samples[0][1]); got != 0.5 {
		t.Errorf("first bucket kv mean %v, want 0.5", got)
	}
}

// TestFailedRequestsKeepBounds: when some requests do not complete (a
// drain), the row's hit rate and TTFT percentiles cover the completed ones
// only, and so must the oracle and the TTFT bound printed next to them: a
// hit rate above its oracle, or a p99 below its lower bound, was shown.
func TestFailedRequestsKeepBounds(t *testing.T) {
	w, err := DefaultWorkload()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		engines int
		limit   int
		policy  string
	}{{8, 100, "least_request"}, {2, 30, "kv-aware"}, {2, 30, "round_robin"}} {
		reqs := w.Requests[:tc.limit]
		res := mustRun(t, Config{Fleet: Fleet{{Count: tc.engines, Profile: "llama-3.1-8b-h100"}}, Policy: tc.policy, Seed: 1, Drain: time.Nanosecond}, reqs)
		row := res.Row(0)
		if row.Completed == len(reqs) || row.Completed == 0 {
			t.Fatalf("%s: %d of %d completed: want the drain to cut some", tc.policy, row.Completed, len(reqs))
		}
		if row.HitRate > row.OracleHitRate+1e-9 {
			t.Errorf("%d x %s: hit rate %.4f above the oracle %.4f shown next to it", tc.engines, tc.policy, row.HitRate, row.OracleHitRate)
		}
		b := res.TTFTBound
		if row.TTFT.P50 < b.P50 || row.TTFT.P90 < b.P90 || row.TTFT.P99 < b.P99 {
			t.Errorf("%d x %s: TTFT p50/p90/p99 %v/%v/%v below the lower bound's %v/%v/%v", tc.engines, tc.policy,
				row.TTFT.P50, row.TTFT.P90, row.TTFT.P99, b.P50, b.P90, b.P99)
		}
	}
}

// TestLateFirstArrivalStartsTheClockNearIt: a trace whose timestamps start
// far from 0 (absolute ones: a production log in Unix milliseconds starts
// about 56 years in) is simulated from shortly before its first request,
// not from 0: the idle engines were scraped every ScrapeInterval and sampled
// from time 0 on, about 18 billion events per engine before the first
// request for such a log, so the run never ended in practice. The records
// and transfers keep the workload's clock, and a run does not depend on
// where the workload starts beyond that (one a day later gives the same
// records a day later).
func TestLateFirstArrivalStartsTheClockNearIt(t *testing.T) {
	base := smallChat(t, 40, 20, 5)
	shifted := func(by time.Duration) []workload.Request {
		out := append([]workload.Request(nil), base...)
		for i := range out {
			out[i].Arrival += by
		}
		return out
	}
	const day = 24 * time.Hour
	a := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "least_request", Seed: 1}, shifted(day))
	b := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "least_request", Seed: 1}, shifted(2*day))
	// 40 requests on 2 engines: a few thousand events, not 2 x 864,000
	// scrapes of idle engines over the day before the first request.
	if a.Events > 20000 {
		t.Errorf("%d events for 40 requests arriving a day in: the idle day was simulated", a.Events)
	}
	for i := range a.Records {
		ra, rb := a.Records[i], b.Records[i]
		if ra.Arrival != base[i].Arrival+day {
			t.Errorf("record %s: arrival %v, want the workload's %v", ra.ID, ra.Arrival, base[i].Arrival+day)
		}
		rb.Arrival -= day
		if ra != rb {
			t.Fatalf("record %d: a day later %+v, two days later (less a day) %+v: want the same", i, ra, rb)
		}
		if !ra.OK() {
			t.Errorf("record %s: status %d %s", ra.ID, ra.Status, ra.Error)
		}
	}
}

// TestRateScaleAbsoluteTrace: a rate scale below 1 on a trace with absolute
// timestamps (Unix milliseconds, 56 years in) slows its arrivals from its
// first request, as workload.ScaleRate does: the simulator divided the
// timestamps themselves, putting the first request 112 years in, and
// refused the run. The run equals the same trace's from 0, a constant
// number of scrape intervals later.
func TestRateScaleAbsoluteTrace(t *testing.T) {
	base := smallChat(t, 40, 20, 5)
	const unixMs = 1_764_000_000_000 * time.Millisecond // a whole number of seconds
	late := append([]workload.Request(nil), base...)
	for i := range late {
		late[i].Arrival += unixMs - base[0].Arrival
	}
	early := append([]workload.Request(nil), base...)
	for i := range early {
		early[i].Arrival -= base[0].Arrival
	}
	cfg := Config{Fleet: tinyFleet(2), Policy: "least_request", Seed: 1, RateScale: 0.5}
	a := mustRun(t, cfg, late)
	b := mustRun(t, cfg, early)
	for i := range a.Records {
		ra, rb := a.Records[i], b.Records[i]
		if want := unixMs + 2*early[i].Arrival; ra.Arrival != want {
			t.Errorf("record %s: arrival %v, want %v (the first kept, the gaps doubled)", ra.ID, ra.Arrival, want)
		}
		ra.Arrival -= unixMs
		if ra != rb {
			t.Fatalf("record %d: on the Unix-ms clock %+v, from 0 %+v: want the same but for the arrival's origin", i, ra, rb)
		}
	}
}

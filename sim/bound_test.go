package sim

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

// segReq is a request whose prompt is the given segments (a segment with
// the same key as a longer one is a prefix of it).
func segReq(id string, at time.Duration, segs ...workload.Segment) workload.Request {
	n := 0
	for _, s := range segs {
		n += s.Len
	}
	return workload.Request{ID: id, Arrival: at, PromptLen: n, OutputLen: 1, Segments: segs}
}

// engineTTFTs runs reqs on one fresh engine of profile p, as the simulator
// hands them to its engines (block hashes, max_tokens the output length),
// and returns each request's TTFT as the engine reports it. With together
// every request is added at time 0 before the first step (they share
// steps); otherwise each is added once the engine is idle again, so each
// runs alone, after the earlier ones warmed the cache.
func engineTTFTs(t *testing.T, p engine.Profile, reqs []workload.Request, together bool) []time.Duration {
	t.Helper()
	return engineTTFTsAt(t, engine.Config{Profile: p, NoEvents: true}, reqs, together)
}

func engineTTFTsAt(t *testing.T, cfg engine.Config, reqs []workload.Request, together bool) []time.Duration {
	t.Helper()
	p := cfg.Profile
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]time.Duration, len(reqs))
	var now time.Duration
	add := func(i int) {
		r := &reqs[i]
		er := &engine.Request{ID: fmt.Sprint(i), PromptLen: r.PromptLen, MaxTokens: r.OutputLen, IgnoreEOS: true,
			BlockHashes: r.BlockHashes(p.BlockSize, nil)}
		if err := e.Add(now, er); err != nil {
			t.Fatal(err)
		}
	}
	run := func() {
		for e.HasWork() {
			res := e.Step(now)
			now += res.Duration
			for _, o := range res.Outputs {
				if o.First {
					var i int
					fmt.Sscan(o.ID, &i)
					out[i] = o.TTFT
				}
			}
		}
	}
	for i := range reqs {
		if together || i == 0 {
			add(i)
		}
	}
	run()
	for i := 1; i < len(reqs) && !together; i++ {
		add(i)
		run()
	}
	return out
}

func mustProfile(t *testing.T, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustBounds(t *testing.T, fleet Fleet, reqs []workload.Request) []time.Duration {
	t.Helper()
	b, err := TTFTBounds(fleet, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBoundIsLonePrefill: the bound of a request is its TTFT alone on an
// idle engine whose cache holds what the oracle's does (warmed by an
// earlier request sharing the prefix), from one token to several prefill
// chunks. In these cases the last chunk is long enough that its attention
// FLOPs outweigh its KV read, so no busier schedule is faster (see
// TestBoundBelowLonePrefill for the others). At a speed other than 1 the
// engine rounds each step after dividing by the speed, which the bound
// cannot reproduce from StepTime's rounded value: there it is below the
// engine's TTFT by at most 1/speed + 1 nanoseconds per step.
func TestBoundIsLonePrefill(t *testing.T) {
	cases := []struct {
		profile      string
		warm, prompt int // the warming request's prompt (0 = none) and the request's
		speed        float64
	}{
		{"llama-3.1-8b-h100", 0, 1, 1},
		{"llama-3.1-8b-h100", 0, 100, 1},
		{"llama-3.1-8b-h100", 0, 8192, 1},                     // one full chunk
		{"llama-3.1-8b-h100", 0, 3*8192 + 700, 1},             // four chunks
		{"llama-3.1-8b-h100", 4096, 6000, 1},                  // 4,096 cached, one chunk
		{"llama-3.1-8b-h100", 8000, 20000, 1},                 // 8,000 cached, 8,192 + 3,808
		{"llama-3.1-8b-h100", 30000, 30000 + 2*8192 + 300, 1}, // 30,000 cached, 8,192 + 8,192 + 300
		{"tiny", 0, 1, 1},
		{"tiny", 0, 200, 1},
		{"tiny", 0, 700, 1}, // 256 + 256 + 188
		{"tiny", 512, 900, 1},
		{"tiny", 300, 1000, 1},
		{"tiny", 300, 1000, 1.7},
		{"tiny", 0, 700, 0.3},
		{"llama-3.1-8b-h100", 8000, 40000, 2.5},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s/warm=%d/prompt=%d/speed=%g", c.profile, c.warm, c.prompt, c.speed)
		t.Run(name, func(t *testing.T) {
			p := mustProfile(t, c.profile)
			reqs := []workload.Request{segReq("probe", time.Second, workload.Segment{Key: 1, Len: c.prompt})}
			if c.warm > 0 {
				reqs = append([]workload.Request{segReq("warm", 0, workload.Segment{Key: 1, Len: c.warm})}, reqs...)
			}
			got := mustBounds(t, Fleet{{Count: 1, Profile: c.profile, Speed: c.speed}}, reqs)
			want := engineTTFTsAt(t, engine.Config{Profile: p, Speed: c.speed, NoEvents: true}, reqs, false)
			for i := range reqs {
				slack := time.Duration(0)
				if c.speed != 0 && c.speed != 1 {
					steps := (reqs[i].PromptLen + p.MaxNumBatchedTokens - 1) / p.MaxNumBatchedTokens
					slack = time.Duration(steps) * time.Duration(math.Ceil(1/c.speed)+1)
				}
				if got[i] > want[i] || got[i] < want[i]-slack {
					t.Errorf("%s: bound %v, want the engine's lone TTFT %v (less at most %v)", reqs[i].ID, got[i], want[i], slack)
				}
			}
		})
	}
}

// TestBoundBelowLonePrefill: where the cost model lets a busier engine beat
// the lone prefill, the bound is below it and still below what the engine
// does. Both schedules here are real engine runs.
func TestBoundBelowLonePrefill(t *testing.T) {
	const prof = "llama-3.1-8b-h100"
	p := mustProfile(t, prof)
	fleet := Fleet{{Count: 1, Profile: prof}}

	// 8,193 uncached tokens alone are 8,192 + 1: the 1-token last step
	// reads the whole 8,192-token context. Sharing the first step with a
	// 60-token request makes them 8,132 + 61, and the first token comes
	// sooner (a 61-token chunk costs its attention FLOPs, little more than
	// the lone last step's KV read, and the first step attends to fewer
	// pairs).
	a := segReq("a", 0, workload.Segment{Key: 1, Len: 8193})
	z := segReq("z", 0, workload.Segment{Key: 2, Len: 60})
	lone := engineTTFTs(t, p, []workload.Request{a}, false)[0]
	shared := engineTTFTs(t, p, []workload.Request{z, a}, true)[1]
	bound := mustBounds(t, fleet, []workload.Request{a})[0]
	if !(shared < lone) {
		t.Fatalf("8,193 tokens: TTFT sharing the first step %v, alone %v: want sharing to be faster (else this test shows nothing)", shared, lone)
	}
	if bound > shared {
		t.Errorf("8,193 tokens: bound %v above the TTFT %v of a real schedule (alone: %v)", bound, shared, lone)
	}

	// 16 uncached tokens after 16,384 cached ones cost the KV read of the
	// 16,384; with one block less cached the engine computes 32 tokens
	// and reads 16,368, which is faster.
	probe := segReq("probe", time.Second, workload.Segment{Key: 1, Len: 16400})
	warm := func(n int) workload.Request { return segReq("warm", 0, workload.Segment{Key: 1, Len: n}) }
	full := engineTTFTs(t, p, []workload.Request{warm(16384), probe}, false)[1]
	fewer := engineTTFTs(t, p, []workload.Request{warm(16384 - 16), probe}, false)[1]
	bound = mustBounds(t, fleet, []workload.Request{warm(16384), probe})[1]
	if !(fewer < full) {
		t.Fatalf("16,400 tokens: TTFT with one block less cached %v, with all %v: want fewer hits to be faster (else this test shows nothing)", fewer, full)
	}
	if bound > fewer {
		t.Errorf("16,400 tokens: bound %v above the TTFT %v with one block less cached (all cached: %v)", bound, fewer, full)
	}
}

// boundEpsilon is the rounding the per-request check allows: the engine
// rounds each step's modelled time to the nanosecond, and the bound adds
// a few steps up differently (the full steps before the last chunk as one,
// a speed's division after StepTime's rounding), at most a nanosecond or
// two per step; the runs below take at most 16 prefill steps per request.
const boundEpsilon = 64 * time.Nanosecond

// boundWorkload is a workload for TestBoundHolds and the fleet it runs on.
type boundWorkload struct {
	name  string
	fleet Fleet
	reqs  []workload.Request
}

// boundWorkloads are small workloads of every generator sized for the tiny
// profile (prompts under its 1,024-token context), and the Mooncake trace's
// first requests for llama engines.
func boundWorkloads(t *testing.T) []boundWorkload {
	t.Helper()
	gen := func(name string, rate float64, params map[string]float64) []workload.Request {
		w, err := workload.Generate(name, workload.Options{Seed: 5, Requests: 150,
			Arrivals: workload.Arrivals{Kind: workload.Poisson, Rate: rate}, Params: params})
		if err != nil {
			t.Fatal(err)
		}
		return w.Requests
	}
	tr, err := DefaultWorkload()
	if err != nil {
		t.Fatal(err)
	}
	tiny := Fleet{{Count: 3, Profile: "tiny", NumGPUBlocks: 160}}
	return []boundWorkload{
		{"chat", tiny, gen("chat", 150, map[string]float64{"turns": 3, "system_len": 96, "user_len": 40,
			"reply_len": 24, "think_s": 0.3, "max_len": 700})},
		{"rag", tiny, gen("rag", 150, map[string]float64{"docs": 12, "doc_len": 400, "question_len": 30,
			"system_len": 60, "output_len": 20})},
		{"sysprompt", tiny, gen("sysprompt", 200, map[string]float64{"prompts": 3, "system_len": 500,
			"user_len": 40, "output_len": 20, "users": 40})},
		{"storm", tiny, gen("storm", 150, map[string]float64{"prefixes": 10, "prefix_len": 200, "hot_len": 500,
			"suffix_len": 30, "output_len": 20, "burst": 60, "burst_at_s": 0.3, "burst_s": 0.2})},
		{"tenants", tiny, gen("tenants", 200, map[string]float64{"tenants": 3, "system_len": 100,
			"heavy_len": 400, "user_len": 40, "output_len": 20})},
		{"mooncake[:300]", Fleet{{Count: 4, Profile: "llama-3.1-8b-h100"}}, tr.Requests[:300]},
	}
}

// TestBoundHolds is the property that makes the bound one: in simulations
// of every generator and a slice of the trace under every policy, the same
// at several times the load (queueing, chunks shared with other requests,
// preemptions), with KV events, on a mixed fleet and on P/D fleets, no
// completed request's TTFT is below its own bound (less boundEpsilon). At
// the base load some requests (those that met an idle engine holding the
// oracle's blocks) reach it, so it is not trivially low.
func TestBoundHolds(t *testing.T) {
	type run struct {
		name  string
		cfg   Config
		reqs  []workload.Request
		tight bool // some request must reach its bound
	}
	var runs []run
	ws := boundWorkloads(t)
	for _, w := range ws {
		for _, pol := range policy.Names() {
			runs = append(runs, run{w.name + "/" + pol, Config{Fleet: w.fleet, Policy: pol, Seed: 1}, w.reqs, true})
		}
		for _, pol := range []string{policy.Default, policy.NameRoundRobin} {
			runs = append(runs, run{w.name + "/x6/" + pol, Config{Fleet: w.fleet, Policy: pol, Seed: 1, RateScale: 6}, w.reqs, false})
		}
	}
	chat, rag := ws[0].reqs, ws[1].reqs
	mixed := Fleet{
		{Count: 1, Profile: "tiny", NumGPUBlocks: 160},
		{Count: 1, Profile: "tiny", NumGPUBlocks: 160, Speed: 1.7},
		{Count: 1, Profile: "tiny", NumGPUBlocks: 160, MaxNumBatchedTokens: 64, Speed: 3},
	}
	pd := Fleet{{Count: 1, Profile: "tiny", NumGPUBlocks: 160, Role: "prefill"},
		{Count: 2, Profile: "tiny", NumGPUBlocks: 160, Role: "decode"}}
	runs = append(runs,
		run{"chat/mixed-fleet", Config{Fleet: mixed, Policy: policy.NameLeastRequest, Seed: 1}, chat, false},
		run{"chat/kv-events", Config{Fleet: ws[0].fleet, Seed: 1, KVEvents: true, Routers: 2}, chat, true},
		run{"rag/pd-always", Config{Fleet: pd, Seed: 1, PD: PDConfig{Mode: disagg.ModeAlways}}, rag, false},
		run{"rag/pd-conditional", Config{Fleet: pd, Seed: 1}, rag, false},
	)
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			res := mustRun(t, r.cfg, r.reqs)
			bounds := mustBounds(t, r.cfg.Fleet, r.reqs)
			ok, tight, below, preempted := 0, 0, 0, 0
			for i := range res.Records {
				rec := &res.Records[i]
				if want := bounds[i] + 2*DefaultNetLatency; bounds[i] > 0 && rec.TTFTBound != want {
					t.Fatalf("%s: record's bound %v, want TTFTBounds' %v + the network round trip = %v", rec.ID, rec.TTFTBound, bounds[i], want)
				}
				if !rec.OK() {
					continue
				}
				ok++
				preempted += min(rec.Preemptions, 1)
				if rec.TTFTBound <= 0 {
					t.Errorf("%s: completed (%d prompt tokens) but has no bound", rec.ID, rec.PromptTokens)
					continue
				}
				switch d := rec.TTFT - rec.TTFTBound; {
				case d < -boundEpsilon:
					below++
					if below <= 5 {
						t.Errorf("%s: TTFT %v is below its bound %v by %v (prompt %d, cached %d on %s, queue %v, prefill %v, first step %v, preemptions %d)",
							rec.ID, rec.TTFT, rec.TTFTBound, -d, rec.PromptTokens, rec.CachedTokens, rec.Engine, rec.Queue,
							rec.Prefill, rec.FirstDecode, rec.Preemptions)
					}
				case d <= boundEpsilon:
					tight++
				}
			}
			if below > 0 {
				t.Errorf("%d of %d completed requests below their bound", below, ok)
			}
			if ok < len(r.reqs)/2 || (r.tight && tight == 0) {
				t.Errorf("%d of %d requests completed, %d at their bound: want most to complete and some at the bound (a bound never reached may be too low)",
					ok, len(r.reqs), tight)
			}
			t.Logf("%d completed, %d at the bound, %d preempted; bound p99 %v, TTFT p99 %v", ok, tight, preempted,
				res.TTFTBound.P99, res.Row(0).TTFT.P99)
		})
	}
}

// TestBoundDistribution: Result.TTFTBound summarises the records' bounds
// with the report's percentiles; bounds given in Config are used as they
// are; the bounds do not depend on the policy.
func TestBoundDistribution(t *testing.T) {
	reqs := smallChat(t, 300, 60, 4)
	fleet := tinyFleet(2)
	res := mustRun(t, Config{Fleet: fleet, Policy: "round_robin", NetLatency: 3 * time.Millisecond}, reqs)
	var d []time.Duration
	for _, rec := range res.Records {
		if rec.TTFTBound > 0 {
			d = append(d, rec.TTFTBound)
		}
	}
	if len(d) != len(reqs) {
		t.Fatalf("%d of %d records have a bound, want all", len(d), len(reqs))
	}
	b := res.TTFTBound
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"p50", b.P50, report.Percentile(d, 0.5)},
		{"p90", b.P90, report.Percentile(d, 0.9)},
		{"p99", b.P99, report.Percentile(d, 0.99)},
		{"max", b.Max, report.Percentile(d, 1)},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if b.N != len(d) || !(b.P50 > 6*time.Millisecond) || !(b.P50 <= b.P90 && b.P90 <= b.P99 && b.P99 <= b.Max) {
		t.Errorf("distribution %+v: want %d bounds, each above the 6ms network round trip, ordered", b, len(d))
	}
	row := res.Row(0)
	if row.Completed == len(reqs) && (row.TTFT.P50 < b.P50 || row.TTFT.P99 < b.P99) {
		t.Errorf("TTFT p50 %v, p99 %v below the bound's %v, %v", row.TTFT.P50, row.TTFT.P99, b.P50, b.P99)
	}

	bounds := mustBounds(t, fleet, reqs)
	other := mustRun(t, Config{Fleet: fleet, Policy: "kv-aware", NetLatency: 3 * time.Millisecond, TTFTBounds: bounds}, reqs)
	if other.TTFTBound != b {
		t.Errorf("kv-aware with bounds given: %+v, round robin computing them: %+v; want the same", other.TTFTBound, b)
	}
	fake := make([]time.Duration, len(reqs))
	for i := range fake {
		fake[i] = time.Duration(i+1) * time.Second
	}
	given := mustRun(t, Config{Fleet: fleet, Policy: "round_robin", TTFTBounds: fake}, reqs)
	if got, want := given.Records[9].TTFTBound, 10*time.Second+2*DefaultNetLatency; got != want {
		t.Errorf("given bounds: record 9's bound %v, want %v", got, want)
	}
	if _, err := Run(t.Context(), Config{Fleet: fleet, TTFTBounds: fake[1:]}, reqs); err == nil {
		t.Error("TTFTBounds one short: got nil error")
	}
}

// TestTTFTBoundsEdges: requests no engine holds get no bound; a fleet
// takes each request's fastest group; bad fleets are errors.
func TestTTFTBoundsEdges(t *testing.T) {
	reqs := []workload.Request{
		segReq("short", 0, workload.Segment{Key: 1, Len: 300}),
		segReq("too-long", 0, workload.Segment{Key: 2, Len: 1100}), // tiny's context is 1,024
		{ID: "empty", Arrival: 0},
	}
	slow := mustBounds(t, Fleet{{Count: 1, Profile: "tiny", Speed: 0.5}}, reqs)
	fast := mustBounds(t, Fleet{{Count: 1, Profile: "tiny"}}, reqs)
	both := mustBounds(t, Fleet{{Count: 2, Profile: "tiny", Speed: 0.5}, {Count: 1, Profile: "tiny"}}, reqs)
	if slow[1] != 0 || slow[2] != 0 || fast[1] != 0 || fast[2] != 0 {
		t.Errorf("too long and empty prompts: got bounds %v and %v, want 0", slow[1:], fast[1:])
	}
	if !(slow[0] > fast[0]) || both[0] != fast[0] {
		t.Errorf("300 tokens: half speed %v, full speed %v, both groups %v: want the full speed's, lower", slow[0], fast[0], both[0])
	}
	if _, err := TTFTBounds(nil, reqs); err == nil {
		t.Error("empty fleet: got nil error")
	}
	if _, err := TTFTBounds(Fleet{{Count: 1, Profile: "nope"}}, reqs); err == nil {
		t.Error("unknown profile: got nil error")
	}
}

// A prompt prefilled from scratch, then one that extends it: the oracle
// holds the first one's 37 full blocks, so only the last 28 tokens count.
func ExampleTTFTBounds() {
	reqs := []workload.Request{
		{ID: "first", PromptLen: 600, OutputLen: 8, Segments: []workload.Segment{{Key: 1, Len: 600}}},
		{ID: "longer", Arrival: time.Second, PromptLen: 620, OutputLen: 8, Segments: []workload.Segment{{Key: 1, Len: 620}}},
	}
	bounds, err := TTFTBounds(Fleet{{Count: 2, Profile: "tiny"}}, reqs)
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, b := range bounds {
		fmt.Printf("%s: %v\n", reqs[i].ID, b)
	}
	// Output:
	// first: 18.174584ms
	// longer: 1.510425ms
}

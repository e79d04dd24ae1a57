package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/difftest"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/workload"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// smallChat is a chat workload sized for the tiny engine profile.
func smallChat(t testing.TB, n int, rate float64, seed uint64) []workload.Request {
	t.Helper()
	w, err := workload.Generate("chat", workload.Options{
		Seed:     seed,
		Requests: n,
		Arrivals: workload.Arrivals{Kind: workload.Poisson, Rate: rate},
		Params: map[string]float64{"turns": 3, "system_len": 96, "user_len": 40, "reply_len": 24,
			"think_s": 1, "max_len": 700},
	})
	if err != nil {
		t.Fatal(err)
	}
	return w.Requests
}

func tinyFleet(n int) Fleet { return Fleet{{Count: n, Profile: "tiny", NumGPUBlocks: 256}} }

func mustRun(t testing.TB, cfg Config, reqs []workload.Request) *Result {
	t.Helper()
	res, err := Run(context.Background(), cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestDeterministic(t *testing.T) {
	reqs := smallChat(t, 400, 40, 7)
	for _, pol := range []string{"kv-aware", "round_robin", "random", "power_of_two"} {
		t.Run(pol, func(t *testing.T) {
			cfg := Config{Fleet: tinyFleet(4), Policy: pol, Seed: 3, KVEvents: true, Routers: 2}
			a := mustRun(t, cfg, reqs)
			b := mustRun(t, cfg, reqs)
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if !bytes.Equal(ja, jb) {
				t.Fatalf("two runs with the same seed differ (%d vs %d bytes of JSON)", len(ja), len(jb))
			}
			ra, rb := a.Row(0), b.Row(0)
			if !reflect.DeepEqual(ra, rb) {
				t.Fatalf("rows differ:\n got %+v\nwant %+v", ra, rb)
			}
		})
	}
}

func TestConservation(t *testing.T) {
	reqs := smallChat(t, 300, 200, 11)
	// Add requests the engine must refuse (longer than its context).
	long := workload.Request{ID: "too-long", Arrival: reqs[10].Arrival, PromptLen: 2000, OutputLen: 8,
		Segments: []workload.Segment{{Key: 99, Len: 2000}}}
	reqs = append(reqs, long)
	// A picker that sheds every third request.
	n := 0
	shed := kvroute.PickerFunc(func(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
		n++
		if n%3 == 0 && req.ID != "too-long" {
			d := kvroute.None("shed-some", "test shed")
			d.Shed = true
			return d
		}
		for i := range cands {
			j := (n + i) % len(cands)
			if cands[j].Healthy {
				return kvroute.Chose("shed-some", cands, j, "rotate")
			}
		}
		return kvroute.None("shed-some", "none healthy")
	})
	res := mustRun(t, Config{Fleet: tinyFleet(3), Picker: shed, Policy: "shed-some"}, reqs)
	if len(res.Records) != len(reqs) {
		t.Fatalf("records: got %d, want %d", len(res.Records), len(reqs))
	}
	counts := map[int]int{}
	for i, r := range res.Records {
		if r.ID != reqs[i].ID {
			t.Fatalf("record %d: got id %q, want %q (workload order)", i, r.ID, reqs[i].ID)
		}
		counts[r.Status]++
		switch r.Status {
		case http.StatusOK:
			if r.OutputTokens != reqs[i].OutputLen {
				t.Errorf("%s: got %d output tokens, want %d", r.ID, r.OutputTokens, reqs[i].OutputLen)
			}
			if r.TTFT <= 0 || r.E2E < r.TTFT {
				t.Errorf("%s: TTFT %v, E2E %v", r.ID, r.TTFT, r.E2E)
			}
			if sum := r.Network + r.Queue + r.Prefill + r.FirstDecode; sum != r.TTFT {
				t.Errorf("%s: TTFT %v != network %v + queue %v + prefill %v + first step %v", r.ID, r.TTFT,
					r.Network, r.Queue, r.Prefill, r.FirstDecode)
			}
		case http.StatusTooManyRequests:
			if r.Engine != "" {
				t.Errorf("%s: shed but engine %q", r.ID, r.Engine)
			}
		case http.StatusBadRequest:
			if r.ID != "too-long" {
				t.Errorf("%s: refused by the engine: %s", r.ID, r.Error)
			}
		default:
			t.Errorf("%s: status %d (%s)", r.ID, r.Status, r.Error)
		}
	}
	if counts[http.StatusBadRequest] != 1 {
		t.Errorf("engine refusals: got %d, want 1", counts[http.StatusBadRequest])
	}
	if want := len(reqs) / 3; counts[http.StatusTooManyRequests] < want-1 || counts[http.StatusTooManyRequests] > want+1 {
		t.Errorf("shed: got %d, want about %d", counts[http.StatusTooManyRequests], want)
	}
	row := res.Row(0)
	if got := row.Completed + row.Rejected + row.ErrorCount(); got != row.Requests || row.Requests != len(reqs) {
		t.Errorf("row: completed %d + rejected %d + errors %d = %d, want %d", row.Completed, row.Rejected,
			row.ErrorCount(), got, len(reqs))
	}
	routed := 0
	for _, e := range res.Engines {
		routed += e.Requests
	}
	if want := len(reqs) - counts[http.StatusTooManyRequests]; routed != want {
		t.Errorf("routed: got %d, want %d", routed, want)
	}
}

func TestEmptyWorkloadAndBadConfig(t *testing.T) {
	res, err := Run(context.Background(), Config{Fleet: tinyFleet(1)}, nil)
	if err != nil || len(res.Records) != 0 {
		t.Fatalf("empty workload: got %v, %v", res, err)
	}
	for name, cfg := range map[string]Config{
		"no fleet":       {},
		"bad profile":    {Fleet: Fleet{{Count: 1, Profile: "nope"}}},
		"bad policy":     {Fleet: tinyFleet(1), Policy: "nope"},
		"bad rate scale": {Fleet: tinyFleet(1), RateScale: -1},
	} {
		if _, err := Run(context.Background(), cfg, smallChat(t, 5, 1, 1)); err == nil {
			t.Errorf("%s: got nil error", name)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{Fleet: tinyFleet(1)}, smallChat(t, 5, 1, 1)); err == nil {
		t.Error("cancelled context: got nil error")
	}
}

func TestHeterogeneousFleet(t *testing.T) {
	reqs := smallChat(t, 600, 100, 5)
	fleet := Fleet{
		{Count: 2, Profile: "tiny", NumGPUBlocks: 256},
		{Count: 2, Profile: "tiny", NumGPUBlocks: 256, Speed: 0.1},
	}
	res := mustRun(t, Config{Fleet: fleet, Policy: "least_request", Seed: 1}, reqs)
	if len(res.Engines) != 4 {
		t.Fatalf("engines: got %d, want 4", len(res.Engines))
	}
	fast := res.Engines[0].Requests + res.Engines[1].Requests
	slow := res.Engines[2].Requests + res.Engines[3].Requests
	if fast <= slow {
		t.Errorf("least-request load: fast engines got %d requests, slow (10x slower) ones %d; want the fast ones to take more", fast, slow)
	}
	// Round robin ignores speed: the slow engines pile up and TTFT suffers.
	rr := mustRun(t, Config{Fleet: fleet, Policy: "round_robin", Seed: 1}, reqs)
	t.Logf("p99 TTFT: round robin %v, least request %v; requests fast %d, slow %d", rr.Row(0).TTFT.P99, res.Row(0).TTFT.P99, fast, slow)
	if a, b := rr.Row(0).TTFT.P99, res.Row(0).TTFT.P99; a <= b {
		t.Errorf("p99 TTFT: round robin %v <= least request %v on a mixed-speed fleet", a, b)
	}
	if row := res.Row(0); row.Completed != len(reqs) {
		t.Errorf("completed: got %d, want %d", row.Completed, len(reqs))
	}
}

// TestFleetWeights: a fleet group's weight reaches the router's
// endpoints: round robin sends engines of weights 1 and 3 requests 1:3.
func TestFleetWeights(t *testing.T) {
	reqs := smallChat(t, 400, 20, 3)
	fleet, err := ParseFleetFile([]byte("engines:\n  - {count: 1, profile: tiny}\n  - {count: 1, profile: tiny, weight: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	res := mustRun(t, Config{Fleet: fleet, Policy: "round_robin", Seed: 1}, reqs)
	if a, b := res.Engines[0].Requests, res.Engines[1].Requests; a != 100 || b != 300 {
		t.Errorf("requests on weights 1 and 3: got %d and %d, want 100 and 300", a, b)
	}
}

func TestRateScale(t *testing.T) {
	reqs := smallChat(t, 300, 20, 9)
	slow := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin", RateScale: 0.5}, reqs)
	fast := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin", RateScale: 2}, reqs)
	last, first := len(reqs)-1, reqs[0].Arrival // the scaling keeps the first arrival
	if got, want := slow.Records[last].Arrival-first, 4*(fast.Records[last].Arrival-first); absDur(got-want) > time.Microsecond {
		t.Errorf("scaled arrivals after the first: got %v at 0.5x, want 4 x %v", got, fast.Records[last].Arrival-first)
	}
	if slow.Records[0].Arrival != first || fast.Records[0].Arrival != first {
		t.Errorf("first arrival %v at 0.5x, %v at 2x: want the workload's %v", slow.Records[0].Arrival, fast.Records[0].Arrival, first)
	}
	if fast.Row(0).TTFT.P99 < slow.Row(0).TTFT.P99 {
		t.Errorf("p99 TTFT at 4x the load (%v) below the light load's (%v)", fast.Row(0).TTFT.P99, slow.Row(0).TTFT.P99)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func TestOracleBoundsHitRate(t *testing.T) {
	reqs := smallChat(t, 400, 40, 2)
	for _, pol := range []string{"kv-aware", "round_robin"} {
		res := mustRun(t, Config{Fleet: tinyFleet(4), Policy: pol}, reqs)
		row := res.Row(0)
		if row.OracleHitRate <= 0 || row.HitRate > row.OracleHitRate+1e-9 {
			t.Errorf("%s: hit rate %.3f, oracle %.3f: want 0 < hit <= oracle", pol, row.HitRate, row.OracleHitRate)
		}
	}
}

// TestStaleSignals shows the stale-signal effect. Near saturation, a policy
// that balances on scraped KV usage (llm-d's kv-cache-utilization scorer
// alone) herds onto the engine that looked emptiest at the last scrape: the
// router corrects the scrape with the prompts it dispatched since, but not
// with the cache the engines' decodes fill. p99 TTFT grows with the scrape
// interval.
func TestStaleSignals(t *testing.T) {
	reqs := smallChat(t, 1500, 350, 4)
	run := func(interval time.Duration) (p99 time.Duration, imbalance float64) {
		res := mustRun(t, Config{Fleet: tinyFleet(4), Policy: "llm-d", Seed: 1,
			PolicyParams:   map[string]any{"prefix_weight": 0, "queue_weight": 0, "kv_weight": 1},
			ScrapeInterval: interval, StaleAfter: time.Hour}, reqs)
		row := res.Row(0)
		return row.TTFT.P99, row.Imbalance
	}
	fresh, freshImb := run(5 * time.Millisecond)
	stale, staleImb := run(time.Second)
	t.Logf("p99 TTFT %v (imbalance %.2f) with 5ms scrapes, %v (%.2f) with 1s scrapes", fresh, freshImb, stale, staleImb)
	if stale <= fresh {
		t.Errorf("p99 TTFT %v with 1s scrapes <= %v with 5ms scrapes; want stale signals to hurt", stale, fresh)
	}
	if staleImb <= freshImb {
		t.Errorf("imbalance %.2f with 1s scrapes <= %.2f with 5ms scrapes; want stale signals to herd", staleImb, freshImb)
	}
}

// golden is the part of a run a golden file pins: the summary row and a few
// records.
type golden struct {
	Row     any      `json:"row"`
	Engines any      `json:"engines"`
	Records []Record `json:"records"`
}

// TestGoldenTinyScenario pins the outcome of a tiny scenario. It uses the
// baseline policies, which do not change as the tuned ones do; a change to
// the engine model, the router or the simulator shows up here.
func TestGoldenTinyScenario(t *testing.T) {
	reqs := smallChat(t, 60, 30, 1)
	for _, pol := range []string{"least_request", "round_robin"} {
		t.Run(pol, func(t *testing.T) {
			res := mustRun(t, Config{Fleet: tinyFleet(3), Policy: pol, Seed: 1, SLO: SLO{TTFT: 50 * time.Millisecond}}, reqs)
			g := golden{Row: res.Row(0), Engines: res.Engines, Records: res.Records[:12]}
			got, err := json.MarshalIndent(g, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", "golden_"+pol+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the simulation (run go test ./sim -run Golden -update after checking the change):\n%s",
					path, difftest.FirstLine(got, want))
			}
		})
	}
}

func TestKVEventsFeedPreciseIndex(t *testing.T) {
	reqs := smallChat(t, 300, 40, 8)
	count := func(delay time.Duration) (precise int) {
		n := 0
		p := kvroute.PickerFunc(func(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
			for i := range cands {
				if cands[i].Precise && cands[i].CachedBlocks > 0 {
					precise++
				}
			}
			n++
			return kvroute.Chose("rotate", cands, n%len(cands), "rotate")
		})
		res := mustRun(t, Config{Fleet: tinyFleet(3), Picker: p, Policy: "rotate", KVEvents: true, KVEventDelay: delay}, reqs)
		if row := res.Row(0); row.Completed != len(reqs) {
			t.Fatalf("completed %d of %d", row.Completed, len(reqs))
		}
		return precise
	}
	if got := count(10 * time.Millisecond); got == 0 {
		t.Error("KV events after 10ms: no candidate ever had a precise prefix hit")
	}
	if got := count(time.Hour); got != 0 {
		t.Errorf("KV events after 1h: got %d precise hits, want 0 (no event is delivered during the run)", got)
	}
}

func TestDuplicateWorkloadIDs(t *testing.T) {
	reqs := smallChat(t, 50, 100, 12)
	for i := range reqs {
		reqs[i].ID = "same"
	}
	res := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin"}, reqs)
	if row := res.Row(0); row.Completed != len(reqs) {
		t.Fatalf("completed %d of %d requests sharing one ID", row.Completed, len(reqs))
	}
}

func TestParseEngineID(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int32
		ok   bool
	}{{"0", 0, true}, {"12031", 12031, true}, {"", 0, false}, {"-1", 0, false}, {"1x", 0, false}, {"1234567890", 0, false}} {
		if got, ok := parseEngineID(tt.in); got != tt.want || ok != tt.ok {
			t.Errorf("parseEngineID(%q): got %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRouterTextMode(t *testing.T) {
	reqs := smallChat(t, 300, 40, 6)
	tok := mustRun(t, Config{Fleet: tinyFleet(3), Policy: "sglang-cache-aware", Seed: 1}, reqs)
	txt := mustRun(t, Config{Fleet: tinyFleet(3), Policy: "sglang-cache-aware", Seed: 1, RouterText: true}, reqs)
	rt, rx := tok.Row(0), txt.Row(0)
	t.Logf("hit rate: tokens %.3f, text %.3f", rt.HitRate, rx.HitRate)
	if rx.Completed != len(reqs) {
		t.Fatalf("text mode: completed %d of %d", rx.Completed, len(reqs))
	}
	// Both modes see the same sharing: affinity must work in both.
	rr := mustRun(t, Config{Fleet: tinyFleet(3), Policy: "round_robin", Seed: 1}, reqs).Row(0)
	if rx.HitRate <= rr.HitRate || rt.HitRate <= rr.HitRate {
		t.Errorf("hit rate: sglang-cache-aware %.3f (tokens), %.3f (text), round robin %.3f; want affinity to beat round robin in both modes",
			rt.HitRate, rx.HitRate, rr.HitRate)
	}
	if _, err := Run(context.Background(), Config{Fleet: tinyFleet(1), RouterText: true, KVEvents: true}, reqs); err == nil {
		t.Error("text mode with KV events: got nil error")
	}
}

// TestEveryPolicy runs every policy through the simulator, with and without
// KV events and router replicas, and checks that every request is accounted
// for exactly once.
func TestEveryPolicy(t *testing.T) {
	reqs := smallChat(t, 250, 80, 21)
	for _, pol := range policy.Names() {
		for _, kv := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/kv-events=%v", pol, kv), func(t *testing.T) {
				routers := 1
				if kv {
					routers = 2
				}
				res := mustRun(t, Config{Fleet: tinyFleet(3), Policy: pol, Seed: 2, KVEvents: kv, Routers: routers}, reqs)
				row := res.Row(0)
				if got := row.Completed + row.Rejected + row.ErrorCount(); got != len(reqs) {
					t.Fatalf("completed %d + rejected %d + errors %d = %d, want %d", row.Completed, row.Rejected,
						row.ErrorCount(), got, len(reqs))
				}
				if row.Completed == 0 {
					t.Fatal("nothing completed")
				}
			})
		}
	}
}

func TestTimeline(t *testing.T) {
	reqs := smallChat(t, 400, 100, 13)
	res := mustRun(t, Config{Fleet: tinyFleet(3), Policy: "round_robin", TimelineStep: 500 * time.Millisecond}, reqs)
	if len(res.Busy) != 3 || len(res.KVUsage) != 3 || len(res.Queue) != 3 {
		t.Fatalf("timeline engines: got %d/%d/%d series, want 3", len(res.Busy), len(res.KVUsage), len(res.Queue))
	}
	wantBuckets := int(res.Makespan/res.TimelineStep) + 1
	var busy time.Duration
	for e := range res.Busy {
		if n := len(res.Busy[e]); n < wantBuckets-1 || n > wantBuckets+1 {
			t.Errorf("engine %d: %d buckets over a %v makespan at %v, want about %d", e, n, res.Makespan, res.TimelineStep, wantBuckets)
		}
		for b, f := range res.Busy[e] {
			if f < 0 || f > 1+1e-9 || res.KVUsage[e][b] < 0 || res.KVUsage[e][b] > 1 {
				t.Fatalf("engine %d bucket %d: busy %g, KV usage %g, want both in [0, 1]", e, b, f, res.KVUsage[e][b])
			}
			busy += time.Duration(f * float64(res.TimelineStep))
		}
	}
	var total time.Duration
	for _, e := range res.Engines {
		total += e.Busy
		if e.Utilisation <= 0 || e.Utilisation > 1 {
			t.Errorf("%s: utilisation %g, want in (0, 1]", e.ID, e.Utilisation)
		}
	}
	if d := busy - total; d > time.Millisecond || d < -time.Millisecond {
		t.Errorf("timeline busy time %v, engines' busy time %v: want equal", busy, total)
	}
	u := res.Utilisation("rr")
	if len(u) != 2 || len(u[0].Engines) != 3 || len(u[0].Engines[0].X) != len(res.Busy[0]) {
		t.Errorf("report utilisation: got %d charts, want 2 with 3 engines each and one point per bucket", len(u))
	}
}

func TestDrainBoundsOverload(t *testing.T) {
	reqs := smallChat(t, 600, 2000, 14) // far beyond two toy engines
	res := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin", Drain: 100 * time.Millisecond}, reqs)
	last := time.Duration(0)
	for _, r := range res.Records {
		last = max(last, r.Arrival)
	}
	if res.Makespan > last+100*time.Millisecond {
		t.Errorf("makespan %v, want at most the last arrival %v + 100ms", res.Makespan, last)
	}
	row := res.Row(0)
	if row.Errors["http_504"] == 0 || row.Completed == 0 {
		t.Fatalf("completed %d, errors %v: want some of each", row.Completed, row.Errors)
	}
	if got := row.Completed + row.Rejected + row.ErrorCount(); got != len(reqs) {
		t.Errorf("accounted %d of %d requests", got, len(reqs))
	}
	// The engines' busy time is over the run's makespan, not past its end:
	// a step the drain cut counted whole (utilisation above 1).
	for _, e := range res.Engines {
		if e.Busy > res.Makespan || e.Utilisation > 1 {
			t.Errorf("engine %s: busy %v, utilisation %.4f over a makespan of %v", e.ID, e.Busy, e.Utilisation, res.Makespan)
		}
	}
	full := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin"}, reqs).Row(0)
	if full.Completed != len(reqs) {
		t.Errorf("without drain: completed %d of %d", full.Completed, len(reqs))
	}
}

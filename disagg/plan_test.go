package disagg

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/router"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

type candSpec struct {
	ep     *kvroute.Endpoint
	load   kvroute.Load
	cached int
	down   bool
}

func cands(specs ...candSpec) []kvroute.Candidate {
	out := make([]kvroute.Candidate, len(specs))
	for i, s := range specs {
		out[i] = kvroute.Candidate{Endpoint: s.ep, Healthy: !s.down, Load: s.load, CachedTokens: s.cached,
			CachedBlocks: s.cached / 16, Tier: kvroute.TierGPU}
		if s.cached == 0 {
			out[i].Tier = kvroute.TierNone
		}
	}
	return out
}

func newPlanner(t testing.TB, mode Mode, links Links) *Planner {
	t.Helper()
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "llama-3.1-8b-h100"), Links: links, Mode: mode, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

func req(id string, prompt, maxTokens int) *kvroute.Request {
	return &kvroute.Request{ID: id, Model: "m", PromptTokens: prompt, MaxTokens: maxTokens, BlockSize: 16,
		BlockHashes: make([]uint64, prompt/16)}
}

// pool returns 2 prefill and 2 decode endpoints over the default links:
// p1 and d1 share a node (NVLink), everything shares a rack (RDMA).
func pool() (p1, p2, d1, d2 *kvroute.Endpoint) {
	return ep("p1", kvroute.RolePrefill, "node", "n1", "rack", "r1"), ep("p2", kvroute.RolePrefill, "node", "n2", "rack", "r1"),
		ep("d1", kvroute.RoleDecode, "node", "n1", "rack", "r1"), ep("d2", kvroute.RoleDecode, "node", "n3", "rack", "r1")
}

func render(b *strings.Builder, name string, pl Plan) {
	mode := "aggregated"
	if pl.Disaggregated {
		mode = "disaggregated"
	}
	pf := "-"
	if pl.Prefill != nil {
		pf = pl.Prefill.ID
	}
	df := "-"
	if pl.Decode != nil {
		df = pl.Decode.ID
	}
	fmt.Fprintf(b, "%s: %s prefill=%s decode=%s first=%s link=%s\n  reason: %s\n  parts:", name, mode, pf, df,
		pl.Decision.Endpoint, pl.Transfer.Link.Name, pl.Decision.Reason)
	if pl.Decision.Index >= 0 {
		for _, p := range pl.Decision.Scores[0].Parts {
			fmt.Fprintf(b, " %s=%.1f", p.Name, p.Value)
		}
	}
	b.WriteString("\n")
}

// TestConditionalGolden runs the conditional-disaggregation rule (and the
// always/never modes) over hand-built pools and compares every decision,
// with its reason and estimates, to testdata/golden/conditional.txt.
// Regenerate with go test ./disagg -run Golden -update.
func TestConditionalGolden(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	p1, p2, d1, d2 := pool()
	busyDecode := kvroute.Load{Running: 48, DecodeTokens: 48 * 3000, KVUsage: 0.4, PrefixHitRate: -1}
	busyPrefill := kvroute.Load{InFlight: 6, InFlightTokens: 6 * 8192, Waiting: 6, PrefixHitRate: -1}
	fullKV := kvroute.Load{Running: 10, DecodeTokens: 10 * 4000, KVUsage: 0.99, PrefixHitRate: -1}
	type scen struct {
		name  string
		mode  Mode
		req   *kvroute.Request
		cands []kvroute.Candidate
	}
	scens := []scen{
		{"short-prompt", ModeConditional, req("a", 200, 64), cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"long-8k-idle", ModeConditional, req("b", 8192, 256), cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"mid-3k-idle", ModeConditional, req("c", 3000, 256), cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"mid-3k-busy-decode", ModeConditional, req("d", 3000, 256),
			cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1, load: busyDecode}, candSpec{ep: d2, load: busyDecode})},
		{"mid-3k-busy-prefill", ModeConditional, req("e", 3000, 256),
			cands(candSpec{ep: p1, load: busyPrefill}, candSpec{ep: p2, load: busyPrefill}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"8k-mostly-cached-on-decode", ModeConditional, req("f", 8192, 256),
			cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1, cached: 7168}, candSpec{ep: d2})},
		{"8k-cached-on-p2", ModeConditional, req("g", 8192, 256),
			cands(candSpec{ep: p1}, candSpec{ep: p2, cached: 6144}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"d1-kv-full", ModeConditional, req("h", 8192, 256),
			cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1, load: fullKV}, candSpec{ep: d2})},
		{"prefill-pool-down", ModeConditional, req("i", 8192, 256),
			cands(candSpec{ep: p1, down: true}, candSpec{ep: p2, down: true}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"decode-pool-down", ModeConditional, req("j", 8192, 256),
			cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1, down: true}, candSpec{ep: d2, down: true})},
		{"mid-3k-always", ModeAlways, req("k", 3000, 256), cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"long-8k-never", ModeNever, req("l", 8192, 256), cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2})},
		{"32k-idle", ModeConditional, req("m", 32768, 256), cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2})},
	}
	var b strings.Builder
	for _, s := range scens {
		for _, links := range []struct {
			name string
			l    Links
		}{{"default", DefaultLinks()}, {"tcp100", UniformLinks(Link{Name: "tcp", Gbps: 100, Setup: 2 * time.Millisecond})}} {
			pl := newPlanner(t, s.mode, links.l)
			render(&b, s.name+"/"+links.name, pl.Plan(t0, s.req, s.cands))
		}
	}
	// Congestion: three 32k handoffs planned at once over 100G TCP; later
	// ones see the earlier ones' transfers queued on the shared ports.
	// One decode node (the other's KV is full) and two prefill nodes on
	// their own nodes: the second handoff queues behind the first at the
	// decode node's port.
	pl := newPlanner(t, ModeConditional, UniformLinks(Link{Name: "tcp", Gbps: 100, Setup: 2 * time.Millisecond}))
	cs := cands(candSpec{ep: ep("p1", kvroute.RolePrefill)}, candSpec{ep: ep("p2", kvroute.RolePrefill)},
		candSpec{ep: ep("d1", kvroute.RoleDecode)}, candSpec{ep: ep("d2", kvroute.RoleDecode), load: fullKV})
	for i := range 3 {
		render(&b, fmt.Sprintf("congestion-32k-tcp100/%d", i), pl.Plan(t0, req(fmt.Sprintf("x%d", i), 32768, 256), cs))
	}
	golden(t, "testdata/golden/conditional.txt", b.String())
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s line %d:\ngot  %s\nwant %s\n(run with -update if the change is intended)", path, i+1, g, w)
			}
		}
	}
}

func TestPlannerInvariants(t *testing.T) {
	p1, p2, d1, d2 := pool()
	both := ep("b1", kvroute.RoleBoth, "node", "n9")
	t0 := time.Unix(1_700_000_000, 0)
	for _, mode := range []Mode{ModeConditional, ModeAlways, ModeNever} {
		pl := newPlanner(t, mode, DefaultLinks())
		for n := 16; n <= 65536; n *= 2 {
			cs := cands(candSpec{ep: p1}, candSpec{ep: p2}, candSpec{ep: d1}, candSpec{ep: d2}, candSpec{ep: both})
			plan := pl.Plan(t0, req("r", n, 128), cs)
			if plan.Decision.Index < 0 {
				t.Fatalf("%s/%d: no plan: %s", mode, n, plan.Decision.Reason)
			}
			if !plan.Decode.Role.CanDecode() || !plan.Prefill.Role.CanPrefill() && plan.Disaggregated {
				t.Errorf("%s/%d: got prefill %s (%v) decode %s (%v)", mode, n, plan.Prefill.ID, plan.Prefill.Role, plan.Decode.ID, plan.Decode.Role)
			}
			if plan.Disaggregated && plan.Prefill.ID == plan.Decode.ID {
				t.Errorf("%s/%d: disaggregated onto one endpoint %s", mode, n, plan.Decode.ID)
			}
			if mode == ModeNever && plan.Disaggregated {
				t.Errorf("never/%d: got disaggregated", n)
			}
			if mode == ModeAlways && !plan.Disaggregated {
				t.Errorf("always/%d: got aggregated: %s", n, plan.Reason)
			}
			want := plan.Decode.ID
			if plan.Disaggregated {
				want = plan.Prefill.ID
			}
			if plan.Decision.Endpoint != want {
				t.Errorf("%s/%d: first leg %s, want %s", mode, n, plan.Decision.Endpoint, want)
			}
			pl.Finish(plan.Ticket)
		}
	}
}

func TestPlannerConfig(t *testing.T) {
	prof := mustProfile(t, "tiny")
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no profile", Config{}},
		{"bad mode", Config{Profile: prof, Mode: "sometimes"}},
		{"bad ratio", Config{Profile: prof, Conditional: Conditional{LocalRatio: 2}}},
		{"bad soft cap", Config{Profile: prof, Decode: DecodeParams{KVSoftCap: 1.5}}},
		{"bad link", Config{Profile: prof, Links: Links{Default: Link{Gbps: -1}}}},
	} {
		if _, err := NewPlanner(tc.cfg); err == nil {
			t.Errorf("%s: got no error", tc.name)
		}
	}
	if _, err := NewPlanner(Config{Profile: prof}); err != nil {
		t.Errorf("tiny: %v", err)
	}
	var _ = engine.Profile{}
}

// TestDecodePicker: decode placement ignores prefixes and follows KV
// headroom, batch and transfer cost.
func TestDecodePicker(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	pl := newPlanner(t, ModeAlways, DefaultLinks())
	p := ep("p", kvroute.RolePrefill, "node", "n1", "rack", "r1")
	near := ep("near", kvroute.RoleDecode, "node", "n1", "rack", "r1") // NVLink from p
	far := ep("far", kvroute.RoleDecode, "node", "n2", "rack", "r1")   // RDMA from p
	busy := kvroute.Load{Running: 200, DecodeTokens: 200 * 6000, KVUsage: 0.5}
	full := kvroute.Load{KVUsage: 0.999}
	for _, tc := range []struct {
		name  string
		cands []kvroute.Candidate
		want  string
	}{
		{"transfer: NVLink beats RDMA", cands(candSpec{ep: far}, candSpec{ep: near}), "near"},
		{"prefix ignored", cands(candSpec{ep: far}, candSpec{ep: near, cached: 0}, candSpec{ep: ep("cached", kvroute.RoleDecode, "node", "n3"), cached: 8000}), "near"},
		{"batch: a busy near node loses", cands(candSpec{ep: far}, candSpec{ep: near, load: busy}), "far"},
		{"kv headroom: a full node is not chosen", cands(candSpec{ep: far}, candSpec{ep: near, load: full}), "far"},
		{"role: prefill nodes never decode", cands(candSpec{ep: ep("p2", kvroute.RolePrefill, "node", "n1")}, candSpec{ep: far}), "far"},
	} {
		dp := pl.NewDecodePicker()
		got := dp.PickFrom(t0, t0, req("r", 8192, 256), tc.cands, p)
		if got.d.Endpoint != tc.want {
			t.Errorf("%s: got %q (%s), want %q", tc.name, got.d.Endpoint, got.d.Reason, tc.want)
		}
	}
	// Every candidate full: the least bad still gets the request.
	dp := pl.NewDecodePicker()
	got := dp.PickFrom(t0, t0, req("r", 8192, 256), cands(candSpec{ep: far, load: full}, candSpec{ep: near, load: full}), p)
	if got.d.Index < 0 || !strings.Contains(got.d.Reason, "least bad") {
		t.Errorf("all full: got %+v", got.d)
	}
	// As a plain kvroute.Picker (no prefill node): no transfer term.
	if d := dp.Pick(t0, req("r", 100, 10), cands(candSpec{ep: far})); d.Endpoint != "far" {
		t.Errorf("Pick: got %+v", d)
	}
}

// hearingPicker records the flight events a Planner passes on.
type hearingPicker struct {
	kvroute.Picker
	firstTokens, releases []string
}

func (h *hearingPicker) FirstToken(_ time.Time, req *kvroute.Request, endpoint string) {
	h.firstTokens = append(h.firstTokens, req.ID+"@"+endpoint)
}

func (h *hearingPicker) Release(_ time.Time, req *kvroute.Request, endpoint string) {
	h.releases = append(h.releases, req.ID+"@"+endpoint)
}

// TestPlannerPassesFlightEvents: the prefill picker hears first tokens and
// releases through the Planner, as it would without disaggregation.
func TestPlannerPassesFlightEvents(t *testing.T) {
	inner := &hearingPicker{Picker: kvroute.PickerFunc(func(time.Time, *kvroute.Request, []kvroute.Candidate) kvroute.Decision {
		return kvroute.None("test", "unused")
	})}
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "llama-3.1-8b-h100"), Prefill: inner, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var o router.FirstTokenObserver = pl
	now := time.Unix(1_800_000_000, 0)
	o.FirstToken(now, req("r1", 512, 8), "p0")
	pl.Release(now, req("r1", 512, 8), "p0")
	if want := []string{"r1@p0"}; !slices.Equal(inner.firstTokens, want) || !slices.Equal(inner.releases, want) {
		t.Fatalf("prefill picker heard first tokens %v and releases %v, want %v each", inner.firstTokens, inner.releases, want)
	}
}

package sim

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/workload"
)

func pdWorkload(t *testing.T) []workload.Request {
	t.Helper()
	w, err := workload.Generate("rag", workload.Options{Seed: 3, Requests: 150, Arrivals: workload.Arrivals{Rate: 6},
		Params: map[string]float64{"docs": 100, "doc_len": 8000, "output_len": 64}})
	if err != nil {
		t.Fatal(err)
	}
	return w.Requests
}

func pdRun(t *testing.T, fleet string, mode disagg.Mode, gbps float64) *Result {
	t.Helper()
	f, err := ParseFleet(fleet, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Config{Fleet: f, Seed: 1, PD: PDConfig{Mode: mode,
		Links: disagg.UniformLinks(disagg.Link{Name: "fabric", Gbps: gbps, Setup: time.Millisecond})}}, pdWorkload(t))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

const pdFleet = "2xllama-3.1-8b-h100/prefill,2xllama-3.1-8b-h100/decode"

func TestPDSimulation(t *testing.T) {
	always := pdRun(t, pdFleet, disagg.ModeAlways, 400)
	slow := pdRun(t, pdFleet, disagg.ModeAlways, 100)
	never := pdRun(t, pdFleet, disagg.ModeNever, 400)
	if always.Policy != "pd-always:kv-aware" {
		t.Errorf("got policy name %q", always.Policy)
	}
	gbps := map[string]float64{"always": 400, "slow": 100, "never": 400}
	for name, res := range map[string]*Result{"always": always, "slow": slow, "never": never} {
		pulled := map[string]int64{}
		for _, tr := range res.Transfers {
			pulled[tr.ID] = tr.Bytes
		}
		for i := range res.Records {
			r := &res.Records[i]
			if !r.OK() {
				t.Fatalf("%s: request %s: status %d %s", name, r.ID, r.Status, r.Error)
			}
			sum := r.Network + r.Queue + r.Prefill + r.Transfer + r.FirstDecode
			if d := r.TTFT - sum; d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("%s: request %s: TTFT %v, parts sum to %v (%+v)", name, r.ID, r.TTFT, sum, r)
			}
			switch name {
			case "never":
				if r.Transfer != 0 || r.PrefillEngine != "" || (r.Engine != "e2" && r.Engine != "e3") {
					t.Errorf("never: request %s ran on %s/%s with transfer %v", r.ID, r.PrefillEngine, r.Engine, r.Transfer)
				}
			default:
				// At least the wire time of the KV pulled (the prompt
				// past the decode engine's prefix-cache hit).
				wire := time.Duration(float64(pulled[r.ID]) * 8 / (gbps[name] * 1e9) * float64(time.Second))
				if pulled[r.ID] <= 0 || r.Transfer < wire || (r.PrefillEngine != "e0" && r.PrefillEngine != "e1") || (r.Engine != "e2" && r.Engine != "e3") {
					t.Errorf("%s: request %s: prefill %s decode %s transfer %v (wire alone %v)", name, r.ID, r.PrefillEngine, r.Engine, r.Transfer, wire)
				}
			}
		}
	}
	fast, slowB := always.TTFTBreakdown(), slow.TTFTBreakdown()
	if slowB.Transfer < 3*fast.Transfer {
		t.Errorf("mean transfer: got %v at 100 Gb/s and %v at 400 Gb/s, want about 4x", slowB.Transfer, fast.Transfer)
	}
	// Determinism: the same config gives the same records.
	again := pdRun(t, pdFleet, disagg.ModeAlways, 400)
	for i := range always.Records {
		if always.Records[i] != again.Records[i] {
			t.Fatalf("run differs at %d: %+v vs %+v", i, always.Records[i], again.Records[i])
		}
	}
}

func TestPDSimulationConditional(t *testing.T) {
	res := pdRun(t, pdFleet, disagg.ModeConditional, 400)
	var dis, agg int
	for i := range res.Records {
		r := &res.Records[i]
		if !r.OK() {
			t.Fatalf("request %s: status %d %s", r.ID, r.Status, r.Error)
		}
		if r.PrefillEngine != "" {
			dis++
		} else {
			agg++
		}
	}
	if dis == 0 || agg == 0 {
		t.Errorf("conditional: got %d disaggregated and %d aggregated, want both kinds on this workload", dis, agg)
	}
}

func TestPDFleetParse(t *testing.T) {
	f, err := ParseFleet("2xtiny/prefill,tiny/decode,tiny", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.String(), "2xtiny/prefill,1xtiny/decode,1xtiny"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := ParseFleet("2xtiny/sideways", ""); err == nil {
		t.Error("bad role: got no error")
	}
	cfg := Config{Fleet: f, PD: PDConfig{Mode: "sometimes"}}
	cfg.applyDefaults()
	if err := cfg.Validate(); err == nil {
		t.Error("bad mode: got no error")
	}
}

// TestPDFleetOneModel: a P/D fleet whose prefill and decode engines run
// different models is refused (the decode engine cannot use the other
// model's KV; the run priced the handoff with the prefill model's shape and
// decoded on the other model); one model on other hardware, TP or overrides
// is a P/D fleet.
func TestPDFleetOneModel(t *testing.T) {
	reqs := pdWorkload(t)[:5]
	for spec, ok := range map[string]bool{
		"1xllama-3.1-8b-h100/prefill,1xqwen2.5-7b-h100/decode":        false,
		"1xllama-3.1-8b-h100/prefill,1xllama-3.1-70b-h100-tp4/decode": false,
		"1xllama-3.1-8b-h100,1xqwen2.5-7b-h100/decode":                false,
		"1xllama-3.1-8b-h100/prefill,2xllama-3.1-8b-h100/decode":      true,
		"1xllama-3.1-8b-h100,1xqwen2.5-7b-h100":                       true, // aggregated: no handoff
	} {
		f, err := ParseFleet(spec, "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Run(context.Background(), Config{Fleet: f, Seed: 1}, reqs)
		if ok && err != nil {
			t.Errorf("%s: got %v, want a run", spec, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), "a P/D fleet runs one model")) {
			t.Errorf("%s: got %v, want the one-model error", spec, err)
		}
	}
	// Other hardware (a fleet file's speed and blocks) for the same model.
	f := Fleet{{Count: 1, Profile: "llama-3.1-8b-h100", Role: "prefill", Speed: 2},
		{Count: 1, Profile: "llama-3.1-8b-h100", Role: "decode", NumGPUBlocks: 4096}}
	if _, err := Run(context.Background(), Config{Fleet: f, Seed: 1}, reqs); err != nil {
		t.Errorf("one model, other overrides: got %v, want a run", err)
	}
	// The same model read from a config.json: another name ("llama", its
	// model_type), the same KV layout.
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	hf := prof
	hf.Name, hf.Model.Name = "llama-h100-tp1", "llama"
	f = Fleet{{Count: 1, Profile: "llama-3.1-8b-h100", Role: "prefill"}, {Count: 1, Spec: &hf, Role: "decode"}}
	if _, err := Run(context.Background(), Config{Fleet: f, Seed: 1}, reqs); err != nil {
		t.Errorf("one model, two names: got %v, want a run", err)
	}
}

// learningPicker places the prefill stage on the first healthy candidate
// and records the outcomes it is taught.
type learningPicker struct{ got []kvroute.Outcome }

func (l *learningPicker) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	for i, c := range cands {
		if c.Healthy {
			return kvroute.Chose("learn", cands, i, "first healthy")
		}
	}
	return kvroute.None("learn", "none")
}

func (l *learningPicker) Observe(_ time.Time, o kvroute.Outcome) { l.got = append(l.got, o) }

// TestPDPrefillPolicyLearnsPrefillLegs: a custom Picker places the prefill
// stage of a P/D fleet, and learns only from the prefill legs: a decode
// leg's TTFT is the KV pull, not a prefill.
func TestPDPrefillPolicyLearnsPrefillLegs(t *testing.T) {
	f := Fleet{{Count: 1, Profile: "tiny", NumGPUBlocks: 256, Role: "prefill"}, {Count: 1, Profile: "tiny", NumGPUBlocks: 256, Role: "decode"}}
	lp := &learningPicker{}
	reqs := smallChat(t, 30, 20, 1)
	res, err := Run(context.Background(), Config{Fleet: f, Seed: 1, Picker: lp, PD: PDConfig{Mode: disagg.ModeAlways}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	completed := 0
	for i := range res.Records {
		if res.Records[i].OK() {
			completed++
		}
	}
	if completed == 0 {
		t.Fatal("no request completed")
	}
	prefill := res.Engines[0].ID
	n := 0
	for _, o := range lp.got {
		if o.Decode || o.Endpoint != prefill {
			t.Errorf("the prefill policy was taught %+v, want only outcomes of %s's prefill legs", o, prefill)
		}
		if !o.Failed {
			n++
		}
	}
	if n != completed {
		t.Errorf("taught %d prefill outcomes, want one per completed request (%d)", n, completed)
	}
}

// TestPDPlannerKeepsHandoffBookedUntilDone: the router's P/D planner keeps a
// disaggregated request's transfer on its fabric's books until the request
// ends, as kvroute serve's handoff does (Planner.Finish when the NixlConnector
// legs return), so that plans made while the KV moves queue behind it. The
// simulator released it when the prefill reply arrived, before the transfer
// began: its planner then priced the next handoffs on a link it took to be
// idle.
func TestPDPlannerKeepsHandoffBookedUntilDone(t *testing.T) {
	f, err := ParseFleet("1xllama-3.1-8b-h100/prefill,1xllama-3.1-8b-h100/decode", "")
	if err != nil {
		t.Fatal(err)
	}
	// A 4,000-token prompt's KV (about 0.5 GB) over a 1 Gbps link: seconds
	// on the wire, well past the prefill reply.
	reqs := []workload.Request{{ID: "a", PromptLen: 4000, OutputLen: 8, Segments: []workload.Segment{{Key: 1, Len: 4000}}}}
	cfg := Config{Fleet: f, Seed: 1, ScrapeInterval: -1, PD: PDConfig{Mode: disagg.ModeAlways,
		Links: disagg.UniformLinks(disagg.Link{Name: "slow", Gbps: 1, Setup: time.Millisecond})}}
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := newSimulation(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	s.schedule(0, evArrival, -1, 0)
	s.next = 1
	fab := s.planners[0].Fabric()
	var sawPrefilled, sawTransferred bool
	for s.q.Len() > 0 && s.finished < 1 {
		ev := s.q.pop()
		s.handle(ev)
		if s.err != nil {
			t.Fatal(s.err)
		}
		switch ev.kind {
		case evPDPrefilled:
			sawPrefilled = true
			if n, _ := fab.InFlight(wall(s.now)); n != 1 {
				t.Errorf("after the prefill reply (%v): the planner's fabric has %d transfers booked, want the handoff's", s.now, n)
			}
		case evPDTransferred:
			sawTransferred = true
		}
	}
	if !sawPrefilled || !sawTransferred || !s.st[0].finished {
		t.Fatalf("the request did not run disaggregated to its end (prefilled %v, transferred %v)", sawPrefilled, sawTransferred)
	}
	if n, _ := fab.InFlight(wall(s.now)); n != 0 {
		t.Errorf("after the request ended: %d transfers still booked, want 0", n)
	}
}

// TestPDRowImbalance: a P/D run's imbalance is over the engines its records
// name (the decode engines): counted as idle, the prefill engines made it
// 2.03 for round_robin over two decode engines that got 500 requests each.
func TestPDRowImbalance(t *testing.T) {
	for _, mode := range []disagg.Mode{disagg.ModeAlways, disagg.ModeNever} {
		res := pdRun(t, pdFleet, mode, 400)
		count := map[string]int{}
		for i := range res.Records {
			count[res.Records[i].Engine]++
		}
		most := 0
		for _, n := range count {
			most = max(most, n)
		}
		want := float64(most) / (float64(len(res.Records)) / 2) // two decode engines
		row := res.Row(0)
		if d := row.Imbalance - want; d < -1e-9 || d > 1e-9 {
			t.Errorf("%s: imbalance %.3f, want %.3f (records per engine %v)", mode, row.Imbalance, want, count)
		}
		var names []string
		for _, e := range row.Engines {
			names = append(names, e.Name)
		}
		if len(names) != 2 || names[0] != "e2" || names[1] != "e3" {
			t.Errorf("%s: row engines %v, want [e2 e3]", mode, names)
		}
	}
}

// TestPDRowEnginesWhenPrefillLegsFail: requests a drain cuts off in their
// prefill leg name no decode engine, and the row's engines (and
// imbalance) stay the decode engines; they were counted on their prefill
// engine, which then led the imbalance.
func TestPDRowEnginesWhenPrefillLegsFail(t *testing.T) {
	f, err := ParseFleet("1xllama-3.1-8b-h100/prefill,3xllama-3.1-8b-h100/decode", "")
	if err != nil {
		t.Fatal(err)
	}
	reqs := pdWorkload(t)
	for i := range reqs { // all at once: most are still prefilling at the drain
		reqs[i].Arrival = 0
	}
	res, err := Run(context.Background(), Config{Fleet: f, Seed: 1, Drain: time.Second, PD: PDConfig{Mode: disagg.ModeAlways}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	row := res.Row(0)
	var names []string
	for _, e := range row.Engines {
		names = append(names, e.Name)
	}
	if !slices.Equal(names, []string{"e1", "e2", "e3"}) {
		t.Errorf("row engines %v (imbalance %.2f), want the decode engines [e1 e2 e3]", names, row.Imbalance)
	}
	stuck := 0
	for _, r := range res.Records {
		if r.PrefillEngine != "e0" || r.Engine == "e0" {
			t.Fatalf("record %+v: want prefill engine e0 and no engine or a decode one", r)
		}
		if !r.OK() && r.Engine == "" {
			stuck++
		}
	}
	if stuck == 0 {
		t.Fatal("no request failed in its prefill leg: the drain cut nothing off")
	}
}

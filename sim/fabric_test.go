package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
)

// TestFabricLoadByHand: two decode engines, three transfers worked by hand.
func TestFabricLoadByHand(t *testing.T) {
	s := time.Second
	r := &Result{
		Engines: []EngineResult{{ID: "e0", Role: "prefill"}, {ID: "e1", Role: "decode"}, {ID: "e2", Role: "decode"}},
		Transfers: []Transfer{
			// 1 GB over [0, 1s) into e1.
			{Decode: "e1", Bytes: 1e9, Ready: 0, Wire: 0, End: s},
			// 2 GB over [0.5s, 1.5s) into e1 after 0.5s queueing: 1 GB in each window.
			{Decode: "e1", Bytes: 2e9, Ready: 0, Wire: s / 2, End: 3 * s / 2},
			// 0.5 GB over [1s, 2s) into e2.
			{Decode: "e2", Bytes: 5e8, Ready: s, Wire: s, End: 2 * s},
		},
	}
	fl := r.FabricLoad(time.Second)
	// Span 2s: total 3.5 GB / 2 s; windows e1: [2 GB, 1 GB], e2: [0, 0.5 GB].
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"total", fl.Total, 1.75e9},
		{"per decode mean", fl.PerDecodeMean, 0.875e9},
		{"per decode p99", fl.PerDecodeP99, 2e9},
		{"per decode max", fl.PerDecodeMax, 2e9},
	} {
		if d := c.got - c.want; d > 1 || d < -1 {
			t.Errorf("%s: got %.0f, want %.0f", c.name, c.got, c.want)
		}
	}
	if fl.DecodeEngines != 2 || fl.Transfers != 3 || fl.Bytes != 35e8 {
		t.Errorf("got %d decode engines, %d transfers, %d bytes; want 2, 3, 3500000000", fl.DecodeEngines, fl.Transfers, fl.Bytes)
	}
	if fl.TimeP50 != s || fl.TimeP99 != 3*s/2 || fl.QueueP99 != s/2 {
		t.Errorf("got times p50 %v p99 %v queue p99 %v; want 1s, 1.5s, 500ms", fl.TimeP50, fl.TimeP99, fl.QueueP99)
	}
	if z := (&Result{}).FabricLoad(0); z.Transfers != 0 || z.Total != 0 || z.Window != time.Second {
		t.Errorf("aggregated run: got %+v, want zero load over 1s windows", z)
	}
}

// TestFabricQueueLeavesOutSetup: transfers that never wait behind another
// have no queue, whatever the link's setup; the queue p99 was the setup
// (1ms by default, 250ms here) on an idle fabric.
func TestFabricQueueLeavesOutSetup(t *testing.T) {
	f, err := ParseFleet("1xllama-3.1-8b-h100/prefill,1xllama-3.1-8b-h100/decode", "")
	if err != nil {
		t.Fatal(err)
	}
	reqs := pdWorkload(t)[:3]
	for i := range reqs { // a minute apart: each handoff has the fabric to itself
		reqs[i].Arrival = time.Duration(i) * time.Minute
	}
	const setup = 250 * time.Millisecond
	res, err := Run(context.Background(), Config{Fleet: f, Seed: 1, PD: PDConfig{Mode: disagg.ModeAlways,
		Links: disagg.UniformLinks(disagg.Link{Name: "fabric", Gbps: 400, Setup: setup})}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Transfers) != len(reqs) {
		t.Fatalf("got %d transfers, want %d", len(res.Transfers), len(reqs))
	}
	for _, tr := range res.Transfers {
		if tr.Setup != setup || tr.Wire-tr.Ready != setup {
			t.Errorf("transfer %s: got setup %v, ready to wire %v; want %v and %v", tr.ID, tr.Setup, tr.Wire-tr.Ready, setup, setup)
		}
	}
	fl := res.FabricLoad(time.Second)
	if fl.QueueP99 != 0 || fl.TimeP50 < setup {
		t.Errorf("got queue p99 %v, time p50 %v; want 0 (nothing queued) and at least the %v setup", fl.QueueP99, fl.TimeP50, setup)
	}
}

// TestPDTransfersRecorded: every disaggregated request of a simulated P/D
// run has one transfer, its size from the KV shape of the prompt tokens
// past the decode engine's prefix-cache hit (whole blocks: the prompt's
// length less a multiple of the block size, at least one token; on this
// workload of hot documents some hit), ending when its decode leg could
// start.
func TestPDTransfersRecorded(t *testing.T) {
	res := pdRun(t, pdFleet, disagg.ModeAlways, 400)
	prof, _ := engine.LookupProfile("llama-3.1-8b-h100")
	shape := disagg.ShapeOf(prof)
	byID := map[string]*Record{}
	for i := range res.Records {
		byID[res.Records[i].ID] = &res.Records[i]
	}
	partial := 0
	if len(res.Transfers) != len(res.Records) {
		t.Fatalf("got %d transfers for %d always-disaggregated requests", len(res.Transfers), len(res.Records))
	}
	for _, tr := range res.Transfers {
		rec := byID[tr.ID]
		if rec == nil || tr.Decode != rec.Engine || tr.Prefill != rec.PrefillEngine {
			t.Fatalf("transfer %+v does not match its record %+v", tr, rec)
		}
		bpt := shape.BytesPerToken()
		if k := tr.Bytes / bpt; tr.Bytes%bpt != 0 || k < 1 || int(k) > rec.PromptTokens || (rec.PromptTokens-int(k))%prof.BlockSize != 0 {
			t.Errorf("request %s: got %d bytes (%d tokens), want the KV of %d tokens less whole blocks", tr.ID, tr.Bytes, k, rec.PromptTokens)
		}
		if tr.Bytes < shape.Bytes(rec.PromptTokens) {
			partial++
		}
		if !(tr.Ready <= tr.Wire && tr.Wire < tr.End) || tr.End-tr.Ready > rec.Transfer {
			t.Errorf("request %s: transfer %v..%v..%v longer than the record's transfer %v", tr.ID, tr.Ready, tr.Wire, tr.End, rec.Transfer)
		}
	}
	if partial == 0 {
		t.Errorf("no transfer smaller than its prompt's KV: decode engines hold the hot documents")
	}
	fl := res.FabricLoad(0)
	if fl.DecodeEngines != 2 || fl.Total <= 0 || fl.PerDecodeP99 < fl.PerDecodeMean {
		t.Errorf("fabric load %+v: want 2 decode engines and a p99 at least the mean", fl)
	}
	if never := pdRun(t, pdFleet, disagg.ModeNever, 400); len(never.Transfers) != 0 {
		t.Errorf("mode never: got %d transfers, want 0", len(never.Transfers))
	}
}

// TestSpecProfile: a group given a profile value (as from a config.json)
// runs like the built-in profile of the same deployment.
func TestSpecProfile(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	spec := prof
	spec.Name = "my-llama"
	reqs := pdWorkload(t)
	run := func(f Fleet) *Result {
		res, err := Run(context.Background(), Config{Fleet: f, Seed: 1}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	byName := run(Fleet{{Count: 2, Profile: "llama-3.1-8b-h100"}})
	byValue := run(Fleet{{Count: 2, Spec: &spec}})
	if byValue.Fleet != "2xmy-llama" || byValue.Engines[0].Profile != "my-llama" {
		t.Errorf("got fleet %q, engine profile %q; want 2xmy-llama", byValue.Fleet, byValue.Engines[0].Profile)
	}
	for i := range byName.Records {
		if a, b := byName.Records[i], byValue.Records[i]; a.TTFT != b.TTFT || a.E2E != b.E2E {
			t.Fatalf("request %s: by name TTFT %v E2E %v, by value %v %v", a.ID, a.TTFT, a.E2E, b.TTFT, b.E2E)
		}
	}
	bad := spec
	bad.BlockSize = 0
	if _, err := Run(context.Background(), Config{Fleet: Fleet{{Count: 1, Spec: &bad}}}, reqs); err == nil {
		t.Error("a group with an invalid profile value ran")
	}
}

func BenchmarkFabricLoad(b *testing.B) {
	r := &Result{Engines: []EngineResult{{ID: "e0", Role: "prefill"}, {ID: "e1", Role: "decode"}, {ID: "e2", Role: "decode"}}}
	for i := range 10000 {
		at := time.Duration(i) * 300 * time.Millisecond
		r.Transfers = append(r.Transfers, Transfer{Decode: []string{"e1", "e2"}[i%2], Bytes: 1e9, Ready: at, Wire: at + time.Millisecond, End: at + 30*time.Millisecond})
	}
	b.ReportAllocs()
	for b.Loop() {
		r.FabricLoad(time.Second)
	}
}

package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/workload"
)

// TestPDPullsOnlyMissingBlocks: a conversation's second turn goes to the
// decode engine that served its first, which still caches the first
// turn's prompt: the KV pulled from the prefill engine is the new turn's
// 1000 tokens, not the whole 5096-token prompt, as vLLM's NixlConnector
// pulls only the blocks the decode engine lacks.
func TestPDPullsOnlyMissingBlocks(t *testing.T) {
	const first, added = 4096, 1000
	turn1 := make([]uint32, first)
	for k := range turn1 {
		turn1[k] = uint32(1 + k%30000)
	}
	turn2 := append(append([]uint32(nil), turn1...), make([]uint32, added)...)
	for k := first; k < len(turn2); k++ {
		turn2[k] = uint32(30001 + k%1000)
	}
	reqs := []workload.Request{
		{ID: "turn1", Session: "c", PromptLen: first, OutputLen: 8, Tokens: turn1},
		{ID: "turn2", Session: "c", Arrival: 10 * time.Second, PromptLen: len(turn2), OutputLen: 8, Tokens: turn2},
	}
	f, err := ParseFleet("llama-3.1-8b-h100/prefill,llama-3.1-8b-h100/decode", "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Config{Fleet: f, Seed: 1, PD: PDConfig{Mode: disagg.ModeAlways,
		Links: disagg.UniformLinks(disagg.Link{Name: "fabric", Gbps: 10, Setup: time.Millisecond})}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	prof, _ := engine.LookupProfile("llama-3.1-8b-h100")
	shape := disagg.ShapeOf(prof)
	want := map[string]int64{"turn1": shape.Bytes(first), "turn2": shape.Bytes(added)}
	if len(res.Transfers) != 2 {
		t.Fatalf("got %d transfers, want 2: %+v", len(res.Transfers), res.Transfers)
	}
	for _, tr := range res.Transfers {
		if tr.Bytes != want[tr.ID] {
			t.Errorf("%s: got %d bytes (%d tokens), want %d (%d tokens)", tr.ID, tr.Bytes, tr.Bytes/shape.BytesPerToken(),
				want[tr.ID], want[tr.ID]/shape.BytesPerToken())
		}
	}
	for _, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %s: status %d %s", r.ID, r.Status, r.Error)
		}
	}
}

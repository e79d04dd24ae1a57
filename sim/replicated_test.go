package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/workload"
)

// TestPDTransferBytesDecodeTP: a handoff moves what the decode engine's
// ranks read, each its own KV of every block (disagg.KVShape). Llama-3.1-70B
// prefilled at TP4 and decoded at TP16: a TP16 rank holds one of the 8 KV
// heads (each held twice), 80 layers x 128 x 2 x 2 B = 40,960 B a token,
// 655,360 B on its 16 ranks, so the 4096-token prompt moves 2,684,354,560
// B, twice the model's 1,342,177,280 B (what the TP4 prefill engine holds
// and what the simulator moved when it sized the transfer from it).
func TestPDTransferBytesDecodeTP(t *testing.T) {
	p4, err := engine.LookupProfile("llama-3.1-70b-h100-tp4")
	if err != nil {
		t.Fatal(err)
	}
	p16 := p4
	p16.Name, p16.TP = "llama-3.1-70b-h100-tp16", 16
	p16.NumGPUBlocks = p16.DeriveNumGPUBlocks()
	f := Fleet{{Count: 1, Spec: &p4, Role: "prefill"}, {Count: 1, Spec: &p16, Role: "decode"}}
	prompt := make([]uint32, 4096)
	for k := range prompt {
		prompt[k] = uint32(1 + k)
	}
	reqs := []workload.Request{{ID: "r", PromptLen: len(prompt), OutputLen: 4, Tokens: prompt}}
	res, err := Run(context.Background(), Config{Fleet: f, Seed: 1, PD: PDConfig{Mode: disagg.ModeAlways,
		Links: disagg.UniformLinks(disagg.Link{Name: "fabric", Gbps: 400, Setup: time.Millisecond})}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Transfers) != 1 {
		t.Fatalf("got %d transfers, want 1: %+v", len(res.Transfers), res.Transfers)
	}
	if got, want := res.Transfers[0].Bytes, int64(2684354560); got != want {
		t.Errorf("got %d bytes, want %d (4096 tokens x 655,360 B)", got, want)
	}
	for _, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %s: status %d %s", r.ID, r.Status, r.Error)
		}
	}
}

package disagg

import (
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
)

// TestKVWireBytesReplicated: a handoff moves what each decode rank reads
// (vLLM's NixlConnector: every rank reads its own KV of each block), so
// KV heads or an MLA latent that TP replicates cross the wire once per
// copy. Worked by hand, BF16:
//
//   - Llama-3.1-70B, 80 layers, 8 KV heads of 128: at TP4 a rank holds 2
//     heads, 80 x 2 x 128 x 2 x 2 = 81,920 B a token, 4 ranks 327,680 B
//     (the model's); at TP8 one head, 40,960 B, x 8 = 327,680 B; at TP16
//     still one head (replicated twice), x 16 = 655,360 B. 8k tokens at
//     TP16 are 5,368,709,120 B: 107.37 ms at 400 Gb/s, not 53.69 ms.
//   - Qwen3-30B-A3B's attention, 48 layers, 32 query and 4 KV heads of
//     128: at TP8 one KV head a rank (replicated twice), 48 x 128 x 2 x 2
//     = 24,576 B, x 8 = 196,608 B, twice the model's 98,304 B. (Not
//     Qwen2.5-7B, also 4 KV heads: vLLM refuses TP8 for its 28 query
//     heads.)
//   - DeepSeek-V3 (MLA), 61 layers x (512 + 64) x 2 B = 70,272 B on every
//     rank: at TP8, 8 x 70,272 = 562,176 B.
//
// Each is TP x engine.Profile.KVBytesPerTokenPerGPU, the KV one rank holds
// (and so the engine's KV capacity in tokens).
func TestKVWireBytesReplicated(t *testing.T) {
	at := func(name string, tp int) engine.Profile {
		p := mustProfile(t, name)
		p.TP = tp
		return p
	}
	ds, err := os.ReadFile("testdata/hf/deepseek-v3.json")
	if err != nil {
		t.Fatal(err)
	}
	dsv3, err := engine.ProfileFromHFConfig(ds, "h200", 8, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		p             engine.Profile
		perRank, wire int64
	}{
		{"70b-tp4", at("llama-3.1-70b-h100-tp4", 4), 81920, 327680},
		{"70b-tp8", at("llama-3.1-70b-h100-tp4", 8), 40960, 327680},
		{"70b-tp16", at("llama-3.1-70b-h100-tp4", 16), 40960, 655360},
		{"qwen3-30b-a3b-tp8", engine.Profile{TP: 8, Model: engine.Model{Name: "Qwen/Qwen3-30B-A3B", Layers: 48, Heads: 32, KVHeads: 4,
			HeadDim: 128, DTypeBytes: 2}}, 24576, 196608},
		{"8b-tp1", at("llama-3.1-8b-h100", 1), 131072, 131072},
		{"dsv3-tp8", dsv3, 70272, 562176},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.KVBytesPerTokenPerGPU(); got != tc.perRank {
				t.Errorf("KVBytesPerTokenPerGPU = %d, want %d", got, tc.perRank)
			}
			s := ShapeOf(tc.p)
			if got := s.BytesPerToken(); got != tc.wire {
				t.Errorf("ShapeOf(%s TP%d).BytesPerToken() = %d, want %d", tc.p.Model.Name, tc.p.TP, got, tc.wire)
			}
			if got, want := s.BytesPerToken(), int64(tc.p.TP)*tc.p.KVBytesPerTokenPerGPU(); got != want {
				t.Errorf("wire %d B a token, want TP x per rank = %d", got, want)
			}
			if got := tc.p.KVTransferBytesPerToken(); got != tc.wire {
				t.Errorf("engine's KVTransferBytesPerToken = %d, want %d (the emulator times its pulls with it)", got, tc.wire)
			}
		})
	}
	b := ShapeOf(at("llama-3.1-70b-h100-tp4", 16)).Bytes(8192)
	if got, want := (Link{Gbps: RDMAGbps}).Duration(b), 107374183*time.Nanosecond; b != 5368709120 || got != want {
		t.Errorf("70B TP16 8k tokens: %d B in %v, want 5368709120 B in %v", b, got, want)
	}
}

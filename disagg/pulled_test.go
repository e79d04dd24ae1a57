package disagg

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestPulledTokens: the prompt tokens a decode engine pulls are the ones
// past its own prefix-cache hit, counted as vLLM's scheduler counts it:
// whole blocks, never the last prompt token.
func TestPulledTokens(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		prompt, cached, bs, want int
	}{
		{"nothing cached: every token", 8192, 0, 16, 8192},
		{"most cached: the rest", 8192, 7168, 16, 1024},
		{"whole prompt cached: the last block still moves", 8192, 8192, 16, 16},
		{"full blocks of a ragged prompt cached: its partial block", 8200, 8192, 16, 8},
		{"a hit inside a block counts whole blocks", 8192, 7170, 16, 1024},
		{"cached past the prompt is capped", 100, 500, 16, 4},
		{"one-token prompt", 1, 1, 16, 1},
		{"no block size: all but the last token", 100, 100, 0, 1},
		{"negative cached: nothing", 64, -5, 16, 64},
		{"empty prompt", 0, 0, 16, 0},
	} {
		if got := PulledTokens(tc.prompt, tc.cached, tc.bs); got != tc.want {
			t.Errorf("%s: PulledTokens(%d, %d, %d) = %d, want %d", tc.name, tc.prompt, tc.cached, tc.bs, got, tc.want)
		}
	}
}

// TestDecodePrefersHolderOnSlowFabric: two decode nodes with equal load,
// one holding most of the conversation (its earlier turns): over a slow
// fabric the holder wins, since it pulls only the new turn's KV, and the
// plan's explanation shows that smaller transfer. Without prefix
// information both price the whole prompt and are taken in turn.
func TestDecodePrefersHolderOnSlowFabric(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	slow := UniformLinks(Link{Name: "tcp", Gbps: 10, Setup: 2 * time.Millisecond})
	p := ep("p", kvroute.RolePrefill)
	cold, holder := ep("cold", kvroute.RoleDecode), ep("holder", kvroute.RoleDecode)
	const prompt, held = 8192, 7168
	part := func(s kvroute.Score, name string) float64 {
		for _, pt := range s.Parts {
			if pt.Name == name {
				return pt.Value
			}
		}
		t.Fatalf("score %s has no part %s: %+v", s.Endpoint, name, s.Parts)
		return 0
	}

	t.Run("holder wins", func(t *testing.T) {
		pl := newPlanner(t, ModeAlways, slow)
		shape := pl.Config().Shape
		plan := pl.Plan(t0, req("r", prompt, 256), cands(candSpec{ep: p}, candSpec{ep: cold}, candSpec{ep: holder, cached: held}))
		if !plan.Disaggregated || plan.Decode == nil || plan.Decode.ID != "holder" {
			t.Fatalf("got decode %v (disaggregated %v): %s; scores %+v", plan.Decode, plan.Disaggregated, plan.Reason, plan.Decision.Scores)
		}
		if got, want := plan.Transfer.Bytes, shape.Bytes(prompt-held); got != want {
			t.Errorf("plan transfer: got %d bytes, want %d (the %d tokens holder lacks)", got, want, prompt-held)
		}
		if got, want := part(plan.Decision.Scores[0], "transfer_mb"), float64(shape.Bytes(prompt-held))/1e6; got != want {
			t.Errorf("plan's transfer_mb: got %v, want %v", got, want)
		}
		// The decode picker's own scores: the cold node prices the whole
		// prompt, the holder its missing part.
		for _, s := range plan.Decision.Scores[1:] {
			want := map[string]float64{"cold": float64(shape.Bytes(prompt)) / 1e6, "holder": float64(shape.Bytes(prompt-held)) / 1e6}[s.Endpoint]
			if want == 0 {
				continue
			}
			if got := part(s, "transfer_mb"); got != want {
				t.Errorf("%s: transfer_mb got %v, want %v", s.Endpoint, got, want)
			}
		}
		// The decode picker's reason names the bytes it priced.
		dc := pl.NewDecodePicker().PickFrom(t0, t0, req("r", prompt, 256), cands(candSpec{ep: cold}, candSpec{ep: holder, cached: held}), p)
		if want := "of 134.2 MB"; dc.d.Endpoint != "holder" || !strings.Contains(dc.d.Reason, want) {
			t.Errorf("decode picker: got %s (%q), want holder with %q", dc.d.Endpoint, dc.d.Reason, want)
		}
	})

	t.Run("sglang: the whole prompt", func(t *testing.T) {
		// SGLang's decode engines receive every prompt token's KV: holding
		// the earlier turns saves no transfer.
		pl, err := NewPlanner(Config{Profile: mustProfile(t, "llama-3.1-8b-h100"), Links: slow, Mode: ModeAlways, Protocol: ProtocolSGLang, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		plan := pl.Plan(t0, req("r", prompt, 256), cands(candSpec{ep: p}, candSpec{ep: cold}, candSpec{ep: holder, cached: held}))
		if want := pl.Config().Shape.Bytes(prompt); plan.Transfer.Bytes != want {
			t.Errorf("transfer to %s: got %d bytes, want the whole prompt's %d", plan.Decode.ID, plan.Transfer.Bytes, want)
		}
		if _, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Protocol: "carrier-pigeon"}); err == nil ||
			!strings.Contains(err.Error(), "protocol") {
			t.Errorf("bad protocol: got %v, want an error naming protocol", err)
		}
	})

	t.Run("no prefix info: whole prompt, in turn", func(t *testing.T) {
		pl := newPlanner(t, ModeAlways, slow)
		var got []string
		for range 2 {
			plan := pl.Plan(t0, req("r", prompt, 256), cands(candSpec{ep: p}, candSpec{ep: cold}, candSpec{ep: holder}))
			if want := pl.Config().Shape.Bytes(prompt); plan.Transfer.Bytes != want {
				t.Errorf("transfer: got %d bytes, want the whole prompt's %d", plan.Transfer.Bytes, want)
			}
			got = append(got, plan.Decode.ID)
			pl.Finish(plan.Ticket)
		}
		if got[0] == got[1] {
			t.Errorf("tied decode nodes: got %v, want both in turn", got)
		}
	})
}

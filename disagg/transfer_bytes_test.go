package disagg

import (
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/openai"
)

// TestPDTransferBytesHanded: kvroute_pd_transfer_bytes_total counts the
// KV bytes handed from prefill to decode engines, so a placement whose
// prefill leg failed (and the request ran aggregated) hands nothing; it
// was counted when the plan was made, once per placement tried.
func TestPDTransferBytesHanded(t *testing.T) {
	bytes := func(t *testing.T, f *pdFixture) float64 {
		t.Helper()
		sum := 0.0
		for _, link := range []string{"nvlink", "rdma", "tcp"} {
			sum += counter(t, f.h.cfg.Metrics.transferBytes, "tiny", link)
		}
		return sum
	}
	t.Run("prefill failed, ran aggregated", func(t *testing.T) {
		bad := fake(t, status500)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("bad", bad.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		if code, body := f.post(t, completion(false, 2)); code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
		if got := counter(t, f.h.cfg.Metrics.decisions, "tiny", "disaggregated", "always"); got != 1 {
			t.Fatalf("disaggregated plans: got %v, want 1", got)
		}
		if got := bytes(t, f); got != 0 {
			t.Errorf("transfer bytes: got %v, want 0 (no KV was handed over)", got)
		}
	})
	t.Run("handed", func(t *testing.T) {
		p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		if code, body := f.post(t, completion(false, 2)); code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
		ri, err := openai.ParseRequest(openai.KindCompletion, []byte(completion(false, 2)))
		if err != nil {
			t.Fatal(err)
		}
		want := float64(f.pl.Config().Shape.Bytes(ri.PromptTokens()))
		if got := bytes(t, f); got != want {
			t.Errorf("transfer bytes: got %v, want one handoff's %v", got, want)
		}
	})
}

package disagg

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
)

// TestPDPrefillStoppedEarly: a prefill leg whose one token ends the
// request (EOS or a stop token: finish_reason "stop") gets no
// kv_transfer_params from vLLM's NixlConnector, which hands the KV over
// only for a request finished by its length cap (request_finished returns
// None otherwise, and frees the blocks). That is not the engine's failure:
// the request runs whole on the planned decode node (as vLLM's toy proxy
// sends it on without params), without a prefill failure, a health report
// against the prefill engine or a second prefill. Counted as failures, a
// run of such prompts ejected a healthy prefill engine.
func TestPDPrefillStoppedEarly(t *testing.T) {
	var prefills atomic.Int32
	stopped := fake(t, func(w http.ResponseWriter, _ *http.Request) {
		prefills.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-x","object":"text_completion","model":"tiny","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":30,"total_tokens":31,"completion_tokens":1},"kv_transfer_params":null}`)
	})
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", stopped.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	const n = 4 // more than the router's default FailThreshold (3)
	for i := range n {
		code, body, answered := f.postH(t, completion(false, 2))
		if code != 200 || answered != "d" {
			t.Fatalf("request %d: got %d %s from %q, want 200 from d", i, code, body, answered)
		}
	}
	if got := prefills.Load(); got != n {
		t.Errorf("got %d prefill legs, want %d (one per request, the prefill engine never ejected)", got, n)
	}
	for i, l := range f.rec.to(d.URL) {
		if l.body["kv_transfer_params"] != nil {
			t.Errorf("decode leg %d: got kv_transfer_params %v, want none (the request runs whole)", i, l.body["kv_transfer_params"])
		}
	}
	if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "missing_kv_params"); got != 0 {
		t.Errorf("missing_kv_params failures: got %v, want 0", got)
	}
	for _, s := range f.r.Status(time.Now()) {
		if s.Ejections != 0 {
			t.Errorf("endpoint %s: got %d ejections, want 0", s.ID, s.Ejections)
		}
	}
}

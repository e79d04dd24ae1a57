package disagg

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/openai"
)

// TestReplyOverCapNeverCut: a reply the router reads whole that is over
// MaxReplyBytes is never cut. Before, an engine's error body was replayed
// cut at the cap (a corrupt JSON answer), and a prefill reply cut before
// its kv_transfer_params was taken for one without them (the
// missing_kv_params failure and its "is the engine's KV connector
// configured?" error). Now an error body over the cap is answered with
// the router's own error under the engine's status, and a prefill reply
// over it is a failed leg saying so.
func TestReplyOverCapNeverCut(t *testing.T) {
	const limit = 1 << 10
	long := strings.Repeat("x", 2*limit)
	t.Run("error body", func(t *testing.T) {
		bad := fake(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"`+long+`","type":"BadRequestError","param":null,"code":400}}`)
		})
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("bad", bad.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		f.h.cfg.MaxReplyBytes = limit
		code, body := f.post(t, completion(false, 2))
		var e openai.ErrorResponse
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("got %d, a body (%d bytes) that is not whole: %v", code, len(body), err)
		}
		if code != http.StatusBadRequest || !strings.Contains(e.Error.Message, "answered 400 with a body over") {
			t.Errorf("got %d %q, want 400 saying the engine's body was too large", code, e.Error.Message)
		}
	})
	t.Run("prefill reply", func(t *testing.T) {
		big := fake(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"`+long+`","finish_reason":"length"}],`+
				`"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"h","remote_port":1}}`)
		})
		d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
		f := newPD(t, ProtocolNixl, ModeAlways, endpoint("big", big.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
		f.h.cfg.MaxReplyBytes = limit
		_, _ = f.post(t, completion(false, 2))
		if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "missing_kv_params"); got != 0 {
			t.Errorf("missing_kv_params failures: got %v, want 0 (the reply had them)", got)
		}
		if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "transport"); got != 1 {
			t.Errorf("prefill transport failures: got %v, want 1", got)
		}
		if logs := f.logs.String(); strings.Contains(logs, "KV connector") || !strings.Contains(logs, "over the size") {
			t.Errorf("logs: got %q, want the reply's size named, not the KV connector", logs)
		}
	})
}

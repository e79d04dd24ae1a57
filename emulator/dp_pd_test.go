package emulator

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// TestDPPrefillDecodeRoles: data-parallel prefill and decode servers (vLLM
// --data-parallel-size with a P/D kv_role): a decode rank pulls the KV
// from the prefill rank its kv_transfer_params name, and a pull naming
// another rank fails as vLLM's handshake does (engine ID mismatch), the
// lease staying with the rank that holds it.
func TestDPPrefillDecodeRoles(t *testing.T) {
	p, ps := testDP(t, Config{Role: kvroute.RolePrefill}, 2)
	d, ds := testDP(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail}, 2)
	if p.Rank(0).EngineID() == p.Rank(1).EngineID() || !strings.HasSuffix(p.Rank(1).EngineID(), "_dp1") {
		t.Fatalf("engine IDs: got %s and %s, want <id>_dp0 and <id>_dp1", p.Rank(0).EngineID(), p.Rank(1).EngineID())
	}
	prefill := func(rank string) map[string]any {
		t.Helper()
		code, _, body := postRank(t, ps.URL+"/v1/completions", rank, fmt.Sprintf(`{"prompt":%q,"max_tokens":1,
			"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`, pdPrompt))
		if code != 200 {
			t.Fatalf("prefill on rank %s: got %d %s", rank, code, body)
		}
		var pr openai.Completion
		if err := json.Unmarshal(body, &pr); err != nil {
			t.Fatal(err)
		}
		return pr.KVTransferParams
	}
	decode := func(rank string, kv map[string]any) (int, string) {
		b, _ := json.Marshal(map[string]any{"prompt": pdPrompt, "max_tokens": 3, "kv_transfer_params": kv})
		code, _, body := postRank(t, ds.URL+"/v1/completions", rank, string(b))
		return code, string(body)
	}

	kv := prefill("1")
	if kv["remote_engine_id"] != p.Rank(1).EngineID() {
		t.Fatalf("got remote_engine_id %v, want rank 1's %s", kv["remote_engine_id"], p.Rank(1).EngineID())
	}
	wrong := map[string]any{}
	for k, v := range kv {
		wrong[k] = v
	}
	wrong["remote_engine_id"] = p.Rank(0).EngineID()
	if code, body := decode("0", wrong); code != 500 || !strings.Contains(body, "no held KV") {
		t.Errorf("decode pulling rank 1's KV from rank 0: got %d %s, want 500: no held KV", code, body)
	}
	wrong["remote_engine_id"] = "another-engine"
	if code, body := decode("0", wrong); code != 500 || !strings.Contains(body, "engine ID mismatch") {
		t.Errorf("decode pulling from an engine ID no rank has: got %d %s, want 500 with an engine ID mismatch", code, body)
	}
	if code, body := decode("1", kv); code != 200 {
		t.Errorf("decode rank 1 pulling from prefill rank 1: got %d %s", code, body)
	}
	if got := d.Rank(1).EngineID(); !strings.HasSuffix(got, "_dp1") {
		t.Errorf("decode rank 1's engine ID: got %s", got)
	}
}

// TestDPSGLangPullByRoom: an SGLang decode engine not told the prefill's
// rank reads from DP group bootstrap_room % size: a room whose remainder
// is not the rank that prefilled finds no KV there.
func TestDPSGLangPullByRoom(t *testing.T) {
	_, ps := testDP(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, BootstrapTimeout: 50 * time.Second}, 2) // 0.5 s
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, LoadFailure: LoadFailureFail,
		BootstrapWait: 500 * time.Millisecond})
	host, port := splitHostPort(t, ps.URL)
	for _, tc := range []struct {
		room uint64
		want int
	}{{41, 200}, {40, 500}} { // prefilled on rank 1
		body := fmt.Sprintf(`{"prompt":%q,"max_tokens":2,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`,
			pdPrompt, host, port, tc.room)
		pch := make(chan int, 1)
		go func() {
			code, _, _ := postRank(t, ps.URL+"/v1/completions", "1", body)
			pch <- code
		}()
		if code, b := post(t, ds.URL+"/v1/completions", body); code != tc.want {
			t.Errorf("room %d: decode got %d %s, want %d", tc.room, code, b, tc.want)
		}
		// The prefill leg whose KV no decode engine took fails when its
		// bootstrap times out (SGLang's 500).
		if code := <-pch; code != tc.want {
			t.Errorf("room %d: prefill got %d, want %d", tc.room, code, tc.want)
		}
	}
}

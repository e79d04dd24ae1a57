package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// writePrefillReply answers a NixlConnector prefill leg with a 600-token
// prompt's usage, details (",prompt_tokens_details":{...} or "") in it.
func writePrefillReply(w http.ResponseWriter, details string) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"id":"cmpl-p","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":600,"completion_tokens":1,"total_tokens":601` + details + `},` +
		`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`))
}

// TestPDPrefillUsageIsCounted: on a P/D pool, the prefix cache hits the
// prefill engines report (the prefill reply's usage.prompt_tokens and
// prompt_tokens_details.cached_tokens) are counted in
// kvroute_prefix_cached_tokens_total and kvroute_prefix_prompt_tokens_total
// on the prefill endpoint, as an aggregated pool counts its engines': the
// prefill engine is where a P/D request's prompt meets a prefix cache.
// Nothing was counted on any endpoint of a P/D pool.
func TestPDPrefillUsageIsCounted(t *testing.T) {
	ps, _ := pdEngineHook(t, kvroute.RolePrefill, "nixl", func(w http.ResponseWriter, r *http.Request) bool {
		writePrefillReply(w, `,"prompt_tokens_details":{"cached_tokens":512}`)
		return true
	})
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, ds.URL), policy.New)
	resp := tp.post(t, PathCompletions, `{"model":"tiny","prompt":"a prompt handed off to decode","max_tokens":4}`)
	if out := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d %s", resp.StatusCode, out)
	}
	if got := tp.metric(t, tp.fb.cached, "tiny", "p0"); got != 512 {
		t.Errorf("kvroute_prefix_cached_tokens_total{endpoint=p0}: got %v, want 512", got)
	}
	if got := tp.metric(t, tp.fb.prompt, "tiny", "p0"); got != 600 {
		t.Errorf("kvroute_prefix_prompt_tokens_total{endpoint=p0}: got %v, want 600", got)
	}
}

// TestPDWholeRunUsageIsCounted: on a P/D pool, a request the conditional
// rule runs whole on a decode node (a short prompt: not handed off) is
// counted as an aggregated pool counts its engines': the decode engine
// computed the prompt itself, against its own prefix cache, and its
// usage (a JSON body's, a stream's final usage chunk) reports the hits.
// Nothing was counted: only a prefill reply's usage was read.
func TestPDWholeRunUsageIsCounted(t *testing.T) {
	ps, prefills := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", func(w http.ResponseWriter, r *http.Request) bool {
		engineUsage(300, 256)(w, r)
		return true
	})
	cfg := pdTestConfig("", "nixl", ps.URL, ds.URL)
	cfg.Models[0].PD.Mode = "conditional" // a short prompt runs whole on d0
	tp := newTestProxyWith(t, cfg, policy.New)
	for _, body := range []string{
		`{"model":"tiny","prompt":"a short prompt","max_tokens":2}`,
		`{"model":"tiny","prompt":"a short prompt","max_tokens":200,"stream":true,"stream_options":{"include_usage":true}}`,
	} {
		resp := tp.post(t, PathCompletions, body)
		if out := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(out, `"cached_tokens":256`) {
			t.Fatalf("got %d %.200s", resp.StatusCode, out)
		}
	}
	if n := len(prefills()); n != 0 {
		t.Fatalf("prefill engine got %d requests, want 0 (the requests run whole on d0)", n)
	}
	// Counted as the answer ends, which the client may have read whole
	// before: the leg's inflight gauge falls after.
	waitFor(t, "d0's inflight back to 0", func() bool { return tp.metric(t, tp.metrics.inflight, "tiny", "d0") == 0 })
	if got := tp.metric(t, tp.fb.cached, "tiny", "d0"); got != 512 {
		t.Errorf("kvroute_prefix_cached_tokens_total{endpoint=d0}: got %v, want 512", got)
	}
	if got := tp.metric(t, tp.fb.prompt, "tiny", "d0"); got != 600 {
		t.Errorf("kvroute_prompt_tokens_total{endpoint=d0}: got %v, want 600", got)
	}
}

// TestPDPrefillAbsentCachedTokens: a prefill engine that has reported
// cached tokens and then answers without prompt_tokens_details (vLLM: none
// cached) counts 0 cached, as on the aggregated path
// (TestAbsentCachedTokensAfterReported), and the prefill flight's outcome
// says 0.
func TestPDPrefillAbsentCachedTokens(t *testing.T) {
	var n atomic.Int32
	ps, _ := pdEngineHook(t, kvroute.RolePrefill, "nixl", func(w http.ResponseWriter, r *http.Request) bool {
		details := `,"prompt_tokens_details":{"cached_tokens":512}`
		if n.Add(1) > 1 {
			details = ""
		}
		writePrefillReply(w, details)
		return true
	})
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, ds.URL), policy.New)
	for range 2 {
		resp := tp.post(t, PathCompletions, `{"model":"tiny","prompt":"a prompt handed off to decode","max_tokens":4}`)
		if out := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s", resp.StatusCode, out)
		}
	}
	if got := tp.metric(t, tp.fb.cached, "tiny", "p0"); got != 512 {
		t.Errorf("kvroute_prefix_cached_tokens_total{endpoint=p0}: got %v, want 512", got)
	}
	if got := tp.metric(t, tp.fb.prompt, "tiny", "p0"); got != 1200 {
		t.Errorf("kvroute_prefix_prompt_tokens_total{endpoint=p0}: got %v, want 1200 (the second answer cached 0)", got)
	}
}

package emulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/openai"
)

// serving is a LoRA configuration serving the named adapters.
func serving(names ...string) LoRAConfig {
	c := LoRAConfig{Enable: true, MaxLoRAs: len(names)}
	for _, n := range names {
		c.Modules = append(c.Modules, LoRAModule{Name: n, Path: "/adapters/" + n})
	}
	return c
}

// pdLeg runs one NixlConnector leg of a request for model (an adapter's
// name, or "" for the base model) on url: the prefill leg when kv is nil,
// else the decode leg with the prefill leg's kv_transfer_params.
func pdLeg(t *testing.T, url, model, prompt string, kv map[string]any) (int, openai.Completion, string) {
	t.Helper()
	req := map[string]any{"prompt": prompt, "max_tokens": 3, "ignore_eos": true}
	if model != "" {
		req["model"] = model
	}
	if kv == nil {
		req["max_tokens"] = 1
		req["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
	} else {
		req["kv_transfer_params"] = kv
	}
	b, _ := json.Marshal(req)
	code, body := post(t, url+"/v1/completions", string(b))
	var c openai.Completion
	_ = json.Unmarshal(body, &c)
	return code, c, string(body)
}

// TestPDLoRA: a LoRA adapter's request through NixlConnector, as vLLM runs
// it: the prefill engine computes the prompt with the adapter (its blocks
// keyed by the adapter's name) and answers in its name with the usual
// kv_transfer_params, which say nothing of the adapter; the decode engine,
// serving the adapter too, pulls the blocks into its cache under the
// adapter's keys (the same adapter's next turn hits them there and pulls
// only the rest; the base model's request for the same prompt hits none)
// and answers in the adapter's name.
func TestPDLoRA(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, LoRA: serving("sql-lora")})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoRA: serving("sql-lora"), LoadFailure: LoadFailureFail})
	hits := func() float64 { return value(scrape(t, ds.URL)["vllm:prefix_cache_hits_total"].GetMetric()[0]) }
	first := strings.Repeat(pdPrompt+" ", 6)
	second := first + "And a second turn that extends the first."
	var firstBlocks float64
	for i, turn := range []struct {
		model, prompt string
		hit           bool // the decode engine holds the first turn's blocks for it
	}{{"sql-lora", first, false}, {"sql-lora", second, true}, {"", second, false}} {
		code, pre, body := pdLeg(t, ps.URL, turn.model, turn.prompt, nil)
		want := turn.model
		if want == "" {
			want = "tiny"
		}
		if code != http.StatusOK || pre.Model != want || pre.KVTransferParams == nil {
			t.Fatalf("turn %d prefill: got %d %s, want 200 in %s's name with kv_transfer_params", i, code, body, want)
		}
		for _, k := range []string{"lora_name", "lora_request", "model"} {
			if _, ok := pre.KVTransferParams[k]; ok {
				t.Errorf("turn %d: kv_transfer_params has %q: %v", i, k, pre.KVTransferParams)
			}
		}
		before := hits()
		code, dec, body := pdLeg(t, ds.URL, turn.model, turn.prompt, pre.KVTransferParams)
		if code != http.StatusOK || dec.Model != want || dec.Usage.CompletionTokens != 3 {
			t.Fatalf("turn %d decode: got %d %s, want 3 tokens in %s's name", i, code, body, want)
		}
		got := hits() - before
		if i == 0 {
			firstBlocks = float64(pre.Usage.PromptTokens / 16 * 16)
		}
		if turn.hit && got < firstBlocks || !turn.hit && got != 0 {
			t.Errorf("turn %d (%q): the decode engine's own prefix-cache hit %v tokens, want %v", i, turn.model, got,
				map[bool]float64{true: firstBlocks, false: 0}[turn.hit])
		}
	}
}

// TestPDRejectedDecodeLegReleases: a decode engine that does not serve the
// adapter a decode leg names answers it as vLLM does, 404 "The model ...
// does not exist.", and tells the prefill engine at once that the KV it
// holds for it will not be read (vLLM PR #41269: a decode leg rejected
// before admission notifies the prefill engine), which frees the blocks
// then rather than at the lease's expiry. So does another rejection
// before admission (a prompt over the context).
func TestPDRejectedDecodeLegReleases(t *testing.T) {
	var plog, dlog syncbuf.Buffer
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, LoRA: serving("sql-lora"), Logger: logTo(&plog), LeaseTimeout: time.Hour})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoRA: serving("chat-lora"), Logger: logTo(&dlog)})
	prompt := strings.Repeat(pdPrompt+" ", 6)
	for _, tc := range []struct {
		name, model string
		maxTokens   int
		status      int
		msg         string
	}{
		{"adapter not served", "sql-lora", 3, http.StatusNotFound, "The model `sql-lora` does not exist."},
		{"over the context", "", 1 << 20, http.StatusBadRequest, "max_tokens"},
	} {
		code, pre, body := pdLeg(t, ps.URL, tc.model, prompt, nil)
		if code != http.StatusOK || pre.KVTransferParams == nil {
			t.Fatalf("%s: prefill: got %d %s", tc.name, code, body)
		}
		if u := kvUsage(t, ps.URL); u <= 0 {
			t.Fatalf("%s: prefill engine's KV usage %v while it holds the blocks, want > 0", tc.name, u)
		}
		req := map[string]any{"prompt": prompt, "max_tokens": tc.maxTokens, "kv_transfer_params": pre.KVTransferParams}
		if tc.model != "" {
			req["model"] = tc.model
		}
		b, _ := json.Marshal(req)
		code, out := post(t, ds.URL+"/v1/completions", string(b))
		if code != tc.status || !strings.Contains(string(out), tc.msg) {
			t.Errorf("%s: decode: got %d %s, want %d %q", tc.name, code, out, tc.status, tc.msg)
		}
		waitFor(t, tc.name+": the prefill engine to free the blocks", func() bool { return kvUsage(t, ps.URL) == 0 })
	}
	if strings.Contains(plog.String(), "kv lease expired") || strings.Contains(dlog.String(), "kv release") {
		t.Errorf("logs: prefill %q, decode %q", plog.String(), dlog.String())
	}
}

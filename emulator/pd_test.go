package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/openai"
)

func logTo(b *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

const pdPrompt = "Disaggregated serving splits the prompt computation from token generation across two engines."

func kvUsage(t *testing.T, url string) float64 {
	return value(scrape(t, url)["vllm:kv_cache_usage_perc"].GetMetric()[0])
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPDNixlHandshake(t *testing.T) {
	var plog, dlog syncbuf.Buffer
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, Logger: logTo(&plog)})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, Logger: logTo(&dlog), LoadFailure: LoadFailureRecompute})

	// 1. The proxy's prefill request (toy_proxy_server.py).
	code, body := post(t, ps.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1,"stream":false,
		"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, pdPrompt))
	if code != 200 {
		t.Fatalf("prefill: got %d %s", code, body)
	}
	var pr openai.Completion
	if err := json.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	kv := pr.KVTransferParams
	host, port := splitHostPort(t, ps.URL)
	if kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false || kv["remote_host"] != host ||
		kv["remote_port"] != float64(port) || kv["remote_request_id"] == "" || kv["tp_size"] != float64(1) {
		t.Fatalf("got kv_transfer_params %v", kv)
	}
	if ids, _ := kv["remote_block_ids"].([]any); len(ids) == 0 {
		t.Errorf("got remote_block_ids %v, want the held blocks", kv["remote_block_ids"])
	}
	// The newest NixlConnector's fields (pull_scheduler), and no other.
	keys := slices.Sorted(maps.Keys(kv))
	if want := []string{"dcp_size", "do_remote_decode", "do_remote_prefill", "pp_size", "remote_block_ids",
		"remote_blocks_expiry_time", "remote_engine_id", "remote_host", "remote_num_tokens", "remote_port",
		"remote_request_id", "tp_size", "transfer_mode"}; !slices.Equal(keys, want) {
		t.Errorf("kv_transfer_params keys %v, want %v", keys, want)
	}
	if kv["transfer_mode"] != "pull" || kv["remote_blocks_expiry_time"] != nil || kv["dcp_size"] != float64(1) ||
		kv["pp_size"] != float64(1) || kv["remote_num_tokens"] != float64(pr.Usage.PromptTokens) {
		t.Errorf("got kv_transfer_params %v", kv)
	}
	if u := kvUsage(t, ps.URL); u <= 0 {
		t.Errorf("prefill engine: got KV usage %v while holding the blocks, want > 0", u)
	}

	// 2. The decode request carries the params verbatim.
	decode := func() (int, []byte) {
		b, _ := json.Marshal(map[string]any{"prompt": pdPrompt, "max_tokens": 5, "kv_transfer_params": kv})
		return post(t, ds.URL+"/v1/completions", string(b))
	}
	code, body = decode()
	if code != 200 {
		t.Fatalf("decode: got %d %s", code, body)
	}
	var dr openai.Completion
	_ = json.Unmarshal(body, &dr)
	if dr.Usage.CompletionTokens != 5 || dr.KVTransferParams != nil {
		t.Errorf("decode: got %s", body)
	}
	if strings.Contains(dlog.String(), "kv transfer failed") {
		t.Errorf("decode log: %s", dlog.String())
	}
	waitFor(t, "the prefill engine to release the pulled blocks", func() bool { return kvUsage(t, ps.URL) == 0 })

	// 3. The lease is gone: vLLM-style recompute with a warning.
	code, body = decode()
	if code != 200 {
		t.Fatalf("decode again: got %d %s", code, body)
	}
	if !strings.Contains(dlog.String(), "kv transfer failed, recomputing") {
		t.Errorf("got decode log %q, want a recompute warning", dlog.String())
	}
}

func TestPDLeaseExpiryAndFailPolicy(t *testing.T) {
	var plog syncbuf.Buffer
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, Logger: logTo(&plog), LeaseTimeout: time.Second}) // 10 ms at speed 100
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})
	code, body := post(t, ps.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`, pdPrompt))
	if code != 200 {
		t.Fatalf("prefill: got %d %s", code, body)
	}
	var pr openai.Completion
	_ = json.Unmarshal(body, &pr)
	waitFor(t, "the lease to expire", func() bool { return strings.Contains(plog.String(), "kv lease expired") })
	waitFor(t, "the expired blocks to be released", func() bool { return kvUsage(t, ps.URL) == 0 })
	b, _ := json.Marshal(map[string]any{"prompt": pdPrompt, "max_tokens": 2, "kv_transfer_params": pr.KVTransferParams})
	code, body = post(t, ds.URL+"/v1/completions", string(b))
	if code != 500 || !strings.Contains(string(body), "KV transfer failed") {
		t.Errorf("got %d %s, want 500 KV transfer failed (policy fail)", code, body)
	}
}

func TestPDSGLangBootstrap(t *testing.T) {
	var dlog syncbuf.Buffer
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, Logger: logTo(&dlog)})
	host, port := splitHostPort(t, ps.URL)
	body := fmt.Sprintf(`{"prompt":%q,"max_tokens":4,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":9007199254740993}`, pdPrompt, host, port)
	// The router sends the same body to both at once; the decode leg
	// arrives first and must wait for the prefill's room.
	var wg sync.WaitGroup
	var dcode int
	var dbody []byte
	wg.Add(1)
	go func() {
		defer wg.Done()
		dcode, dbody = post(t, ds.URL+"/v1/completions", body)
	}()
	time.Sleep(20 * time.Millisecond)
	if code, b := post(t, ps.URL+"/v1/completions", body); code != 200 {
		t.Fatalf("prefill: got %d %s", code, b)
	}
	wg.Wait()
	if dcode != 200 {
		t.Fatalf("decode: got %d %s", dcode, dbody)
	}
	var dr openai.Completion
	_ = json.Unmarshal(dbody, &dr)
	if dr.Usage.CompletionTokens != 4 {
		t.Errorf("decode: got %s, want 4 tokens", dbody)
	}
	if strings.Contains(dlog.String(), "kv transfer failed") {
		t.Errorf("decode log: %s", dlog.String())
	}
	waitFor(t, "the prefill engine to release the room's blocks", func() bool { return kvUsage(t, ps.URL) == 0 })
}

// TestPDNixlByRequestIDHeader is the older vLLM form: the decode request has
// no remote_request_id, and the lease is found by the proxy's X-Request-Id,
// which both legs carry.
func TestPDNixlByRequestIDHeader(t *testing.T) {
	var dlog syncbuf.Buffer
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, Logger: logTo(&dlog)})
	send := func(url, body string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("X-Request-Id", "5f1c2f0e-proxy-id")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, body := send(ps.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`, pdPrompt))
	if code != 200 {
		t.Fatalf("prefill: got %d %s", code, body)
	}
	var pr openai.Completion
	_ = json.Unmarshal(body, &pr)
	kv := pr.KVTransferParams
	if kv["remote_request_id"] != "5f1c2f0e-proxy-id" {
		t.Errorf("got remote_request_id %v, want the X-Request-Id", kv["remote_request_id"])
	}
	delete(kv, "remote_request_id")
	b, _ := json.Marshal(map[string]any{"prompt": pdPrompt, "max_tokens": 2, "kv_transfer_params": kv})
	if code, body = send(ds.URL+"/v1/completions", string(b)); code != 200 {
		t.Fatalf("decode: got %d %s", code, body)
	}
	if strings.Contains(dlog.String(), "kv transfer failed") {
		t.Errorf("decode log: %s", dlog.String())
	}
	waitFor(t, "the prefill engine to release the blocks", func() bool { return kvUsage(t, ps.URL) == 0 })
}

// TestPDShortPromptNotHeld: a prompt shorter than one KV block has no
// transfer (the decode engine recomputes it, pullForDecode), so the prefill
// engine must not hold its blocks for a pull that never comes, as vLLM's
// NixlConnector frees them at once ("If prompt < block_size, no xfer so
// free blocks immediately"): they were held until the lease expired.
func TestPDShortPromptNotHeld(t *testing.T) {
	ps, phs := testServer(t, Config{Role: kvroute.RolePrefill, LeaseTimeout: time.Hour}) // 36 s at speed 100
	_, dhs := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})
	code, body := post(t, phs.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":1,"stream":false,
		"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`)
	if code != 200 {
		t.Fatalf("prefill: got %d %s", code, body)
	}
	var pr openai.Completion
	if err := json.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	if n, bs := pr.Usage.PromptTokens, ps.Profile().BlockSize; n >= bs {
		t.Fatalf("prompt of %d tokens, want fewer than a block (%d)", n, bs)
	}
	if ids, ok := pr.KVTransferParams["remote_block_ids"].([]any); !ok || len(ids) != 0 {
		t.Errorf("got remote_block_ids %v, want [] (no block to transfer)", pr.KVTransferParams["remote_block_ids"])
	}
	b, _ := json.Marshal(map[string]any{"prompt": "Hi", "max_tokens": 2, "kv_transfer_params": pr.KVTransferParams})
	if code, body = post(t, dhs.URL+"/v1/completions", string(b)); code != 200 {
		t.Fatalf("decode: got %d %s", code, body)
	}
	waitFor(t, "the prefill engine to free the short prompt's blocks", func() bool { return kvUsage(t, phs.URL) == 0 })
}

// TestPDPrefillStoppedNoParams: a prefill leg that its one token ends in
// the engine core (EOS; vLLM's check_stop tests EOS and stop tokens before
// the length cap) is not handed over: vLLM's NixlConnector gives
// kv_transfer_params only for a request its length cap ended
// (request_finished returns None otherwise) and frees the blocks at once.
// A stop string is found by the front end once the engine core ended the
// request by its length cap: that KV is handed over (params, finish_reason
// "stop"). The emulator answered params and held the blocks after an EOS.
func TestPDPrefillStoppedNoParams(t *testing.T) {
	const prefill = `"max_tokens":1,"stream":false,"seed":7,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	check := func(t *testing.T, url, body string, handed bool) {
		t.Helper()
		code, b := post(t, url+"/v1/completions", body)
		if code != 200 {
			t.Fatalf("prefill: got %d %s", code, b)
		}
		var pr openai.Completion
		if err := json.Unmarshal(b, &pr); err != nil {
			t.Fatal(err)
		}
		if len(pr.Choices) != 1 || pr.Choices[0].FinishReason == nil || *pr.Choices[0].FinishReason != openai.FinishStop {
			t.Fatalf("prefill: got %s, want finish_reason stop", b)
		}
		if !handed {
			if pr.KVTransferParams != nil {
				t.Errorf("prefill: got kv_transfer_params %v, want null", pr.KVTransferParams)
			}
			waitFor(t, "the prefill engine to free the stopped request's blocks", func() bool { return kvUsage(t, url) == 0 })
			return
		}
		if pr.KVTransferParams == nil || pr.KVTransferParams["do_remote_prefill"] != true {
			t.Errorf("prefill: got kv_transfer_params %v, want the handoff's", pr.KVTransferParams)
		}
		if u := kvUsage(t, url); u <= 0 {
			t.Errorf("prefill engine: got KV usage %v, want the blocks held for the pull", u)
		}
	}
	t.Run("eos", func(t *testing.T) {
		_, hs := testServer(t, Config{Role: kvroute.RolePrefill, EOSMean: 1, LeaseTimeout: time.Hour}) // EOS first
		check(t, hs.URL, fmt.Sprintf(`{"prompt":%q,%s}`, pdPrompt, prefill), false)
	})
	t.Run("stop string", func(t *testing.T) {
		_, hs := testServer(t, Config{Role: kvroute.RolePrefill, LeaseTimeout: time.Hour})
		_, b := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1,"seed":7}`, pdPrompt))
		var c openai.Completion
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Text == "" {
			t.Fatalf("first token: got %s (%v)", b, err)
		}
		check(t, hs.URL, fmt.Sprintf(`{"prompt":%q,"stop":[%q],%s}`, pdPrompt, c.Choices[0].Text, prefill), true)
	})
}

// TestPDLoadFailureDefaultFails: by default a decode engine whose pull
// fails (here: no lease, the prefill engine never held one) fails the
// request, as vLLM does since its kv_load_failure_policy default became
// "fail" (vLLM PR #34896; SGLang's decode engines never recompute a
// prompt either). The emulator recomputed it by default, so a lost lease
// went unnoticed behind a 200.
func TestPDLoadFailureDefaultFails(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode})
	host, port := splitHostPort(t, ps.URL)
	b, _ := json.Marshal(map[string]any{"prompt": pdPrompt, "max_tokens": 2, "kv_transfer_params": map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []int{0, 1}, "remote_engine_id": "gone",
		"remote_request_id": "never-prefilled", "remote_host": host, "remote_port": port}})
	code, body := post(t, ds.URL+"/v1/completions", string(b))
	if code != http.StatusInternalServerError || !strings.Contains(string(body), "KV transfer failed") {
		t.Errorf("got %d %s, want 500 KV transfer failed", code, body)
	}
}

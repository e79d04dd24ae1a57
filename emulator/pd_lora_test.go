package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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

// sglangPair runs an SGLang request's two legs at once, as SGLang's router
// does, and returns their answers. cancelOnDecodeFailure makes the client
// cancel the prefill leg when the decode leg fails, as kvroute's handoff
// does.
func sglangPair(t *testing.T, pURL, dURL, body string, cancelOnDecodeFailure bool) (pcode int, pbody string, dcode int, dbody string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefill := sendAsync(ctx, pURL+"/v1/completions", body)
	dc, db := post(t, dURL+"/v1/completions", body)
	if dc != http.StatusOK && cancelOnDecodeFailure {
		cancel()
	}
	pc, pb, _ := prefill()
	return pc, pb, dc, string(db)
}

// TestPDSGLangLoRA: an SGLang P/D pair serving a LoRA adapter, addressed
// as SGLang addresses one (lora_path, or "model" as "<base>:<adapter>"):
// both legs run the adapter (its blocks keyed with it: the adapter's
// repeat hits each engine's cache, the base model's request for the
// same prompt does not, on either engine: the decode engine, run with
// SGLang's --disaggregation-decode-enable-radix-cache (without it it has
// no prefix cache), caches the blocks it pulled under the adapter's keys),
// and
// SGLang answers in the request's model as given. A "model" naming the
// adapter alone is, to SGLang, the base model's request.
func TestPDSGLangLoRA(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, LoRA: serving("sql-lora")})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, LoRA: serving("sql-lora"), LoadFailure: LoadFailureFail,
		DisaggregationDecodeEnableRadixCache: true})
	host, port := splitHostPort(t, ps.URL)
	prompt := strings.Repeat(pdPrompt+" ", 6)
	hits := func(url string) float64 { return value(scrape(t, url)["vllm:prefix_cache_hits_total"].GetMetric()[0]) }
	for i, tc := range []struct {
		name, extra, model string
		hit                bool // both engines hold the prompt's blocks for this adapter (the decode engine those it pulled)
	}{
		{"lora_path", `"model":"tiny","lora_path":"sql-lora"`, "tiny", false},
		{"model with the adapter", `"model":"tiny:sql-lora"`, "tiny:sql-lora", true},
		{"base model", `"model":"tiny"`, "tiny", false},
		{"model naming the adapter alone", `"model":"sql-lora"`, "sql-lora", true}, // the base model's blocks, computed just before
	} {
		body := fmt.Sprintf(`{%s,"prompt":%q,"max_tokens":3,"ignore_eos":true,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`,
			tc.extra, prompt, host, port, 100+i)
		pbefore, dbefore := hits(ps.URL), hits(ds.URL)
		pcode, pbody, dcode, dbody := sglangPair(t, ps.URL, ds.URL, body, true)
		if pcode != http.StatusOK || dcode != http.StatusOK {
			t.Fatalf("%s: prefill %d %s, decode %d %s", tc.name, pcode, pbody, dcode, dbody)
		}
		var c openai.Completion
		_ = json.Unmarshal([]byte(dbody), &c)
		if c.Model != tc.model || c.Usage.CompletionTokens != 3 {
			t.Errorf("%s: decode answered %s, want 3 tokens in %q's name", tc.name, dbody, tc.model)
		}
		if got := hits(ps.URL) - pbefore; (got > 0) != tc.hit {
			t.Errorf("%s: the prefill engine's prefix-cache hit %v tokens, want a hit: %v", tc.name, got, tc.hit)
		}
		if got := hits(ds.URL) - dbefore; (got > 0) != tc.hit {
			t.Errorf("%s: the decode engine's own prefix-cache hit %v tokens, want a hit: %v", tc.name, got, tc.hit)
		}
	}
	waitFor(t, "both engines to free the blocks", func() bool { return kvUsage(t, ps.URL) == 0 })
}

// TestPDSGLangUnknownAdapter: an SGLang decode engine that does not serve
// the adapter a request names answers SGLang's 400 (its flat error body,
// LoRARegistry's message) before taking it, and tells the prefill engine
// nothing, as SGLang's decode engine does not. The prefill leg, which
// waits in the bootstrap queue for a decode engine that never comes, is
// never computed and holds no blocks: it leaves with its client (the
// router cancelling it when the decode leg failed) or, with a client that
// stays, fails at the bootstrap timeout with SGLang's 500. (Before, the
// prefill leg answered 200 at once and its blocks stayed held for
// LeaseTimeout, 480 s by default; then it was computed and held its
// blocks until either.) A prefill engine that does not serve the adapter
// answers the same 400.
func TestPDSGLangUnknownAdapter(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, LoRA: serving("sql-lora"),
		LeaseTimeout: time.Hour, BootstrapTimeout: 30 * time.Second}) // 0.3 s at speed 100
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, LoRA: serving("chat-lora")})
	host, port := splitHostPort(t, ps.URL)
	prompt := strings.Repeat(pdPrompt+" ", 6)
	body := func(room int) string {
		return fmt.Sprintf(`{"model":"tiny","lora_path":"sql-lora","prompt":%q,"max_tokens":3,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`,
			prompt, host, port, room)
	}
	const want400 = `{"object":"error","message":"The following requested LoRA adapters are not loaded: sql-lora\nLoaded adapters: odict_keys(['chat-lora']).","type":"BadRequestError","param":null,"code":400}` + "\n"
	for _, tc := range []struct {
		name   string
		cancel bool
		pcode  int
		pmsg   string
	}{
		{"the client cancels the prefill leg", true, 0, ""},
		{"the client waits", false, http.StatusInternalServerError, "timed out after 30.0s in KVPoll.Bootstrapping"},
	} {
		room := 7
		if !tc.cancel {
			room = 8
		}
		pcode, pbody, dcode, dbody := sglangPair(t, ps.URL, ds.URL, body(room), tc.cancel)
		if dcode != http.StatusBadRequest || dbody != want400 {
			t.Errorf("%s: decode got %d %s, want 400 %s", tc.name, dcode, dbody, want400)
		}
		if pcode != tc.pcode || !strings.Contains(pbody, tc.pmsg) || tc.pmsg != "" && !strings.Contains(pbody, `"object":"error"`) {
			t.Errorf("%s: prefill got %d %s, want %d %q", tc.name, pcode, pbody, tc.pcode, tc.pmsg)
		}
		waitFor(t, tc.name+": the prefill engine to free the blocks", func() bool { return kvUsage(t, ps.URL) == 0 })
		if got := value(scrape(t, ps.URL)["vllm:prompt_tokens_total"].GetMetric()[0]); got != 0 {
			t.Errorf("%s: the prefill engine computed %v prompt tokens, want none", tc.name, got)
		}
	}
	// The prefill engine refuses an adapter it does not serve the same way.
	b := fmt.Sprintf(`{"model":"tiny:chat-lora","prompt":%q,"max_tokens":3,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":9}`, prompt, host, port)
	if code, out := post(t, ps.URL+"/v1/completions", b); code != http.StatusBadRequest ||
		!strings.Contains(string(out), `"message":"The following requested LoRA adapters are not loaded: chat-lora\nLoaded adapters: odict_keys(['sql-lora']).","type":"BadRequestError"`) {
		t.Errorf("prefill engine, chat-lora: got %d %s", code, out)
	}
}

// TestSGLangStreamedUnknownAdapter: SGLang answers a streamed request
// naming an adapter it does not serve with a 200 whose stream is the error
// event and [DONE], on /v1/chat/completions and /v1/completions alike: the
// adapter is acquired inside the tokenizer manager's generate_request,
// which a streamed response runs after its StreamingResponse started, and
// the serving code yields create_streaming_error_response's event (Python's
// json.dumps of {"error": ErrorResponse}). A request that does not stream
// keeps the flat 400. Before, a streamed request got the flat 400 too.
func TestSGLangStreamedUnknownAdapter(t *testing.T) {
	_, hs := testServer(t, Config{PDProtocol: PDSGLang, LoRA: serving("chat-lora")})
	const want = `data: {"error": {"object": "error", "message": "The following requested LoRA adapters are not loaded: sql-lora\nLoaded adapters: odict_keys(['chat-lora']).", "type": "BadRequestError", "param": null, "code": 400}}` +
		"\n\ndata: [DONE]\n\n"
	const want400 = `{"object":"error","message":"The following requested LoRA adapters are not loaded: sql-lora\nLoaded adapters: odict_keys(['chat-lora']).","type":"BadRequestError","param":null,"code":400}` + "\n"
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		for _, form := range []string{`"model":"tiny","lora_path":"sql-lora"`, `"model":"tiny:sql-lora"`} {
			input := `"prompt":"Hello there"`
			if path == "/v1/chat/completions" {
				input = `"messages":[{"role":"user","content":"Hello there"}]`
			}
			for _, stream := range []bool{true, false} {
				body := fmt.Sprintf(`{%s,%s,"max_tokens":3,"stream":%v}`, form, input, stream)
				resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				ct := resp.Header.Get("Content-Type")
				switch {
				case stream && (resp.StatusCode != http.StatusOK || string(b) != want || ct != "text/event-stream; charset=utf-8"):
					t.Errorf("%s %s, streamed: got %d (%s) %q, want 200 (text/event-stream; charset=utf-8) %q", path, form, resp.StatusCode, ct, b, want)
				case !stream && (resp.StatusCode != http.StatusBadRequest || string(b) != want400):
					t.Errorf("%s %s: got %d %q, want 400 %q", path, form, resp.StatusCode, b, want400)
				}
			}
		}
	}
}

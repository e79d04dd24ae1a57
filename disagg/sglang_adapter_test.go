package disagg

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/openai"
)

// engineGauge reads an unlabelled series of an emulated engine's /metrics.
func engineGauge(t *testing.T, u, name string) float64 {
	t.Helper()
	resp, err := http.Get(u + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	t.Fatalf("%s: no %s", u, name)
	return 0
}

// TestSGLangAdapterLive: SGLang P/D with a LoRA adapter, through the
// handoff, against two emulated SGLang engines (prefill and decode) that
// serve it. The client names the adapter as its model (kvroute's adapter
// routing); both legs go to engines serving it and name it as SGLang
// reads an adapter, lora_path, so both engines run it: the repeat hits
// the prefill engine's cache under the adapter's keys, and the base
// model's request for the same prompt does not (without lora_path SGLang
// runs the base model on both). An adapter no decode endpoint serves is
// the router's 503, reaching no engine. A decode engine the router
// believes serves an adapter but does not answers SGLang's 400, replayed
// to the client; the prefill leg is cancelled, and the prefill engine,
// which kept it uncomputed in its bootstrap queue, holds no blocks for it
// (before the emulator's fixes, for LeaseTimeout, then until the leg was
// cancelled).
func TestSGLangAdapterLive(t *testing.T) {
	_, pre := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: kvroute.RolePrefill, PDProtocol: ProtocolSGLang,
		LoRA: emulatortest.LoRA("sql-lora", "chat-lora"), LeaseTimeout: time.Hour, BootstrapTimeout: time.Hour}, nil)
	_, dec := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: kvroute.RoleDecode, PDProtocol: ProtocolSGLang,
		LoRA: emulatortest.LoRA("sql-lora"), LoadFailure: emulator.LoadFailureFail}, nil)
	_, port := hostPort(t, pre.URL)
	p := endpoint("p", pre.URL, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port))
	p.Adapters = []string{"chat-lora", "solo-lora", "sql-lora"}
	d := endpoint("d", dec.URL, kvroute.RoleDecode)
	d.Adapters = []string{"chat-lora", "sql-lora"} // chat-lora: the router's config is wrong
	f := newPD(t, ProtocolSGLang, ModeAlways, p, d)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		ri, err := openai.ParseRequest(openai.KindCompletion, body)
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		kr := &kvroute.Request{ID: fmt.Sprint(time.Now().UnixNano()), Model: "tiny", Prompt: ri.Prompt,
			PromptTokens: ri.PromptTokens(), MaxTokens: ri.MaxTokens, Arrival: time.Now()}
		if ri.Model != "tiny" { // an adapter, as the proxy finds it
			kr.Adapter = ri.Model
		}
		f.h.Serve(w, req, req.URL.Path, body, kr)
	}))
	t.Cleanup(srv.Close)
	send := func(model, prompt string) (int, string) {
		t.Helper()
		b := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":3,"ignore_eos":true}`, model, prompt)
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	long := strings.Repeat(prompt+" ", 4)
	hits := func() float64 { return engineGauge(t, pre.URL, "vllm:prefix_cache_hits_total") }

	for i, tc := range []struct {
		model string
		hit   bool
	}{{"sql-lora", false}, {"sql-lora", true}, {"tiny", false}} {
		before, n := hits(), f.rec.count()
		code, out := send(tc.model, long)
		if code != http.StatusOK || !strings.Contains(out, `"completion_tokens":3`) {
			t.Fatalf("request %d (%s): got %d %s", i, tc.model, code, out)
		}
		f.rec.mu.Lock()
		legs := append([]leg(nil), f.rec.legs[n:]...)
		f.rec.mu.Unlock()
		if len(legs) != 2 {
			t.Fatalf("request %d: %d legs, want 2", i, len(legs))
		}
		want := any(tc.model)
		if tc.model == "tiny" {
			want = nil
		}
		for _, l := range legs {
			if l.body["lora_path"] != want || l.body["model"] != tc.model {
				t.Errorf("request %d: leg to %s has model %v, lora_path %v; want %s, %v", i, l.host, l.body["model"], l.body["lora_path"], tc.model, want)
			}
		}
		if got := hits() - before; (got > 0) != tc.hit {
			t.Errorf("request %d (%s): the prefill engine's prefix-cache hit %v tokens, want a hit: %v", i, tc.model, got, tc.hit)
		}
	}

	// No decode endpoint serves solo-lora: the router's 503, no leg.
	n := f.rec.count()
	if code, out := send("solo-lora", long); code != http.StatusServiceUnavailable || !strings.Contains(out, "solo-lora") {
		t.Errorf("solo-lora: got %d %s, want 503 naming it", code, out)
	}
	if f.rec.count() != n {
		t.Errorf("solo-lora: %d legs sent, want none", f.rec.count()-n)
	}

	// The decode engine does not serve chat-lora, whatever the router
	// believes: its SGLang 400, replayed; the prefill engine, which never
	// computed the leg (its decode engine never bootstrapped the room),
	// holds no blocks once the router cancelled it.
	code, out := send("chat-lora", long)
	const want = `{"object":"error","message":"The following requested LoRA adapters are not loaded: chat-lora\nLoaded adapters: odict_keys(['sql-lora']).","type":"BadRequestError","param":null,"code":400}` + "\n"
	if code != http.StatusBadRequest || out != want {
		t.Errorf("chat-lora: got %d %s, want the decode engine's 400 %s", code, out, want)
	}
	deadline := time.Now().Add(5 * time.Second)
	for engineGauge(t, pre.URL, "vllm:kv_cache_usage_perc") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("chat-lora: the prefill engine still holds blocks 5 s after the decode leg was refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSGLangStreamedAdapterRefusedLive: a streamed request whose adapter
// the SGLang decode engine does not serve (the router's config believes it
// does), through the handoff against two emulated SGLang engines: the
// decode engine answers as SGLang does, a 200 whose stream is the error
// event and [DONE], which the client gets byte for byte; the two legs are
// all that is sent (nothing is placed again), and the prefill leg, which
// waits in the prefill engine's bootstrap queue for a decode engine that
// will never come, is cancelled at once rather than after PrefillGrace
// (the decode engine refused the request: it will not take the KV), so
// the prefill engine computes nothing and holds no blocks.
func TestSGLangStreamedAdapterRefusedLive(t *testing.T) {
	_, pre := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: kvroute.RolePrefill, PDProtocol: ProtocolSGLang,
		MetricsFlavor: emulator.FlavorSGLang, LoRA: emulatortest.LoRA("sql-lora", "chat-lora"), LeaseTimeout: time.Hour,
		BootstrapTimeout: time.Hour}, nil)
	_, dec := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: kvroute.RoleDecode, PDProtocol: ProtocolSGLang,
		MetricsFlavor: emulator.FlavorSGLang, LoRA: emulatortest.LoRA("sql-lora"), LoadFailure: emulator.LoadFailureFail}, nil)
	_, port := hostPort(t, pre.URL)
	p := endpoint("p", pre.URL, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port))
	d := endpoint("d", dec.URL, kvroute.RoleDecode)
	p.Adapters = []string{"chat-lora", "sql-lora"}
	d.Adapters = []string{"chat-lora", "sql-lora"} // chat-lora: the router's config is wrong
	f := newPD(t, ProtocolSGLang, ModeAlways, p, d)
	f.h.cfg.PrefillGrace = time.Hour // a handoff waiting for the prefill leg's reply hangs the test
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		kind := openai.KindCompletion
		if req.URL.Path == "/v1/chat/completions" {
			kind = openai.KindChat
		}
		ri, err := openai.ParseRequest(kind, body)
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		kr := &kvroute.Request{ID: fmt.Sprint(time.Now().UnixNano()), Model: "tiny", Prompt: ri.Prompt,
			PromptTokens: ri.PromptTokens(), MaxTokens: ri.MaxTokens, Stream: ri.Stream, Arrival: time.Now(), Adapter: ri.Model}
		f.h.Serve(w, req, req.URL.Path, body, kr)
	}))
	t.Cleanup(srv.Close)
	const want = `data: {"error": {"object": "error", "message": "The following requested LoRA adapters are not loaded: chat-lora\nLoaded adapters: odict_keys(['sql-lora']).", "type": "BadRequestError", "param": null, "code": 400}}` +
		"\n\ndata: [DONE]\n\n"
	long := strings.Repeat(prompt+" ", 4)
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		input := fmt.Sprintf(`"prompt":%q`, long)
		if path == "/v1/chat/completions" {
			input = fmt.Sprintf(`"messages":[{"role":"user","content":%q}]`, long)
		}
		n := f.rec.count()
		b := fmt.Sprintf(`{"model":"chat-lora",%s,"max_tokens":3,"stream":true}`, input)
		client := &http.Client{Timeout: 10 * time.Second} // the handoff waiting for the prefill leg hangs
		resp, err := client.Post(srv.URL+path, "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		code := resp.StatusCode
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: no whole answer: %v (the handoff waits for the prefill leg)", path, err)
		}
		if code != http.StatusOK || string(out) != want {
			t.Errorf("%s: got %d %q, want 200 %q", path, code, out, want)
		}
		if got := f.rec.count() - n; got != 2 {
			t.Errorf("%s: %d legs sent, want 2 (nothing placed again)", path, got)
		}
		if strings.Contains(f.logs.String(), "prefill leg still unanswered") {
			t.Errorf("%s: the handoff waited for the prefill leg: %s", path, f.logs.String())
		}
		deadline := time.Now().Add(5 * time.Second)
		for engineGauge(t, pre.URL, "sglang:num_prefill_prealloc_queue_reqs") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the prefill leg still waits in the bootstrap queue 5 s after the decode leg's refusal", path)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := engineGauge(t, pre.URL, "sglang:prompt_tokens_total"); got != 0 {
			t.Errorf("%s: the prefill engine computed %v prompt tokens, want none", path, got)
		}
		if got := engineGauge(t, pre.URL, "sglang:token_usage"); got != 0 {
			t.Errorf("%s: the prefill engine holds %v of its cache, want none", path, got)
		}
	}
	// The engines stay in the pool: the adapter both serve is answered.
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":"sql-lora","prompt":%q,"max_tokens":3,"stream":true}`, long)))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(out), `"finish_reason":"length"`) {
		t.Errorf("sql-lora after the refusals: got %d %s", resp.StatusCode, out)
	}
}

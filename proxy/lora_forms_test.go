package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/signals"
)

// The tests of the LoRA adapter forms: a client names an adapter as vLLM
// reads it ("model": "<adapter>") or as SGLang does ("model":
// "<base>:<adapter>", "lora_path"); the router routes it the same way
// and forwards it in the form the chosen engine reads.

// recorder keeps the bodies of an engine's /v1/ requests.
type recorder struct {
	mu     sync.Mutex
	bodies []string
}

func (rc *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			b, _ := io.ReadAll(r.Body)
			rc.mu.Lock()
			rc.bodies = append(rc.bodies, string(b))
			rc.mu.Unlock()
			r.Body = io.NopCloser(strings.NewReader(string(b)))
		}
		h.ServeHTTP(w, r)
	})
}

func (rc *recorder) got() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.bodies)
}

// last returns the last body the engine got, decoded.
func (rc *recorder) last(t *testing.T) map[string]any {
	t.Helper()
	got := rc.got()
	if len(got) == 0 {
		t.Fatal("the engine got no request")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(got[len(got)-1]), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// formsEngine is one emulated engine of a forms test: its kind ("vllm"
// or "sglang": the emulator's metrics and LoRA forms), the flavor the
// router's config names (signals.flavor; "" for auto) and the adapters
// the router's config says it serves (nil: all).
type formsEngine struct {
	id, kind, flavor string
	adapters         []string
}

// formsProxy serves model "tiny" with adapters sql-lora and chat-lora over
// emulated engines (each loading both adapters), routed round-robin, with
// active health checks and scraping off. It returns the engines'
// recorders by ID.
func formsProxy(t *testing.T, engines ...formsEngine) (*testProxy, map[string]*recorder) {
	t.Helper()
	cfg := formsConfig(t, engines...)
	cfg.Models[0].Signals.Disabled = true
	tp := newTestProxy(t, cfg.Config)
	return tp, cfg.recs
}

type formsCfg struct {
	config.Config
	recs map[string]*recorder
}

func formsConfig(t *testing.T, engines ...formsEngine) formsCfg {
	t.Helper()
	cfg := testConfig("rr")
	m := &cfg.Models[0]
	m.Name, m.Adapters = "tiny", []string{"sql-lora", "chat-lora"}
	recs := map[string]*recorder{}
	for _, e := range engines {
		rc := &recorder{}
		recs[e.id] = rc
		hs := startFormsEngine(t, e.kind, rc)
		m.Endpoints = append(m.Endpoints, config.Endpoint{ID: e.id, URL: hs.URL, Adapters: e.adapters,
			Signals: config.EndpointSignals{Flavor: e.flavor}})
	}
	return formsCfg{cfg, recs}
}

// startFormsEngine starts an emulated engine of kind serving "tiny" with
// LoRA adapters sql-lora and chat-lora: a vLLM engine (vLLM's metrics,
// adapters named by "model"), or an SGLang engine (SGLang's metrics,
// adapters named by lora_path or "<base>:<adapter>", SGLang's 400 for an
// unknown one).
func startFormsEngine(t *testing.T, kind string, rc *recorder) *httptest.Server {
	t.Helper()
	cfg := emulator.Config{Model: "tiny", MetricsFlavor: emulator.FlavorVLLM,
		LoRA: emulator.LoRAConfig{Enable: true, MaxLoRAs: 2, Modules: []emulator.LoRAModule{
			{Name: "sql-lora", Path: "/adapters/sql"}, {Name: "chat-lora", Path: "/adapters/chat"}}}}
	if kind == "sglang" {
		cfg.MetricsFlavor, cfg.PDProtocol = emulator.FlavorSGLang, emulator.PDSGLang
	}
	_, hs := emulatortest.Start(t, cfg, rc.wrap)
	return hs
}

// answerModel posts body and returns the "model" of the engine's 200
// answer.
func answerModel(t *testing.T, tp *testProxy, path, body string) string {
	t.Helper()
	resp := tp.post(t, path, body)
	out := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: got %d %s, want 200", body, resp.StatusCode, out)
	}
	var r struct{ Model string }
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("POST %s: answer %q: %v", body, out, err)
	}
	return r.Model
}

// TestSGLangFormsToVLLM: a client naming an adapter in SGLang's forms
// ("<base>:<adapter>", lora_path, a batch's lora_path list) is routed as
// vLLM's form is, only to the engines serving the adapter, and reaches a
// vLLM engine in vLLM's form: "model" is the adapter, lora_path gone; the
// engine runs the adapter (its answer names it). The decision log names
// the adapter.
func TestSGLangFormsToVLLM(t *testing.T) {
	tp, recs := formsProxy(t,
		formsEngine{id: "base", kind: "vllm", flavor: "vllm", adapters: []string{"chat-lora"}},
		formsEngine{id: "v", kind: "vllm", flavor: "vllm", adapters: []string{"sql-lora"}})
	for _, body := range []string{
		`{"model":"tiny:sql-lora","prompt":"hello there","max_tokens":2}`,
		`{"model":"tiny : sql-lora ","prompt":"hello there","max_tokens":2}`,
		`{"model":"tiny","prompt":"hello there","max_tokens":2,"lora_path":"sql-lora"}`,
		`{"model":"tiny","prompt":["hello there"],"max_tokens":2,"lora_path":["sql-lora"]}`,
		`{"model":"tiny:sql-lora","prompt":"hello there","max_tokens":2,"lora_path":"sql-lora"}`,
	} {
		t.Run(body, func(t *testing.T) {
			before := len(recs["base"].got())
			if got := answerModel(t, tp, PathCompletions, body); got != "sql-lora" {
				t.Errorf("answer's model %q, want sql-lora (the adapter ran)", got)
			}
			if n := len(recs["base"].got()); n != before {
				t.Errorf("an engine not serving sql-lora got the request")
			}
			m := recs["v"].last(t)
			if _, has := m["lora_path"]; m["model"] != "sql-lora" || has {
				t.Errorf("engine got model %v, lora_path %v; want model sql-lora, no lora_path", m["model"], m["lora_path"])
			}
			d := tp.Router("tiny").Decisions(1)
			if len(d) != 1 || d[0].Adapter != "sql-lora" {
				t.Errorf("decision log: %+v, want adapter sql-lora", d)
			}
		})
	}
}

// TestVLLMFormToSGLang: a request naming an adapter in vLLM's form reaches
// an SGLang engine with lora_path naming it (SGLang would run the base
// model for a "model" naming the adapter alone), its model as sent; SGLang's
// own forms reach it byte for byte.
func TestVLLMFormToSGLang(t *testing.T) {
	tp, recs := formsProxy(t, formsEngine{id: "s", kind: "sglang", flavor: "sglang"})
	body := `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	answerModel(t, tp, PathChatCompletions, body)
	m := recs["s"].last(t)
	if m["model"] != "sql-lora" || m["lora_path"] != "sql-lora" {
		t.Errorf("engine got model %v, lora_path %v; want sql-lora and sql-lora", m["model"], m["lora_path"])
	}
	for _, body := range []string{
		`{"model":"tiny:chat-lora","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		`{"model":"tiny", "messages":[{"role":"user","content":"hi"}],"lora_path":"chat-lora"}`,
		`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`,
	} {
		answerModel(t, tp, PathChatCompletions, body)
		if got := recs["s"].got(); got[len(got)-1] != body {
			t.Errorf("engine got %s, want the client's body %s", got[len(got)-1], body)
		}
	}
}

// TestVLLMFormUntouched: a request in the form the engine reads, or for
// the base model, is forwarded byte for byte, to either engine; so is
// every request to an engine whose kind the router does not know (no
// signals.flavor, no scrape).
func TestVLLMFormUntouched(t *testing.T) {
	tp, recs := formsProxy(t,
		formsEngine{id: "v", kind: "vllm", flavor: "vllm"},
		formsEngine{id: "s", kind: "sglang", flavor: "sglang"},
		formsEngine{id: "u", kind: "vllm"})
	for _, tc := range []struct{ body, id string }{
		{`{"model":"sql-lora","prompt":"hello there","max_tokens":2}`, "v"},
		{`{"model":"tiny","prompt":"hello there","max_tokens":2}`, "s"},
		{`{"model":"tiny","prompt":"hello there","max_tokens":2}`, "u"},
		{`{"model":"tiny","prompt":"hello there","max_tokens":2}`, "v"},
		{`{"model":"tiny:sql-lora","prompt":"hello there","max_tokens":2}`, "s"},
		{`{"model":"tiny:sql-lora","prompt":"hello there","max_tokens":2}`, "u"}, // unknown kind: as sent (vLLM's 404)
	} {
		resp := tp.post(t, PathCompletions, tc.body)
		readAll(t, resp)
		if got := recs[tc.id].got(); len(got) == 0 || got[len(got)-1] != tc.body {
			t.Errorf("engine %s got %v, want the client's body %s", tc.id, got, tc.body)
		}
	}
}

// TestAdapterFormErrors: SGLang's forms fail as vLLM's does: an adapter
// the model does not have is the router's 404, one whose engines are all
// unhealthy its 503; two adapters named at once (model and lora_path, or
// a batch's list) are a 400 naming both.
func TestAdapterFormErrors(t *testing.T) {
	tp, recs := formsProxy(t,
		formsEngine{id: "v", kind: "vllm", flavor: "vllm", adapters: []string{"sql-lora"}},
		formsEngine{id: "s", kind: "sglang", flavor: "sglang"})
	r := tp.Router("tiny")
	r.SetActiveHealth(tp.clock.Now(), "v", false)
	r.SetActiveHealth(tp.clock.Now(), "s", false)
	for _, tc := range []struct {
		body        string
		status      int
		code, param string
		says        []string
	}{
		{`{"model":"tiny:nope","prompt":"p"}`, 404, "model_not_found", "model", []string{"`tiny`", "`nope`"}},
		{`{"model":"tiny","prompt":"p","lora_path":"nope"}`, 404, "model_not_found", "lora_path", []string{"`nope`"}},
		{`{"model":"other:sql-lora","prompt":"p"}`, 404, "model_not_found", "model", []string{"`other:sql-lora`"}},
		{`{"model":"tiny:sql-lora","prompt":"p","lora_path":"chat-lora"}`, 400, "conflicting_adapters", "lora_path",
			[]string{`"sql-lora"`, `"chat-lora"`}},
		{`{"model":"chat-lora","prompt":"p","lora_path":"sql-lora"}`, 400, "conflicting_adapters", "lora_path",
			[]string{`"sql-lora"`, `"chat-lora"`}},
		{`{"model":"tiny","prompt":["a","b"],"lora_path":["sql-lora","chat-lora"]}`, 400, "mixed_adapters", "lora_path",
			[]string{`"sql-lora"`, `"chat-lora"`}},
		{`{"model":"tiny:sql-lora","prompt":"p"}`, 503, "no_adapter_endpoint", "", []string{"sql-lora"}},
		{`{"model":"tiny","prompt":"p","lora_path":"sql-lora"}`, 503, "no_adapter_endpoint", "", []string{"sql-lora"}},
		{`{"model":"sql-lora","prompt":"p"}`, 503, "no_adapter_endpoint", "", []string{"sql-lora"}},
	} {
		resp := tp.post(t, PathCompletions, tc.body)
		out, e, param := errorBody(t, resp)
		if resp.StatusCode != tc.status || e.Error.Code != tc.code || param != tc.param {
			t.Errorf("%s: got %d %s, want %d with code %s, param %q", tc.body, resp.StatusCode, out, tc.status, tc.code, tc.param)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(e.Error.Message, s) {
				t.Errorf("%s: message %q does not name %s", tc.body, e.Error.Message, s)
			}
		}
	}
	if n := len(recs["v"].got()) + len(recs["s"].got()); n != 0 {
		t.Errorf("the engines got %d requests, want none", n)
	}
}

// TestAdapterFormRetry: a request retried on an engine of another kind is
// sent in that engine's form: SGLang's lora_path to the SGLang engine that
// failed, then vLLM's model to the vLLM engine that answers.
func TestAdapterFormRetry(t *testing.T) {
	var failed recorder
	fail := httptest.NewServer(failed.wrap(statusHandler(http.StatusInternalServerError)))
	t.Cleanup(fail.Close)
	cfg := formsConfig(t, formsEngine{id: "v", kind: "vllm", flavor: "vllm"})
	m := &cfg.Models[0]
	m.Signals.Disabled = true
	m.Endpoints = append([]config.Endpoint{{ID: "s", URL: fail.URL, Signals: config.EndpointSignals{Flavor: "sglang"}}}, m.Endpoints...)
	cfg.Retry.Attempts = 2
	tp := newTestProxy(t, cfg.Config)
	body := `{"model":"sql-lora","prompt":"hello there","max_tokens":2}`
	if got := answerModel(t, tp, PathCompletions, body); got != "sql-lora" {
		t.Errorf("answer's model %q, want sql-lora", got)
	}
	var first map[string]any
	if got := failed.got(); len(got) != 1 || json.Unmarshal([]byte(got[0]), &first) != nil || first["lora_path"] != "sql-lora" {
		t.Errorf("the SGLang engine got %v, want one request with lora_path sql-lora", got)
	}
	if got := cfg.recs["v"].got(); len(got) != 1 || got[0] != body {
		t.Errorf("the vLLM engine got %v, want the client's body %s", got, body)
	}
}

// TestAdapterFormDetected: with signals.flavor auto, an engine's kind is
// the one its scrape detected: before its first scrape the body goes as
// sent; after it, SGLang's engine gets lora_path and vLLM's engine
// "model" naming the adapter.
func TestAdapterFormDetected(t *testing.T) {
	cfg := formsConfig(t, formsEngine{id: "s", kind: "sglang"}, formsEngine{id: "v", kind: "vllm"})
	cfg.Models[0].Policy.Name = "first"
	tp := newTestProxy(t, cfg.Config)
	r := tp.Router("tiny")
	post := func(id, body string) map[string]any {
		t.Helper()
		now := tp.clock.Now()
		r.SetActiveHealth(now, "s", id == "s")
		r.SetActiveHealth(now, "v", id == "v")
		answerModel(t, tp, PathCompletions, body)
		return cfg.recs[id].last(t)
	}
	vform := `{"model":"sql-lora","prompt":"hello there","max_tokens":2}`
	if m := post("s", vform); m["lora_path"] != nil {
		t.Errorf("before a scrape: the SGLang engine got lora_path %v, want the body as sent", m["lora_path"])
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunSignals(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "both engines' flavours detected", func() bool {
		s, v := r.View("s"), r.View("v")
		return s.Flavor() == signals.FlavorSGLang && v.Flavor() == signals.FlavorVLLM
	})
	if m := post("s", vform); m["lora_path"] != "sql-lora" || m["model"] != "sql-lora" {
		t.Errorf("SGLang engine got model %v, lora_path %v; want sql-lora, sql-lora", m["model"], m["lora_path"])
	}
	if m := post("v", `{"model":"tiny:sql-lora","prompt":"hello there","max_tokens":2}`); m["model"] != "sql-lora" {
		t.Errorf("vLLM engine got model %v, want sql-lora", m["model"])
	}
}

// TestAdapterFormPD: on a pd.protocol nixl pool (vLLM's engines) both legs
// of a request naming its adapter in SGLang's form carry vLLM's form; the
// client gets the adapter's answer.
func TestAdapterFormPD(t *testing.T) {
	lora := emulator.LoRAConfig{Enable: true, MaxLoRAs: 2, Modules: []emulator.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}}}
	var pr, dr recorder
	_, ps := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: kvroute.RolePrefill, LoRA: lora}, pr.wrap)
	_, ds := emulatortest.Start(t, emulator.Config{Model: "tiny", Role: kvroute.RoleDecode, LoRA: lora,
		LoadFailure: emulator.LoadFailureFail}, dr.wrap)
	cfg := pdTestConfig("", "nixl", ps.URL, ds.URL)
	cfg.Models[0].Adapters = []string{"sql-lora"}
	tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: policy.New})
	body := `{"model":"tiny","prompt":"hello there, a prompt longer than one block of the tiny profile","max_tokens":2,"lora_path":"sql-lora"}`
	if got := answerModel(t, tp, PathCompletions, body); got != "sql-lora" {
		t.Errorf("answer's model %q, want sql-lora", got)
	}
	for leg, rc := range map[string]*recorder{"prefill": &pr, "decode": &dr} {
		m := rc.last(t)
		if _, has := m["lora_path"]; m["model"] != "sql-lora" || has {
			t.Errorf("%s leg got model %v, lora_path %v; want model sql-lora, no lora_path", leg, m["model"], m["lora_path"])
		}
	}
}

// TestSGLangStreamedUnknownAdapter: an SGLang engine answers a streamed
// request naming an adapter it does not serve with a 200 whose stream is
// SGLang's error event and [DONE] (the router's config believes it serves
// the adapter): the router passes the stream on to the client byte for
// byte, retries nothing (one request reached the engine) and keeps the
// engine in the pool (the next request is answered). A request that does
// not stream gets the engine's flat 400, replayed.
func TestSGLangStreamedUnknownAdapter(t *testing.T) {
	rc := &recorder{}
	_, hs := emulatortest.Start(t, emulator.Config{Model: "tiny", MetricsFlavor: emulator.FlavorSGLang, PDProtocol: emulator.PDSGLang,
		LoRA: emulatortest.LoRA("sql-lora")}, rc.wrap)
	cfg := testConfig("rr")
	m := &cfg.Models[0]
	m.Name, m.Adapters = "tiny", []string{"sql-lora", "chat-lora"}
	m.Endpoints = []config.Endpoint{{ID: "s", URL: hs.URL, Signals: config.EndpointSignals{Flavor: "sglang"}}}
	m.Signals.Disabled = true
	tp := newTestProxy(t, cfg)
	const msg = `The following requested LoRA adapters are not loaded: chat-lora\nLoaded adapters: odict_keys(['sql-lora']).`
	wantStream := `data: {"error": {"object": "error", "message": "` + msg + `", "type": "BadRequestError", "param": null, "code": 400}}` +
		"\n\ndata: [DONE]\n\n"
	want400 := `{"object":"error","message":"` + msg + `","type":"BadRequestError","param":null,"code":400}` + "\n"
	n := 0
	for _, path := range []string{PathChatCompletions, PathCompletions} {
		input := `"prompt":"hi"`
		if path == PathChatCompletions {
			input = `"messages":[{"role":"user","content":"hi"}]`
		}
		for _, stream := range []bool{true, false} {
			body := fmt.Sprintf(`{"model":"chat-lora",%s,"max_tokens":2,"stream":%v}`, input, stream)
			resp := tp.post(t, path, body)
			out := readAll(t, resp)
			n++
			switch {
			case stream && (resp.StatusCode != http.StatusOK || out != wantStream):
				t.Errorf("%s, streamed: got %d %q, want 200 %q", path, resp.StatusCode, out, wantStream)
			case !stream && (resp.StatusCode != http.StatusBadRequest || out != want400):
				t.Errorf("%s: got %d %q, want 400 %q", path, resp.StatusCode, out, want400)
			}
			if got := len(rc.got()); got != n {
				t.Fatalf("%s (stream %v): the engine got %d requests in all, want %d (no retry)", path, stream, got, n)
			}
		}
	}
	if model := answerModel(t, tp, PathChatCompletions, `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); model != "sql-lora" {
		t.Errorf("after the refusals: answered in model %q, want sql-lora", model)
	}
}

package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/signals"
)

// The tests of LoRA adapters on llama.cpp servers (openai.AdapterLlamaCPP)
// and TGI (vLLM's form), against fake engines speaking their wire formats.

// llamaAdapters is a fake llama.cpp server's GET /lora-adapters, in the
// server's JSON (server_task_result_get_lora): started with --lora
// /models/sql-lora.gguf --lora-scaled /models/chat.gguf:0.5 (task_name
// chat-lora) --lora other.gguf, the last one's global scale set to 0.
const llamaAdapters = `[{"id":0,"path":"/models/sql-lora.gguf","scale":1.0,"task_name":"","prompt_prefix":""},` +
	`{"id":1,"path":"/models/chat.gguf","scale":0.5,"task_name":"chat-lora","prompt_prefix":""},` +
	`{"id":2,"path":"other.gguf","scale":0.0,"task_name":"","prompt_prefix":""}]`

// fakeLlama is a llama.cpp server: /metrics (llama.cpp's names, 503 while
// "loading"), /slots, /props, /health, /lora-adapters (list) and the
// OpenAI routes, which record their bodies and answer in the request's
// model.
type fakeLlama struct {
	*httptest.Server
	rec     recorder
	mu      sync.Mutex
	list    string // "" answers 404
	loading bool
}

func newFakeLlama(t *testing.T, list string) *fakeLlama {
	t.Helper()
	f := &fakeLlama{list: list}
	f.Server = httptest.NewServer(f.rec.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		list, loading := f.list, f.loading
		f.mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			if loading {
				http.Error(w, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"+
				"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")
		case "/slots":
			fmt.Fprint(w, `[{"id":0,"n_ctx":4096,"speculative":false,"is_processing":false}]`)
		case "/props":
			fmt.Fprint(w, `{"default_generation_settings":{"n_ctx":4096},"total_slots":1}`)
		case "/health":
			fmt.Fprint(w, `{"status":"ok"}`)
		case "/lora-adapters":
			if list == "" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			fmt.Fprint(w, list)
		case PathCompletions, PathChatCompletions:
			b, _ := io.ReadAll(r.Body)
			var req struct{ Model string }
			_ = json.Unmarshal(b, &req)
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","model":%q,"choices":[{"index":0,"text":"ok","finish_reason":"stop"}],`+
				`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, req.Model)
		default:
			http.NotFound(w, r)
		}
	})))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeLlama) set(list string, loading bool) {
	f.mu.Lock()
	f.list, f.loading = list, loading
	f.mu.Unlock()
}

// llamaEngine is one fake llama.cpp server of a llamaProxy: its ID, its
// /lora-adapters and the signals.flavor the config gives it.
type llamaEngine struct {
	id, list, flavor string
}

// llamaProxy serves model "tiny" with adapters sql-lora, chat-lora and
// nope-lora (which no engine lists) over fake llama.cpp servers, routed
// to the first healthy endpoint, its signals scraped every 10ms; it waits
// until each engine's adapter list has been read.
func llamaProxy(t *testing.T, attempts int, engines ...llamaEngine) (*testProxy, map[string]*fakeLlama) {
	t.Helper()
	cfg := testConfig("first")
	cfg.Retry.Attempts = attempts
	m := &cfg.Models[0]
	m.Name, m.Adapters = "tiny", []string{"sql-lora", "chat-lora", "nope-lora"}
	m.Signals.ScrapeInterval = 10 * time.Millisecond
	fakes := map[string]*fakeLlama{}
	for _, e := range engines {
		f := newFakeLlama(t, e.list)
		fakes[e.id] = f
		m.Endpoints = append(m.Endpoints, config.Endpoint{ID: e.id, URL: f.URL, Signals: config.EndpointSignals{Flavor: e.flavor}})
	}
	tp := newTestProxy(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunSignals(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r := tp.Router("tiny")
	waitFor(t, "the engines' adapter lists read", func() bool {
		for _, e := range engines {
			if v := r.View(e.id); v.Flavor() != signals.FlavorLlamaCPP || v.LlamaAdapters() == nil {
				return false
			}
		}
		return true
	})
	return tp, fakes
}

// loraOf returns the "lora" list of an engine's request body, and whether
// it had one.
func loraOf(t *testing.T, m map[string]any) ([]openai.LoRAScale, bool) {
	t.Helper()
	raw, ok := m["lora"]
	if !ok {
		return nil, false
	}
	b, _ := json.Marshal(raw)
	var l []openai.LoRAScale
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("lora %s: %v", b, err)
	}
	return l, true
}

// TestLlamaCPPAdapterForms: whichever form a client names an adapter in,
// a llama.cpp server gets "lora" listing each of its adapters by id, the
// request's at its global scale (1 where that is 0) and the others at 0,
// "model" the base model and no lora_path; a request for the base model
// lists every adapter at 0, the client's own list replaced, so that no
// global scale applies. Detected (auto) or configured, alike.
func TestLlamaCPPAdapterForms(t *testing.T) {
	for _, flavor := range []string{"", "llamacpp"} {
		t.Run("flavor="+flavor, func(t *testing.T) {
			tp, fakes := llamaProxy(t, 1, llamaEngine{id: "l", list: llamaAdapters, flavor: flavor})
			base := []openai.LoRAScale{{ID: 0}, {ID: 1}, {ID: 2}}
			sql := []openai.LoRAScale{{ID: 0, Scale: 1}, {ID: 1}, {ID: 2}}
			chat := []openai.LoRAScale{{ID: 0}, {ID: 1, Scale: 0.5}, {ID: 2}}
			for _, tc := range []struct {
				path, body string
				want       []openai.LoRAScale
			}{
				{PathCompletions, `{"model":"sql-lora","prompt":"hello","max_tokens":2}`, sql},
				{PathCompletions, `{"model":"tiny:sql-lora","prompt":"hello","max_tokens":2}`, sql},
				{PathChatCompletions, `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"lora_path":"chat-lora"}`, chat},
				{PathChatCompletions, `{"model":"chat-lora","messages":[{"role":"user","content":"hi"}],"stream":false}`, chat},
				{PathCompletions, `{"model":"tiny","prompt":"hello","max_tokens":2}`, base},
				{PathCompletions, `{"model":"tiny:","prompt":"hello","lora":[{"id":2,"scale":1}]}`, base},
			} {
				if got := answerModel(t, tp, tc.path, tc.body); got != "tiny" {
					t.Errorf("%s: answered in model %q, want tiny (the engine got the base model's name)", tc.body, got)
				}
				m := fakes["l"].rec.last(t)
				lora, ok := loraOf(t, m)
				_, hasPath := m["lora_path"]
				if !ok || fmt.Sprint(lora) != fmt.Sprint(tc.want) || m["model"] != "tiny" || hasPath {
					t.Errorf("%s: engine got model %v, lora %v (%v), lora_path %v; want model tiny, lora %v, no lora_path",
						tc.body, m["model"], lora, ok, m["lora_path"], tc.want)
				}
			}
			// An adapter the model has but the server does not list: the
			// router's 404, naming what the server lists; nothing sent.
			n := len(fakes["l"].rec.got())
			resp := tp.post(t, PathCompletions, `{"model":"nope-lora","prompt":"hello"}`)
			out := readAll(t, resp)
			var e openai.ErrorResponse
			_ = json.Unmarshal([]byte(out), &e)
			if resp.StatusCode != http.StatusNotFound || e.Error.Code != "model_not_found" ||
				!strings.Contains(e.Error.Message, "`nope-lora`") || !strings.Contains(e.Error.Message, "sql-lora, chat, other") ||
				resp.Header.Get(HeaderErrorSource) != "" {
				t.Errorf("unlisted adapter: got %d %s (error source %q), want the router's 404 model_not_found naming nope-lora and the listed adapters",
					resp.StatusCode, out, resp.Header.Get(HeaderErrorSource))
			}
			if got := len(fakes["l"].rec.got()); got != n {
				t.Errorf("unlisted adapter: the engine got %d more requests, want none", got-n)
			}
		})
	}
}

// TestLlamaCPPAdapterRetry: an engine that does not list the request's
// adapter is passed over for one that does (kvroute_retries_total reason
// adapter_not_listed), and its health is not at fault; with no other
// endpoint the client gets the router's 404.
func TestLlamaCPPAdapterRetry(t *testing.T) {
	tp, fakes := llamaProxy(t, 2,
		llamaEngine{id: "a", list: `[{"id":0,"path":"/m/sql-lora.gguf","scale":1}]`, flavor: "llamacpp"},
		llamaEngine{id: "b", list: `[{"id":0,"path":"/m/sql-lora.gguf","scale":1},{"id":1,"path":"/m/chat-lora.gguf","scale":1}]`})
	answerModel(t, tp, PathCompletions, `{"model":"chat-lora","prompt":"hello"}`)
	if got := fakes["a"].rec.got(); len(got) != 0 {
		t.Errorf("engine a (no chat-lora) got %v, want nothing", got)
	}
	if lora, _ := loraOf(t, fakes["b"].rec.last(t)); fmt.Sprint(lora) != fmt.Sprint([]openai.LoRAScale{{ID: 0}, {ID: 1, Scale: 1}}) {
		t.Errorf("engine b got lora %v, want chat-lora's id 1 at scale 1", lora)
	}
	if got := tp.metric(t, tp.metrics.retries, "tiny", "a", "adapter_not_listed"); got != 1 {
		t.Errorf("retries{reason=adapter_not_listed} = %v, want 1", got)
	}
	for range 3 { // never ejected: a's next sql-lora request is its own
		answerModel(t, tp, PathCompletions, `{"model":"tiny","prompt":"hello","lora_path":"sql-lora"}`)
	}
	if got := len(fakes["a"].rec.got()); got != 3 {
		t.Errorf("engine a got %d sql-lora requests, want 3 (still healthy)", got)
	}
	tp.Router("tiny").SetActiveHealth(tp.clock.Now(), "b", false)
	resp := tp.post(t, PathCompletions, `{"model":"chat-lora","prompt":"hello"}`)
	if out := readAll(t, resp); resp.StatusCode != http.StatusNotFound || !strings.Contains(out, "model_not_found") {
		t.Errorf("with b down: got %d %s, want the router's 404", resp.StatusCode, out)
	}
}

// TestLlamaCPPAdapterListUnknown: a llama.cpp endpoint whose adapter list
// the router has not read (scraping off here) cannot be told an adapter:
// 503 adapter_list_unknown, with Retry-After; a base model's request goes
// to it as sent. A server without /lora-adapters lists none: 404.
func TestLlamaCPPAdapterListUnknown(t *testing.T) {
	f := newFakeLlama(t, llamaAdapters)
	cfg := testConfig("first")
	m := &cfg.Models[0]
	m.Name, m.Adapters = "tiny", []string{"sql-lora"}
	m.Signals.Disabled = true
	m.Endpoints = []config.Endpoint{{ID: "l", URL: f.URL, Signals: config.EndpointSignals{Flavor: "llamacpp"}}}
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathCompletions, `{"model":"sql-lora","prompt":"hello"}`)
	out := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(out, "adapter_list_unknown") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("got %d %s (Retry-After %q), want 503 adapter_list_unknown with Retry-After", resp.StatusCode, out, resp.Header.Get("Retry-After"))
	}
	body := `{"model":"tiny","prompt":"hello"}`
	answerModel(t, tp, PathCompletions, body)
	if got := f.rec.got(); len(got) != 1 || got[0] != body {
		t.Errorf("engine got %v, want only the base model's request, as sent", got)
	}

	tp2, fakes := llamaProxy(t, 1, llamaEngine{id: "old", list: ""})
	resp = tp2.post(t, PathCompletions, `{"model":"sql-lora","prompt":"hello"}`)
	if out := readAll(t, resp); resp.StatusCode != http.StatusNotFound || !strings.Contains(out, "lists none") {
		t.Errorf("server without /lora-adapters: got %d %s, want 404 saying it lists none", resp.StatusCode, out)
	}
	answerModel(t, tp2, PathCompletions, body)
	if got := fakes["old"].rec.got(); len(got) != 1 || got[0] != body {
		t.Errorf("server without /lora-adapters got %v, want the base model's request as sent", got)
	}
}

// TestLlamaCPPAdapterListRefresh: a server restarted with its adapters in
// another order is read again once its scrape recovers: the router names
// the adapter by its new id.
func TestLlamaCPPAdapterListRefresh(t *testing.T) {
	tp, fakes := llamaProxy(t, 1, llamaEngine{id: "l", list: llamaAdapters})
	body := `{"model":"sql-lora","prompt":"hello"}`
	answerModel(t, tp, PathCompletions, body)
	if lora, _ := loraOf(t, fakes["l"].rec.last(t)); len(lora) != 3 || lora[0].Scale != 1 {
		t.Fatalf("before the restart: lora %v, want sql-lora as id 0", lora)
	}
	v := tp.Router("tiny").View("l")
	fakes["l"].set(`[{"id":0,"path":"/models/chat.gguf","scale":1},{"id":1,"path":"/models/sql-lora.gguf","scale":0.25}]`, true)
	waitFor(t, "the restart seen", func() bool { return v.Snapshot().ConsecutiveErrors > 0 })
	fakes["l"].set(`[{"id":0,"path":"/models/chat.gguf","scale":1},{"id":1,"path":"/models/sql-lora.gguf","scale":0.25}]`, false)
	waitFor(t, "the new list read", func() bool {
		a, ok := v.LlamaAdapters().Lookup("sql-lora")
		return ok && a.ID == 1
	})
	answerModel(t, tp, PathCompletions, body)
	if lora, _ := loraOf(t, fakes["l"].rec.last(t)); fmt.Sprint(lora) != fmt.Sprint([]openai.LoRAScale{{ID: 0}, {ID: 1, Scale: 0.25}}) {
		t.Errorf("after the restart: lora %v, want sql-lora as id 1 at 0.25, chat off", lora)
	}
}

// TestTGIAdapterForm: TGI reads an adapter as vLLM does (its OpenAI
// routes take "model" as the adapter_id), so a TGI engine gets vLLM's
// form: a client's SGLang form rewritten.
func TestTGIAdapterForm(t *testing.T) {
	var rc recorder
	b := newBackend(t, "tgi", func(w http.ResponseWriter, r *http.Request) { rc.wrap(okHandler("tgi")).ServeHTTP(w, r) })
	cfg := testConfig("first")
	m := &cfg.Models[0]
	m.Name, m.Adapters = "tiny", []string{"sql-lora"}
	m.Signals.Disabled = true
	m.Endpoints = []config.Endpoint{{ID: "t", URL: b.URL, Signals: config.EndpointSignals{Flavor: "tgi"}}}
	tp := newTestProxy(t, cfg)
	readAll(t, tp.post(t, PathCompletions, `{"model":"tiny:sql-lora","prompt":"hello"}`))
	if got := rc.last(t); got["model"] != "sql-lora" {
		t.Errorf("TGI engine got model %v, want sql-lora (its adapter_id)", got["model"])
	}
	body := `{"model":"sql-lora","prompt":"hello"}`
	readAll(t, tp.post(t, PathCompletions, body))
	if got := rc.got(); got[len(got)-1] != body {
		t.Errorf("TGI engine got %s, want the vLLM form as sent", got[len(got)-1])
	}
}

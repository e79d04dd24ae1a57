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

// llamaRetries is kvroute_retries_total{reason="adapter_not_listed"} of
// model tiny, summed over the endpoints ids.
func llamaRetries(t *testing.T, tp *testProxy, ids ...string) float64 {
	t.Helper()
	var n float64
	for _, id := range ids {
		n += tp.metric(t, tp.metrics.retries, "tiny", id, "adapter_not_listed")
	}
	return n
}

// TestLlamaCPPAdapterPick: the endpoints whose llama.cpp server does not
// list the request's adapter are no candidates for it: with the adapter
// only on the last of three endpoints and one retry, the request goes
// straight to it (no retry), and the others still take the adapters they
// list. With the endpoint that lists it down, the client gets the
// router's 503 (no_adapter_endpoint, with Retry-After).
func TestLlamaCPPAdapterPick(t *testing.T) {
	sql := `[{"id":0,"path":"/m/sql-lora.gguf","scale":1}]`
	tp, fakes := llamaProxy(t, 2,
		llamaEngine{id: "a", list: sql, flavor: "llamacpp"},
		llamaEngine{id: "b", list: sql},
		llamaEngine{id: "c", list: `[{"id":0,"path":"/m/sql-lora.gguf","scale":1},{"id":1,"path":"/m/chat-lora.gguf","scale":1}]`})
	for _, body := range []string{`{"model":"chat-lora","prompt":"hello"}`, `{"model":"tiny","prompt":"hello","lora_path":"chat-lora"}`} {
		if got := answerModel(t, tp, PathCompletions, body); got != "tiny" {
			t.Errorf("%s: answered in model %q, want tiny", body, got)
		}
	}
	for _, id := range []string{"a", "b"} {
		if got := fakes[id].rec.got(); len(got) != 0 {
			t.Errorf("engine %s (no chat-lora) got %v, want nothing", id, got)
		}
	}
	if got := fakes["c"].rec.got(); len(got) != 2 {
		t.Errorf("engine c got %d requests, want both", len(got))
	} else if lora, _ := loraOf(t, fakes["c"].rec.last(t)); fmt.Sprint(lora) != fmt.Sprint([]openai.LoRAScale{{ID: 0}, {ID: 1, Scale: 1}}) {
		t.Errorf("engine c got lora %v, want chat-lora's id 1 at scale 1", lora)
	}
	if got := llamaRetries(t, tp, "a", "b", "c"); got != 0 {
		t.Errorf("retries{reason=adapter_not_listed} = %v, want 0 (no endpoint tried that does not list it)", got)
	}
	for range 3 { // a lists sql-lora: the first healthy endpoint takes it
		answerModel(t, tp, PathCompletions, `{"model":"tiny","prompt":"hello","lora_path":"sql-lora"}`)
	}
	if got := len(fakes["a"].rec.got()); got != 3 {
		t.Errorf("engine a got %d sql-lora requests, want 3", got)
	}
	tp.Router("tiny").SetActiveHealth(tp.clock.Now(), "c", false)
	resp := tp.post(t, PathCompletions, `{"model":"chat-lora","prompt":"hello"}`)
	if out := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(out, "no_adapter_endpoint") ||
		!strings.Contains(out, "2 more endpoints do not list it") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("with c down: got %d %s (Retry-After %q), want the router's 503 no_adapter_endpoint counting the 2 that do not list it",
			resp.StatusCode, out, resp.Header.Get("Retry-After"))
	}
}

// TestLlamaCPPAdapterNoneLists: an adapter the model has but no endpoint's
// llama.cpp server lists is the router's 404 model_not_found (in the
// field the client named it in), naming what each lists, without routing
// the request to any endpoint: nothing routed, nothing retried, nothing
// sent.
func TestLlamaCPPAdapterNoneLists(t *testing.T) {
	tp, fakes := llamaProxy(t, 5,
		llamaEngine{id: "a", list: `[{"id":0,"path":"/m/sql-lora.gguf","scale":1}]`},
		llamaEngine{id: "b", list: ""}, // no /lora-adapters: lists none
		llamaEngine{id: "c", list: `[{"id":0,"path":"/m/chat-lora.gguf","scale":1}]`})
	for _, tc := range []struct{ body, param string }{
		{`{"model":"nope-lora","prompt":"hello"}`, "model"},
		{`{"model":"tiny:nope-lora","prompt":"hello"}`, "model"},
		{`{"model":"tiny","prompt":"hello","lora_path":"nope-lora"}`, "lora_path"},
	} {
		resp := tp.post(t, PathCompletions, tc.body)
		out, e, param := errorBody(t, resp)
		if resp.StatusCode != http.StatusNotFound || e.Error.Code != "model_not_found" || param != tc.param ||
			!strings.Contains(e.Error.Message, "`nope-lora` on any of its endpoints") ||
			!strings.Contains(e.Error.Message, "a lists sql-lora; b lists none; c lists chat-lora") ||
			resp.Header.Get(HeaderErrorSource) != "" || resp.Header.Get("Retry-After") != "" {
			t.Errorf("%s: got %d %s (error source %q, Retry-After %q), want the router's 404 model_not_found, param %s, naming each list",
				tc.body, resp.StatusCode, out, resp.Header.Get(HeaderErrorSource), resp.Header.Get("Retry-After"), tc.param)
		}
	}
	if d := tp.Router("tiny").Decisions(0); len(d) != 0 {
		t.Errorf("%d routing decisions, want none", len(d))
	}
	if got := llamaRetries(t, tp, "a", "b", "c"); got != 0 {
		t.Errorf("retries{reason=adapter_not_listed} = %v, want 0", got)
	}
	for id, f := range fakes {
		if got := f.rec.got(); len(got) != 0 {
			t.Errorf("engine %s got %v, want nothing", id, got)
		}
	}
}

// TestLlamaCPPAdapterRetryUnknown: an endpoint whose llama.cpp server's
// list is not known (its scrapes failing since its signals were reset)
// is still a candidate; naming the adapter to it fails before sending
// (503 adapter_list_unknown) and the request is retried on one that lists
// it (kvroute_retries_total reason adapter_not_listed), the endpoint's
// health not at fault.
func TestLlamaCPPAdapterRetryUnknown(t *testing.T) {
	tp, fakes := llamaProxy(t, 2,
		llamaEngine{id: "u", list: `[{"id":0,"path":"/m/chat-lora.gguf","scale":1}]`, flavor: "llamacpp"},
		llamaEngine{id: "c", list: `[{"id":0,"path":"/m/sql-lora.gguf","scale":1},{"id":1,"path":"/m/chat-lora.gguf","scale":1}]`})
	v := tp.Router("tiny").View("u")
	fakes["u"].set(`[{"id":0,"path":"/m/chat-lora.gguf","scale":1}]`, true)
	waitFor(t, "u's scrapes failing", func() bool { return v.Snapshot().ConsecutiveErrors > 0 })
	v.ResetSignals() // u's list is not known now, and is not read while its scrapes fail
	for range 3 {
		answerModel(t, tp, PathCompletions, `{"model":"sql-lora","prompt":"hello"}`)
	}
	if got := fakes["u"].rec.got(); len(got) != 0 {
		t.Errorf("engine u (list unknown) got %v, want nothing", got)
	}
	if got := len(fakes["c"].rec.got()); got != 3 {
		t.Errorf("engine c got %d requests, want 3", got)
	}
	if got := llamaRetries(t, tp, "u"); got != 3 {
		t.Errorf("retries{endpoint=u, reason=adapter_not_listed} = %v, want 3", got)
	}
	body := `{"model":"tiny","prompt":"hello"}`
	answerModel(t, tp, PathCompletions, body) // u, never ejected, takes the base model's
	if got := fakes["u"].rec.got(); len(got) != 1 || got[0] != body {
		t.Errorf("engine u got %v, want the base model's request as sent", got)
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

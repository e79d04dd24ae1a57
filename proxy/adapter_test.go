package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/openai"
)

// modelEcho is an engine that records the body of each request it serves
// and answers 200.
type modelEcho struct {
	mu     sync.Mutex
	bodies []string
}

func (e *modelEcho) handler(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.bodies = append(e.bodies, string(b))
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
}

func (e *modelEcho) got() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.bodies)
}

// adapterBody is a completion request for model.
func adapterBody(model string) string {
	return fmt.Sprintf(`{"model":%q,"prompt":"hello there","max_tokens":4}`, model)
}

// newAdapterProxy serves model m with adapters sql and chat over three
// engines: a serves sql only, b every adapter, c chat only; round-robin.
func newAdapterProxy(t *testing.T) (*testProxy, map[string]*modelEcho) {
	t.Helper()
	cfg, engines := adapterConfig(t)
	return newTestProxy(t, cfg), engines
}

// adapterConfig is newAdapterProxy's configuration and engines.
func adapterConfig(t *testing.T) (config.Config, map[string]*modelEcho) {
	t.Helper()
	engines := map[string]*modelEcho{}
	cfg := testConfig("rr")
	cfg.Models[0].Adapters = []string{"sql", "chat"}
	for _, id := range []string{"a", "b", "c"} {
		e := &modelEcho{}
		engines[id] = e
		be := newBackend(t, id, e.handler)
		ep := config.Endpoint{ID: id, URL: be.URL}
		switch id {
		case "a":
			ep.Adapters = []string{"sql"}
		case "c":
			ep.Adapters = []string{"chat"}
		}
		cfg.Models[0].Endpoints = append(cfg.Models[0].Endpoints, ep)
	}
	return cfg, engines
}

// TestAdapterRouting: a request naming a LoRA adapter is routed in its
// base model's pool, only to the engines that serve the adapter, its body
// forwarded byte for byte (the model field keeps the adapter's name, as
// vLLM expects); the base model's requests go to every engine.
func TestAdapterRouting(t *testing.T) {
	tp, engines := newAdapterProxy(t)
	want := map[string][]string{"sql": {"a", "b"}, "chat": {"b", "c"}, "m": {"a", "b", "c"}}
	for _, model := range []string{"sql", "chat", "m"} {
		body := adapterBody(model)
		before := map[string]int{}
		for id, e := range engines {
			before[id] = len(e.got())
		}
		tp.postOK(t, 6, PathCompletions, body)
		var reached []string
		for _, id := range []string{"a", "b", "c"} {
			got := engines[id].got()[before[id]:]
			if len(got) > 0 {
				reached = append(reached, id)
			}
			for _, b := range got {
				if b != body {
					t.Errorf("model %s: engine %s got body %s, want %s", model, id, b, body)
				}
			}
		}
		if !slices.Equal(reached, want[model]) {
			t.Errorf("model %s reached engines %v, want %v", model, reached, want[model])
		}
	}
}

// TestAdapterUnserved: a request for an adapter whose serving engines are
// all unhealthy gets the OpenAI-style 503 naming the adapter, with a
// Retry-After, as a model without a healthy endpoint does; a name that is
// neither a model nor an adapter is vLLM's 404.
func TestAdapterUnserved(t *testing.T) {
	tp, _ := newAdapterProxy(t)
	r := tp.Router("m")
	now := tp.clock.Now()
	r.SetActiveHealth(now, "a", false)
	r.SetActiveHealth(now, "b", false)
	resp := tp.post(t, PathCompletions, adapterBody("sql"))
	out := readAll(t, resp)
	var e openai.ErrorResponse
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("body %s: %v", out, err)
	}
	wantMsg := `no healthy endpoint of model "m" serves adapter "sql" (2 serve it)`
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Type != "service_unavailable_error" || e.Error.Message != wantMsg ||
		fmt.Sprint(e.Error.Code) != "no_adapter_endpoint" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("got %d %s (Retry-After %q), want 503 no_adapter_endpoint %q with Retry-After", resp.StatusCode, out, resp.Header.Get("Retry-After"), wantMsg)
	}
	tp.postOK(t, 1, PathCompletions, adapterBody("chat")) // c serves it
	resp = tp.post(t, PathCompletions, adapterBody("fr"))
	if out := readAll(t, resp); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown adapter: got %d %s, want 404", resp.StatusCode, out)
	}
}

// TestAdapterModels: /v1/models lists the base models, then the adapters
// with their base model as parent, as vLLM does.
func TestAdapterModels(t *testing.T) {
	tp, _ := newAdapterProxy(t)
	out := readAll(t, must(http.Get(tp.srv.URL+PathModels)))
	var l struct {
		Data []struct{ ID, Parent string }
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(l.Data)
	if want := "[{m } {chat m} {sql m}]"; got != want {
		t.Errorf("/v1/models: got %s, want %s (%s)", got, want, out)
	}
}

// TestAdapterReload: a reload applies the adapters live: one added is
// routed at once, one removed is a 404, an endpoint's own list changes
// with it, and none of it is reported as needing a restart.
func TestAdapterReload(t *testing.T) {
	tp, engines := newAdapterProxy(t)
	next := tp.applied
	next.Models = slices.Clone(next.Models)
	m := &next.Models[0]
	m.Adapters = []string{"sql", "fr"}
	m.Endpoints = slices.Clone(m.Endpoints)
	m.Endpoints[0].Adapters = []string{"sql", "fr"}
	m.Endpoints[2].Adapters = nil // c now serves every adapter
	res, err := tp.Reload(func() (config.Config, error) { return next, nil })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Adapters, []string{"m"}) || len(res.Restart) != 0 {
		t.Errorf("Reload: Adapters %v, Restart %v; want [m] and nothing to restart", res.Adapters, res.Restart)
	}
	before := len(engines["c"].got())
	tp.postOK(t, 6, PathCompletions, adapterBody("fr"))
	if len(engines["c"].got()) == before {
		t.Error("adapter fr never reached c, which serves every adapter now")
	}
	resp := tp.post(t, PathCompletions, adapterBody("chat"))
	if out := readAll(t, resp); resp.StatusCode != http.StatusNotFound {
		t.Errorf("removed adapter chat: got %d %s, want 404", resp.StatusCode, out)
	}
}

// capturePicker picks the first healthy candidate and keeps a copy of the
// last request's routing fields.
type capturePicker struct {
	mu      sync.Mutex
	adapter string
	hashes  []uint64
}

func (p *capturePicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.mu.Lock()
	p.adapter, p.hashes = req.Adapter, slices.Clone(req.BlockHashes)
	p.mu.Unlock()
	return firstHealthy(now, req, cands)
}

// TestAdapterPreciseKeys: in precise mode an adapter's request is hashed
// with the adapter (kvindex.HashTokensKeyed), the keys under which the
// index holds the blocks an engine stored for it
// (signals.TestSubscriberLoRAKeys), and not as the base model's.
func TestAdapterPreciseKeys(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	cfg := testConfig("first", be.URL)
	cfg.Models[0].Adapters = []string{"sql"}
	cfg.Models[0].Precise.Tokenizer = "builtin"
	pk := &capturePicker{}
	tp := newTestProxyWith(t, cfg, onePicker(pk))
	prompt := `{"model":%q,"prompt":"` + fmt.Sprintf("%0200d", 7) + `","cache_salt":"s1"}`
	pc := tp.pools["m"].precise
	ri, err := openai.ParseRequest(openai.KindCompletion, []byte(fmt.Sprintf(prompt, "m")))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pc.tokens(openai.KindCompletion, []byte(fmt.Sprintf(prompt, "m")), &ri)
	if err != nil {
		t.Fatal(err)
	}
	bs := cfg.Models[0].Precise.BlockSize
	if bs == 0 {
		bs = config.DefaultPreciseBlockSize
	}
	for _, model := range []string{"sql", "m"} {
		tp.postOK(t, 1, PathCompletions, fmt.Sprintf(prompt, model))
		adapter := model
		if model == "m" {
			adapter = ""
		}
		want := kvindex.HashTokensKeyed(ids, adapter, "s1", bs, nil)
		pk.mu.Lock()
		gotAdapter, got := pk.adapter, pk.hashes
		pk.mu.Unlock()
		if gotAdapter != adapter || len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("model %s: Adapter %q, hashes %x; want %q, %x", model, gotAdapter, got, adapter, want)
		}
	}
}

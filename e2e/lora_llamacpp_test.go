package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

// answer is what TestLlamaCPPAdapters reads from one routed response.
type answer struct {
	status          int
	endpoint, model string // x-kvroute-endpoint; the body's model (its error code when not 200)
}

func postAnswer(t *testing.T, url, body string) answer {
	t.Helper()
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, endpoint: resp.Header.Get(proxy.HeaderEndpoint)}
	if a.status != http.StatusOK {
		var e openai.ErrorResponse
		_ = json.Unmarshal(data, &e)
		a.model = fmt.Sprint(e.Error.Code)
		return a
	}
	var c struct{ Model string }
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	a.model = c.Model
	return a
}

// TestLlamaCPPAdapters: two llama.cpp-flavoured emulated engines with
// different LoRA adapters (a: sql-lora as id 0; b: chat-lora as id 0,
// sql-lora as id 1) behind the router, which reads each one's GET
// /lora-adapters and names a request's adapter to the engine by its id
// there ("lora": [{"id": N, "scale": S}], every other adapter at 0). An
// adapter only b lists always ends on b, a's refusal retried there; one
// both list is served by both, each running it under its own id; each
// response names the adapter the engine ran, the base model's none; an
// adapter neither lists is the router's 404.
func TestLlamaCPPAdapters(t *testing.T) {
	sql := emulator.LoRAModule{Name: "sql-lora", Path: "/adapters/sql-lora.gguf"}
	chat := emulator.LoRAModule{Name: "chat-lora", Path: "/adapters/chat-lora.gguf"}
	a := startEngine(t, "a", engineOpts{flavor: emulator.FlavorLlamaCpp,
		lora: emulator.LoRAConfig{Enable: true, Modules: []emulator.LoRAModule{sql}}})
	b := startEngine(t, "b", engineOpts{flavor: emulator.FlavorLlamaCpp,
		lora: emulator.LoRAConfig{Enable: true, Modules: []emulator.LoRAModule{chat, sql}}})
	m := modelConfig(policy.NameRoundRobin, false, a, b)
	m.Adapters = []string{"sql-lora", "chat-lora", "nope-lora"}
	for i := range m.Endpoints {
		m.Endpoints[i].Signals.Flavor = "llamacpp"
	}
	r := startRouter(t, m)
	for _, e := range []*engineProc{a, b} {
		eventually(t, 5*time.Second, "the router read "+e.id+"'s /lora-adapters", func() (bool, string) {
			v := r.p.Router(model).View(e.id)
			if v == nil || v.LlamaAdapters() == nil {
				return false, "no list yet"
			}
			return true, ""
		})
	}
	if got := r.p.Router(model).View("b").LlamaAdapters().Names(); fmt.Sprint(got) != "[chat-lora sql-lora]" {
		t.Fatalf("b's adapters as the router names them: %v", got)
	}

	served := map[string]map[string]int{} // adapter asked -> endpoint -> requests
	ask := func(adapter string, n int) {
		t.Helper()
		for i := range n {
			res := postAnswer(t, r.url, adapterBody(adapter, text(uint64(1000+10*i+len(served)), 40), 1))
			if res.status != http.StatusOK || res.model != adapter {
				t.Errorf("request %d for %s: got %d from %q answering model %q, want 200 naming %s", i, adapter, res.status, res.endpoint, res.model, adapter)
			}
			if served[adapter] == nil {
				served[adapter] = map[string]int{}
			}
			served[adapter][res.endpoint]++
		}
	}
	ask("chat-lora", 6)
	ask("sql-lora", 4) // one after another: round robin takes each engine in turn
	ask(model, 4)
	if got := served["chat-lora"]; got[b.id] != 6 {
		t.Errorf("chat-lora went to %v; only %s lists it", got, b.id)
	}
	for _, adapter := range []string{"sql-lora", model} {
		if got := served[adapter]; got[a.id] != 2 || got[b.id] != 2 {
			t.Errorf("%s went to %v; both engines serve it, taken in turn", adapter, got)
		}
	}

	res := postAnswer(t, r.url, adapterBody("nope-lora", "hi", 1))
	if res.status != http.StatusNotFound || res.model != "model_not_found" {
		t.Errorf("an adapter no engine lists: got %d %s, want the router's 404 model_not_found", res.status, res.model)
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/openai"
)

// TestLoRADisaggregated: a P/D pool whose engines serve LoRA adapters
// (vLLM's --enable-lora, --lora-modules, with NixlConnector). A request
// naming an adapter is prefilled on a prefill engine that serves it and
// decoded on a decode engine that serves it, both legs naming the adapter
// as their model (vLLM's kv_transfer_params say nothing of it: each engine
// keys the prompt's blocks with the adapter's name itself); the client
// gets the decode engine's answer in the adapter's name, and the decision
// log names the adapter and says which engines do not serve it. The prompt
// repeated is served from the prefill engine's cache under the adapter's
// keys (its cached_tokens), not the base model's, and the decode engine
// holds the KV it pulled under them too (its own prefix-cache hit on the
// repeat). An adapter that only a prefill engine serves is a 503
// no_adapter_endpoint that says no decode endpoint serves it, and reaches
// no engine.
func TestLoRADisaggregated(t *testing.T) {
	p0 := startEngine(t, "p0", engineOpts{role: kvroute.RolePrefill, encoding: "array", lora: emulatortest.LoRA("sql-lora", "chat-lora", "solo-lora")})
	p1 := startEngine(t, "p1", engineOpts{role: kvroute.RolePrefill, encoding: "array", lora: emulatortest.LoRA("chat-lora")})
	d0 := startEngine(t, "d0", engineOpts{role: kvroute.RoleDecode, encoding: "array", lora: emulatortest.LoRA("sql-lora", "chat-lora")})
	d1 := startEngine(t, "d1", engineOpts{role: kvroute.RoleDecode, encoding: "array", lora: emulatortest.LoRA("chat-lora")})
	engines := []*engineProc{p0, p1, d0, d1}
	m := modelConfig("kv-aware", true, engines...)
	m.PD = config.PD{Protocol: "nixl", Mode: "always", Profile: "tiny"}
	m.Adapters = []string{"sql-lora", "chat-lora", "solo-lora"}
	for i, a := range [][]string{{"sql-lora", "chat-lora", "solo-lora"}, {"chat-lora"}, {"sql-lora", "chat-lora"}, {"chat-lora"}} {
		m.Endpoints[i].Adapters = a
	}
	r := startRouter(t, m)
	for _, e := range engines {
		awaitEvents(t, r, e, false)
		e.takeLegs() // the warm-up requests
	}

	// checkLegs: the request was prefilled on pre and decoded on dec, both
	// legs naming adapter.
	checkLegs := func(what, adapter string, pre, dec *engineProc) {
		t.Helper()
		for _, e := range engines {
			var want []leg
			switch e {
			case pre:
				want = []leg{{model: adapter, prefill: true}}
			case dec:
				want = []leg{{model: adapter, decode: true}}
			}
			if got := e.takeLegs(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: %s received %+v, want %+v", what, e.id, got, want)
			}
		}
	}
	prefillCached := func() float64 {
		v, _ := r.metric(t, "kvroute_prefix_cached_tokens_total", map[string]string{"model": model, "endpoint": p0.id})
		return v
	}
	decodeHits := func() float64 { return engineMetric(t, d0, "vllm:prefix_cache_hits_total") }

	prompt := text(1100, 400)
	body := adapterBody("sql-lora", prompt, 5)
	resp, err := client.Post(r.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var c openai.Completion
	if err := json.Unmarshal(raw, &c); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("sql-lora request: got %d %s (%v)", resp.StatusCode, raw, err)
	}
	if c.Model != "sql-lora" || len(c.Choices) != 1 || c.Usage.CompletionTokens != 5 || c.KVTransferParams != nil {
		t.Errorf("sql-lora request: got %s, want 5 tokens in sql-lora's name and no kv_transfer_params", raw)
	}
	if got := resp.Header.Get("X-Kvroute-Endpoint"); got != d0.id {
		t.Errorf("sql-lora request answered by %q, want d0 (the one decode engine serving it)", got)
	}
	checkLegs("sql-lora request", "sql-lora", p0, d0)
	// The plan's decision (the one before its decode leg's, newest first)
	// names the adapter, and says why d1 was no candidate.
	d := r.p.Router(model).Decisions(2)[1]
	why := ""
	for _, s := range d.Decision.Scores {
		if s.Endpoint == d1.id {
			why = s.Why
		}
	}
	if d.Adapter != "sql-lora" || d.Decision.Policy != "pd" || why != `does not serve adapter "sql-lora"` {
		t.Errorf("sql-lora's decision: adapter %q, policy %q, d1: %q; want sql-lora, pd, does not serve adapter", d.Adapter, d.Decision.Policy, why)
	}

	// The repeat: the prefill engine's cache holds the adapter's blocks,
	// and the decode engine has those it pulled, under the adapter's keys.
	ids := tokenize(t, p0, completionBody(prompt, 1))
	blocks := float64(len(ids) / blockSize * blockSize)
	cached0, hits0 := prefillCached(), decodeHits()
	again := post(t, r.url, "/v1/completions", adapterBody("sql-lora", prompt+" and a follow-up question", 5))
	checkLegs("the repeated sql-lora prompt", "sql-lora", p0, d0)
	if got := prefillCached() - cached0; got < blocks*9/10 {
		t.Errorf("the repeated sql-lora prompt: p0 reported %v cached tokens, want about %v (its blocks)", got, blocks)
	}
	if got := decodeHits() - hits0; got < blocks*9/10 {
		t.Errorf("the repeated sql-lora prompt: d0's own prefix-cache hit %v tokens, want about %v (the blocks it pulled)", got, blocks)
	}
	if again.endpoint != d0.id {
		t.Errorf("the repeated sql-lora prompt answered by %q, want d0", again.endpoint)
	}
	// The base model's request for the same prompt shares no block with
	// the adapter's, on either side.
	cached0, hits0 = prefillCached(), decodeHits()
	base := post(t, r.url, "/v1/completions", completionBody(prompt+" and a follow-up question", 5))
	if base.endpoint == d0.id {
		if got := decodeHits() - hits0; got != 0 {
			t.Errorf("the base model's request for the adapter's prompt: d0's own hit %v tokens, want 0", got)
		}
	}
	if got := prefillCached() - cached0; got != 0 {
		t.Errorf("the base model's request for the adapter's prompt: p0 reported %v cached tokens, want 0", got)
	}
	for _, e := range engines {
		e.takeLegs()
	}

	// An adapter two prefill and two decode engines serve: each leg on one
	// of them.
	for i := range 4 {
		res := post(t, r.url, "/v1/completions", adapterBody("chat-lora", text(uint64(1200+i), 60), 3))
		if res.endpoint != d0.id && res.endpoint != d1.id {
			t.Errorf("chat-lora request %d answered by %q, want a decode engine", i, res.endpoint)
		}
		var pre, dec int
		for _, e := range engines {
			for _, l := range e.takeLegs() {
				if l.model != "chat-lora" {
					t.Errorf("chat-lora request %d: %s got a leg for %q", i, e.id, l.model)
				}
				if l.prefill {
					pre++
				}
				if l.decode {
					dec++
				}
			}
		}
		if pre != 1 || dec != 1 {
			// More legs are a recovery (a replan or a decode retry): say
			// which failure the router saw, and its decisions.
			var ds strings.Builder
			for _, d := range r.p.Router(model).Decisions(2 * (pre + dec)) {
				fmt.Fprintf(&ds, "  %s %s: %s (%s)\n", d.RequestID, d.Decision.Policy, d.Decision.Endpoint, d.Decision.Reason)
			}
			t.Errorf("chat-lora request %d: %d prefill and %d decode legs, want 1 and 1; the router's counters:\n%sits last decisions, newest first:\n%s",
				i, pre, dec, r.series(t, "kvroute_pd_leg_failures_total", "kvroute_pd_fallbacks_total"), ds.String())
		}
	}

	// No decode engine serves solo-lora: a 503 that says so, and no leg.
	resp, err = client.Post(r.url+"/v1/completions", "application/json", strings.NewReader(adapterBody("solo-lora", prompt, 5)))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &eb)
	if resp.StatusCode != http.StatusServiceUnavailable || eb.Error.Code != "no_adapter_endpoint" ||
		!strings.Contains(eb.Error.Message, "no decode endpoint") || !strings.Contains(eb.Error.Message, "solo-lora") {
		t.Errorf("solo-lora (no decode engine serves it): got %d %s, want 503 no_adapter_endpoint saying no decode endpoint serves it", resp.StatusCode, raw)
	}
	for _, e := range engines {
		if got := e.takeLegs(); len(got) != 0 {
			t.Errorf("solo-lora: %s received %+v, want nothing", e.id, got)
		}
	}
}

// engineMetric reads an unlabelled (or summed) counter from an engine's
// /metrics page.
func engineMetric(t testing.TB, e *engineProc, name string) float64 {
	t.Helper()
	resp, err := client.Get(e.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	var sum float64
	for line := range strings.SplitSeq(string(page), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

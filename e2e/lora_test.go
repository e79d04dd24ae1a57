package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/kvindex"
)

// adapterBody is completionBody for a request naming a LoRA adapter as its
// model.
func adapterBody(adapter, prompt string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": adapter, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true})
	return string(b)
}

// TestLoRAAdapters: engines serving LoRA adapters (vLLM's --enable-lora,
// --lora-modules) publish their adapter blocks with lora_name and
// extra_keys, in either event encoding; the router's precise index holds
// them under the keys it gives a request for the same adapter
// (kvindex.HashTokensKeyed) and under none of the base model's or another
// adapter's. Through the router, an adapter only one engine serves always
// goes there, a repeated adapter prompt goes back to the engine that holds
// its blocks and is served from its cache, and a name that is neither a
// model nor an adapter is a 404.
func TestLoRAAdapters(t *testing.T) {
	both := emulator.LoRAConfig{Enable: true, MaxLoRAs: 2, Modules: []emulator.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}, {Name: "chat-lora", Path: "/adapters/chat"}}}
	a := startEngine(t, "a", engineOpts{encoding: "array", lora: both})
	b := startEngine(t, "b", engineOpts{encoding: "map", connect: true,
		lora: emulator.LoRAConfig{Enable: true, Modules: []emulator.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}}}})
	m := modelConfig("kv-aware", true, a, b)
	m.Adapters = []string{"sql-lora", "chat-lora"}
	m.Endpoints[1].Adapters = []string{"sql-lora"}
	r := startRouter(t, m)
	idx := r.p.PreciseIndex(model)
	awaitEvents(t, r, a, false)
	awaitEvents(t, r, b, false)

	// Straight to each engine: the adapter's blocks are indexed under the
	// adapter's keys only.
	owners := []*engineProc{a, b}
	prompts := make([]string, len(owners))
	for i, owner := range owners {
		prompt := text(uint64(700+i), 200)
		prompts[i] = prompt
		ids := tokenize(t, owner, completionBody(prompt, 1))
		post(t, owner.url(), "/v1/completions", adapterBody("sql-lora", prompt, 1))
		want := kvindex.HashTokensKeyed(ids, "sql-lora", "", blockSize, nil)
		eventually(t, 5*time.Second, fmt.Sprintf("adapter prompt %d indexed on %s", i, owner.id), func() (bool, string) {
			got := indexHolds(idx, want)
			return got[owner.id] == len(want), fmt.Sprintf("index holds %v of %d adapter blocks", got, len(want))
		})
		if got := indexHolds(idx, kvindex.HashTokens(ids, blockSize, nil)); len(got) != 0 {
			t.Errorf("prompt %d: the base model's keys match %v", i, got)
		}
		if got := indexHolds(idx, kvindex.HashTokensKeyed(ids, "chat-lora", "", blockSize, nil)); len(got) != 0 {
			t.Errorf("prompt %d: another adapter's keys match %v", i, got)
		}
	}

	// Through the router: the adapter's prompts go where the index has
	// their blocks, which only the engines' events told it, and are served
	// from the cache there.
	for i, owner := range owners {
		res := post(t, r.url, "/v1/completions", adapterBody("sql-lora", prompts[i]+" and a question", 1))
		if res.endpoint != owner.id {
			t.Errorf("adapter prompt %d went to %q; its blocks are on %s", i, res.endpoint, owner.id)
		}
		if got := res.usage.PromptTokensDetails; got == nil || got.CachedTokens == 0 {
			t.Errorf("adapter prompt %d: cached tokens %+v, want its blocks", i, got)
		}
	}
	for i := range 4 {
		res := post(t, r.url, "/v1/completions", adapterBody("chat-lora", text(uint64(800+i), 50), 1))
		if res.endpoint != a.id {
			t.Errorf("chat-lora request %d went to %q; only %s serves it", i, res.endpoint, a.id)
		}
	}
	long := text(900, 600)
	first := post(t, r.url, "/v1/completions", adapterBody("sql-lora", long, 1))
	ids := tokenize(t, a, completionBody(long, 1))
	want := kvindex.HashTokensKeyed(ids, "sql-lora", "", blockSize, nil)
	eventually(t, 5*time.Second, "the routed adapter prompt indexed", func() (bool, string) {
		got := indexHolds(idx, want)
		return got[first.endpoint] == len(want), fmt.Sprintf("index holds %v of %d blocks", got, len(want))
	})
	again := post(t, r.url, "/v1/completions", adapterBody("sql-lora", long+" and one more question", 1))
	if again.endpoint != first.endpoint {
		t.Errorf("the repeated adapter prompt went to %s, its blocks are on %s", again.endpoint, first.endpoint)
	}
	if got := again.usage.PromptTokensDetails; got == nil || got.CachedTokens < len(want)*blockSize*9/10 {
		t.Errorf("the repeated adapter prompt's cached tokens %+v, want about %d", got, len(want)*blockSize)
	}
	base := post(t, first.endpointURL(a, b), "/v1/completions", completionBody(long, 1))
	if got := base.usage.PromptTokensDetails; got != nil && got.CachedTokens != 0 {
		t.Errorf("the base model's request for the adapter's prompt reported %d cached tokens, want 0", got.CachedTokens)
	}

	resp, err := client.Post(r.url+"/v1/completions", "application/json", strings.NewReader(adapterBody("nope-lora", "hi", 1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown adapter: status %d, want 404", resp.StatusCode)
	}
}

// endpointURL is the URL of the engine among engines that served res.
func (res result) endpointURL(engines ...*engineProc) string {
	for _, e := range engines {
		if e.id == res.endpoint {
			return e.url()
		}
	}
	return ""
}

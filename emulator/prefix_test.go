package emulator

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

// TestPrefixCachingEndToEnd sends two prompts sharing a 4k-token prefix to
// an 8B/H100 engine at real speed: the second reports the shared blocks as
// cached_tokens and its TTFT (as the engine measured it) is lower by what
// the cost model predicts.
func TestPrefixCachingEndToEnd(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	_, hs := testServer(t, Config{Model: "llama", Engine: engine.Config{Profile: prof}, Speed: 1})
	tok := tokenizer.Builtin()
	var b strings.Builder
	for i := 0; len(tok.Encode(b.String())) < 4096; i++ {
		fmt.Fprintf(&b, "Section %d of the shared system prompt describes the rules of the game. ", i)
	}
	prefix := b.String()
	ttftSum := func() float64 {
		return scrape(t, hs.URL)["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleSum()
	}
	send := func(question string) (openai.Completion, float64, time.Duration) {
		before := ttftSum()
		start := time.Now()
		code, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":1}`, prefix+question))
		elapsed := time.Since(start)
		if code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
		var c openai.Completion
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatal(err)
		}
		return c, ttftSum() - before, elapsed
	}
	a, ttftA, wallA := send("Question: who starts?")
	bResp, ttftB, wallB := send("Question: who wins?")
	if got := a.Usage.CachedTokens(); got != 0 {
		t.Errorf("first request: got cached_tokens %d, want 0", got)
	}
	common := len(tok.Encode(prefix)) - 2 // the last chunks of a text prefix may differ
	wantCached := common / 16 * 16
	gotCached := bResp.Usage.CachedTokens()
	if gotCached < wantCached-16 || gotCached%16 != 0 || gotCached >= bResp.Usage.PromptTokens {
		t.Errorf("second request: got cached_tokens %d of %d prompt tokens, want about %d (whole blocks)", gotCached, bResp.Usage.PromptTokens, wantCached)
	}
	predA := prof.PrefillTime(a.Usage.PromptTokens, 0)
	predB := prof.PrefillTime(bResp.Usage.PromptTokens-gotCached, gotCached)
	predGain := (predA - predB).Seconds()
	gain := ttftA - ttftB
	t.Logf("TTFT engine A %.1f ms, B %.1f ms (gain %.1f ms); model predicts A %.1f ms, B %.1f ms (gain %.1f ms); client wall A %v, B %v",
		ttftA*1e3, ttftB*1e3, gain*1e3, predA.Seconds()*1e3, predB.Seconds()*1e3, predGain*1e3, wallA, wallB)
	if gain < 0.75*predGain || gain > 1.25*predGain {
		t.Errorf("got TTFT gain %.2f ms, want the model's %.2f ms within 25%%", gain*1e3, predGain*1e3)
	}
}

// TestCacheSalt: vLLM's cache_salt keeps requests' prefix caches apart: a
// request shares the cached prefix of an earlier one with the same salt
// only; a salt that is not a non-empty string is vLLM's 400.
func TestCacheSalt(t *testing.T) {
	_, hs := testServer(t, Config{})
	prompt := strings.Repeat("the same long document for every tenant ", 40)
	cached := func(salt string) int {
		t.Helper()
		body := map[string]any{"prompt": prompt + salt, "max_tokens": 1}
		if salt != "" {
			body["cache_salt"] = salt
		}
		b, _ := json.Marshal(body)
		code, out := post(t, hs.URL+"/v1/completions", string(b))
		var c openai.Completion
		if err := json.Unmarshal(out, &c); code != 200 || err != nil {
			t.Fatalf("salt %q: got %d %s", salt, code, out)
		}
		return c.Usage.CachedTokens()
	}
	if got := cached("a"); got != 0 {
		t.Fatalf("first request: %d cached tokens, want 0", got)
	}
	if got := cached("a"); got == 0 {
		t.Errorf("same salt: no cached token, want the shared prefix's")
	}
	for _, salt := range []string{"b", ""} {
		if got := cached(salt); got != 0 {
			t.Errorf("salt %q after salt \"a\": %d cached tokens, want 0", salt, got)
		}
	}
	for _, bad := range []string{`""`, `5`, `["a"]`} {
		code, out := post(t, hs.URL+"/v1/completions", `{"prompt":"x","max_tokens":1,"cache_salt":`+bad+`}`)
		if code != 400 || !strings.Contains(string(out), "Parameter 'cache_salt' must be a non-empty string if provided.") {
			t.Errorf("cache_salt %s: got %d %s, want vLLM's 400", bad, code, out)
		}
	}
	if code, out := post(t, hs.URL+"/v1/completions", `{"prompt":"x","max_tokens":1,"cache_salt":null}`); code != 200 {
		t.Errorf("cache_salt null: got %d %s, want 200", code, out)
	}
}

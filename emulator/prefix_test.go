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

package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// TestKVAwareRoutesPrefixHome: with precise mode and KV events, the
// kv-aware policy sends every request sharing a long system prompt to the
// engine that computed it, which reports the prefix as cached tokens (in
// the response, streamed or not, and in the router's counters), while
// cold prompts spread over both engines.
func TestKVAwareRoutesPrefixHome(t *testing.T) {
	a := startEngine(t, "a", engineOpts{encoding: "array", speed: 20})
	b := startEngine(t, "b", engineOpts{encoding: "map", connect: true, speed: 20})
	r := startRouter(t, modelConfig("kv-aware", true, a, b))
	idx := r.p.PreciseIndex(model)
	awaitEvents(t, r, a, false)
	awaitEvents(t, r, b, false)

	system := text(42, 1500) // about 2,000 tokens
	first := post(t, r.url, "/v1/chat/completions", chatBody(system, "first question", 4, false))
	home := first.endpoint
	if home == "" {
		t.Fatal("no x-kvroute-endpoint header (debug on)")
	}
	sys := kvindex.HashTokens(tokenize(t, a, chatBody(system, "", 1, false)), blockSize, nil)
	eventually(t, 5*time.Second, "system prompt indexed on "+home, func() (bool, string) {
		got := indexHolds(idx, sys)
		return got[home] >= len(sys)-1, fmt.Sprintf("index holds %v of %d blocks", got, len(sys))
	})

	var cached int
	for i := range 8 {
		res := post(t, r.url, "/v1/chat/completions", chatBody(system, fmt.Sprintf("follow-up question %d", i), 4, i%2 == 1))
		if res.endpoint != home {
			t.Errorf("follow-up %d: routed to %s, want %s (the engine caching the system prompt)", i, res.endpoint, home)
		}
		if !res.hasUsage {
			t.Fatalf("follow-up %d: no usage in the response", i)
		}
		if c := res.usage.CachedTokens(); c < (len(sys)-1)*blockSize {
			t.Errorf("follow-up %d: cached_tokens %d, want >= %d", i, c, (len(sys)-1)*blockSize)
		}
		cached += res.usage.CachedTokens()
	}
	labels := map[string]string{"model": model, "endpoint": home}
	eventually(t, 2*time.Second, "cached-token counter", func() (bool, string) {
		got, _ := r.metric(t, "kvroute_prefix_cached_tokens_total", labels)
		return int(got) >= cached, fmt.Sprintf("kvroute_prefix_cached_tokens_total{endpoint=%s} = %v, want >= %d", home, got, cached)
	})
	if got, _ := r.metric(t, "kvroute_prompt_tokens_total", labels); got < float64(cached) {
		t.Errorf("kvroute_prompt_tokens_total{endpoint=%s} = %v, want >= %d", home, got, cached)
	}

	// Cold prompts share nothing: a burst of them goes where the load is
	// lowest, and the router's own dispatches move that, so they spread.
	seen := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			res, err := tryPost(r.url, "/v1/completions", completionBody(text(uint64(500+i), 60), 64))
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			seen[res.endpoint]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if seen["a"] == 0 || seen["b"] == 0 {
		t.Errorf("a burst of cold prompts all went to one engine: %v", seen)
	}

	// The router matched on the engines' own tokens: its decision for a
	// follow-up saw the cached blocks in the precise index.
	decisions := r.p.Router(model).Decisions(40)
	found := false
	for _, d := range decisions {
		for _, c := range d.Candidates {
			if c.Endpoint == home && c.Precise && c.CachedBlocks >= len(sys)-1 {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("no decision saw %s's %d cached blocks as precise", home, len(sys)-1)
	}
}

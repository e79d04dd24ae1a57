package emulator

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/openai"
)

// TestPreemptionUnderMemoryPressure overfills the tiny profile's 64-block
// cache with concurrent requests: the engine preempts (recompute), and every
// request still completes with all its tokens.
func TestPreemptionUnderMemoryPressure(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 50})
	const n = 8
	var wg sync.WaitGroup
	results := make([]openai.Completion, n)
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := fmt.Sprintf("request %d: %s", i, strings.Repeat("memory pressure test words ", 40))
			var body []byte
			codes[i], body = post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":200,"ignore_eos":true}`, prompt))
			_ = json.Unmarshal(body, &results[i])
		}()
	}
	wg.Wait()
	for i := range n {
		if codes[i] != 200 || results[i].Usage == nil || results[i].Usage.CompletionTokens != 200 {
			t.Errorf("request %d: got status %d usage %+v, want 200 tokens", i, codes[i], results[i].Usage)
		}
	}
	mfs := scrape(t, hs.URL)
	if got := value(mfs["vllm:num_preemptions_total"].GetMetric()[0]); got == 0 {
		t.Errorf("got num_preemptions_total 0, want > 0 with %d requests of ~%d tokens in a %d-token cache", n, 400, 64*16)
	}
	if got := value(mfs["vllm:kv_cache_usage_perc"].GetMetric()[0]); got != 0 {
		t.Errorf("got kv_cache_usage_perc %v after all requests finished, want 0", got)
	}
}

// TestEvictionEvents fills the cache with distinct prompts one after the
// other: older cached blocks are evicted and reported as BlockRemoved.
func TestEvictionEvents(t *testing.T) {
	ctx, endpoint, replay := listeningSub(t)
	_, hs := testServer(t, Config{Speed: 100, KVEvents: KVEventsConfig{Endpoint: endpoint, ReplayEndpoint: replay, Encoding: EncodingMap}})
	for i := range 12 { // 12 x ~13 blocks > 64 blocks
		prompt := fmt.Sprintf("distinct prompt %d %s", i, strings.Repeat(fmt.Sprintf("filler%d ", i), 100))
		if code, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt)); code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
	}
	// Read the whole history through the replay socket (the last
	// batches may still be queued).
	stored, removed := 0, 0
	waitFor(t, "BlockRemoved events, replayed", func() bool {
		stored, removed = 0, 0
		for _, e := range replayEvents(t, ctx, replay, EncodingMap) {
			switch e.Type {
			case "BlockStored":
				stored += len(e.Hashes)
			case "BlockRemoved":
				removed += len(e.Hashes)
			}
		}
		return removed > 0
	})
	if stored <= 64 || removed == 0 {
		t.Errorf("got %d blocks stored and %d removed, want > 64 stored and some removed", stored, removed)
	}
}

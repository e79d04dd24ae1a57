package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

// TestPDDecodePullsOnlyMissingBlocks: a decode engine that caches a
// conversation's first turn pulls only the second turn's new tokens from
// the prefill engine (their transfer time), as vLLM's NixlConnector reads
// only the blocks past the decode engine's local prefix-cache hit. The
// prefill side is a fake side channel that records each pull.
func TestPDDecodePullsOnlyMissingBlocks(t *testing.T) {
	var mu sync.Mutex
	var pulls []PullRequest
	side := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var pr PullRequest
		if err := json.NewDecoder(r.Body).Decode(&pr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		pulls = append(pulls, pr)
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(PullResponse{EngineID: "p"})
	}))
	defer side.Close()
	host, port := splitHostPort(t, side.URL)
	s, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})

	const first, added = 256, 100 // 16 blocks, then 100 more tokens
	prompt := make([]int, first+added)
	for k := range prompt {
		prompt[k] = 1 + k%900
	}
	turn := func(id string, tokens []int) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"prompt": tokens, "max_tokens": 4, "kv_transfer_params": map[string]any{
			"do_remote_prefill": true, "remote_request_id": id, "remote_host": host, "remote_port": port}})
		if code, body := post(t, ds.URL+"/v1/completions", string(b)); code != 200 {
			t.Fatalf("%s: got %d %s", id, code, body)
		}
	}
	turn("turn1", prompt[:first])
	turn("turn2", prompt)

	mu.Lock()
	defer mu.Unlock()
	if len(pulls) != 2 {
		t.Fatalf("got %d pulls, want 2: %+v", len(pulls), pulls)
	}
	for i, want := range []struct {
		id     string
		tokens int
	}{{"turn1", first}, {"turn2", added}} {
		got := pulls[i]
		if w := s.transferTime(want.tokens).Seconds(); got.RemoteRequestID != want.id || got.TransferSeconds != w {
			t.Errorf("pull %d: got %s for %v s, want %s for %v s (%d tokens; the whole prompt's would be %v s)", i, got.RemoteRequestID,
				got.TransferSeconds, want.id, w, want.tokens, s.transferTime(first+added*i).Seconds())
		}
	}
}

// TestPDDecodeUsageAndPrefixMetrics pins what a decode engine reports for
// a prompt whose KV it pulled, as vLLM's V1 engine does:
//   - usage cached_tokens is the prompt length - 1: the scheduler
//     (Scheduler._update_waiting_for_remote_kv) sets num_computed_tokens to
//     the received blocks' tokens capped at the prompt, less the last token
//     it recomputes for the logits, and request.num_cached_tokens takes that
//     value when the request is first scheduled after the transfer;
//   - vllm:prefix_cache_queries counts the whole prompt once and
//     vllm:prefix_cache_hits only the decode engine's own prefix-cache hit
//     (the scheduler records the local lookup, KVCacheManager
//     get_computed_blocks / record_prefix_cache_stats, before asking the
//     connector; the pulled tokens go to the connector's separate stats);
//   - vllm:prompt_tokens_total and vllm:request_prompt_tokens count the
//     whole prompt (IterationStats / PromptTokenStats total,
//     FinishedRequestStats.num_prompt_tokens).
//
// The second turn extends the first, which the decode engine caches.
func TestPDDecodeUsageAndPrefixMetrics(t *testing.T) {
	side := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(PullResponse{EngineID: "p"})
	}))
	defer side.Close()
	host, port := splitHostPort(t, side.URL)
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})

	const first, added = 256, 100 // 16 blocks, then 100 more tokens
	prompt := make([]int, first+added)
	for k := range prompt {
		prompt[k] = 1 + k%900
	}
	var queries, hits, promptTotal float64
	for i, turn := range []struct {
		tokens    []int
		localHit  int
		wantCache int
	}{{prompt[:first], 0, first - 1}, {prompt, first, first + added - 1}} {
		b, _ := json.Marshal(map[string]any{"prompt": turn.tokens, "max_tokens": 2, "kv_transfer_params": map[string]any{
			"do_remote_prefill": true, "remote_request_id": fmt.Sprint("turn", i), "remote_host": host, "remote_port": port}})
		code, body := post(t, ds.URL+"/v1/completions", string(b))
		if code != 200 {
			t.Fatalf("turn %d: got %d %s", i, code, body)
		}
		var c openai.Completion
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatal(err)
		}
		if d := c.Usage.PromptTokensDetails; c.Usage.PromptTokens != len(turn.tokens) || d == nil || d.CachedTokens != turn.wantCache {
			t.Errorf("turn %d: got usage %s, want prompt_tokens %d, cached_tokens %d", i, body, len(turn.tokens), turn.wantCache)
		}
		queries += float64(len(turn.tokens))
		hits += float64(turn.localHit)
		promptTotal += float64(len(turn.tokens))
		m := scrape(t, ds.URL)
		h := m["vllm:request_prompt_tokens"].GetMetric()[0].GetHistogram()
		for _, c := range []struct {
			name      string
			got, want float64
		}{
			{"vllm:prefix_cache_queries_total", value(m["vllm:prefix_cache_queries_total"].GetMetric()[0]), queries},
			{"vllm:prefix_cache_hits_total", value(m["vllm:prefix_cache_hits_total"].GetMetric()[0]), hits},
			{"vllm:prompt_tokens_total", value(m["vllm:prompt_tokens_total"].GetMetric()[0]), promptTotal},
			{"vllm:request_prompt_tokens sum", h.GetSampleSum(), promptTotal},
		} {
			if c.got != c.want {
				t.Errorf("turn %d: %s = %v, want %v", i, c.name, c.got, c.want)
			}
		}
	}
}

// TestTransferTimeWireBytes: a decode engine's pull moves what its ranks
// read, TP x one rank's KV (engine.Profile.KVTransferBytesPerToken): for
// Llama-3.1-70B at TP16, whose 8 KV heads each rank pair replicates, 8,192
// tokens are 8192 x 655,360 B = 5.37 GB, 107.37 ms at 400 Gb/s, twice the
// model's own KV.
func TestTransferTimeWireBytes(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-70b-h100-tp4")
	if err != nil {
		t.Fatal(err)
	}
	prof.TP = 16
	s, _ := testServer(t, Config{Role: kvroute.RoleDecode, Engine: engine.Config{Profile: prof}, FabricGbps: 400, Speed: 1})
	got := s.transferTime(8192) - s.cfg.TransferSetup
	bytes := float64(8192 * 655360)
	if want := time.Duration(bytes * 8 / 400e9 * float64(time.Second)); got != want {
		t.Fatalf("transfer of 8192 tokens takes %v, want %v", got, want)
	}
}

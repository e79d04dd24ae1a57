package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/openai"
)

// promptIDs returns n prompt token ids starting at from.
func promptIDs(from, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = from + i
	}
	return p
}

// decodeBody is the body of a decode leg of prompt whose KV the side
// channel at host:port holds under id.
func decodeBody(prompt []int, maxTokens int, id, host string, port int) string {
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "kv_transfer_params": map[string]any{
		"do_remote_prefill": true, "remote_request_id": id, "remote_host": host, "remote_port": port}})
	return string(b)
}

// pullSide is a fake prefill engine's side channel that answers every
// pull once check (when set) returned, counting them.
func pullSide(t *testing.T, check func(PullRequest)) (host string, port int, pulls *atomic.Int64) {
	pulls = new(atomic.Int64)
	side := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var pr PullRequest
		if err := json.NewDecoder(r.Body).Decode(&pr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if check != nil {
			check(pr)
		}
		pulls.Add(1)
		_ = json.NewEncoder(w).Encode(PullResponse{EngineID: "p"})
	}))
	t.Cleanup(side.Close)
	host, port = splitHostPort(t, side.URL)
	return host, port, pulls
}

// TestPDDecodeHoldsBlocksDuringPull: a decode engine holds the KV blocks
// of a prompt whose KV it pulls for the whole transfer, as vLLM's
// scheduler allocates them (all the prompt's, at once) before its
// NixlConnector reads the KV into them, and counts the request waiting
// (WAITING_FOR_REMOTE_KVS): vllm:kv_cache_usage_perc and
// vllm:num_requests_waiting are raised during the pull. The transfer is
// slow here (a slow fabric), and the client leaves in its middle: the
// request is aborted (no longer waiting), but both engines keep the blocks
// while the transfer goes on (TestPDDecodeAbortFreesAfterTransfer), here
// until the decode engine stops. The decode engine held no block during
// the pull before.
func TestPDDecodeHoldsBlocksDuringPull(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, LeaseTimeout: time.Hour})
	// 100 tokens of 1 KiB over 1 kbit/s: the transfer takes far longer
	// than the test (the prefill engine holds a pull 10 minutes at most).
	dsrv, ds := testServer(t, Config{Role: kvroute.RoleDecode, FabricGbps: 1e-6, LoadFailure: LoadFailureFail})
	prompt := promptIDs(1, 100) // 7 blocks of 16
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}})
	code, body := post(t, ps.URL+"/v1/completions", string(b))
	if code != 200 {
		t.Fatalf("prefill: got %d %s", code, body)
	}
	var pr openai.Completion
	if err := json.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	pr.KVTransferParams["do_remote_prefill"] = true
	b, _ = json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 4, "kv_transfer_params": pr.KVTransferParams})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := sendAsync(ctx, ds.URL+"/v1/completions", string(b))
	const blocks = 7.0 / 64
	var usage, waiting, running float64
	waitFor(t, "the decode engine to hold the prompt's blocks during the pull", func() bool {
		mfs := scrape(t, ds.URL)
		usage, waiting, running = gaugeOf(t, mfs, "vllm:kv_cache_usage_perc"), gaugeOf(t, mfs, "vllm:num_requests_waiting"),
			gaugeOf(t, mfs, "vllm:num_requests_running")
		return usage > 0
	})
	if usage != blocks || waiting != 1 || running != 0 {
		t.Errorf("during the pull: KV usage %v, %v waiting, %v running; want %v (7 of 64 blocks), 1, 0", usage, waiting, running, blocks)
	}
	if u := kvUsage(t, ps.URL); u <= 0 {
		t.Errorf("prefill engine: KV usage %v during the pull, want its blocks held", u)
	}

	cancel() // the client leaves in the middle of the transfer
	if _, _, err := wait(); err == nil {
		t.Fatal("decode: answered although its client left")
	}
	waitFor(t, "the decode engine to drop the aborted request from its queue", func() bool {
		return gaugeOf(t, scrape(t, ds.URL), "vllm:num_requests_waiting") == 0
	})
	if u := kvUsage(t, ds.URL); u != blocks {
		t.Errorf("decode engine: KV usage %v once the request was aborted, want %v: the transfer still writes into its blocks", u, blocks)
	}
	if u := kvUsage(t, ps.URL); u <= 0 {
		t.Errorf("prefill engine: KV usage %v while the pull goes on, want its blocks held", u)
	}
	dsrv.Close() // the engine stopping ends the transfer
	waitFor(t, "the prefill engine to release the blocks of the ended pull", func() bool { return kvUsage(t, ps.URL) == 0 })
}

// TestPDDecodeAbortFreesAfterTransfer: a decode leg whose client leaves
// during its pull is aborted at once, but its blocks are freed only when
// the transfer ends, as vLLM's scheduler delays freeing the blocks of a
// request aborted in WAITING_FOR_REMOTE_KVS until its connector reports
// the receive done (the read still writes into them). The fake prefill
// side ends the transfer when the test says.
func TestPDDecodeAbortFreesAfterTransfer(t *testing.T) {
	release := make(chan struct{})
	pulling := make(chan struct{}, 1)
	host, port, pulls := pullSide(t, func(PullRequest) {
		pulling <- struct{}{}
		<-release
	})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := sendAsync(ctx, ds.URL+"/v1/completions", decodeBody(promptIDs(1, 100), 4, "r1", host, port))
	<-pulling
	cancel()
	if _, _, err := wait(); err == nil {
		t.Fatal("decode: answered although its client left")
	}
	waitFor(t, "the aborted request to leave the decode engine's queue", func() bool {
		return gaugeOf(t, scrape(t, ds.URL), "vllm:num_requests_waiting") == 0
	})
	if u := kvUsage(t, ds.URL); u != 7.0/64 {
		t.Errorf("KV usage %v after the abort, during the transfer; want %v (the prompt's 7 of 64 blocks)", u, 7.0/64)
	}
	close(release)
	waitFor(t, "the decode engine to free the blocks once the transfer ended", func() bool { return kvUsage(t, ds.URL) == 0 })
	if n := pulls.Load(); n != 1 {
		t.Errorf("%d pulls answered, want 1", n)
	}
}

// TestPDDecodeCachesPulledBlocks: once a decode engine received a prompt's
// KV, the prompt's full blocks are prefix-cache entries, announced in
// BlockStored events as vLLM announces them: its scheduler caches the
// received blocks up to the last prompt token
// (Scheduler._update_waiting_for_remote_kv, KVCacheManager.cache_blocks:
// one event), then the step that recomputes that token caches the block
// it fills (allocate_slots: a second event, its parent the first's last
// block) when the prompt is a whole number of blocks. A request with the
// same prompt sent to the decode engine itself then hits them. The
// decode engine announced them in one event before.
func TestPDDecodeCachesPulledBlocks(t *testing.T) {
	ctx, endpoint, replay := listeningSub(t)
	host, port, pulls := pullSide(t, nil)
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail,
		KVEvents: KVEventsConfig{Endpoint: endpoint, ReplayEndpoint: replay}})

	prompt := promptIDs(1, 64) // 4 whole blocks
	if code, body := post(t, ds.URL+"/v1/completions", decodeBody(prompt, 2, "r1", host, port)); code != 200 {
		t.Fatalf("decode: got %d %s", code, body)
	}
	if n := pulls.Load(); n != 1 {
		t.Fatalf("%d pulls, want 1", n)
	}
	toks := make([]uint32, len(prompt))
	for i, v := range prompt {
		toks[i] = uint32(v)
	}
	want := kvindex.HashTokens(toks, 16, nil)
	var stored []decodedEvent
	waitFor(t, "the pulled blocks' BlockStored events", func() bool {
		stored = stored[:0]
		for _, ev := range replayEvents(t, ctx, replay, EncodingArray) {
			if ev.Type == "BlockStored" {
				stored = append(stored, ev)
			}
		}
		return len(stored) >= 2
	})
	if first := stored[0]; !reflect.DeepEqual(first.Hashes, want[:3]) || first.Parent != nil || !reflect.DeepEqual(first.Tokens, toks[:48]) {
		t.Errorf("first BlockStored: hashes %v, parent %v; want %v (the blocks before the last prompt token), no parent",
			first.Hashes, first.Parent, want[:3])
	}
	if second := stored[1]; !reflect.DeepEqual(second.Hashes, want[3:4]) || second.Parent != want[2] {
		t.Errorf("second BlockStored: hashes %v, parent %v; want %v, parent %d (the block of the recomputed token)",
			second.Hashes, second.Parent, want[3:4], want[2])
	}

	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
	code, body := post(t, ds.URL+"/v1/completions", string(b))
	var c openai.Completion
	if err := json.Unmarshal(body, &c); code != 200 || err != nil {
		t.Fatalf("same prompt again: got %d %s", code, body)
	}
	if got := c.Usage.CachedTokens(); got != 48 {
		t.Errorf("same prompt again: %d cached tokens, want 48 (the pulled blocks but the last token's)", got)
	}
}

// TestPDDecodeConnectorMetrics pins a decode engine's KV-connector series
// as vLLM reports them (vllm/v1/metrics/loggers.py), over a conversation
// whose first turn the decode engine caches, and a plain request:
//   - vllm:external_prefix_cache_queries_total counts, at each request's
//     first scheduling, its prompt tokens past the local prefix-cache hit,
//     and ..._hits_total those the connector loads (Scheduler.schedule's
//     connector_prefix_cache_stats, from the NixlConnector's
//     get_num_new_matched_tokens: the prompt less the local hit for a
//     do_remote_prefill request, 0 for the others; an engine with a
//     connector records every request);
//   - vllm:prompt_tokens_by_source_total{source} (PromptTokenStats):
//     local_compute is the prompt less its cached tokens (the decode legs'
//     last token), local_cache_hit the cached tokens less the external
//     ones plus the recomputed last token, external_kv_transfer the
//     connector's; vllm:prompt_tokens_cached_total and
//     vllm:prompt_tokens_recomputed_total.
//
// The series were missing.
func TestPDDecodeConnectorMetrics(t *testing.T) {
	host, port, _ := pullSide(t, nil)
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})
	conversation := promptIDs(1, 356)
	for i, prompt := range [][]int{conversation[:256], conversation} { // 256 tokens, then 100 more (256 hit locally)
		if code, body := post(t, ds.URL+"/v1/completions", decodeBody(prompt, 2, fmt.Sprint("turn", i), host, port)); code != 200 {
			t.Fatalf("turn %d: got %d %s", i, code, body)
		}
	}
	b, _ := json.Marshal(map[string]any{"prompt": promptIDs(900, 20), "max_tokens": 1})
	if code, body := post(t, ds.URL+"/v1/completions", string(b)); code != 200 {
		t.Fatalf("plain: got %d %s", code, body)
	}
	mfs := scrape(t, ds.URL)
	bySource := func(src string) float64 {
		v, ok := sample(mfs, "vllm:prompt_tokens_by_source_total", map[string]string{"source": src})
		if !ok {
			t.Errorf("no vllm:prompt_tokens_by_source_total{source=%q}", src)
		}
		return v
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"vllm:external_prefix_cache_queries_total", gaugeOf(t, mfs, "vllm:external_prefix_cache_queries_total"), 256 + 100 + 20},
		{"vllm:external_prefix_cache_hits_total", gaugeOf(t, mfs, "vllm:external_prefix_cache_hits_total"), 256 + 100},
		{"vllm:prefix_cache_queries_total", gaugeOf(t, mfs, "vllm:prefix_cache_queries_total"), 256 + 356 + 20},
		{"vllm:prefix_cache_hits_total", gaugeOf(t, mfs, "vllm:prefix_cache_hits_total"), 256},
		{`local_compute`, bySource("local_compute"), 1 + 1 + 20},
		{`local_cache_hit`, bySource("local_cache_hit"), 0 + 256 + 0},
		{`external_kv_transfer`, bySource("external_kv_transfer"), 256 + 100},
		{"vllm:prompt_tokens_cached_total", gaugeOf(t, mfs, "vllm:prompt_tokens_cached_total"), 255 + 355},
		{"vllm:prompt_tokens_recomputed_total", gaugeOf(t, mfs, "vllm:prompt_tokens_recomputed_total"), 2},
		{"vllm:prompt_tokens_total", gaugeOf(t, mfs, "vllm:prompt_tokens_total"), 256 + 356 + 20},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	// An engine without a P/D role runs without a connector: its plain
	// requests query none.
	_, both := testServer(t, Config{})
	if code, body := post(t, both.URL+"/v1/completions", string(b)); code != 200 {
		t.Fatalf("plain, no connector: got %d %s", code, body)
	}
	if got := gaugeOf(t, scrape(t, both.URL), "vllm:external_prefix_cache_queries_total"); got != 0 {
		t.Errorf("no connector: vllm:external_prefix_cache_queries_total = %v, want 0", got)
	}
}

// TestPDDecodeWaitsForBlocks: a decode leg whose prompt's blocks do not
// fit the decode engine's free KV waits, queued, and pulls nothing until
// blocks are freed, as vLLM's scheduler allocates a do_remote_prefill
// request's blocks before its connector reads its KV (allocate_slots
// fails: the request stays waiting). Here a lease the engine holds (a
// prefill leg it ran) takes most of a small cache; the pull is made once
// the lease ends. The decode engine pulled at once before, into no block.
func TestPDDecodeWaitsForBlocks(t *testing.T) {
	var mu sync.Mutex
	released, early := false, false
	host, port, pulls := pullSide(t, func(PullRequest) {
		mu.Lock()
		early = early || !released
		mu.Unlock()
	})
	eng := tinyEngine(t)
	eng.NumGPUBlocks = 33 // 32 usable, and the null block
	_, ds := testServer(t, Config{Engine: eng, LeaseTimeout: time.Hour, LoadFailure: LoadFailureFail})

	// A prefill leg of 300 tokens: its 19 blocks stay held.
	b, _ := json.Marshal(map[string]any{"prompt": promptIDs(600, 300), "max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}})
	code, body := post(t, ds.URL+"/v1/completions", string(b))
	var lease openai.Completion
	if err := json.Unmarshal(body, &lease); code != 200 || err != nil {
		t.Fatalf("prefill leg: got %d %s", code, body)
	}
	held := 19.0 / 32
	if u := kvUsage(t, ds.URL); u != held {
		t.Fatalf("lease: KV usage %v, want %v", u, held)
	}

	// A decode leg of 256 tokens needs 16 blocks; 13 are free.
	wait := sendAsync(context.Background(), ds.URL+"/v1/completions", decodeBody(promptIDs(1, 256), 3, "d", host, port))
	waitFor(t, "the decode leg to wait", func() bool { return gaugeOf(t, scrape(t, ds.URL), "vllm:num_requests_waiting") == 1 })
	if u, n := kvUsage(t, ds.URL), pulls.Load(); u != held || n != 0 {
		t.Errorf("decode leg waiting for blocks: KV usage %v, %d pulls; want %v (the lease's blocks) and none", u, n, held)
	}

	mu.Lock()
	released = true
	mu.Unlock()
	rb, _ := json.Marshal(PullRequest{RemoteRequestID: lease.KVTransferParams["remote_request_id"].(string)})
	if code, body := post(t, ds.URL+"/internal/kv/pull", string(rb)); code != 200 {
		t.Fatalf("ending the lease: got %d %s", code, body)
	}
	if code, body, err := wait(); code != 200 || err != nil {
		t.Fatalf("decode leg: got %d %s (%v)", code, body, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := pulls.Load(); n != 1 || early {
		t.Errorf("%d pulls, one before the lease's blocks were freed: %v; want 1 pull, after", n, early)
	}
}

// TestPDAbortBeforePullStarts: a decode leg admitted to pull (its blocks
// allocated, its load handed to its handler) whose handler left before it
// took the load starts no transfer, so none will end and free the blocks
// the engine keeps for an abort during a pull: the loop frees them when it
// applies the abort. (The window is a handler's select racing an
// admission; the loop is driven by hand here.)
func TestPDAbortBeforePullStarts(t *testing.T) {
	cfg := Config{Role: kvroute.RoleDecode}
	testDefaults(t, &cfg)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ls := &loopState{live: map[string]*stream{}}
	st := newStream("d", 0, 2)
	st.loads = make(chan engine.KVLoad, 1)
	ls.live["d"] = st
	prompt := make([]uint32, 100)
	for i := range prompt {
		prompt[i] = uint32(i + 1)
	}
	if err := s.eng.Add(0, &engine.Request{ID: "d", Prompt: prompt, MaxTokens: 2, RemoteKV: true}); err != nil {
		t.Fatal(err)
	}
	s.eng.StepInto(0, &ls.res)
	s.startLoads(ls)
	if len(st.loads) != 1 {
		t.Fatalf("admission handed %d loads to the handler, want 1", len(st.loads))
	}
	s.apply(0, &command{kind: cmdAbort, id: "d"}, ls)
	if got := s.eng.Stats(); got.AbortedLoading != 0 || got.FreeBlocks != got.NumGPUBlocks-1 {
		t.Errorf("after the abort: %d aborted loads, %d of %d blocks free; want none kept (no transfer will end)",
			got.AbortedLoading, got.FreeBlocks, got.NumGPUBlocks-1)
	}
}

// TestPDAbortBeforeAdmissionFreesPrefill: a NixlConnector decode leg whose
// client leaves while it waits for blocks tells the prefill engine, which
// frees the blocks it held for it at once rather than when their lease
// expires (an hour here), as vLLM's decode scheduler has its worker notify
// the prefill engine of a read of no blocks (request_finished on a request
// still do_remote_prefill).
func TestPDAbortBeforeAdmissionFreesPrefill(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, LeaseTimeout: time.Hour})
	eng := tinyEngine(t)
	eng.NumGPUBlocks = 33 // 32 usable, and the null block
	_, ds := testServer(t, Config{Engine: eng, LeaseTimeout: time.Hour, LoadFailure: LoadFailureFail})

	prefill := func(url string, prompt []int) map[string]any {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}})
		code, body := post(t, url+"/v1/completions", string(b))
		var c openai.Completion
		if err := json.Unmarshal(body, &c); code != 200 || err != nil || c.KVTransferParams == nil {
			t.Fatalf("prefill leg: got %d %s", code, body)
		}
		return c.KVTransferParams
	}
	kv := prefill(ps.URL, promptIDs(1, 256))
	if u := kvUsage(t, ps.URL); u <= 0 {
		t.Fatalf("prefill engine: KV usage %v while it holds the lease, want > 0", u)
	}
	// The decode engine holds a lease of its own on 19 of its 32 blocks:
	// the decode leg's 16 do not fit, and it waits.
	prefill(ds.URL, promptIDs(600, 300))
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"prompt": promptIDs(1, 256), "max_tokens": 3, "kv_transfer_params": kv})
	wait := sendAsync(ctx, ds.URL+"/v1/completions", string(b))
	waitFor(t, "the decode leg to wait", func() bool { return gaugeOf(t, scrape(t, ds.URL), "vllm:num_requests_waiting") == 1 })
	cancel()
	if _, _, err := wait(); err == nil {
		t.Fatal("the cancelled decode leg was answered")
	}
	waitFor(t, "the prefill engine to free the aborted leg's blocks", func() bool { return kvUsage(t, ps.URL) == 0 })
	waitFor(t, "the decode engine to drop the leg", func() bool { return gaugeOf(t, scrape(t, ds.URL), "vllm:num_requests_waiting") == 0 })
	// The lease is gone: a pull finds nothing.
	rb, _ := json.Marshal(PullRequest{RemoteRequestID: kv["remote_request_id"].(string)})
	if code, body := post(t, ps.URL+"/internal/kv/pull", string(rb)); code != http.StatusNotFound {
		t.Errorf("pull after the release: got %d %s, want 404", code, body)
	}
}

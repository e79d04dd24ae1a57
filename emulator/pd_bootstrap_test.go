package emulator

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
)

// TestPDSGLangBootstrapQueue: an SGLang prefill engine computes a leg only
// once the decode engine bootstrapped its room, which the decode engine
// does once it pre-allocated the leg's KV, as SGLang's prefill engine keeps
// a request in its bootstrap queue until its KV sender leaves
// KVPoll.Bootstrapping (the decode engine's DecodePreallocQueue sends the
// room's destination only from pop_preallocated). Here the decode engine's
// cache is held by another leg's pull, so the room's decode leg waits for
// KV space (its prealloc queue): the prefill leg meanwhile waits in the
// bootstrap queue (sglang:num_prefill_prealloc_queue_reqs), neither running
// nor queued, its prompt not computed and no block held. When the decode
// engine admits the leg, both legs run and answer. Before, the prefill leg
// was computed at once and held its blocks while the decode leg waited.
func TestPDSGLangBootstrapQueue(t *testing.T) {
	const (
		bootstrap = "sglang:num_prefill_prealloc_queue_reqs"
		inflight  = "sglang:num_prefill_inflight_queue_reqs"
		prealloc  = "sglang:num_decode_prealloc_queue_reqs"
		transfer  = "sglang:num_decode_transfer_queue_reqs"
		running   = "sglang:num_running_reqs"
		queue     = "sglang:num_queue_reqs"
		usage     = "sglang:token_usage"
		prompts   = "sglang:prompt_tokens_total"
	)
	// Another prefill engine's side channel, whose pull the test holds: the
	// decode leg pulling from it holds the decode engine's cache.
	side, arrived, release := heldPull(t, "other")
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LeaseTimeout: time.Hour, BootstrapTimeout: time.Hour})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LoadFailure: LoadFailureFail, Engine: engine.Config{Profile: prof, NumGPUBlocks: 5}}) // 4 blocks of 16 tokens (and the null block)
	body := func(url, prompt string, room, maxTokens int) string {
		host, port := splitHostPort(t, url)
		return fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"ignore_eos":true,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`,
			prompt, maxTokens, host, port, room)
	}

	// The blocker: a decode leg whose prompt fills the cache, in its pull.
	blocker := sendAsync(context.Background(), ds.URL+"/v1/completions", body(side.URL, strings.Repeat(pdPrompt+" ", 2), 1, 1)) // 47 tokens: 3 blocks
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for the blocker's pull")
	}
	if u := gaugeOf(t, scrape(t, ds.URL), usage); u < 0.7 {
		t.Fatalf("the blocker holds %v of the decode engine's cache, want it (nearly) full", u)
	}

	leg := body(ps.URL, pdPrompt, 42, 4) // 24 tokens: 2 blocks
	prefill := sendAsync(context.Background(), ps.URL+"/v1/completions", leg)
	decode := sendAsync(context.Background(), ds.URL+"/v1/completions", leg)
	waitFor(t, "the decode leg to wait for KV space", func() bool { return gaugeOf(t, scrape(t, ds.URL), prealloc) == 1 })
	waitFor(t, "the prefill leg to wait in the bootstrap queue", func() bool { return gaugeOf(t, scrape(t, ps.URL), bootstrap) == 1 })
	time.Sleep(50 * time.Millisecond) // 5 s of the engines' time: the prefill engine computes nothing meanwhile
	checkGauges(t, "prefill engine, its leg in the bootstrap queue", ps.URL,
		map[string]float64{bootstrap: 1, inflight: 0, running: 0, queue: 0, usage: 0})
	if got := gaugeOf(t, scrape(t, ps.URL), prompts); got != 0 {
		t.Errorf("prefill engine, its leg in the bootstrap queue: got %s %v, want 0 (not computed)", prompts, got)
	}

	release() // the blocker's KV arrives: it runs, ends and frees the cache
	if code, b, err := blocker(); code != http.StatusOK {
		t.Fatalf("blocker: got %d %s %v", code, b, err)
	}
	if code, b, err := decode(); code != http.StatusOK {
		t.Errorf("decode leg: got %d %s %v", code, b, err)
	}
	if code, b, err := prefill(); code != http.StatusOK {
		t.Errorf("prefill leg: got %d %s %v", code, b, err)
	}
	checkGauges(t, "prefill engine after the handoff", ps.URL, map[string]float64{bootstrap: 0, inflight: 0, running: 0, queue: 0})
	checkGauges(t, "decode engine after the handoff", ds.URL, map[string]float64{prealloc: 0, transfer: 0, running: 0, queue: 0})
	if got := gaugeOf(t, scrape(t, ps.URL), prompts); got == 0 {
		t.Errorf("prefill engine after the handoff: got %s 0, want the leg's prompt", prompts)
	}
}

// TestPDSGLangPullBeforePrefill: the decode engine's pull may reach the
// prefill engine before the prefill leg does (the router sends both legs
// at once): the room is then bootstrapped already, and the prefill leg,
// when it comes, is computed at once and its KV taken.
func TestPDSGLangPullBeforePrefill(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LeaseTimeout: time.Hour, BootstrapTimeout: time.Hour})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LoadFailure: LoadFailureFail})
	host, port := splitHostPort(t, ps.URL)
	leg := fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":77}`, pdPrompt, host, port)
	decode := sendAsync(context.Background(), ds.URL+"/v1/completions", leg)
	waitFor(t, "the decode engine's pull", func() bool {
		return gaugeOf(t, scrape(t, ds.URL), "sglang:num_decode_transfer_queue_reqs") == 1
	})
	if code, b := post(t, ps.URL+"/v1/completions", leg); code != http.StatusOK {
		t.Errorf("prefill leg: got %d %s", code, b)
	}
	if code, b, err := decode(); code != http.StatusOK {
		t.Errorf("decode leg: got %d %s %v", code, b, err)
	}
	waitFor(t, "the prefill engine to free the blocks", func() bool { return gaugeOf(t, scrape(t, ps.URL), "sglang:token_usage") == 0 })
}

// TestPDSGLangBootstrapTimeout: a prefill leg whose decode engine never
// bootstrapped its room fails after BootstrapTimeout with SGLang's 500
// (KVPoll.Bootstrapping), never computed; a streamed one as the stream's
// error event. A client that leaves meanwhile frees its place in the queue
// at once.
func TestPDSGLangBootstrapTimeout(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		BootstrapTimeout: 20 * time.Second}) // 0.2 s at speed 100
	host, port := splitHostPort(t, ps.URL)
	leg := func(room int, stream bool) string {
		return fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"stream":%v,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`,
			pdPrompt, stream, host, port, room)
	}
	const msg = "KVTransferError(bootstrap_room=%d): Request %d timed out after 20.0s in KVPoll.Bootstrapping"
	code, b := post(t, ps.URL+"/v1/completions", leg(5, false))
	if want := fmt.Sprintf(`{"object":"error","message":"`+msg+`","type":"InternalServerError","param":null,"code":500}`, 5, 5); code != http.StatusInternalServerError || strings.TrimSpace(string(b)) != want {
		t.Errorf("whole: got %d %s, want 500 %s", code, b, want)
	}
	code, b = post(t, ps.URL+"/v1/completions", leg(6, true))
	if want := fmt.Sprintf(msg, 6, 6); code != http.StatusOK || !strings.Contains(string(b), want) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Errorf("streamed: got %d %s, want 200 with the error event %q and [DONE]", code, b, want)
	}
	checkGauges(t, "after the timeouts", ps.URL, map[string]float64{"sglang:num_prefill_prealloc_queue_reqs": 0})
	if got := gaugeOf(t, scrape(t, ps.URL), "sglang:prompt_tokens_total"); got != 0 {
		t.Errorf("after the timeouts: got sglang:prompt_tokens_total %v, want 0 (never computed)", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	wait := sendAsync(ctx, ps.URL+"/v1/completions", leg(7, false))
	waitFor(t, "the leg in the bootstrap queue", func() bool {
		return gaugeOf(t, scrape(t, ps.URL), "sglang:num_prefill_prealloc_queue_reqs") == 1
	})
	cancel()
	if _, _, err := wait(); err == nil {
		t.Error("answered after its client left")
	}
	waitFor(t, "the queue to empty", func() bool {
		return gaugeOf(t, scrape(t, ps.URL), "sglang:num_prefill_prealloc_queue_reqs") == 0
	})
}

// TestPDSGLangStreamedLegStartsAtOnce: a streamed SGLang prefill leg gets
// its 200 and headers at once, as SGLang's StreamingResponse sends them
// before its generator waits, while the leg waits in the bootstrap queue;
// its chunks follow once the decode engine bootstrapped the room.
func TestPDSGLangStreamedLegStartsAtOnce(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LeaseTimeout: time.Hour, BootstrapTimeout: time.Hour})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LoadFailure: LoadFailureFail})
	host, port := splitHostPort(t, ps.URL)
	leg := fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"stream":true,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":9}`, pdPrompt, host, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ps.URL+"/v1/completions", strings.NewReader(leg))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the streamed prefill leg's headers: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		t.Fatalf("got %d %s, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The leg joins the queue just after its headers went out.
	waitFor(t, "the leg in the bootstrap queue", func() bool {
		return gaugeOf(t, scrape(t, ps.URL), "sglang:num_prefill_prealloc_queue_reqs") == 1
	})
	if code, b := post(t, ds.URL+"/v1/completions", strings.Replace(leg, `"stream":true`, `"stream":false`, 1)); code != http.StatusOK {
		t.Fatalf("decode leg: got %d %s", code, b)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(b), `"finish_reason":"length"`) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Errorf("the streamed prefill leg: got %q %v, want its chunk and [DONE]", b, err)
	}
}

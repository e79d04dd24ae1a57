package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	dto "github.com/prometheus/client_model/go"
)

// gaugeOf is the value of the one series of family name, failing the test
// when the family is missing.
func gaugeOf(t *testing.T, mfs map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	v, ok := sample(mfs, name, nil)
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return v
}

// checkGauges compares the gauges of want with a scrape of url.
func checkGauges(t *testing.T, what, url string, want map[string]float64) {
	t.Helper()
	mfs := scrape(t, url)
	for name, w := range want {
		if got := gaugeOf(t, mfs, name); got != w {
			t.Errorf("%s: got %s %v, want %v", what, name, got, w)
		}
	}
}

// sendAsync posts body to url with ctx in its own goroutine; the returned
// function waits for the answer and returns its status (0 and the error
// when there was no answer).
func sendAsync(ctx context.Context, url, body string) func() (int, string, error) {
	type answer struct {
		code int
		body string
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			ch <- answer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{resp.StatusCode, string(b), err}
	}()
	return func() (int, string, error) {
		a := <-ch
		return a.code, a.body, a.err
	}
}

// TestPDDecodePullCountsWaiting: a decode engine's request whose KV is
// being pulled from the prefill engine is load the engine reports, as
// vLLM's scheduler keeps a do_remote_prefill request in its waiting queue
// (WAITING_FOR_REMOTE_KVS) while its KV arrives: vllm:num_requests_waiting
// (and the endpoint-load-metrics header, which vLLM reads from that
// gauge), llamacpp:requests_deferred, and in the SGLang flavour the decode
// transfer queue (not num_queue_reqs, SGLang's own waiting queue, which
// its requests enter once their KV arrived). The request was counted
// nowhere until its pull ended. The prefill side here is a side channel
// that holds the pull until the test releases it.
func TestPDDecodePullCountsWaiting(t *testing.T) {
	tests := []struct {
		flavor, protocol string
		during, after    map[string]float64
	}{
		{FlavorVLLM, PDNixl,
			map[string]float64{"vllm:num_requests_waiting": 1, "vllm:num_requests_running": 0},
			map[string]float64{"vllm:num_requests_waiting": 0}},
		{FlavorVLLMLegacy, PDNixl,
			map[string]float64{"vllm:num_requests_waiting": 1, "vllm:num_requests_running": 0},
			map[string]float64{"vllm:num_requests_waiting": 0}},
		{FlavorLlamaCpp, PDNixl,
			map[string]float64{"llamacpp:requests_deferred": 1, "llamacpp:requests_processing": 0},
			map[string]float64{"llamacpp:requests_deferred": 0}},
		{FlavorSGLang, PDSGLang,
			map[string]float64{"sglang:num_decode_transfer_queue_reqs": 1, "sglang:num_decode_prealloc_queue_reqs": 0,
				"sglang:num_queue_reqs": 0, "sglang:num_running_reqs": 0,
				"sglang:num_prefill_prealloc_queue_reqs": 0, "sglang:num_prefill_inflight_queue_reqs": 0},
			map[string]float64{"sglang:num_decode_transfer_queue_reqs": 0, "sglang:num_queue_reqs": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.flavor, func(t *testing.T) {
			side, arrived, unblock := heldPull(t, "p")
			host, port := splitHostPort(t, side.URL)
			_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: tt.protocol, MetricsFlavor: tt.flavor,
				LoadFailure: LoadFailureFail})

			body := fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"kv_transfer_params":{"do_remote_prefill":true,"remote_request_id":"r1","remote_host":%q,"remote_port":%d}}`,
				pdPrompt, host, port)
			if tt.protocol == PDSGLang {
				body = fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":7}`, pdPrompt, host, port)
			}
			wait := sendAsync(context.Background(), ds.URL+"/v1/completions", body)
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("timed out waiting for the decode engine's pull")
			}
			checkGauges(t, "during the pull", ds.URL, tt.during)
			if tt.flavor == FlavorVLLM {
				// vLLM's endpoint-load-metrics header reads
				// vllm:num_requests_waiting.
				req, _ := http.NewRequest(http.MethodPost, ds.URL+"/v1/completions", strings.NewReader(`{"prompt":"Hi","max_tokens":1}`))
				req.Header.Set("endpoint-load-metrics-format", "TEXT")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if got, want := resp.Header.Get("endpoint-load-metrics"), "named_metrics.num_requests_waiting=1.0"; !strings.Contains(got, want) {
					t.Errorf("during the pull: got endpoint-load-metrics %q, want %s", got, want)
				}
			}
			unblock()
			code, b, err := wait()
			if err != nil || code != 200 {
				t.Fatalf("decode: got %d %s (%v)", code, b, err)
			}
			checkGauges(t, "after the request", ds.URL, tt.after)
		})
	}
}

// TestPDSGLangQueueGauges: an SGLang-flavoured P/D pair publishes SGLang's
// P/D queue gauges from its state: the prefill leg waiting for its decode
// engine is the prefill bootstrap queue, then its held lease the inflight
// queue (prefilled, its KV waiting for the decode engine to read it) until
// the decode engine's pull released it, the decode engine's request in its
// pull (a slow transfer here) is its transfer queue; their waiting queues
// (num_queue_reqs) stay empty, and the decode prealloc queue (decode legs
// waiting for KV space: this one has room; TestPDSGLangBootstrapQueue
// fills it) reads 0. The gauges were missing.
func TestPDSGLangQueueGauges(t *testing.T) {
	_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LeaseTimeout: time.Hour})
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		TransferSetup: time.Hour, LoadFailure: LoadFailureFail}) // 36 s at speed 100: the pull lasts until cancelled
	host, port := splitHostPort(t, ps.URL)
	body := fmt.Sprintf(`{"prompt":%q,"max_tokens":4,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":42}`, pdPrompt, host, port)
	const (
		bootstrap = "sglang:num_prefill_prealloc_queue_reqs"
		inflight  = "sglang:num_prefill_inflight_queue_reqs"
		prealloc  = "sglang:num_decode_prealloc_queue_reqs"
		transfer  = "sglang:num_decode_transfer_queue_reqs"
		queue     = "sglang:num_queue_reqs"
	)
	zero := map[string]float64{bootstrap: 0, inflight: 0, prealloc: 0, transfer: 0, queue: 0}
	checkGauges(t, "idle prefill engine", ps.URL, zero)
	checkGauges(t, "idle decode engine", ds.URL, zero)

	// An SGLang prefill leg waits for its decode engine's bootstrap
	// (awaitBootstrap), then answers once the decode engine took its KV
	// (awaitPeer).
	prefill := sendAsync(context.Background(), ps.URL+"/v1/completions", body)
	waitFor(t, "the prefill leg to wait for its decode engine", func() bool { return gaugeOf(t, scrape(t, ps.URL), bootstrap) == 1 })
	checkGauges(t, "prefill engine waiting for the room's bootstrap", ps.URL,
		map[string]float64{bootstrap: 1, inflight: 0, prealloc: 0, transfer: 0, queue: 0, "sglang:num_running_reqs": 0})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := sendAsync(ctx, ds.URL+"/v1/completions", body)
	waitFor(t, "the decode engine's transfer queue to hold the request", func() bool {
		v := gaugeOf(t, scrape(t, ds.URL), transfer)
		return v == 1
	})
	waitFor(t, "the prefill engine to hold the room's KV", func() bool { return gaugeOf(t, scrape(t, ps.URL), inflight) == 1 })
	checkGauges(t, "prefill engine holding the room's KV", ps.URL,
		map[string]float64{bootstrap: 0, inflight: 1, prealloc: 0, transfer: 0, queue: 0, "sglang:num_running_reqs": 0})
	checkGauges(t, "decode engine pulling", ds.URL, map[string]float64{prealloc: 0, queue: 0, "sglang:num_running_reqs": 0})
	checkGauges(t, "prefill engine being pulled from", ps.URL, map[string]float64{inflight: 1, queue: 0})

	cancel() // the client leaves: the pull ends, the prefill engine releases the blocks
	if _, _, err := wait(); err == nil {
		t.Fatal("decode: answered after its client left")
	}
	waitFor(t, "the prefill engine's inflight queue to empty", func() bool {
		v := gaugeOf(t, scrape(t, ps.URL), inflight)
		return v == 0
	})
	waitFor(t, "the decode engine's transfer queue to empty", func() bool {
		v := gaugeOf(t, scrape(t, ds.URL), transfer)
		return v == 0
	})
	checkGauges(t, "prefill engine after the pull", ps.URL, zero)
	if code, b, err := prefill(); code != 200 {
		t.Errorf("prefill: got %d %s %v", code, b, err)
	}
}

// TestPDInflightLeaseEnds: a prefill engine's SGLang room leaves its
// queues however it ends: its pull left after bootstrapping it (the blocks
// are freed when the leg is computed, not held for LeaseTimeout), or
// another leg reused it (the new leg is bootstrapped and pulled, the old
// one's bootstrap times out).
func TestPDInflightLeaseEnds(t *testing.T) {
	const (
		bootstrap = "sglang:num_prefill_prealloc_queue_reqs"
		inflight  = "sglang:num_prefill_inflight_queue_reqs"
		usage     = "sglang:token_usage"
	)
	leg := func(url, prompt string, n int) string {
		host, port := splitHostPort(t, url)
		return fmt.Sprintf(`{"prompt":%q,"max_tokens":2,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`, prompt, host, port, n)
	}
	// pull is a decode engine's pull of room n, waiting wait for its KV
	// and holding the transfer for hold.
	pull := func(ctx context.Context, url string, n int, wait, hold time.Duration) func() (int, string, error) {
		return sendAsync(ctx, url+"/internal/kv/pull",
			fmt.Sprintf(`{"bootstrap_room":%d,"wait_seconds":%g,"transfer_seconds":%g}`, n, wait.Seconds(), hold.Seconds()))
	}
	t.Run("its pull left before the grant", func(t *testing.T) {
		prof, err := engine.LookupProfile("tiny")
		if err != nil {
			t.Fatal(err)
		}
		_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
			LeaseTimeout: time.Hour, BootstrapTimeout: time.Hour, Engine: engine.Config{Profile: prof, NumGPUBlocks: 5}})
		// Room 1's KV (3 of the 4 blocks) is held in a transfer that
		// lasts until the test ends it, so room 2's leg cannot be
		// computed once bootstrapped.
		ctx, endTransfer := context.WithCancel(context.Background())
		defer endTransfer()
		held := pull(ctx, ps.URL, 1, 10*time.Second, time.Hour)
		first := sendAsync(context.Background(), ps.URL+"/v1/completions", leg(ps.URL, strings.Repeat(pdPrompt+" ", 2), 1))
		waitFor(t, "room 1's transfer", func() bool { return gaugeOf(t, scrape(t, ps.URL), inflight) == 1 })
		other := "A prompt that shares no block with room 1's, long enough to fill more than one block of KV."
		second := sendAsync(context.Background(), ps.URL+"/v1/completions", leg(ps.URL, other, 2))
		waitFor(t, "room 2's leg in the bootstrap queue", func() bool { return gaugeOf(t, scrape(t, ps.URL), bootstrap) == 1 })
		// Room 2's pull bootstraps it, then gives up.
		if code, b, err := pull(context.Background(), ps.URL, 2, 20*time.Millisecond, 0)(); code != http.StatusNotFound {
			t.Fatalf("room 2's pull: got %d %s %v, want 404", code, b, err)
		}
		checkGauges(t, "room 2 bootstrapped, not computed", ps.URL, map[string]float64{bootstrap: 0, inflight: 1})
		endTransfer()
		if code, b, err := first(); code != http.StatusOK {
			t.Errorf("room 1's leg: got %d %s %v", code, b, err)
		}
		_, _, _ = held()
		// Room 2's leg is computed now; nothing will take its KV.
		if code, b, err := second(); code != http.StatusOK {
			t.Errorf("room 2's leg: got %d %s %v", code, b, err)
		}
		waitFor(t, "the blocks to be freed", func() bool { return gaugeOf(t, scrape(t, ps.URL), usage) == 0 })
		checkGauges(t, "after both legs", ps.URL, map[string]float64{bootstrap: 0, inflight: 0})
	})
	t.Run("reused room, then pulled", func(t *testing.T) {
		_, ps := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
			LeaseTimeout: time.Hour, BootstrapTimeout: 50 * time.Second}) // 0.5 s at speed 100
		_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
			LoadFailure: LoadFailureFail})
		old := sendAsync(context.Background(), ps.URL+"/v1/completions", leg(ps.URL, pdPrompt, 5))
		waitFor(t, "the first leg of room 5 in the bootstrap queue", func() bool { return gaugeOf(t, scrape(t, ps.URL), bootstrap) == 1 })
		reused := sendAsync(context.Background(), ps.URL+"/v1/completions", leg(ps.URL, pdPrompt, 5))
		waitFor(t, "both legs of room 5 in the bootstrap queue", func() bool { return gaugeOf(t, scrape(t, ps.URL), bootstrap) == 2 })
		if code, b := post(t, ds.URL+"/v1/completions", leg(ps.URL, pdPrompt, 5)); code != http.StatusOK {
			t.Fatalf("decode room 5: got %d %s", code, b)
		}
		if code, b, err := reused(); code != http.StatusOK {
			t.Errorf("the leg that reused room 5: got %d %s %v", code, b, err)
		}
		if code, b, err := old(); code != http.StatusInternalServerError || !strings.Contains(b, "in KVPoll.Bootstrapping") {
			t.Errorf("the leg whose room was reused: got %d %s %v, want its bootstrap's timeout", code, b, err)
		}
		checkGauges(t, "after both legs", ps.URL, map[string]float64{bootstrap: 0, inflight: 0, usage: 0})
	})
}

// heldPull starts another prefill engine's side channel that answers each
// KV pull (as engine engineID, with no blocks) only once the test calls
// release: arrived receives a value as each pull arrives. The server
// closes, and release is called, when the test ends.
func heldPull(t *testing.T, engineID string) (side *httptest.Server, arrived <-chan struct{}, release func()) {
	t.Helper()
	in, held := make(chan struct{}, 1), make(chan struct{})
	side = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in <- struct{}{}
		select {
		case <-held:
		case <-r.Context().Done():
			return
		}
		_ = json.NewEncoder(w).Encode(PullResponse{EngineID: engineID})
	}))
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(side.Close)
	t.Cleanup(release) // runs first: a held pull answers, and the server can close
	return side, in, release
}

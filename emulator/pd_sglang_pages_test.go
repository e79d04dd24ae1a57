package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// recordedPulls starts a fake prefill engine's side channel that answers
// every KV pull at once and records it; pulls returns those so far.
func recordedPulls(t *testing.T) (side *httptest.Server, pulls func() []PullRequest) {
	t.Helper()
	var mu sync.Mutex
	var got []PullRequest
	side = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var pr PullRequest
		if err := json.NewDecoder(r.Body).Decode(&pr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, pr)
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(PullResponse{EngineID: "p"})
	}))
	t.Cleanup(side.Close)
	return side, func() []PullRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]PullRequest(nil), got...)
	}
}

// sglangLeg is an SGLang leg's body: prompt (a string or token ids), the
// bootstrap fields naming the prefill engine at url and room.
func sglangLeg(t *testing.T, url string, prompt any, room, maxTokens int) string {
	t.Helper()
	host, port := splitHostPort(t, url)
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true,
		"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room})
	return string(b)
}

// TestPDSGLangShortPromptBootstraps: an SGLang prefill leg whose prompt is
// shorter than one KV block (page) waits in the bootstrap queue, not
// computed, for its decode engine as any leg does (SGLang's
// PrefillBootstrapQueue takes every request of a prefill engine, whatever
// its length); once bootstrapped it is computed and its KV held
// (sglang:num_prefill_inflight_queue_reqs) until the decode engine pulled
// it (the prefill engine sends kv_to_page_num pages, the last one
// partial). Before, the short leg was computed at once, its blocks freed
// at once, and its decode leg recomputed the prompt with no pull.
func TestPDSGLangShortPromptBootstraps(t *testing.T) {
	const (
		bootstrap = "sglang:num_prefill_prealloc_queue_reqs"
		inflight  = "sglang:num_prefill_inflight_queue_reqs"
		usage     = "sglang:token_usage"
		prompts   = "sglang:prompt_tokens_total"
	)
	ps, phs := testServer(t, Config{Role: kvroute.RolePrefill, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LeaseTimeout: time.Hour, BootstrapTimeout: time.Hour})
	_, dhs := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
		LoadFailure: LoadFailureFail})
	leg := sglangLeg(t, phs.URL, "Hi", 11, 3)

	prefill := sendAsync(context.Background(), phs.URL+"/v1/completions", leg)
	waitFor(t, "the short leg in the bootstrap queue", func() bool { return gaugeOf(t, scrape(t, phs.URL), bootstrap) == 1 })
	time.Sleep(50 * time.Millisecond) // 5 s of the engine's time: nothing is computed meanwhile
	checkGauges(t, "the short leg in the bootstrap queue", phs.URL, map[string]float64{bootstrap: 1, inflight: 0, usage: 0, prompts: 0})

	// The room's pull, as the decode engine makes it once it pre-allocated
	// the leg, held in its transfer: the leg is computed, its KV held.
	ctx, endTransfer := context.WithCancel(context.Background())
	defer endTransfer()
	pull := sendAsync(ctx, phs.URL+"/internal/kv/pull", `{"bootstrap_room":11,"wait_seconds":10,"transfer_seconds":3600}`)
	waitFor(t, "the short leg's KV held for the pull", func() bool { return gaugeOf(t, scrape(t, phs.URL), inflight) == 1 })
	mfs := scrape(t, phs.URL)
	if u, p := gaugeOf(t, mfs, usage), gaugeOf(t, mfs, prompts); u == 0 || p == 0 {
		t.Errorf("during the pull: got %s %v, %s %v; want the leg computed and its block held", usage, u, prompts, p)
	}
	endTransfer()
	_, _, _ = pull()
	if code, b, err := prefill(); code != http.StatusOK {
		t.Errorf("prefill leg: got %d %s %v", code, b, err)
	}
	waitFor(t, "the prefill engine to free the short leg's block", func() bool { return gaugeOf(t, scrape(t, phs.URL), usage) == 0 })

	// A whole pair: the decode engine pulls the short prompt's KV and
	// computes only its last token.
	leg = sglangLeg(t, phs.URL, "Hi", 12, 3)
	pcode, pbody, dcode, dbody := sglangPair(t, phs.URL, dhs.URL, leg, true)
	if pcode != http.StatusOK || dcode != http.StatusOK {
		t.Fatalf("pair: prefill %d %s, decode %d %s", pcode, pbody, dcode, dbody)
	}
	var c openai.Completion
	if err := json.Unmarshal([]byte(dbody), &c); err != nil {
		t.Fatal(err)
	}
	n, bs := c.Usage.PromptTokens, ps.Profile().BlockSize
	if n >= bs {
		t.Fatalf("prompt of %d tokens, want fewer than a block (%d)", n, bs)
	}
	if d := c.Usage.PromptTokensDetails; d == nil || d.CachedTokens != n-1 {
		t.Errorf("decode leg: got usage %+v, want cached_tokens %d (the pulled prompt less its last token)", c.Usage, n-1)
	}
	waitFor(t, "the prefill engine to free the pair's block", func() bool { return gaugeOf(t, scrape(t, phs.URL), usage) == 0 })
}

// TestPDSGLangShortPromptPulled: an SGLang decode engine pulls a prompt
// shorter than one block from its prefill engine, one page's transfer
// (SGLang's transfer engine moves a page's bytes for its partial last
// page), where it computed the prompt itself and made no pull.
func TestPDSGLangShortPromptPulled(t *testing.T) {
	side, pulls := recordedPulls(t)
	s, dhs := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, LoadFailure: LoadFailureFail})
	if code, b := post(t, dhs.URL+"/v1/completions", sglangLeg(t, side.URL, "Hi", 21, 2)); code != http.StatusOK {
		t.Fatalf("decode leg: got %d %s", code, b)
	}
	got := pulls()
	if len(got) != 1 {
		t.Fatalf("got %d pulls, want 1: %+v", len(got), got)
	}
	want := s.transferTime(s.Profile().BlockSize).Seconds()
	if pr := got[0]; pr.BootstrapRoom == nil || *pr.BootstrapRoom != 21 || pr.TransferSeconds != want {
		t.Errorf("got pull %+v, want room 21 for %v s (one page)", pr, want)
	}
}

// TestPDSGLangDecodePrefixLen: with SGLang's
// --disaggregation-decode-enable-radix-cache a decode engine that caches a
// conversation's first turn pulls only the pages of the second turn past
// that cached prefix (decode_prefix_len; the prefill engine's
// pop_bootstrapped starts sending at it), so its transfer is shorter; a
// cold decode engine, and one without the flag (SGLang forces its cache to
// a chunk cache: it keeps no prefix), pull the whole prompt, page by page.
// The transfers are those of whole pages (blocks): the first turn's 256
// tokens are 16 pages, the second turn's 356 are 23, of which 7 follow
// the first turn's 16.
func TestPDSGLangDecodePrefixLen(t *testing.T) {
	const first, added = 256, 100
	prompt := make([]int, first+added)
	for k := range prompt {
		prompt[k] = 1 + k%900
	}
	for _, tt := range []struct {
		name  string
		radix bool
		pages [2]int  // the pages each turn's pull moves
		hits  float64 // the decode engine's own prefix-cache hit, in tokens
	}{
		{"radix cache", true, [2]int{16, 7}, first},
		{"chunk cache", false, [2]int{16, 23}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			side, pulls := recordedPulls(t)
			s, dhs := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: PDSGLang, MetricsFlavor: FlavorSGLang,
				LoadFailure: LoadFailureFail, DisaggregationDecodeEnableRadixCache: tt.radix})
			for i, tokens := range [][]int{prompt[:first], prompt} {
				if code, b := post(t, dhs.URL+"/v1/completions", sglangLeg(t, side.URL, tokens, 30+i, 2)); code != http.StatusOK {
					t.Fatalf("turn %d: got %d %s", i+1, code, b)
				}
			}
			got := pulls()
			if len(got) != 2 {
				t.Fatalf("got %d pulls, want 2: %+v", len(got), got)
			}
			bs := s.Profile().BlockSize
			for i, pr := range got {
				if want := s.transferTime(tt.pages[i] * bs).Seconds(); pr.TransferSeconds != want {
					whole := (first + added*i + bs - 1) / bs
					t.Errorf("turn %d: pulled for %v s, want %v s (%d pages; the whole prompt's %d would take %v s)", i+1,
						pr.TransferSeconds, want, tt.pages[i], whole, s.transferTime(whole*bs).Seconds())
				}
			}
			// The decode engine's own cache: its hit on the second turn
			// (sglang:cached_tokens_total{cache_source="device"}), none
			// without the radix cache.
			mfs := scrape(t, dhs.URL)
			if got, ok := sample(mfs, "sglang:cached_tokens_total", map[string]string{"cache_source": "device"}); !ok || got != tt.hits {
				t.Errorf("got sglang:cached_tokens_total %v (%v), want %v", got, ok, tt.hits)
			}
		})
	}

	t.Run("needs the SGLang protocol", func(t *testing.T) {
		cfg := Config{Model: "tiny", Engine: tinyEngine(t), Role: kvroute.RoleDecode, DisaggregationDecodeEnableRadixCache: true}
		s, err := New(cfg)
		if err == nil {
			s.Close()
			t.Fatal("New: got no error for DisaggregationDecodeEnableRadixCache with NixlConnector")
		}
		if want := fmt.Sprintf("DisaggregationDecodeEnableRadixCache needs PDProtocol %s", PDSGLang); !strings.Contains(err.Error(), want) {
			t.Errorf("New: got %v, want %q", err, want)
		}
	})
}

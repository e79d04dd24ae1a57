package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/kvindex"
)

// startDPEngine serves an emulated vLLM with --data-parallel-size ranks on
// loopback, each rank binding its KV-event sockets on the tcp port of
// events (and of replay) plus its rank, as vLLM's publishers do.
func startDPEngine(t *testing.T, ranks int, events, replay string) string {
	t.Helper()
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dp, err := emulator.NewDP(emulator.Config{
		Model: model,
		Engine: engine.Config{Profile: prof, NumGPUBlocks: 2048, MaxModelLen: 16384, MaxNumBatchedTokens: 2048,
			MaxNumSeqs: 32},
		Speed:    50,
		Logger:   logger().With("engine", "dp"),
		KVEvents: emulator.KVEventsConfig{Endpoint: events, ReplayEndpoint: replay, Encoding: "array"},
	}, ranks)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: dp.Handler()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = hs.Serve(ln) }()
	go func() {
		defer close(done)
		if err := dp.Run(ctx); err != nil {
			t.Errorf("data-parallel engine: Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		hs.Close()
	})
	return "http://" + ln.Addr().String()
}

// TestDataParallelRanks: kvroute serve in front of one emulated vLLM with
// two data-parallel ranks (--data-parallel-size 2). The router reads each
// rank's KV events from its own port into the precise index under the
// rank's endpoint (dp#dp0, dp#dp1), and a repeated prompt goes back to the
// rank that holds it: the engine, which would otherwise balance the repeat
// onto either rank, reports the prompt cached every time, so the router's
// X-Data-Parallel-Rank reached it.
func TestDataParallelRanks(t *testing.T) {
	evPort, replayPort := freeport.Consecutive(t, 2), freeport.Consecutive(t, 2)
	events, replay := fmt.Sprintf("tcp://127.0.0.1:%d", evPort), fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)
	// A "*" host makes the engine bind (vLLM's rule); the router dials.
	url := startDPEngine(t, 2, fmt.Sprintf("tcp://*:%d", evPort), fmt.Sprintf("tcp://*:%d", replayPort))
	m := config.Model{Name: model, Policy: config.Policy{Name: "kv-aware", Seed: 7},
		Signals: config.Signals{ScrapeInterval: 50 * time.Millisecond, StaleAfter: 500 * time.Millisecond},
		Precise: config.Precise{Tokenizer: config.BuiltinTokenizer, BlockSize: blockSize},
		Endpoints: []config.Endpoint{{ID: "dp", URL: url, DataParallelSize: 2,
			KVEvents: config.KVEvents{Address: events, ReplayAddress: replay}}}}
	r := startRouter(t, m)
	idx := r.p.PreciseIndex(model)
	if idx == nil {
		t.Fatal("no precise index")
	}
	ids := []string{kvroute.DataParallelID("dp", 0), kvroute.DataParallelID("dp", 1)}
	for _, id := range ids {
		if st := r.status(t, id); st.ID != id {
			t.Fatalf("router endpoint %s: got %+v", id, st)
		}
	}

	// Each rank's events flow (warm-ups pinned to the rank straight at the
	// engine, until the router has applied a batch from the rank's port).
	for rank, id := range ids {
		labels := map[string]string{"model": model, "endpoint": id}
		i := 0
		eventually(t, 10*time.Second, "KV events of "+id+" flowing", func() (bool, string) {
			i++
			body := completionBody(fmt.Sprintf("warm-up %d of rank %d: %s", i, rank, text(uint64(5000+100*rank+i), 30)), 1)
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(kvroute.HeaderDataParallelRank, fmt.Sprint(rank))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			time.Sleep(50 * time.Millisecond)
			v, _ := r.metric(t, "kvroute_endpoint_kv_event_batches_total", labels)
			return v > 0, fmt.Sprintf("kvroute_endpoint_kv_event_batches_total{endpoint=%s} = %v", id, v)
		})
	}

	// Prompts through the router, then their repeats.
	type sent struct {
		body, rank string
		hashes     []uint64
		tokens     int
	}
	var prompts []sent
	served := map[string]int{}
	for i := range 8 {
		body := chatBody(text(uint64(200+i), 150+20*i), fmt.Sprintf("question %d", i), 1, false)
		res := post(t, r.url, "/v1/chat/completions", body)
		if res.endpoint != ids[0] && res.endpoint != ids[1] {
			t.Fatalf("prompt %d served by %q, want one of %v", i, res.endpoint, ids)
		}
		served[res.endpoint]++
		toks := tokenizeAt(t, url, body)
		prompts = append(prompts, sent{body: body, rank: res.endpoint, hashes: kvindex.HashTokens(toks, blockSize, nil), tokens: len(toks)})
	}
	for i, p := range prompts {
		eventually(t, 5*time.Second, fmt.Sprintf("prompt %d indexed under %s", i, p.rank), func() (bool, string) {
			got := indexHolds(idx, p.hashes)
			return got[p.rank] == len(p.hashes), fmt.Sprintf("index holds %v, want %d blocks on %s", got, len(p.hashes), p.rank)
		})
	}
	for i, p := range prompts {
		res := post(t, r.url, "/v1/chat/completions", p.body)
		if res.endpoint != p.rank {
			t.Errorf("prompt %d repeat: routed to %s, want %s, the rank that holds it", i, res.endpoint, p.rank)
		}
		want := min(len(p.hashes), (p.tokens-1)/blockSize) * blockSize
		if got := res.usage.CachedTokens(); got != want {
			t.Errorf("prompt %d repeat on %s: cached_tokens %d, want %d: the engine ran it on another rank", i, res.endpoint, got, want)
		}
	}
	t.Logf("first requests per rank: %v", served)
}

// tokenizeAt asks the engine at base for a request's prompt token ids.
func tokenizeAt(t *testing.T, base, body string) []uint32 {
	t.Helper()
	return tokenize(t, &engineProc{addr: strings.TrimPrefix(base, "http://")}, body)
}

package signals_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/signals"
)

// TestScrapeEmulatedLlamaCppSlots scrapes an emulated llama.cpp server
// (its /metrics, /slots and /props) into a View: the router's view of the
// engine follows its load. Idle, no slot is busy and the KV the slots hold
// is unknown (no slot ran a task); under load the busy slots, the tokens
// they hold and the KV usage rise; drained, no slot is busy and the running
// requests hold no KV (the idle slots' cached prompts do not count).
func TestScrapeEmulatedLlamaCppSlots(t *testing.T) {
	_, hs := emulatortest.Start(t, emulator.Config{Model: "tiny", MetricsFlavor: emulator.FlavorLlamaCpp, Speed: 0.2}, nil)
	v := signals.NewView(signals.ViewConfig{StaleAfter: time.Hour})
	sc, err := signals.NewScraper(signals.ScrapeConfig{}, signals.Target{Endpoint: "llama", MetricsURL: hs.URL + "/metrics", View: v})
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() signals.Metrics {
		t.Helper()
		sc.ScrapeOnce(context.Background())
		st := v.Snapshot()
		if st.ConsecutiveErrors > 0 {
			t.Fatalf("scrape failed: %s", st.LastError)
		}
		return st.Last
	}

	idle := scrape()
	if idle.Flavor != signals.FlavorLlamaCPP || !idle.Has(signals.HasSlots) || idle.TotalSlots == 0 || idle.BusySlots != 0 {
		t.Fatalf("idle engine: %+v (%s), want llama.cpp slots, none busy", idle, idle.Have)
	}
	if idle.Has(signals.HasKVTokens) || idle.Has(signals.HasKVUsage) {
		t.Errorf("idle engine whose slots never ran: %+v (%s), want KV unknown", idle, idle.Have)
	}
	idleLoad := v.Load(time.Now())

	const n = 3
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := `{"prompt":"` + strings.Repeat("word ", 60+i) + `","max_tokens":40,"ignore_eos":true}`
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	var busy signals.Metrics
	deadline := time.Now().Add(20 * time.Second)
	for {
		busy = scrape()
		if busy.BusySlots == n && busy.KVTokens >= n*60 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatalf("under load: %+v, want %d busy slots holding at least %d tokens", busy, n, n*60)
		}
		time.Sleep(10 * time.Millisecond)
	}
	load := v.Load(time.Now())
	if load.Running != n || load.KVUsage <= idleLoad.KVUsage || load.KVUsage != float64(busy.KVTokens)/float64(busy.KVCapacityTokens) {
		t.Errorf("router's view under load: running %d KV usage %v (idle %v); want %d running and %d/%d tokens",
			load.Running, load.KVUsage, idleLoad.KVUsage, n, busy.KVTokens, busy.KVCapacityTokens)
	}
	if busy.KVCapacityTokens != busy.TotalSlots*1024 { // the tiny profile's max_model_len per slot
		t.Errorf("KV capacity %d, want %d slots x n_ctx 1024", busy.KVCapacityTokens, busy.TotalSlots)
	}
	wg.Wait()
	cancel()

	drained := scrape()
	if drained.BusySlots != 0 || !drained.Has(signals.HasKVTokens) || drained.KVTokens != 0 || drained.KVUsage != 0 {
		t.Errorf("drained: %+v (%s), want no busy slot and 0 KV tokens", drained, drained.Have)
	}
	if got := v.Load(time.Now()); got.Running != 0 || got.KVUsage != 0 {
		t.Errorf("router's view drained: running %d KV usage %v, want 0 and 0", got.Running, got.KVUsage)
	}
}

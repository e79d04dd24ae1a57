package emulator

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
)

// TestFleetCPU is the speed target as a soak run (KVROUTE_SOAK=1):
// 16 engines with the 8B/H100 profile at --speed 1 in this process, fed
// 200 requests/s in total over loopback HTTP (Poisson arrivals, ~500-token
// prompts sharing system prompts, 200 output tokens, half of them
// streamed). It reports the process CPU (engines and the load generator
// together) per request and per 1,000 generated tokens.
// KVROUTE_SOAK_SECONDS sets the duration (default 10), KVROUTE_SOAK_STREAM
// the share of streamed requests in percent (default 50).
func TestFleetCPU(t *testing.T) {
	if os.Getenv("KVROUTE_SOAK") == "" {
		t.Skip("soak test: set KVROUTE_SOAK=1")
	}
	secs := 10
	if v, err := strconv.Atoi(os.Getenv("KVROUTE_SOAK_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	streamPct := 50
	if v, err := strconv.Atoi(os.Getenv("KVROUTE_SOAK_STREAM")); err == nil && v >= 0 {
		streamPct = v
	}
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	const engines, rate, outTokens = 16, 200.0, 200
	urls := make([]string, engines)
	for i := range urls {
		_, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
		urls[i] = hs.URL
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}
	systems := make([]string, 8)
	for i := range systems {
		systems[i] = strings.Repeat(fmt.Sprintf("System prompt %d sets the rules for this assistant. ", i), 30)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	var done, failed, tokens atomic.Int64
	cpu0, start := cpuTime(), time.Now()
	next := start
	for i := 0; time.Since(start) < time.Duration(secs)*time.Second; i++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		time.Sleep(time.Until(next))
		sys := systems[rng.IntN(len(systems))]
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d about the rules"}],"max_tokens":%d,"ignore_eos":true,"stream":%v}`,
			sys, i, outTokens, i%100 < streamPct)
		url := urls[i%engines] + "/v1/chat/completions"
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(url, "application/json", bytes.NewBufferString(body))
			if err != nil {
				failed.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed.Add(1)
				return
			}
			done.Add(1)
			tokens.Add(outTokens)
		}()
	}
	wg.Wait()
	cpu, wall := cpuTime()-cpu0, time.Since(start)
	n, k := done.Load(), float64(tokens.Load())/1000
	t.Logf("%d engines, %.0f req/s offered (%d%% streamed), %v: %d requests done, %d failed, %.0f tokens", engines, rate, streamPct, wall.Round(time.Millisecond), n, failed.Load(), k*1000)
	t.Logf("process CPU %v = %.1f%% of one core; %.0f us per request, or %.0f us per 1,000 generated tokens (engines + load generator)",
		cpu.Round(time.Millisecond), 100*cpu.Seconds()/wall.Seconds(), float64(cpu.Microseconds())/float64(n), float64(cpu.Microseconds())/k)
	if failed.Load() > 0 {
		t.Errorf("%d requests failed", failed.Load())
	}
}

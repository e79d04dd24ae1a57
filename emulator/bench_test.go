package emulator

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/cputime"
)

// cpuPerRequest runs do(0..b.N-1) on 16 workers and reports the process
// CPU time per request and per 1,000 generated tokens.
func cpuPerRequest(b *testing.B, tokens int, do func(i int)) {
	const workers = 16
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range work {
				do(i)
			}
		})
	}
	cpu0 := cputime.Process()
	b.ResetTimer()
	for i := range b.N {
		work <- i
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	cpu := cputime.Process() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/req")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/float64(tokens)*1000, "cpu-us/1ktok")
}

// BenchmarkServerCPU measures the process CPU time (server and the
// in-process HTTP client together) per request through a real loopback
// HTTP server, with the 8B profile run so fast (--speed 1e6: a step is a
// few nanoseconds) that the engine loop never sleeps: the figure is the
// code's cost, without the timer wake-ups real-time pacing adds (those
// depend on the machine; TestFleetCPU measures them at --speed 1).
// Compare the 8- and 1000-token variants for the cost per generated token.
func BenchmarkServerCPU(b *testing.B) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		b.Fatal(err)
	}
	prompt := strings.Repeat("Benchmarks measure the emulator's own cost per request. ", 20) // ~250 tokens
	for _, tc := range []struct {
		name   string
		tokens int
		stream bool
	}{
		{"nonstream/8tok", 8, false},
		{"nonstream/1000tok", 1000, false},
		{"stream/8tok", 8, true},
		{"stream/1000tok", 1000, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			_, hs := testServer(b, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1e6})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			body := []byte(fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":%v}`, prompt, tc.tokens, tc.stream))
			cpuPerRequest(b, tc.tokens, func(i int) {
				// A distinct first word per request: no request is a
				// full prefix-cache hit of another.
				req := bytes.Replace(body, []byte("Benchmarks"), fmt.Appendf(nil, "B%d", i), 1)
				resp, err := client.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(req))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
				}
			})
			client.CloseIdleConnections()
		})
	}
}

// BenchmarkHandlerCPU is BenchmarkServerCPU without the network: requests
// go straight to the Handler, so the CPU is the emulator's own (parse,
// tokenize, engine model, delivery, response), without net/http and the
// client.
func BenchmarkHandlerCPU(b *testing.B) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		b.Fatal(err)
	}
	prompt := strings.Repeat("Benchmarks measure the emulator's own cost per request. ", 20)
	for _, tc := range []struct {
		name     string
		tokens   int
		stream   bool
		interval int
	}{
		{"nonstream/8tok", 8, false, 1},
		{"nonstream/1000tok", 1000, false, 1},
		{"stream/8tok", 8, true, 1},
		{"stream/1000tok", 1000, true, 1},
		{"stream/1000tok/interval10", 1000, true, 10},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			s, _ := testServer(b, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1e6, StreamInterval: tc.interval})
			h := s.Handler()
			body := []byte(fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":%v}`, prompt, tc.tokens, tc.stream))
			cpuPerRequest(b, tc.tokens, func(i int) {
				req := bytes.Replace(body, []byte("Benchmarks"), fmt.Appendf(nil, "B%d", i), 1)
				r, _ := http.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(req))
				rec := newRecorder()
				h.ServeHTTP(rec, r)
				if rec.code != 200 {
					b.Errorf("status %d", rec.code)
				}
			})
		})
	}
}

// BenchmarkHandlerChatCPU is BenchmarkHandlerCPU with the soak's requests
// (TestFleetCPU): chat requests of a ~1.6 KB system prompt, one of 8, and
// a short user turn, whole responses of 1,000 tokens.
func BenchmarkHandlerChatCPU(b *testing.B) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		b.Fatal(err)
	}
	heads := make([]string, 8) // the body up to the user turn's number
	for i := range heads {
		heads[i] = fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question `,
			strings.Repeat(fmt.Sprintf("System prompt %d sets the rules for this assistant. ", i), 30))
	}
	const tail = ` about the rules"}],"max_tokens":1000,"ignore_eos":true,"stream":false}`
	b.ReportAllocs()
	s, _ := testServer(b, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1e6})
	h := s.Handler()
	cpuPerRequest(b, 1000, func(i int) {
		body := heads[i%len(heads)] + strconv.Itoa(i) + tail
		r, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		rec := newRecorder()
		h.ServeHTTP(rec, r)
		if rec.code != 200 {
			b.Errorf("status %d", rec.code)
		}
	})
}

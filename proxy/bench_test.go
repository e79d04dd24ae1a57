package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/cputime"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/signals"
)

// chatBody32K is a chat request with a 32 KiB user prompt behind a shared
// system prompt.
func chatBody32K(i int) []byte {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 32<<10/45+1)[:32<<10]
	q, _ := json.Marshal(fmt.Sprintf("%d %s", i, text))
	return fmt.Appendf(nil, `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":%s}],"max_tokens":64}`, q)
}

// BenchmarkDecision measures the decision path on a 32 KiB prompt over four
// endpoints with the default policy: route (prefix hashing, candidates,
// Pick, dispatch record) and done, for the base model and for a LoRA
// adapter (route/adapter: no engine's adapter list known, as in a pool
// without llama.cpp servers; route/adapter-llama: four llama.cpp servers
// listing it, whose lists Route reads for every endpoint, and which all
// stay candidates, so that decisions are alike with and without that
// read); and the same behind the request scanner.
func BenchmarkDecision(b *testing.B) {
	cfg := testConfig(policy.Default, "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4")
	cfg.Models[0].Adapters = []string{"sql-lora"}
	p, err := New(Options{Config: cfg, NewPicker: policy.New})
	if err != nil {
		b.Fatal(err)
	}
	rt := p.Router("m")
	bodies := make([][]byte, 64) // 64 distinct prompts sharing the system prompt
	for i := range bodies {
		bodies[i] = chatBody32K(i)
	}
	now := time.Unix(1_800_000_000, 0)
	// route routes the bodies in turn, for adapter ("": the base model).
	route := func(adapter string) func(b *testing.B) {
		return func(b *testing.B) {
			reqs := make([]kvroute.Request, len(bodies))
			for i, body := range bodies {
				ri, _ := openai.ParseRequest(openai.KindChat, body)
				reqs[i] = kvroute.Request{Model: "m", Adapter: adapter, Prompt: ri.Prompt, PromptTokens: ri.PromptTokens()}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req := reqs[i%len(reqs)]
				f, err := rt.Route(now, &req, nil)
				if err != nil {
					b.Fatal(err)
				}
				rt.Done(now, f, kvroute.Outcome{})
				i++
			}
		}
	}
	routeAdapter := route("sql-lora")
	b.Run("route", route(""))
	b.Run("route/adapter", routeAdapter)
	b.Run("route/adapter-llama", func(b *testing.B) {
		for _, ep := range rt.Endpoints() {
			adapters, err := signals.ParseLoRAAdapters([]byte(`[{"id":0,"path":"/m/chat-lora.gguf","scale":1},{"id":1,"path":"/m/sql-lora.gguf","scale":1}]`))
			if err != nil {
				b.Fatal(err)
			}
			rt.View(ep.ID).Observe(now, signals.Metrics{Flavor: signals.FlavorLlamaCPP, LlamaAdapters: signals.NewLlamaAdapters(adapters)})
		}
		routeAdapter(b)
	})
	b.Run("parse+route", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			ri, err := openai.ParseRequest(openai.KindChat, bodies[i%len(bodies)])
			if err != nil {
				b.Fatal(err)
			}
			req := kvroute.Request{Model: ri.Model, Prompt: ri.Prompt, PromptTokens: ri.PromptTokens(), MaxTokens: ri.MaxTokens}
			f, err := rt.Route(now, &req, nil)
			if err != nil {
				b.Fatal(err)
			}
			rt.Done(now, f, kvroute.Outcome{})
			i++
		}
	})
}

// BenchmarkProxyOverhead sends one non-streaming chat request with a 32 KiB
// prompt to an engine on loopback directly and through the proxy. The
// "side-by-side" case alternates direct, a bare httputil.ReverseProxy and
// kvroute in one loop and reports the p50 and p99 of each, the latency
// kvroute adds, and the process CPU time it adds per request (against
// direct, and against the bare proxy: kvroute's own work).
func BenchmarkProxyOverhead(b *testing.B) {
	be := newBackend(b, "a", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8192,"completion_tokens":1,"total_tokens":8193}}`)
	})
	tp := newTestProxyWith(b, testConfig(policy.Default, be.URL), policy.New)
	// bare is a plain httputil.ReverseProxy to the same engine: the floor of
	// any proxy (one more loopback HTTP hop), to tell kvroute's own cost.
	target, _ := url.Parse(be.URL)
	bareRP := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, FlushInterval: -1}
	bare := httptest.NewServer(bareRP)
	b.Cleanup(bare.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	body := chatBody32K(0)
	send := func(b *testing.B, base string) time.Duration {
		t0 := time.Now()
		resp, err := client.Post(base+PathChatCompletions, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(t0)
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			send(b, be.URL)
		}
	})
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			send(b, bare.URL)
		}
	})
	b.Run("proxied", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			send(b, tp.srv.URL)
		}
	})
	b.Run("side-by-side", func(b *testing.B) {
		b.ReportAllocs()
		var direct, bareLat, proxied []time.Duration
		var cpuDirect, cpuBare, cpuProxied time.Duration // process CPU time (user+system): steadier than latency on a busy machine
		for b.Loop() {
			c0 := cputime.Process()
			direct = append(direct, send(b, be.URL))
			c1 := cputime.Process()
			bareLat = append(bareLat, send(b, bare.URL))
			c2 := cputime.Process()
			proxied = append(proxied, send(b, tp.srv.URL))
			c3 := cputime.Process()
			cpuDirect += c1 - c0
			cpuBare += c2 - c1
			cpuProxied += c3 - c2
		}
		n := float64(len(direct))
		b.ReportMetric(float64((cpuProxied-cpuDirect).Microseconds())/n, "added-cpu-µs/req")
		b.ReportMetric(float64((cpuProxied-cpuBare).Microseconds())/n, "vs-bare-cpu-µs/req")
		slices.Sort(bareLat)
		slices.Sort(direct)
		slices.Sort(proxied)
		q := func(d []time.Duration, f float64) float64 {
			return float64(d[min(len(d)-1, int(f*float64(len(d))))].Nanoseconds()) / 1e3
		}
		b.ReportMetric(q(direct, .5), "direct-p50-µs")
		b.ReportMetric(q(direct, .99), "direct-p99-µs")
		b.ReportMetric(q(proxied, .5), "proxied-p50-µs")
		b.ReportMetric(q(proxied, .99), "proxied-p99-µs")
		b.ReportMetric(q(proxied, .5)-q(direct, .5), "added-p50-µs")
		b.ReportMetric(q(proxied, .99)-q(direct, .99), "added-p99-µs")
		b.ReportMetric(q(bareLat, .5)-q(direct, .5), "bare-added-p50-µs")
		b.ReportMetric(0, "ns/op")
	})
}

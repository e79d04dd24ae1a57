package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
	"github.com/kvroute/kvroute/engine"
)

// startTestEngine runs an emulated engine in process, publishing KV events
// on an ipc socket with a replay socket beside it; it returns its URL and
// KV-event and replay addresses.
func startTestEngine(t *testing.T, dir, name string) (url, events, replay string) {
	t.Helper()
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	events = "ipc://" + filepath.Join(dir, name+".sock")
	replay = "ipc://" + filepath.Join(dir, name+"-replay.sock")
	_, hs := emulatortest.Start(t, emulator.Config{Model: "m", Speed: 50,
		Engine:   engine.Config{Profile: prof, NumGPUBlocks: 1024, MaxModelLen: 8192, MaxNumBatchedTokens: 2048},
		KVEvents: emulator.KVEventsConfig{Endpoint: events, ReplayEndpoint: replay}}, nil)
	return hs.URL, events, replay
}

// TestServeConfigWithSignalsAndPrecise runs `kvroute serve --config` on a
// config with signals and precise sections over two emulated engines with
// KV events, and checks through the router's own /metrics that the engines
// are scraped, that their KV events fill the precise index, and that a
// repeated prompt's cached tokens are counted.
//
// The router may subscribe to an engine before it listens, or before its
// PUB socket has taken the subscription (emulatortest.Start returns before
// the engine's Run binds its sockets; ZeroMQ PUB/SUB drops what is sent
// before the subscription arrives), and a failed dial is retried only
// after DialRetry (500ms). An engine that serves the first request
// meanwhile publishes the shared system prompt's blocks in batches the
// router never sees, and every later request's blocks are stored on top
// of those: orphans, never indexed. Without replay the index then stayed
// empty for good, and the test failed (once in CI). So the engines have
// replay sockets: the subscriber catches up their history when it
// connects, or at the first batch it sees.
func TestServeConfigWithSignalsAndPrecise(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvserve")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	urlA, evA, rpA := startTestEngine(t, dir, "a")
	urlB, evB, rpB := startTestEngine(t, dir, "b")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	cfg := fmt.Sprintf(`listen: %q
models:
  - name: m
    endpoints:
      - id: a
        url: %s
        kv_events: {address: %q, replay_address: %q}
      - id: b
        url: %s
        signals: {scrape_interval: 30ms}
        kv_events: {address: %q, replay_address: %q}
    policy: {name: kv-aware}
    signals: {scrape_interval: 50ms, stale_after: 1s, flavor: vllm}
    precise: {tokenizer: builtin, block_size: 16}
health_check: {interval: 1s, timeout: 500ms}
timeouts: {shutdown: 2s}
debug: {enabled: true}
log: {level: warn}
`, addr, urlA, evA, rpA, urlB, evB, rpB)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--check-config", cfgPath}, &out, &errOut); err != nil {
		t.Fatalf("--check-config: %v (%s)", err, errOut.String())
	}

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--config", cfgPath}, &out, &errOut) }()
	t.Cleanup(func() {
		stop()
		waitStopped(t, "serve", done, 10*time.Second)
	})
	base := "http://" + addr
	metric := func(name, labels string) float64 {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name+"{"+labels+"}") + ` (\S+)$`).FindSubmatch(body)
		if m == nil {
			return -1
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s (stderr: %s)", what, errOut.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, ep := range []string{"a", "b"} {
		poll("scrapes of "+ep, func() bool { return metric("kvroute_endpoint_scrapes_total", `endpoint="`+ep+`",model="m"`) > 0 })
	}
	system := strings.Repeat("The router keeps every engine busy and every cache warm. ", 60)
	send := func(i int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, system, i)
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	// The index fills once both subscribers are connected and have caught
	// up (see above); keep sending until it does.
	i := 0
	poll("precise index entries", func() bool {
		i++
		send(i)
		return metric("kvroute_precise_index_entries", `model="m"`) > 0
	})
	send(i + 1)
	poll("cached tokens counted", func() bool {
		return metric("kvroute_prefix_cached_tokens_total", `endpoint="a",model="m"`)+
			metric("kvroute_prefix_cached_tokens_total", `endpoint="b",model="m"`) > 0
	})
}

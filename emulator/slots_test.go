package emulator

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
)

// stepEngine steps e once at *now.
func stepEngine(e *engine.Engine, now *time.Duration) {
	*now += e.Step(*now).Duration
}

func promptOf(n int, base uint32) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = base + uint32(i)
	}
	return p
}

// TestSlotTableGolden steps an engine by hand and renders its slots as
// /slots does: the golden file is llama.cpp's shape (server_slot::to_json
// with only_metrics) for a slot that never ran a task, a busy one, and an
// idle one that keeps its last task.
func TestSlotTableGolden(t *testing.T) {
	e, err := engine.New(tinyEngine(t))
	if err != nil {
		t.Fatal(err)
	}
	tab := newSlotTable(3, e.Profile().MaxModelLen)
	var now time.Duration
	if err := e.Add(now, &engine.Request{ID: "short", Prompt: promptOf(20, 100), MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(now, &engine.Request{ID: "long", Prompt: promptOf(48, 100), MaxTokens: 10}); err != nil {
		t.Fatal(err)
	}
	stepEngine(e, &now)
	tab.update(e)
	stepEngine(e, &now)
	stepEngine(e, &now) // "short" finished
	tab.update(e)
	out, idle := tab.render()
	if idle != 2 {
		t.Errorf("idle slots: got %d, want 2", idle)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "llamacpp_slots.golden", append(b, '\n'))
}

// TestSlotTableAssignment checks the mapping of running requests onto
// slots: a request keeps its slot while it runs, a new one takes the idle
// slot used least recently (never-used ones first, lowest id first), task
// ids count up, and no more requests than slots are shown.
func TestSlotTableAssignment(t *testing.T) {
	e, err := engine.New(tinyEngine(t))
	if err != nil {
		t.Fatal(err)
	}
	tab := newSlotTable(2, e.Profile().MaxModelLen)
	var now time.Duration
	add := func(id string, maxTok int) {
		t.Helper()
		if err := e.Add(now, &engine.Request{ID: id, Prompt: promptOf(16, uint32(len(id))*1000), MaxTokens: maxTok}); err != nil {
			t.Fatal(err)
		}
	}
	state := func() string {
		var parts []string
		tab.mu.Lock()
		defer tab.mu.Unlock()
		for _, sl := range tab.slots {
			if sl.req == "" {
				parts = append(parts, "-")
			} else {
				parts = append(parts, sl.req)
			}
		}
		return strings.Join(parts, ",")
	}
	add("a", 1)
	add("bb", 5)
	stepEngine(e, &now)
	tab.update(e) // a finished at its first token: never seen running
	if got := state(); got != "bb,-" {
		t.Fatalf("after step 1: slots %s, want bb,-", got)
	}
	add("ccc", 5)
	stepEngine(e, &now)
	tab.update(e)
	if got := state(); got != "bb,ccc" {
		t.Fatalf("after step 2: slots %s, want bb,ccc", got)
	}
	for e.HasWork() {
		stepEngine(e, &now)
	}
	tab.update(e)
	if got := state(); got != "-,-" {
		t.Fatalf("drained: slots %s, want -,-", got)
	}
	add("dddd", 5)
	stepEngine(e, &now)
	tab.update(e)
	if got := state(); got != "dddd,-" {
		t.Fatalf("after a new request: slots %s, want dddd,- (slot 0 was assigned before slot 1)", got)
	}
	tab.mu.Lock()
	task := tab.slots[0].task
	tab.mu.Unlock()
	if task != 2 {
		t.Errorf("third task's id: got %d, want 2", task)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	code, _, b := roundTrip(t, req)
	return code, string(b)
}

// TestSlotsHTTP serves /slots and /props from a slow llama.cpp-flavoured
// engine: the slots follow the requests running, ?fail_on_no_slot=1 is
// llama.cpp's 503 once both slots are busy, /props gives total_slots and
// n_ctx, --no-slots is llama.cpp's 501, and other flavours have neither.
func TestSlotsHTTP(t *testing.T) {
	ec := tinyEngine(t)
	ec.MaxNumSeqs = 2
	s, hs := testServer(t, Config{MetricsFlavor: FlavorLlamaCpp, Engine: ec, Speed: 0.05})

	type slotJSON struct {
		ID           int  `json:"id"`
		NCtx         int  `json:"n_ctx"`
		IsProcessing bool `json:"is_processing"`
		NPrompt      *int `json:"n_prompt_tokens"`
	}
	slots := func() []slotJSON {
		t.Helper()
		code, body := get(t, hs.URL+"/slots")
		if code != 200 {
			t.Fatalf("/slots: got %d %s, want 200", code, body)
		}
		var out []slotJSON
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("/slots: %v in %s", err, body)
		}
		return out
	}
	idle := slots()
	if len(idle) != 2 || idle[0].IsProcessing || idle[1].IsProcessing || idle[0].NPrompt != nil {
		t.Fatalf("idle engine's slots: %+v, want 2 idle slots without a task", idle)
	}
	if code, body := get(t, hs.URL+"/slots?fail_on_no_slot=1"); code != 200 {
		t.Errorf("idle engine, fail_on_no_slot: got %d %s, want 200", code, body)
	}
	code, body := get(t, hs.URL+"/props")
	var props struct {
		DGS struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots int `json:"total_slots"`
	}
	if err := json.Unmarshal([]byte(body), &props); code != 200 || err != nil {
		t.Fatalf("/props: got %d %s (%v)", code, body, err)
	}
	if props.TotalSlots != 2 || props.DGS.NCtx != s.prof.MaxModelLen || idle[0].NCtx != s.prof.MaxModelLen {
		t.Errorf("/props: total_slots %d n_ctx %d, slot n_ctx %d; want 2 and %d", props.TotalSlots, props.DGS.NCtx, idle[0].NCtx, s.prof.MaxModelLen)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for range 3 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions",
				strings.NewReader(`{"prompt":"hello there my friend","max_tokens":400,"ignore_eos":true}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy := 0
		for _, sl := range slots() {
			if sl.IsProcessing {
				busy++
				if sl.NPrompt == nil || *sl.NPrompt <= 0 {
					t.Fatalf("busy slot %+v: want n_prompt_tokens > 0", sl)
				}
			}
		}
		if busy == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("busy slots: %d, want 2 (3 requests on 2 slots)", busy)
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, body = get(t, hs.URL+"/slots?fail_on_no_slot=1")
	if want := `{"error":{"code":503,"message":"no slot available","type":"unavailable_error"}}`; code != 503 || body != want {
		t.Errorf("all slots busy, fail_on_no_slot: got %d %s, want 503 %s", code, body, want)
	}

	t.Run("no-slots", func(t *testing.T) {
		_, hs := testServer(t, Config{MetricsFlavor: FlavorLlamaCpp, NoSlots: true})
		code, body := get(t, hs.URL+"/slots")
		want := "{\"error\":{\"code\":501,\"message\":\"This server does not support slots endpoint. Start it with `--slots`\",\"type\":\"not_supported_error\"}}"
		if code != 501 || body != want {
			t.Errorf("--no-slots: got %d %s, want 501 %s", code, body, want)
		}
		if code, _ := get(t, hs.URL+"/props"); code != 200 {
			t.Errorf("--no-slots /props: got %d, want 200", code)
		}
	})
	t.Run("vllm", func(t *testing.T) {
		_, hs := testServer(t, Config{})
		for _, p := range []string{"/slots", "/props"} {
			if code, _ := get(t, hs.URL+p); code != 404 {
				t.Errorf("vLLM %s: got %d, want 404", p, code)
			}
		}
	})
	t.Run("NoSlots needs llamacpp", func(t *testing.T) {
		cfg := Config{NoSlots: true}
		testDefaults(t, &cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "NoSlots") {
			t.Errorf("NoSlots with vLLM metrics: got %v, want an error naming NoSlots", err)
		}
	})
}

// TestPropsGolden pins /props' shape.
func TestPropsGolden(t *testing.T) {
	_, hs := testServer(t, Config{MetricsFlavor: FlavorLlamaCpp})
	code, body := get(t, hs.URL+"/props")
	if code != 200 {
		t.Fatalf("/props: %d %s", code, body)
	}
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(json.RawMessage(body), "", "  ")
	golden(t, "llamacpp_props.golden", append(b, '\n'))
}

package signals

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A /lora-adapters body of a current llama.cpp (server_task_result_get_lora:
// id, path, scale, task_name, prompt_prefix, and an activated LoRA's
// invocation), started with --lora /models/sql-lora.gguf --lora-scaled
// /models/chat.gguf:0.5 --lora aLoRA.gguf.
const loraListNew = `[
 {"id":0,"path":"/models/sql-lora.gguf","scale":1.0,"task_name":"","prompt_prefix":""},
 {"id":1,"path":"/models/chat.gguf","scale":0.5,"task_name":"chat-lora","prompt_prefix":"<chat>"},
 {"id":2,"path":"aLoRA.gguf","scale":0.0,"task_name":"","prompt_prefix":"","alora_invocation_string":"<|start|>","alora_invocation_tokens":[5,6]}
]`

// An older build's (August 2024 to mid 2025): id, path, scale only.
const loraListOld = `[{"id":0,"path":"my_adapter_1.gguf","scale":0.0},{"id":1,"path":"my_adapter_2.gguf","scale":0.0}]`

func TestParseLoRAAdapters(t *testing.T) {
	tests := []struct {
		name, body string
		want       []LlamaAdapter
		err        string
	}{
		{"new", loraListNew, []LlamaAdapter{{0, "/models/sql-lora.gguf", 1, ""}, {1, "/models/chat.gguf", 0.5, "chat-lora"},
			{2, "aLoRA.gguf", 0, ""}}, ""},
		{"old", loraListOld, []LlamaAdapter{{0, "my_adapter_1.gguf", 0, ""}, {1, "my_adapter_2.gguf", 0, ""}}, ""},
		{"none", `[]`, []LlamaAdapter{}, ""},
		{"no scale", `[{"id":0,"path":"a.gguf"}]`, []LlamaAdapter{{0, "a.gguf", 0, ""}}, ""},
		{"null scale", `[{"id":0,"path":"a.gguf","scale":null}]`, []LlamaAdapter{{0, "a.gguf", 0, ""}}, ""},
		{"null", `null`, nil, "body is null"},
		{"object", `{"id":0,"path":"a"}`, nil, "parse lora-adapters: "},
		{"error body", `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`, nil, "parse lora-adapters: "},
		{"not an object", `[0]`, nil, "adapter 0 is not an object"},
		{"no id", `[{"path":"a"}]`, nil, "adapter 0 has no id"},
		{"no path", `[{"id":0}]`, nil, "adapter 0 has no path"},
		{"negative id", `[{"id":-1,"path":"a"}]`, nil, "id -1 out of range"},
		{"fractional id", `[{"id":0.5,"path":"a"}]`, nil, "is not a integer"},
		{"repeated id", `[{"id":0,"path":"a"},{"id":0,"path":"b"}]`, nil, "id 0 repeated"},
		{"string scale", `[{"id":0,"path":"a","scale":"1"}]`, nil, "scale: string is not a float64"},
		{"trailing data", loraListOld + `]`, nil, "parse lora-adapters: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLoRAAdapters([]byte(tt.body))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestLlamaAdaptersNames: a name is an adapter's path, else its file name
// without ".gguf", else its task_name; one two adapters share names
// neither, unless a higher precedence gives it to one.
func TestLlamaAdaptersNames(t *testing.T) {
	list, err := ParseLoRAAdapters([]byte(loraListNew))
	if err != nil {
		t.Fatal(err)
	}
	list = append(list,
		LlamaAdapter{ID: 3, Path: `C:\loras\win.GGUF`},
		LlamaAdapter{ID: 4, Path: "/a/dup.gguf"}, LlamaAdapter{ID: 5, Path: "/b/dup.gguf"},
		LlamaAdapter{ID: 6, Path: "/c/x.gguf", TaskName: "aLoRA"},     // aLoRA is id 2's file name: id 2's
		LlamaAdapter{ID: 7, Path: "/c/y.gguf", TaskName: "/c/x.gguf"}, // id 6's path: id 6's
		LlamaAdapter{ID: 8, Path: "plain"},
	)
	tab := NewLlamaAdapters(list)
	for name, want := range map[string]int{
		"sql-lora": 0, "/models/sql-lora.gguf": 0, "chat": 1, "chat-lora": 1, "aLoRA": 2, "aLoRA.gguf": 2,
		"win": 3, `C:\loras\win.GGUF`: 3, "/a/dup.gguf": 4, "/b/dup.gguf": 5, "/c/x.gguf": 6, "x": 6, "y": 7, "plain": 8,
		"dup": -1, "nope": -1, "": -1, ".gguf": -1,
	} {
		a, ok := tab.Lookup(name)
		if got := map[bool]int{true: a.ID, false: -1}[ok]; got != want {
			t.Errorf("Lookup(%q) = %+v, %v; want id %d", name, a, ok, want)
		}
	}
	if got := tab.Ambiguous(); !slices.Equal(got, []string{"dup"}) {
		t.Errorf("ambiguous %v, want [dup]", got)
	}
	if got := tab.Names(); got[0] != "sql-lora" || got[3] != "win" || len(got) != 9 {
		t.Errorf("names %v", got)
	}
	var nilTab *LlamaAdapters
	if _, ok := nilTab.Lookup("sql-lora"); ok || nilTab.Len() != 0 || !nilTab.Equal(NewLlamaAdapters(nil)) {
		t.Error("a nil table must be empty")
	}
	b, err := json.Marshal(Metrics{LlamaAdapters: NewLlamaAdapters(list[:1])})
	if err != nil || !strings.Contains(string(b), `"llama_lora_adapters":[{"id":0,"path":"/models/sql-lora.gguf","scale":1}]`) {
		t.Errorf("status JSON %s, %v", b, err)
	}
}

func FuzzParseLoRAAdapters(f *testing.F) {
	for _, s := range []string{loraListNew, loraListOld, `[]`, `null`, `[{"id":0,"path":"a/b.gguf","task_name":"b"}]`,
		`[{"id":1,"path":"x.gguf","scale":-2},{"id":0,"path":"y/x.GGUF","task_name":"x.gguf"}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		list, err := ParseLoRAAdapters(body)
		if err != nil {
			if list != nil {
				t.Fatalf("error %v with a result %+v", err, list)
			}
			return
		}
		ids := map[int]bool{}
		for _, a := range list {
			if a.ID < 0 || a.ID >= MaxLoRAAdapters || ids[a.ID] {
				t.Fatalf("bad or repeated id in %+v", list)
			}
			ids[a.ID] = true
		}
		// The list survives a round trip as the server writes it.
		b, err := json.Marshal(list)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseLoRAAdapters(b)
		if err != nil || !slices.Equal(again, list) {
			t.Fatalf("round trip of %+v: %+v, %v", list, again, err)
		}
		// Every name resolves to an adapter that has it, and every
		// adapter is named by its path unless another shares that path.
		tab := NewLlamaAdapters(list)
		for _, a := range list {
			for _, n := range []string{a.Path, adapterStem(a.Path), a.TaskName} {
				got, ok := tab.Lookup(n)
				if ok && got.Path != n && adapterStem(got.Path) != n && got.TaskName != n {
					t.Fatalf("Lookup(%q) = %+v, which does not have that name", n, got)
				}
			}
			if got, ok := tab.Lookup(a.Path); a.Path != "" && !ok && !slices.Contains(tab.Ambiguous(), a.Path) {
				t.Fatalf("path %q of %+v resolves to nothing (%+v) and is not ambiguous", a.Path, a, got)
			}
		}
	})
}

// llamaLoRAServer is a fake llama.cpp server: /metrics (llama.cpp's
// names, or 503 while loading), /slots, /props and /lora-adapters
// answering what list holds (its requests counted).
type llamaLoRAServer struct {
	*httptest.Server
	mu       sync.Mutex
	list     string // the /lora-adapters body; "" for 404
	loading  bool   // /metrics answers 503, as a server loading its model
	requests atomic.Int64
}

func newLlamaLoRAServer(t *testing.T, list string) *llamaLoRAServer {
	t.Helper()
	s := &llamaLoRAServer{list: list}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		list, loading := s.list, s.loading
		s.mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			if loading {
				http.Error(w, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte(llamaMetricsBody))
		case "/slots":
			_, _ = w.Write([]byte(slotsNew))
		case "/props":
			_, _ = w.Write([]byte(`{"total_slots":3}`))
		case "/lora-adapters":
			s.requests.Add(1)
			if list == "" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			_, _ = w.Write([]byte(list))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *llamaLoRAServer) set(list string, loading bool) {
	s.mu.Lock()
	s.list, s.loading = list, loading
	s.mu.Unlock()
}

// TestScrapeLoRAList: a llama.cpp server's scrape reads its
// /lora-adapters at the first scrape, then once per LoRAListInterval, and
// again after a failed scrape (a restart); the View carries the list, a
// change of which is logged.
func TestScrapeLoRAList(t *testing.T) {
	hs := newLlamaLoRAServer(t, loraListOld)
	logs := &logCounter{}
	v := NewView(ViewConfig{})
	s, err := NewScraper(ScrapeConfig{Logger: slog.New(logs), LoRAListInterval: time.Hour},
		Target{Endpoint: "e", MetricsURL: hs.URL + "/metrics", View: v})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := func() []string { return v.LlamaAdapters().Names() }
	for range 3 {
		s.ScrapeOnce(ctx)
	}
	if got := names(); !slices.Equal(got, []string{"my_adapter_1", "my_adapter_2"}) || hs.requests.Load() != 1 {
		t.Fatalf("adapters %v after %d reads, want my_adapter_1 and _2 read once", got, hs.requests.Load())
	}
	// The server restarts with other adapters: its /metrics fails while
	// it loads, and the first scrape after reads the new list.
	hs.set(loraListNew, true)
	s.ScrapeOnce(ctx)
	if got := names(); len(got) != 2 {
		t.Fatalf("while loading: adapters %v, want the last ones read", got)
	}
	hs.set(loraListNew, false)
	s.ScrapeOnce(ctx)
	if got := names(); !slices.Equal(got, []string{"sql-lora", "chat", "aLoRA"}) {
		t.Fatalf("after the restart: adapters %v, want sql-lora, chat, aLoRA", got)
	}
	if a, ok := v.LlamaAdapters().Lookup("chat-lora"); !ok || a.ID != 1 || a.Scale != 0.5 {
		t.Errorf("chat-lora: %+v, %v; want id 1 at scale 0.5", a, ok)
	}
	if got := logs.count("llama.cpp LoRA adapters"); got != 2 {
		t.Errorf("adapter list logged %d times, want 2 (each change)", got)
	}
	// Read again once per interval: with a short one, the next scrape
	// after it sees a changed list.
	s, err = NewScraper(ScrapeConfig{LoRAListInterval: time.Millisecond}, Target{Endpoint: "e", MetricsURL: hs.URL + "/metrics", View: v})
	if err != nil {
		t.Fatal(err)
	}
	s.ScrapeOnce(ctx)
	hs.set(`[{"id":0,"path":"/models/chat.gguf","scale":1}]`, false)
	time.Sleep(2 * time.Millisecond)
	s.ScrapeOnce(ctx)
	if a, ok := v.LlamaAdapters().Lookup("chat"); !ok || a.ID != 0 || v.LlamaAdapters().Len() != 1 {
		t.Errorf("after the interval: chat is %+v, %v in %v; want id 0, alone", a, ok, names())
	}
}

// TestScrapeLoRAListDegrades: a server without /lora-adapters (404) lists
// no adapters, logged once and asked again after SlotsRetry; a broken one
// keeps the last list, one warning per streak, and another engine's
// scrape reads no list.
func TestScrapeLoRAListDegrades(t *testing.T) {
	t.Run("404", func(t *testing.T) {
		hs := newLlamaLoRAServer(t, "")
		s, v, logs := llamaScraper(t, hs.URL, FlavorLlamaCPP)
		for range 3 {
			s.ScrapeOnce(context.Background())
		}
		if l := v.LlamaAdapters(); l == nil || l.Len() != 0 || hs.requests.Load() != 1 {
			t.Errorf("adapters %v after %d reads, want an empty list read once", l, hs.requests.Load())
		}
		if got := logs.count("llama.cpp server does not serve /lora-adapters"); got != 1 {
			t.Errorf("logged %d times, want once", got)
		}
	})
	t.Run("broken", func(t *testing.T) {
		hs := newLlamaLoRAServer(t, loraListOld)
		s, v, logs := llamaScraper(t, hs.URL, FlavorLlamaCPP)
		s.cfg.LoRAListInterval = time.Nanosecond
		s.ScrapeOnce(context.Background())
		hs.set(`[{"id":0`, false)
		for range 3 {
			s.ScrapeOnce(context.Background())
		}
		if got := v.LlamaAdapters().Len(); got != 2 || v.Snapshot().Errors != 0 {
			t.Errorf("adapters %d, scrape errors %d; want the 2 last read, no scrape error", got, v.Snapshot().Errors)
		}
		if got := logs.count("llama.cpp /lora-adapters failed"); got != 1 {
			t.Errorf("failure logged %d times, want once per streak", got)
		}
	})
	t.Run("vllm", func(t *testing.T) {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"))
		}))
		defer hs.Close()
		s, v, _ := llamaScraper(t, hs.URL, FlavorAuto)
		s.ScrapeOnce(context.Background())
		if v.Flavor() != FlavorVLLM || v.LlamaAdapters() != nil {
			t.Errorf("flavour %q, adapters %v; want vllm and no list", v.Flavor(), v.LlamaAdapters())
		}
	})
}

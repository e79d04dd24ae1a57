package signals

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A /slots body of a newer llama.cpp (b7000s): slot 0 busy, slot 1 idle
// with its last task's cached prompt, slot 2 never used.
const slotsNew = `[
 {"id":0,"n_ctx":4096,"speculative":false,"is_processing":true,"id_task":12,"n_prompt_tokens":300,
  "n_prompt_tokens_processed":200,"n_prompt_tokens_cache":100,"params":{"n_predict":-1,"samplers":["top_k"]},
  "next_token":[{"has_next_token":true,"has_new_line":false,"n_remain":-1,"n_decoded":40}]},
 {"id":1,"n_ctx":4096,"speculative":false,"is_processing":false,"id_task":9,"n_prompt_tokens":900,
  "params":{},"next_token":[{"has_next_token":false,"has_new_line":true,"n_remain":0,"n_decoded":128}]},
 {"id":2,"n_ctx":4096,"speculative":false,"is_processing":false}
]`

// An older build's body: id_task always, next_token an object, no
// n_prompt_tokens.
const slotsOld = `[
 {"id":0,"id_task":3,"n_ctx":2048,"speculative":false,"is_processing":true,"params":{},"prompt":"hi",
  "next_token":{"has_next_token":true,"has_new_line":false,"n_remain":10,"n_decoded":5}},
 {"id":1,"id_task":-1,"n_ctx":2048,"speculative":false,"is_processing":false,"params":{},
  "next_token":{"has_next_token":true,"has_new_line":false,"n_remain":-1,"n_decoded":0}}
]`

func TestParseSlots(t *testing.T) {
	tests := []struct {
		name, body string
		want       Slots
		err        string
	}{
		{"new", slotsNew, Slots{Total: 3, Busy: 1, NCtx: 3 * 4096, Tokens: 300, HasTokens: true}, ""},
		{"old", slotsOld, Slots{Total: 2, Busy: 1, NCtx: 4096}, ""},
		{"empty", `[]`, Slots{}, ""},
		{"never used", `[{"id":0,"n_ctx":8,"is_processing":false}]`, Slots{Total: 1, NCtx: 8}, ""},
		{"busy slot without tokens", `[{"id":0,"n_ctx":8,"is_processing":true},{"id":1,"n_ctx":8,"is_processing":false,"n_prompt_tokens":5}]`,
			Slots{Total: 2, Busy: 1, NCtx: 16}, ""},
		{"null", `null`, Slots{}, "parse slots: body is null"},
		{"object", `{"id":0}`, Slots{}, "parse slots: "},
		{"error body", `{"error":{"code":501,"message":"x","type":"not_supported_error"}}`, Slots{}, "parse slots: "},
		{"not an object", `[1]`, Slots{}, "parse slots: slot 0 is not an object"},
		{"no id", `[{"n_ctx":8,"is_processing":true}]`, Slots{}, "parse slots: slot 0 has no id"},
		{"no n_ctx", `[{"id":0,"is_processing":true}]`, Slots{}, "parse slots: slot 0 has no n_ctx"},
		{"no is_processing", `[{"id":0,"n_ctx":1}]`, Slots{}, "parse slots: slot 0 has no is_processing"},
		{"negative n_ctx", `[{"id":0,"n_ctx":-1,"is_processing":true}]`, Slots{}, "n_ctx -1 out of range"},
		{"fractional", `[{"id":0,"n_ctx":1.5,"is_processing":true}]`, Slots{}, "n_ctx: number 1.5 is not a integer"},
		{"repeated id", `[{"id":0,"n_ctx":1,"is_processing":true},{"id":0,"n_ctx":1,"is_processing":true}]`, Slots{}, "id 0 repeated"},
		{"negative tokens", `[{"id":0,"n_ctx":1,"is_processing":true,"n_prompt_tokens":-3}]`, Slots{}, "n_prompt_tokens -3 out of range"},
		{"bad next_token", `[{"id":0,"n_ctx":1,"is_processing":true,"next_token":[{"n_decoded":"x"}]}]`, Slots{}, "next_token"},
		{"string flag", `[{"id":0,"n_ctx":1,"is_processing":"yes"}]`, Slots{}, "is_processing: string is not a boolean"},
		{"truncated", `[{"id":0`, Slots{}, "parse slots: unexpected end of JSON input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSlots([]byte(tt.body))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %+v, %v; want an error containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseProps(t *testing.T) {
	got, err := ParseProps([]byte(`{"default_generation_settings":{"params":{},"n_ctx":4096},"total_slots":4,"model_path":"m.gguf"}`))
	if want := (Props{TotalSlots: 4, NCtx: 4096}); err != nil || got != want {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{`[]`, `{}`, `{"total_slots":-1}`, `{"total_slots":"4"}`, `{"total_slots":1,"default_generation_settings":{"n_ctx":-2}}`, ``} {
		if p, err := ParseProps([]byte(bad)); err == nil {
			t.Errorf("%q: got %+v, want an error", bad, p)
		}
	}
}

func FuzzParseSlots(f *testing.F) {
	for _, s := range []string{slotsNew, slotsOld, `[]`, `null`, `[{"id":0,"n_ctx":1,"is_processing":true,"n_prompt_tokens":1}]`,
		`[{"id":0,"n_ctx":1,"is_processing":true,"next_token":{"n_decoded":1}}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := ParseSlots(body)
		if err != nil {
			if s != (Slots{}) {
				t.Fatalf("error %v with a result %+v", err, s)
			}
			return
		}
		if s.Busy < 0 || s.Busy > s.Total || s.Total > MaxSlots || s.NCtx < 0 || s.Tokens < 0 {
			t.Fatalf("inconsistent %+v", s)
		}
		if !s.HasTokens && s.Tokens != 0 {
			t.Fatalf("tokens without HasTokens: %+v", s)
		}
		var m Metrics
		applySlots(&m, s, Props{})
		if m.KVUsage < 0 || m.KVUsage > 1 || m.BusySlots != s.Busy {
			t.Fatalf("applied %+v: %+v", s, m)
		}
	})
}

func FuzzParseProps(f *testing.F) {
	f.Add([]byte(`{"default_generation_settings":{"n_ctx":4096},"total_slots":4}`))
	f.Add([]byte(`{"total_slots":1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := ParseProps(body)
		if err == nil && (p.TotalSlots < 0 || p.TotalSlots > MaxSlots || p.NCtx < 0) {
			t.Fatalf("out of range: %+v", p)
		}
	})
}

func TestSlotsURLs(t *testing.T) {
	tests := []struct{ in, slots, props string }{
		{"http://h:8080/metrics", "http://h:8080/slots", "http://h:8080/props"},
		{"http://h:8080/llama/metrics?model=a", "http://h:8080/llama/slots?model=a", "http://h:8080/llama/props?model=a"},
		{"http://h:8080/custom", "http://h:8080/slots", "http://h:8080/props"},
		{"http://h:8080", "http://h:8080/slots", "http://h:8080/props"},
	}
	for _, tt := range tests {
		s, p, err := slotsURLs(tt.in)
		if err != nil || s != tt.slots || p != tt.props {
			t.Errorf("slotsURLs(%q) = %q, %q, %v; want %q, %q", tt.in, s, p, err, tt.slots, tt.props)
		}
	}
}

func TestApplySlots(t *testing.T) {
	s, err := ParseSlots([]byte(slotsNew))
	if err != nil {
		t.Fatal(err)
	}
	m := Metrics{Flavor: FlavorLlamaCPP, Have: HasWaiting | HasRunning, Waiting: 2, Running: 0}
	applySlots(&m, s, Props{TotalSlots: 3, NCtx: 4096})
	want := Metrics{Flavor: FlavorLlamaCPP, Have: HasWaiting | HasRunning | HasSlots | HasKVTokens | HasKVCapacity | HasKVUsage,
		Waiting: 2, Running: 1, TotalSlots: 3, BusySlots: 1, KVTokens: 300, KVCapacityTokens: 3 * 4096, KVUsage: 300.0 / (3 * 4096)}
	if m.Have != want.Have || m.Running != want.Running || m.TotalSlots != want.TotalSlots || m.BusySlots != want.BusySlots ||
		m.KVTokens != want.KVTokens || m.KVCapacityTokens != want.KVCapacityTokens || m.KVUsage != want.KVUsage {
		t.Errorf("got %+v\nwant %+v", m, want)
	}
	old, _ := ParseSlots([]byte(slotsOld))
	m = Metrics{Flavor: FlavorLlamaCPP, Have: HasWaiting | HasRunning}
	applySlots(&m, old, Props{})
	if m.Has(HasKVUsage) || m.Has(HasKVTokens) || !m.Has(HasSlots) || m.TotalSlots != 2 || m.Running != 1 {
		t.Errorf("old build: got %+v (%s), want slots and running, no KV", m, m.Have)
	}
}

// TestViewKVTokens: a View moves a llama.cpp engine's KV tokens by the
// router's dispatches, over a configured capacity when there is one
// (--kv-unified: the slots' n_ctx sum overstates it).
func TestViewKVTokens(t *testing.T) {
	t0 := time.Unix(100, 0)
	m := Metrics{Flavor: FlavorLlamaCPP, Have: HasWaiting | HasRunning | HasKVTokens | HasKVCapacity | HasKVUsage,
		KVTokens: 400, KVCapacityTokens: 4000, KVUsage: 0.1}
	for _, tc := range []struct {
		configured int
		want       float64
	}{{0, (400.0 + 100) / 4000}, {1000, (400.0 + 100) / 1000}} {
		v := NewView(ViewConfig{KVCapacityTokens: tc.configured})
		v.Observe(t0, m)
		v.Dispatch(t0.Add(time.Millisecond), 100)
		if got := v.Load(t0.Add(2 * time.Millisecond)).KVUsage; got != tc.want {
			t.Errorf("configured capacity %d: KV usage %v, want %v", tc.configured, got, tc.want)
		}
	}
}

// logCounter counts log records by message.
type logCounter struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.msgs == nil {
		c.msgs = map[string]int{}
	}
	c.msgs[r.Message]++
	return nil
}
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCounter) WithGroup(string) slog.Handler      { return c }

func (c *logCounter) count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for m, k := range c.msgs {
		if strings.HasPrefix(m, prefix) {
			n += k
		}
	}
	return n
}

// llamaScraper is a scraper of the server at base (its /metrics), of
// flavour f, with its View and a log counter.
func llamaScraper(t *testing.T, base string, f Flavor) (*Scraper, *View, *logCounter) {
	t.Helper()
	logs := &logCounter{}
	v := NewView(ViewConfig{})
	s, err := NewScraper(ScrapeConfig{Logger: slog.New(logs)}, Target{Endpoint: "e", MetricsURL: base + "/metrics", View: v, Flavor: f})
	if err != nil {
		t.Fatal(err)
	}
	return s, v, logs
}

const llamaMetricsBody = `# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
`

// TestScrapeSlotsDegrades: a llama.cpp server without /slots (--no-slots:
// 501; or 404) still gives its /metrics signals, with one log line and one
// /slots request per SlotsRetry, not an error per scrape; a broken /slots
// is one warning per failure streak; a working one adds its slots.
func TestScrapeSlotsDegrades(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		body     string
		log      string
		requests int64 // /slots requests over 5 scrapes
	}{
		{"no-slots 501", 501, "{\"error\":{\"code\":501,\"message\":\"This server does not support slots endpoint. Start it with `--slots`\",\"type\":\"not_supported_error\"}}",
			"llama.cpp server does not serve /slots", 1},
		{"404", 404, "File Not Found", "llama.cpp server does not serve /slots", 1},
		{"bad json", 200, `[{"id":0`, "llama.cpp /slots failed", 5},
		{"500", 500, `oops`, "llama.cpp /slots failed", 5},
		{"works", 200, slotsNew, "", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var slotsReqs, propsReqs atomic.Int64
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/metrics":
					_, _ = w.Write([]byte(llamaMetricsBody))
				case "/slots":
					slotsReqs.Add(1)
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
				case "/props":
					propsReqs.Add(1)
					_, _ = w.Write([]byte(`{"default_generation_settings":{"n_ctx":4096},"total_slots":3}`))
				default:
					http.NotFound(w, r)
				}
			}))
			defer hs.Close()
			s, v, logs := llamaScraper(t, hs.URL, FlavorAuto)
			for range 5 {
				s.ScrapeOnce(context.Background())
			}
			st := v.Snapshot()
			if st.Scrapes != 5 || st.Errors != 0 {
				t.Fatalf("scrapes %d errors %d (%s), want 5 and 0: /slots must not fail the scrape", st.Scrapes, st.Errors, st.LastError)
			}
			if got := slotsReqs.Load(); got != tc.requests {
				t.Errorf("/slots requests: got %d, want %d", got, tc.requests)
			}
			last := st.Last
			if last.Waiting != 2 || last.Running != 1 {
				t.Errorf("waiting %v running %v, want 2 and 1", last.Waiting, last.Running)
			}
			if tc.log == "" {
				if !last.Has(HasSlots|HasKVTokens) || last.TotalSlots != 3 || last.KVTokens != 300 {
					t.Errorf("working /slots: got %+v, want 3 slots and 300 KV tokens", last)
				}
				if got := propsReqs.Load(); got != 1 {
					t.Errorf("/props requests: got %d, want 1 (read once)", got)
				}
				return
			}
			if last.Has(HasSlots) || last.Has(HasKVUsage) {
				t.Errorf("without /slots: got %+v (%s), want no slots and no KV usage", last, last.Have)
			}
			if got := logs.count(tc.log); got != 1 {
				t.Errorf("log %q: %d times over 5 scrapes, want once (all: %v)", tc.log, got, logs.msgs)
			}
		})
	}
}

// TestScrapeSlotsRecovers: after /slots failed, the next good answer is
// logged once and read.
func TestScrapeSlotsRecovers(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte(llamaMetricsBody))
		case "/slots":
			if broken.Load() {
				http.Error(w, "busy", http.StatusInternalServerError)
				return
			}
			_, _ = w.Write([]byte(slotsNew))
		case "/props":
			_, _ = w.Write([]byte(`{"total_slots":3}`))
		}
	}))
	defer hs.Close()
	var buf bytes.Buffer
	v := NewView(ViewConfig{})
	s, err := NewScraper(ScrapeConfig{Logger: slog.New(slog.NewTextHandler(&buf, nil))}, Target{Endpoint: "e", MetricsURL: hs.URL + "/metrics", View: v})
	if err != nil {
		t.Fatal(err)
	}
	s.ScrapeOnce(context.Background())
	s.ScrapeOnce(context.Background())
	broken.Store(false)
	s.ScrapeOnce(context.Background())
	if got := v.Snapshot().Last; got.KVTokens != 300 {
		t.Errorf("after recovery: KV tokens %d, want 300", got.KVTokens)
	}
	if n := strings.Count(buf.String(), "llama.cpp /slots failed"); n != 1 {
		t.Errorf("failure logged %d times, want 1:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "llama.cpp /slots read"); n != 1 {
		t.Errorf("recovery logged %d times, want 1:\n%s", n, buf.String())
	}
}

// llamaNoMetrics is llama.cpp's /metrics without --metrics.
const llamaNoMetrics = "{\"error\":{\"code\":501,\"message\":\"This server does not support metrics endpoint. Start it with `--metrics`\",\"type\":\"not_supported_error\"}}"

// TestScrapeSlotsAlone: llama.cpp serves /metrics only with --metrics (else
// its 501) but /slots by default. Such a server's busy slots and KV are
// read from /slots alone, for a target of flavour llamacpp (404 or 501)
// or auto (llama.cpp's 501); the switch is logged once each way. Another
// engine's 501 or 404 on auto, a 500, or a /slots that fails too leave the
// scrape failed. Before, every scrape of a llama.cpp server started
// without --metrics failed.
func TestScrapeSlotsAlone(t *testing.T) {
	for _, tc := range []struct {
		name        string
		flavor      Flavor
		status      int
		body        string
		slotsStatus int
		alone       bool
	}{
		{"auto, llama.cpp's 501", FlavorAuto, 501, llamaNoMetrics, 200, true},
		{"llamacpp, 501", FlavorLlamaCPP, 501, llamaNoMetrics, 200, true},
		{"llamacpp, 404", FlavorLlamaCPP, 404, "File Not Found", 200, true},
		{"auto, another 501", FlavorAuto, 501, "not implemented", 200, false},
		{"auto, 404", FlavorAuto, 404, "File Not Found", 200, false},
		{"vllm, llama.cpp's 501", FlavorVLLM, 501, llamaNoMetrics, 200, false},
		{"llamacpp, 500", FlavorLlamaCPP, 500, "oops", 200, false},
		{"llamacpp, no /slots either", FlavorLlamaCPP, 501, llamaNoMetrics, 501, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var metricsOn atomic.Bool
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/metrics":
					if metricsOn.Load() {
						_, _ = w.Write([]byte(llamaMetricsBody))
						return
					}
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
				case "/slots":
					w.WriteHeader(tc.slotsStatus)
					_, _ = w.Write([]byte(slotsNew))
				case "/props":
					_, _ = w.Write([]byte(`{"default_generation_settings":{"n_ctx":4096},"total_slots":3}`))
				default:
					http.NotFound(w, r)
				}
			}))
			defer hs.Close()
			s, v, logs := llamaScraper(t, hs.URL, tc.flavor)
			for range 3 {
				s.ScrapeOnce(context.Background())
			}
			st := v.Snapshot()
			if !tc.alone {
				if st.Scrapes != 0 || st.Errors != 3 {
					t.Fatalf("scrapes %d errors %d, want 0 and 3", st.Scrapes, st.Errors)
				}
				return
			}
			if st.Scrapes != 3 || st.Errors != 0 {
				t.Fatalf("scrapes %d errors %d (%s), want 3 and 0", st.Scrapes, st.Errors, st.LastError)
			}
			last := st.Last
			if last.Flavor != FlavorLlamaCPP || !last.Has(HasSlots|HasRunning|HasKVTokens) || last.Has(HasWaiting) ||
				last.TotalSlots != 3 || last.KVTokens != 300 {
				t.Errorf("from /slots alone: got %+v (%s), want llamacpp, 3 slots, running and 300 KV tokens, no waiting", last, last.Have)
			}
			if got := s.DetectedFlavor(); got != FlavorLlamaCPP {
				t.Errorf("detected flavour %q, want llamacpp", got)
			}
			metricsOn.Store(true)
			s.ScrapeOnce(context.Background())
			s.ScrapeOnce(context.Background())
			if last := v.Snapshot().Last; last.Waiting != 2 || !last.Has(HasSlots) {
				t.Errorf("with /metrics back: got %+v (%s), want waiting 2 and the slots", last, last.Have)
			}
			if got := logs.count("llama.cpp server without /metrics"); got != 1 {
				t.Errorf("the switch to /slots alone logged %d times, want once (all: %v)", got, logs.msgs)
			}
			if got := logs.count("llama.cpp /metrics read again"); got != 1 {
				t.Errorf("the switch back logged %d times, want once (all: %v)", got, logs.msgs)
			}
		})
	}
}

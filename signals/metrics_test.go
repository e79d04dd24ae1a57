package signals

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

const textCT = "text/plain; version=0.0.4; charset=utf-8"

// TestParseMetricsGolden parses testdata/<flavour>.prom, checks the key
// values by hand and the whole result against <flavour>.golden.json.
func TestParseMetricsGolden(t *testing.T) {
	tests := []struct {
		file   string
		flavor Flavor
		want   Metrics // fields checked by hand; the golden file pins the rest
	}{
		{"vllm", FlavorVLLM, Metrics{Waiting: 1, Running: 5, KVUsage: 0.375, PrefixQueries: 5120, PrefixHits: 2560,
			Preemptions: 3, BlockSize: 16, NumGPUBlocks: 4096, KVCapacityTokens: 65536, LoRAAdapters: []string{"chat-lora", "fr-lora", "sql-lora"}, MaxLoRA: 4,
			LoRARunning: []string{"chat-lora", "sql-lora"}, LoRAWaiting: []string{"fr-lora", "sql-lora"}}},
		{"vllm-legacy", FlavorVLLMLegacy, Metrics{Waiting: 4, Running: 7, KVUsage: 0.8125, PrefixQueries: 160000, PrefixHits: 120000,
			Preemptions: 12, BlockSize: 16, NumGPUBlocks: 27713, KVCapacityTokens: 443408}},
		{"sglang", FlavorSGLang, Metrics{Waiting: 2757, Running: 12, KVUsage: 0.28, CacheHitRate: 0.0075,
			PrefixQueries: 8128902, PrefixHits: 60960, Preemptions: 3, KVCapacityTokens: 442357}},
		// SGLang P/D servers (--disaggregation-mode): requests wait in the
		// P/D queues as well as in num_queue_reqs. Prefill, DP 2: queue
		// 2+1, bootstrap (prefill prealloc) 5+3; its inflight queue (7+4,
		// prefilled, KV transfer running) is not waiting.
		{"sglang-prefill", FlavorSGLang, Metrics{Waiting: 11, Running: 0, KVUsage: 0.3, CacheHitRate: 0.375,
			PrefixQueries: 2.75e6, PrefixHits: 1.1e6, KVCapacityTokens: 409600}},
		// Decode, TP 2 with metrics for all schedulers (one scheduler):
		// queue 4, prealloc max(6, 5), transfer max(3, 4).
		{"sglang-decode", FlavorSGLang, Metrics{Waiting: 14, Running: 41, KVUsage: 0.62,
			PrefixQueries: 2.7494e6, Preemptions: 2, KVCapacityTokens: 441792}},
		{"llamacpp", FlavorLlamaCPP, Metrics{Waiting: 1, Running: 2, PrefixQueries: 8192, PrefixHits: 6144}},
		{"tgi", FlavorTGI, Metrics{Waiting: 6, Running: 14}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join("testdata", tt.file+".prom"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseMetrics(bytes.NewReader(body), textCT, FlavorAuto)
			if err != nil {
				t.Fatalf("ParseMetrics: %v", err)
			}
			if got.Flavor != tt.flavor {
				t.Errorf("Flavor = %q, want %q", got.Flavor, tt.flavor)
			}
			w := tt.want
			for _, c := range []struct {
				name      string
				got, want float64
			}{
				{"Waiting", got.Waiting, w.Waiting}, {"Running", got.Running, w.Running},
				{"KVUsage", got.KVUsage, w.KVUsage}, {"CacheHitRate", got.CacheHitRate, w.CacheHitRate},
				{"PrefixQueries", got.PrefixQueries, w.PrefixQueries}, {"PrefixHits", got.PrefixHits, w.PrefixHits},
				{"Preemptions", got.Preemptions, w.Preemptions},
				{"BlockSize", float64(got.BlockSize), float64(w.BlockSize)},
				{"NumGPUBlocks", float64(got.NumGPUBlocks), float64(w.NumGPUBlocks)},
				{"KVCapacityTokens", float64(got.KVCapacityTokens), float64(w.KVCapacityTokens)},
				{"MaxLoRA", float64(got.MaxLoRA), float64(w.MaxLoRA)},
			} {
				if c.got != c.want {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
			if !reflect.DeepEqual(got.LoRAAdapters, w.LoRAAdapters) {
				t.Errorf("LoRAAdapters = %q, want %q", got.LoRAAdapters, w.LoRAAdapters)
			}
			if !reflect.DeepEqual(got.LoRARunning, w.LoRARunning) || !reflect.DeepEqual(got.LoRAWaiting, w.LoRAWaiting) {
				t.Errorf("LoRARunning, LoRAWaiting = %q, %q, want %q, %q", got.LoRARunning, got.LoRAWaiting, w.LoRARunning, w.LoRAWaiting)
			}
			// Forcing the detected flavour gives the same result.
			forced, err := ParseMetrics(bytes.NewReader(body), "", tt.flavor)
			if err != nil || !reflect.DeepEqual(forced, got) {
				t.Errorf("forced flavour: got %+v, %v; want %+v", forced, err, got)
			}
			checkGolden(t, filepath.Join("testdata", tt.file+".golden.json"), got)
		})
	}
}

func checkGolden(t *testing.T, path string, v any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs:\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestParseMetricsHave(t *testing.T) {
	body, _ := os.ReadFile("testdata/llamacpp.prom")
	m, err := ParseMetrics(bytes.NewReader(body), textCT, FlavorAuto)
	if err != nil {
		t.Fatal(err)
	}
	if m.Has(HasKVUsage) || !m.Has(HasWaiting|HasRunning|HasPrefixCounters) {
		t.Errorf("llama.cpp Have = %b: want waiting, running, prefix counters and no KV usage", m.Have)
	}
}

func TestParseMetricsErrors(t *testing.T) {
	tests := []struct {
		name, body, ct string
		flavor         Flavor
		wantErr        string
	}{
		{"unknown engine", "foo_bar 1\n", textCT, FlavorAuto, "no known engine metrics"},
		{"syntax", "vllm:num_requests_waiting{ 1\n", textCT, FlavorAuto, "parse metrics"},
		{"wrong forced flavour", "vllm:num_requests_waiting 1\n", textCT, FlavorSGLang, "no sglang queue metrics"},
		{"bad flavour", "vllm:num_requests_waiting 1\n", textCT, Flavor("x"), "unknown flavor"},
		{"empty", "", textCT, FlavorAuto, "no known engine metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseMetrics(strings.NewReader(tt.body), tt.ct, tt.flavor)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	_, err := ParseMetrics(strings.NewReader("x 1\n"), "", FlavorAuto)
	if !errors.Is(err, ErrUnknownFlavor) {
		t.Errorf("err = %v, want ErrUnknownFlavor", err)
	}
}

// TestParseMetricsFormats reads the same families in the protobuf and
// OpenMetrics encodings.
func TestParseMetricsFormats(t *testing.T) {
	body, _ := os.ReadFile("testdata/vllm.prom")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	want, err := ParseMetrics(bytes.NewReader(body), textCT, FlavorAuto)
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []expfmt.Format{
		expfmt.NewFormat(expfmt.TypeProtoDelim),
		expfmt.NewFormat(expfmt.TypeOpenMetrics),
	} {
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, format)
		for _, name := range slices.Sorted(maps.Keys(fams)) {
			if err := enc.Encode(fams[name]); err != nil {
				t.Fatalf("%s: encode %s: %v", format, name, err)
			}
		}
		if c, ok := enc.(expfmt.Closer); ok {
			_ = c.Close()
		}
		got, err := ParseMetrics(&buf, string(format), FlavorAuto)
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v, want %+v", format, got, want)
		}
	}
}

// TestParseOpenMetricsText: OpenMetrics bodies go through the text parser.
func TestParseOpenMetricsText(t *testing.T) {
	body := `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 2
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 1
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0"} 10
vllm:prefix_cache_queries_created{engine="0"} 1.7e+09
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0"} 5
# EOF
`
	m, err := ParseMetrics(strings.NewReader(body), "application/openmetrics-text; version=1.0.0; charset=utf-8", FlavorAuto)
	if err != nil {
		t.Fatal(err)
	}
	if m.Waiting != 2 || m.Running != 1 || m.PrefixQueries != 10 || m.PrefixHits != 5 {
		t.Fatalf("got %+v", m)
	}
}

func TestParseFlavor(t *testing.T) {
	for _, in := range []string{"", "auto", "VLLM", "vllm-legacy", "sglang", "llamacpp", "tgi"} {
		if _, err := ParseFlavor(in); err != nil {
			t.Errorf("ParseFlavor(%q): %v", in, err)
		}
	}
	if _, err := ParseFlavor("ollama"); err == nil {
		t.Error("ParseFlavor(ollama): no error")
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"vllm", "vllm-legacy", "sglang", "llamacpp", "tgi"} {
		b, err := os.ReadFile(filepath.Join("testdata", name+".prom"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, textCT)
	}
	f.Add([]byte("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc +Inf\n"), "")
	f.Add([]byte("# TYPE x counter\nx_total 1\n# EOF\n"), "application/openmetrics-text; version=1.0.0")
	f.Fuzz(func(t *testing.T, body []byte, ct string) {
		m, err := ParseMetrics(bytes.NewReader(body), ct, FlavorAuto)
		// The fast path changes nothing (FuzzParseFilter tries every flavour).
		want, wantErr := referenceParseMetrics(bytes.NewReader(body), ct, FlavorAuto)
		if d := sameResult(m, err, want, wantErr); d != nil {
			t.Fatal(d)
		}
		if err != nil {
			return
		}
		if m.KVUsage < 0 || m.KVUsage > 1 || m.Flavor == FlavorAuto {
			t.Fatalf("bad result %+v", m)
		}
		// The adapters: each list sorted without duplicates or empty
		// names, LoRAAdapters the union of the running and the waiting.
		for _, l := range [][]string{m.LoRARunning, m.LoRAWaiting, m.LoRAAdapters} {
			if !slices.IsSorted(l) || len(slices.Compact(slices.Clone(l))) != len(l) || slices.Contains(l, "") {
				t.Fatalf("adapter list %q is not sorted, unique and non-empty", l)
			}
		}
		union := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(m.LoRARunning), m.LoRAWaiting...))))
		if !slices.Equal(union, m.LoRAAdapters) && (len(union) > 0 || len(m.LoRAAdapters) > 0) {
			t.Fatalf("LoRAAdapters %q, want the union of %q and %q", m.LoRAAdapters, m.LoRARunning, m.LoRAWaiting)
		}
		v := NewView(ViewConfig{})
		v.Observe(t0, m)
		if l := v.Load(t0).LoRA; (l != nil) != m.Has(HasLoRA) {
			t.Fatalf("Load.LoRA %+v with HasLoRA %v", l, m.Has(HasLoRA))
		}
	})
}

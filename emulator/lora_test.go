package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/openai"
)

func loraConfig(modules ...LoRAModule) Config {
	return Config{LoRA: LoRAConfig{Enable: true, Modules: modules, MaxLoRAs: 2}}
}

var sqlLoRA = LoRAModule{Name: "sql-lora", Path: "/adapters/sql"}

// TestLoRARequests: a request naming an adapter is served by it: its
// response names the adapter (whole and streamed, as vLLM's carry the
// LoRA's name); it hits no block of a base request with the same prompt,
// and a second request of the adapter hits the first's. Tokenize takes
// the adapter's name too.
func TestLoRARequests(t *testing.T) {
	_, hs := testServer(t, loraConfig(sqlLoRA, LoRAModule{Name: "other", Path: "/adapters/other"}))
	prompt := strings.Repeat("the same long document for every adapter ", 40)
	complete := func(model string) (string, int) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
		code, out := post(t, hs.URL+"/v1/completions", string(b))
		var c openai.Completion
		if err := json.Unmarshal(out, &c); code != 200 || err != nil {
			t.Fatalf("model %q: got %d %s", model, code, out)
		}
		return c.Model, c.Usage.CachedTokens()
	}
	for i, tc := range []struct {
		model  string
		cached bool
	}{{"tiny", false}, {"sql-lora", false}, {"sql-lora", true}, {"other", false}, {"tiny", true}} {
		model, cached := complete(tc.model)
		if model != tc.model {
			t.Errorf("request %d: response model %q, want %q", i, model, tc.model)
		}
		if (cached > 0) != tc.cached {
			t.Errorf("request %d (%s): %d cached tokens, want a hit %v", i, tc.model, cached, tc.cached)
		}
	}
	code, out := post(t, hs.URL+"/v1/chat/completions", `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`)
	if code != 200 || !strings.Contains(string(out), `"model":"sql-lora"`) || strings.Contains(string(out), `"model":"tiny"`) {
		t.Errorf("stream: got %d %s, want chunks of model sql-lora", code, out)
	}
	if code, out := post(t, hs.URL+"/tokenize", `{"model":"sql-lora","prompt":"hi"}`); code != 200 {
		t.Errorf("tokenize with the adapter: got %d %s", code, out)
	}
}

// TestUnknownModel: a model that is neither the served one nor an adapter
// gets vLLM's 404, body for body; an adapter's name does when LoRA is not
// enabled.
func TestUnknownModel(t *testing.T) {
	want := `{"error":{"message":"The model ` + "`nope`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`
	for _, cfg := range []Config{loraConfig(sqlLoRA), {}} {
		_, hs := testServer(t, cfg)
		for _, model := range []string{"nope", "sql-lora"} {
			if model == "sql-lora" && cfg.LoRA.Enable {
				continue
			}
			code, out := post(t, hs.URL+"/v1/completions", `{"model":"`+model+`","prompt":"hi","max_tokens":1}`)
			if w := strings.ReplaceAll(want, "nope", model); code != 404 || strings.TrimSpace(string(out)) != w {
				t.Errorf("LoRA %v, model %s: got %d %s, want 404 %s", cfg.LoRA.Enable, model, code, out, w)
			}
		}
	}
}

// TestLoRAModels: /v1/models lists the served model, then each adapter in
// load order as vLLM does: its root the adapter's path, its parent the
// served model (the JSON form's base_model_name when it names it), no
// max_model_len.
func TestLoRAModels(t *testing.T) {
	_, hs := testServer(t, loraConfig(sqlLoRA, LoRAModule{Name: "b", Path: "/p/b", BaseModelName: "tiny"},
		LoRAModule{Name: "c", Path: "/p/c", BaseModelName: "elsewhere"}))
	resp, err := http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	type card struct {
		id, root string
		parent   any
		maxLen   any
	}
	var got []card
	for _, m := range list.Data {
		got = append(got, card{m["id"].(string), m["root"].(string), m["parent"], m["max_model_len"]})
		if m["object"] != "model" || m["owned_by"] != "vllm" || len(m["permission"].([]any)) != 1 {
			t.Errorf("card %v: want object model, owned_by vllm and one permission", m)
		}
	}
	maxLen := list.Data[0]["max_model_len"]
	want := []card{{"tiny", "tiny", nil, maxLen}, {"sql-lora", "/adapters/sql", "tiny", nil}, {"b", "/p/b", "tiny", nil}, {"c", "/p/c", "tiny", nil}}
	if maxLen == nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got cards %v, want %v", got, want)
	}
}

// TestLoRAConfigErrors: the LoRA configuration is checked as vLLM checks
// its flags, each error naming the field.
func TestLoRAConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		lora LoRAConfig
		want string
	}{
		{LoRAConfig{Enable: true, MaxLoRAs: -1}, "LoRA.MaxLoRAs -1 must be at least 1"},
		{LoRAConfig{Enable: true, MaxLoRARank: 7}, "LoRA.MaxLoRARank 7 must be one of [1 8 16 32 64 128 256 320 512]"},
		{LoRAConfig{Enable: true, MaxLoRAs: 4, MaxCPULoRAs: 2}, "LoRA.MaxCPULoRAs 2 must be at least LoRA.MaxLoRAs 4"},
		{LoRAConfig{Modules: []LoRAModule{sqlLoRA}}, "LoRA.Modules need LoRA.Enable"},
		{LoRAConfig{Enable: true, Modules: []LoRAModule{sqlLoRA, sqlLoRA}}, `LoRA module "sql-lora" is given twice`},
		{LoRAConfig{Enable: true, Modules: []LoRAModule{{Name: "x"}}}, `LoRA module "x" needs a name and a path`},
	} {
		cfg := Config{LoRA: tc.lora}
		testDefaults(t, &cfg)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.lora, err, tc.want)
		}
	}
	cfg := loraConfig()
	testDefaults(t, &cfg)
	if _, err := NewDP(cfg, 2); err == nil || !strings.Contains(err.Error(), "LoRA in DP mode is not supported yet") {
		t.Errorf("data parallel with LoRA: got %v, want vLLM's refusal", err)
	}
}

// TestLoRAInfoMetric: vllm:lora_requests_info, parsed back, has vLLM's
// labels only (max_lora, running_lora_adapters, waiting_lora_adapters:
// no model_name, no engine), the adapters comma-joined, a wall-clock
// timestamp as its value, and keeps the series of earlier label sets, as
// vLLM's GaugeVec does. It is absent without LoRA.
func TestLoRAInfoMetric(t *testing.T) {
	e, err := engine.New(engine.Config{Profile: tinyEngine(t).Profile, MaxLoRAs: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []engine.Request{{ID: "a", LoRA: "a"}, {ID: "b", LoRA: "b"}, {ID: "c", LoRA: "c"}, {ID: "base"}} {
		r.Prompt, r.MaxTokens = []uint32{1, 2, 3}, 4
		if err := e.Add(0, &r); err != nil {
			t.Fatal(err)
		}
	}
	li := newLoRAInfo(2)
	t0 := time.Unix(1_750_000_000, 0)
	li.update(e, 0, t0) // no step yet: no series
	li.update(e, 1, t0) // all waiting
	e.Step(0)
	li.update(e, 2, t0.Add(time.Second)) // a and b running, c waiting
	li.update(e, 2, t0.Add(time.Hour))   // no step since: unchanged
	reg := prometheus.NewRegistry()
	reg.MustRegister(li)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, mf := range mfs {
		if err := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain)).Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := p.TextToMetricFamilies(strings.NewReader(text.String()))
	if err != nil {
		t.Fatalf("parse %s: %v", text.String(), err)
	}
	mf := parsed["vllm:lora_requests_info"]
	if mf == nil || mf.GetType().String() != "GAUGE" || mf.GetHelp() != "Running stats on lora requests." {
		t.Fatalf("got %v, want the gauge", mf)
	}
	got := map[string]float64{}
	for _, m := range mf.Metric {
		l := labelsOf(m)
		if len(l) != 3 || l["max_lora"] != "2" {
			t.Errorf("labels %v: want max_lora=2, running_lora_adapters, waiting_lora_adapters only", l)
		}
		got[l["running_lora_adapters"]+"|"+l["waiting_lora_adapters"]] = m.GetGauge().GetValue()
	}
	want := map[string]float64{"|a,b,c": 1_750_000_000, "a,b|c": 1_750_000_001}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("series %v, want %v", got, want)
	}

	for _, tc := range []struct {
		cfg  Config
		want bool
	}{{loraConfig(sqlLoRA), true}, {Config{}, false}, {Config{MetricsFlavor: FlavorVLLMLegacy, LoRA: LoRAConfig{Enable: true}}, true}} {
		_, hs := testServer(t, tc.cfg)
		if mf := scrape(t, hs.URL)["vllm:lora_requests_info"]; mf != nil {
			t.Errorf("LoRA %v: lora_requests_info %v before any request, want none (vLLM records it with a step's stats)", tc.cfg.LoRA.Enable, mf)
		}
		if code, out := post(t, hs.URL+"/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":2}`); code != 200 {
			t.Fatalf("got %d %s", code, out)
		}
		mf := scrape(t, hs.URL)["vllm:lora_requests_info"]
		if (mf != nil) != tc.want {
			t.Errorf("LoRA %v, flavour %q: lora_requests_info present %v, want %v", tc.cfg.LoRA.Enable, tc.cfg.MetricsFlavor, mf != nil, tc.want)
		}
		if mf != nil {
			for _, m := range mf.Metric {
				if l := labelsOf(m); len(l) != 3 || l["max_lora"] == "" || m.GetGauge().GetValue() < 1.7e9 {
					t.Errorf("series %v = %v: want vLLM's three labels and a wall-clock time", l, m.GetGauge().GetValue())
				}
			}
		}
	}
}

// TestLoRAKVEvents: an adapter's BlockStored events carry its lora_name,
// its lora_id (1-based in the order of the modules) and, for each block,
// the extra_keys tuple (lora_name,), (lora_name, cache_salt) on a salted
// first block, in both encodings, decoded here with a generic msgpack
// decoder; the block hashes are kvindex.HashTokensKeyed's.
func TestLoRAKVEvents(t *testing.T) {
	for _, enc := range []string{EncodingArray, EncodingMap} {
		t.Run(enc, func(t *testing.T) {
			ctx, endpoint, replay := listeningSub(t)
			cfg := loraConfig(LoRAModule{Name: "first", Path: "/p/1"}, sqlLoRA)
			cfg.KVEvents = KVEventsConfig{Endpoint: endpoint, ReplayEndpoint: replay, Encoding: enc}
			_, hs := testServer(t, cfg)
			ids := make([]string, 40)
			toks := make([]uint32, 40)
			for i := range ids {
				ids[i], toks[i] = fmt.Sprint(i+10), uint32(i+10)
			}
			body := `{"model":"sql-lora","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":1,"cache_salt":"s1"}`
			if code, out := post(t, hs.URL+"/v1/completions", body); code != 200 {
				t.Fatalf("got %d %s", code, out)
			}
			// The batch may still be queued for the publisher when the
			// response is out: replay until it is buffered.
			var stored *decodedEvent
			waitFor(t, "the adapter's BlockStored, replayed", func() bool {
				for _, ev := range replayEvents(t, ctx, replay, enc) {
					if ev.Type == "BlockStored" {
						stored = &ev
						return true
					}
				}
				return false
			})
			want := kvindex.HashTokensKeyed(toks, "sql-lora", "s1", 16, nil)
			if !reflect.DeepEqual(stored.Hashes, want) {
				t.Errorf("hashes %v, want kvindex.HashTokensKeyed's %v", stored.Hashes, want)
			}
			if stored.LoRAName != "sql-lora" || stored.LoRAID == nil || toU64(t, stored.LoRAID) != 2 {
				t.Errorf("lora_name %v, lora_id %v: want sql-lora and 2", stored.LoRAName, stored.LoRAID)
			}
			wantKeys := []any{[]any{"sql-lora", "s1"}, []any{"sql-lora"}}
			if !reflect.DeepEqual(stored.ExtraKeys, wantKeys) {
				t.Errorf("extra_keys %#v, want %#v", stored.ExtraKeys, wantKeys)
			}
		})
	}
}

// TestEncodeLoRAEvent: the array form of an adapter's BlockStored has
// vLLM's positional fields up to extra_keys.
func TestEncodeLoRAEvent(t *testing.T) {
	b, err := encodeEventBatch(nil, EncodingArray, 1, 0, []engine.KVEvent{{Kind: engine.BlockStored, BlockHashes: []uint64{7, 8},
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRA: "a"}}, func(string) int { return 3 })
	if err != nil {
		t.Fatal(err)
	}
	var batch []any
	if err := msgpack.Unmarshal(b, &batch); err != nil {
		t.Fatal(err)
	}
	ev := batch[1].([]any)[0].([]any)
	if len(ev) != 9 || toU64(t, ev[5]) != 3 || ev[6] != "GPU" || ev[7] != "a" || !reflect.DeepEqual(ev[8], []any{[]any{"a"}, []any{"a"}}) {
		t.Errorf("got %#v: want [BlockStored, hashes, parent, tokens, block size, 3, GPU, a, [(a,), (a,)]]", ev)
	}
}

// TestRuntimeLoRAUpdating: with VLLM_ALLOW_RUNTIME_LORA_UPDATING the
// load and unload endpoints answer as vLLM's do: a loaded adapter serves
// and is listed, with the next int id; the errors have vLLM's messages
// and types. Without it the paths are 404.
func TestRuntimeLoRAUpdating(t *testing.T) {
	cfg := loraConfig(sqlLoRA)
	cfg.LoRA.RuntimeUpdating = true
	s, hs := testServer(t, cfg)
	for _, tc := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/p/new"}`, 200, "Success: LoRA adapter 'new' added successfully."},
		{"/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/p/new"}`, 400, `{"error":{"message":"The lora adapter 'new' has already been loaded.","type":"InvalidUserInput","param":null,"code":400}}`},
		{"/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, `{"error":{"message":"Both 'lora_name' and 'lora_path' must be provided.","type":"InvalidUserInput","param":null,"code":400}}`},
		{"/v1/unload_lora_adapter", `{"lora_name":"gone"}`, 404, `{"error":{"message":"The lora adapter 'gone' cannot be found.","type":"NotFoundError","param":null,"code":404}}`},
		{"/v1/unload_lora_adapter", `{"lora_name":"sql-lora"}`, 200, "Success: LoRA adapter 'sql-lora' removed successfully."},
	} {
		code, out := post(t, hs.URL+tc.path, tc.body)
		if code != tc.code || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("%s %s: got %d %s, want %d %s", tc.path, tc.body, code, out, tc.code, tc.want)
		}
	}
	if a := s.loras.lookup("new"); a == nil || a.id != 2 {
		t.Errorf("new adapter %+v: want int id 2", a)
	}
	if code, _ := post(t, hs.URL+"/v1/completions", `{"model":"new","prompt":"hi","max_tokens":1}`); code != 200 {
		t.Errorf("request to the loaded adapter: got %d", code)
	}
	if code, _ := post(t, hs.URL+"/v1/completions", `{"model":"sql-lora","prompt":"hi","max_tokens":1}`); code != 404 {
		t.Errorf("request to the unloaded adapter: got %d, want 404", code)
	}
	_, plain := testServer(t, loraConfig())
	resp, err := http.Post(plain.URL+"/v1/load_lora_adapter", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("without runtime updating: load got %d, want 404", resp.StatusCode)
	}
}

package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestParseLoRAPath: "lora_path" (SGLang's field) is read as one adapter
// name: a string, null, or a batch's list naming one adapter; a list
// naming two, or another type, is a 400 naming the field.
func TestParseLoRAPath(t *testing.T) {
	for _, tc := range []struct {
		lora, want string
		code       string // the error's code, "" for none
	}{
		{`"sql"`, "sql", ""},
		{`null`, "", ""},
		{`""`, "", ""},
		{`[]`, "", ""},
		{`["sql"]`, "sql", ""},
		{`["sql", "s\u0071l"]`, "sql", ""},
		{`[null, null]`, "", ""},
		{`[null, ""]`, "", ""},
		{`["sql", "chat"]`, "", "mixed_adapters"},
		{`["sql", null]`, "", "mixed_adapters"},
		{`[null, "sql"]`, "", "mixed_adapters"},
		{`7`, "", "invalid_type"},
		{`{"name":"sql"}`, "", "invalid_type"},
		{`["sql", 7]`, "", "invalid_type"},
		{`["sql" 7]`, "", "invalid_json"},
	} {
		t.Run(tc.lora, func(t *testing.T) {
			body := `{"model":"m","prompt":["a","b"],"lora_path":` + tc.lora + `}`
			ri, err := ParseRequest(KindCompletion, []byte(body))
			var e *kvroute.Error
			switch {
			case tc.code == "" && err != nil:
				t.Fatalf("ParseRequest(%s): got error %v, want lora_path %q", body, err, tc.want)
			case tc.code == "" && ri.LoRAPath != tc.want:
				t.Fatalf("ParseRequest(%s): got lora_path %q, want %q", body, ri.LoRAPath, tc.want)
			case tc.code != "" && (!errors.As(err, &e) || e.Code != tc.code || e.Status != 400):
				t.Fatalf("ParseRequest(%s): got %v, want a 400 with code %s", body, err, tc.code)
			case tc.code == "mixed_adapters" && (e.Param != "lora_path" || !strings.Contains(e.Message, "more than one LoRA adapter")):
				t.Fatalf("ParseRequest(%s): got param %q message %q, want lora_path and the adapters named", body, e.Param, e.Message)
			}
		})
	}
}

// TestAdapterRead: what each engine reads from a body's model and
// lora_path.
func TestAdapterRead(t *testing.T) {
	for _, tc := range []struct {
		model, lora  string
		vllm, sglang string
	}{
		{"tiny", "", "tiny", ""},
		{"sql", "", "sql", ""}, // vLLM's form: the base model on SGLang
		{"tiny:sql", "", "tiny:sql", "sql"},
		{"tiny: sql ", "", "tiny: sql ", "sql"},
		{"tiny:", "", "tiny:", ""},
		{"tiny:", "chat", "tiny:", "chat"},
		{"tiny", "sql", "tiny", "sql"},
		{"tiny:sql", "chat", "tiny:sql", "sql"}, // SGLang: the model's wins
		{"a:b:c", "", "a:b:c", "b:c"},
	} {
		if got := AdapterRead(AdapterVLLM, tc.model, tc.lora); got != tc.vllm {
			t.Errorf("AdapterRead(vllm, %q, %q) = %q, want %q", tc.model, tc.lora, got, tc.vllm)
		}
		if got := AdapterRead(AdapterSGLang, tc.model, tc.lora); got != tc.sglang {
			t.Errorf("AdapterRead(sglang, %q, %q) = %q, want %q", tc.model, tc.lora, got, tc.sglang)
		}
		if got := AdapterRead(AdapterUnknown, tc.model, tc.lora); got != "" {
			t.Errorf("AdapterRead(unknown, %q, %q) = %q, want \"\"", tc.model, tc.lora, got)
		}
	}
}

// TestNameAdapter: the rewritten body names the adapter as the engine
// reads it and keeps every other field's JSON text.
func TestNameAdapter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		form    AdapterForm
		adapter string
		want    string
	}{
		{"sglang model to vllm", `{"model":"tiny:sql","prompt":"<b>","max_tokens":4}`, AdapterVLLM, "sql",
			`{"max_tokens":4,"model":"sql","prompt":"<b>"}`},
		{"lora_path to vllm", `{"model":"tiny","prompt":"p","lora_path":["sql","sql"]}`, AdapterVLLM, "sql",
			`{"model":"sql","prompt":"p"}`},
		{"empty adapter to vllm", "\xef\xbb\xbf" + `{"model":"tiny:","prompt":"p"}`, AdapterVLLM, "",
			`{"model":"tiny","prompt":"p"}`},
		{"vllm model to sglang", `{"model":"sql","prompt":"p","stream":true}`, AdapterSGLang, "sql",
			`{"lora_path":"sql","model":"sql","prompt":"p","stream":true}`},
		{"colon adapter to sglang", `{"model":"org:sql","prompt":"p","lora_path":null}`, AdapterSGLang, "org:sql",
			`{"lora_path":"org:sql","model":"tiny","prompt":"p"}`},
		{"client lora_path replaced", `{"model":"tiny","prompt":"p","lora_path":"chat"}`, AdapterSGLang, "sql",
			`{"lora_path":"sql","model":"tiny","prompt":"p"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NameAdapter([]byte(tc.body), tc.form, "tiny", tc.adapter)
			if err != nil || string(got) != tc.want {
				t.Fatalf("NameAdapter(%s, %s, %q) = %s, %v; want %s", tc.body, tc.form, tc.adapter, got, err, tc.want)
			}
		})
	}
	if _, err := NameAdapter([]byte(`{"model":"sql","prompt":"p"}`), AdapterUnknown, "tiny", "sql"); err == nil {
		t.Fatal("NameAdapter(unknown form): got no error")
	}
}

// FuzzNameAdapter: for any request ParseRequest accepts, the body
// NameAdapter writes for each engine parses again, the engine reads the
// adapter (or the base model) from it, and every field but "model" and
// "lora_path" keeps its JSON text (compacted).
func FuzzNameAdapter(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny:sql","prompt":"p","lora_path":"sql"}`,
		`{"model":"sql","messages":[{"role":"user","content":"hi"}],"lora_path":["sql",null]}`,
		`{"model":"tiny","prompt":["a","b"],"lora_path":[null,null],"stream":true,"x":{"<":"\u2028"}}`,
		"\xef\xbb\xbf" + `{"model":"a:b:c","prompt":[1,2],"model":"tiny"}`,
	} {
		f.Add([]byte(s), "sql", false)
		f.Add([]byte(s), "", true)
	}
	f.Fuzz(func(t *testing.T, body []byte, adapter string, sglang bool) {
		ri, err := ParseRequest(KindCompletion, body)
		if err != nil {
			return
		}
		adapter = strings.ToValidUTF8(adapter, "")
		form, want := AdapterVLLM, adapter
		if sglang {
			form = AdapterSGLang
		} else if want == "" {
			want = "tiny"
		}
		got, err := NameAdapter(body, form, "tiny", adapter)
		if err != nil {
			t.Fatalf("NameAdapter(%q, %s, %q): %v", body, form, adapter, err)
		}
		ri2, err := ParseRequest(KindCompletion, got)
		if err != nil {
			t.Fatalf("NameAdapter(%q, %s, %q) = %q, which does not parse: %v", body, form, adapter, got, err)
		}
		if r := AdapterRead(form, ri2.Model, ri2.LoRAPath); r != want {
			t.Fatalf("NameAdapter(%q, %s, %q) = %q: the engine reads %q, want %q", body, form, adapter, got, r, want)
		}
		if ri2.Prompt != ri.Prompt || ri2.Stream != ri.Stream || ri2.MaxTokens != ri.MaxTokens {
			t.Fatalf("NameAdapter(%q, %s, %q) = %q: routing fields changed: %+v, was %+v", body, form, adapter, got, ri2, ri)
		}
		before, _ := DecodeObject(body)
		after, _ := DecodeObject(got)
		for _, m := range []map[string]json.RawMessage{before, after} {
			delete(m, "model")
			delete(m, "lora_path")
		}
		same := func(a, b json.RawMessage) bool { // as JSON text, white space aside (EncodeObject compacts)
			var ca, cb bytes.Buffer
			return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && ca.String() == cb.String()
		}
		if !maps.EqualFunc(before, after, same) {
			t.Fatalf("NameAdapter(%q, %s, %q) = %q: other fields changed", body, form, adapter, got)
		}
	})
}

// TestNameLlamaAdapter: a body for a llama.cpp server lists its adapters
// in "lora" (the routed one at its scale, the others at 0), names the
// base model and drops lora_path; the client's own "lora" is replaced.
func TestNameLlamaAdapter(t *testing.T) {
	two := []LoRAScale{{ID: 0, Scale: 0}, {ID: 1, Scale: 0.5}}
	for _, tc := range []struct {
		name, body string
		lora       []LoRAScale
		want       string
	}{
		{"vllm form", `{"model":"sql","prompt":"<b>","max_tokens":4}`, two,
			`{"lora":[{"id":0,"scale":0},{"id":1,"scale":0.5}],"max_tokens":4,"model":"tiny","prompt":"<b>"}`},
		{"sglang forms", `{"model":"tiny:sql","prompt":"p","lora_path":["sql"]}`, two,
			`{"lora":[{"id":0,"scale":0},{"id":1,"scale":0.5}],"model":"tiny","prompt":"p"}`},
		{"base model", "\xef\xbb\xbf" + `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			[]LoRAScale{{ID: 0, Scale: 0}, {ID: 1, Scale: 0}},
			`{"lora":[{"id":0,"scale":0},{"id":1,"scale":0}],"messages":[{"role":"user","content":"hi"}],"model":"tiny","stream":true}`},
		{"client lora replaced", `{"model":"tiny","prompt":"p","lora":[{"id":1,"scale":1}]}`, []LoRAScale{{ID: 0, Scale: 1.25}},
			`{"lora":[{"id":0,"scale":1.25}],"model":"tiny","prompt":"p"}`},
		{"no adapters", `{"model":"tiny","prompt":"p"}`, nil, `{"lora":[],"model":"tiny","prompt":"p"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NameLlamaAdapter([]byte(tc.body), "tiny", tc.lora)
			if err != nil || string(got) != tc.want {
				t.Fatalf("NameLlamaAdapter(%s, %v) = %s, %v; want %s", tc.body, tc.lora, got, err, tc.want)
			}
		})
	}
	if _, err := NameAdapter([]byte(`{"model":"sql","prompt":"p"}`), AdapterLlamaCPP, "tiny", "sql"); err == nil {
		t.Fatal("NameAdapter(llamacpp): got no error, want one pointing to NameLlamaAdapter")
	}
	if got := AdapterRead(AdapterLlamaCPP, "sql", "chat"); got != "" {
		t.Errorf("AdapterRead(llamacpp) = %q, want \"\"", got)
	}
}

// FuzzNameLlamaAdapter: for any request ParseRequest accepts, the body
// NameLlamaAdapter writes parses again with the base model, no lora_path,
// a "lora" list that is exactly the one given, and every other field's
// JSON text kept (compacted).
func FuzzNameLlamaAdapter(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny:sql","prompt":"p","lora_path":"sql"}`,
		`{"model":"sql","messages":[{"role":"user","content":"hi"}],"lora":[{"id":3,"scale":1}]}`,
		"\xef\xbb\xbf" + `{"model":"a:b:c","prompt":[1,2],"model":"tiny","x":{"<":"\u2028"}}`,
	} {
		f.Add([]byte(s), uint8(2), int8(1), 0.5)
		f.Add([]byte(s), uint8(0), int8(-1), 1.0)
	}
	f.Fuzz(func(t *testing.T, body []byte, n uint8, pick int8, scale float64) {
		ri, err := ParseRequest(KindCompletion, body)
		if err != nil {
			return
		}
		lora := make([]LoRAScale, n%8)
		for i := range lora {
			lora[i].ID = i
			if i == int(pick) {
				lora[i].Scale = scale
			}
		}
		got, err := NameLlamaAdapter(body, "tiny", lora)
		if err != nil {
			if !math.IsInf(scale, 0) && !math.IsNaN(scale) { // a finite scale must not fail
				t.Fatalf("NameLlamaAdapter(%q, %v): %v", body, lora, err)
			}
			return
		}
		ri2, err := ParseRequest(KindCompletion, got)
		if err != nil {
			t.Fatalf("NameLlamaAdapter(%q) = %q, which does not parse: %v", body, got, err)
		}
		if ri2.Model != "tiny" || ri2.LoRAPath != "" || ri2.Prompt != ri.Prompt || ri2.Stream != ri.Stream {
			t.Fatalf("NameLlamaAdapter(%q) = %q: read as %+v", body, got, ri2)
		}
		after, _ := DecodeObject(got)
		var sent []LoRAScale
		if err := json.Unmarshal(after["lora"], &sent); err != nil || len(sent) != len(lora) {
			t.Fatalf("NameLlamaAdapter(%q) = %q: lora %s, want %v", body, got, after["lora"], lora)
		}
		for i := range sent {
			if sent[i] != lora[i] {
				t.Fatalf("NameLlamaAdapter(%q) = %q: lora %v, want %v", body, got, sent, lora)
			}
		}
		before, _ := DecodeObject(body)
		for _, m := range []map[string]json.RawMessage{before, after} {
			delete(m, "model")
			delete(m, "lora_path")
			delete(m, "lora")
		}
		same := func(a, b json.RawMessage) bool {
			var ca, cb bytes.Buffer
			return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && ca.String() == cb.String()
		}
		if !maps.EqualFunc(before, after, same) {
			t.Fatalf("NameLlamaAdapter(%q) = %q: other fields changed", body, got)
		}
	})
}

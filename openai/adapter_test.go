package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
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

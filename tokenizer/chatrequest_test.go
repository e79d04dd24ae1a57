package tokenizer

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
)

// TestChatRequestVars: the template variables of a chat request as vLLM
// merges them: chat_template_kwargs' tools over the request's (given as
// they are), their null and "auto" values unset, the request's documents
// and reasoning_effort over theirs, and the requests vLLM refuses.
func TestChatRequestVars(t *testing.T) {
	reqTools := json.RawMessage(`[{"function":{"name":"a"}}]`)
	for _, tc := range []struct {
		name    string
		req     ChatRequest
		want    map[string]string
		asGiven bool
		err     error
	}{
		{"nothing", ChatRequest{}, nil, false, nil},
		{"request tools", ChatRequest{Tools: reqTools}, map[string]string{"tools": string(reqTools)}, false, nil},
		{"kwargs tools win", ChatRequest{Tools: reqTools, Kwargs: map[string]json.RawMessage{"tools": json.RawMessage(`[{"name":"b"}]`)}},
			map[string]string{"tools": `[{"name":"b"}]`}, true, nil},
		{"kwargs tools null", ChatRequest{Tools: reqTools, Kwargs: map[string]json.RawMessage{"tools": json.RawMessage(`null`)}},
			map[string]string{"tools": string(reqTools)}, false, nil},
		{"kwargs tools auto", ChatRequest{Tools: reqTools, Kwargs: map[string]json.RawMessage{"tools": json.RawMessage(` "auto"`)}},
			map[string]string{"tools": string(reqTools)}, false, nil},
		{"unset and generation kwargs", ChatRequest{Kwargs: map[string]json.RawMessage{"enable_thinking": json.RawMessage(`null`),
			"date_string": json.RawMessage(`"auto"`), "x": json.RawMessage(`"Auto"`), "add_generation_prompt": json.RawMessage(`false`),
			"continue_final_message": json.RawMessage(`true`)}}, map[string]string{"x": `"Auto"`}, false, nil},
		{"documents", ChatRequest{Documents: json.RawMessage(`[1]`), Kwargs: map[string]json.RawMessage{"documents": json.RawMessage(`[2]`)}},
			map[string]string{"documents": `[1]`}, false, nil},
		{"documents null", ChatRequest{Documents: json.RawMessage(`null`), Kwargs: map[string]json.RawMessage{"documents": json.RawMessage(`[2]`)}},
			map[string]string{"documents": `[2]`}, false, nil},
		{"request chat_template", ChatRequest{ChatTemplate: json.RawMessage(`"{{ 1 }}"`)}, nil, false, ErrRequestChatTemplate},
		{"request chat_template null", ChatRequest{ChatTemplate: json.RawMessage(`null`)}, nil, false, nil},
		{"kwargs chat_template", ChatRequest{Kwargs: map[string]json.RawMessage{"chat_template": json.RawMessage(`"auto"`)}}, nil, false, ErrRequestChatTemplate},
		{"kwargs messages", ChatRequest{Kwargs: map[string]json.RawMessage{"messages": json.RawMessage(`[]`)}}, nil, false, ErrKwargsArgument},
		{"kwargs conversation", ChatRequest{Kwargs: map[string]json.RawMessage{"conversation": json.RawMessage(`[]`)}}, nil, false, ErrKwargsArgument},
		// vLLM's preprocess_chat (vllm/renderers/online_renderer.py) sets
		// tokenize among the kwargs' defaults, which the request's kwargs
		// override (merge_kwargs), and the renderer passes them all as
		// safe_apply_chat_template(..., **kwargs), whose own keyword
		// parameter tokenize takes it (vllm/renderers/hf.py): it reaches
		// transformers' apply_chat_template(tokenize=...), not the template.
		{"kwargs tokenize", ChatRequest{Kwargs: map[string]json.RawMessage{"tokenize": json.RawMessage(`true`), "x": json.RawMessage(`1`)}},
			map[string]string{"x": `1`}, false, nil},
		{"kwargs tokenize false", ChatRequest{Kwargs: map[string]json.RawMessage{"tokenize": json.RawMessage(`false`)}}, nil, false, nil},
		{"kwargs messages null", ChatRequest{Kwargs: map[string]json.RawMessage{"messages": json.RawMessage(`null`)}}, nil, false, nil},
		// transformers' apply_chat_template (src/transformers/
		// tokenization_utils_base.py) names these parameters, which vLLM's
		// resolve_chat_template_kwargs keeps (_get_hf_base_chat_template_params,
		// vllm/renderers/hf.py) and safe_apply_chat_template passes as
		// keyword arguments: they bind to the parameters, not to
		// **kwargs, the template's variables.
		{"kwargs apply_chat_template arguments", ChatRequest{Kwargs: map[string]json.RawMessage{"padding": json.RawMessage(`"max_length"`),
			"truncation": json.RawMessage(`true`), "max_length": json.RawMessage(`8`), "return_tensors": json.RawMessage(`"np"`),
			"return_dict": json.RawMessage(`true`), "return_assistant_tokens_mask": json.RawMessage(`false`),
			"tokenizer_kwargs": json.RawMessage(`{"x": 1}`), "max_len": json.RawMessage(`2`)}},
			map[string]string{"max_len": `2`}, false, nil},
		// vLLM merges return_dict=False over the kwargs
		// (ChatParams.get_apply_chat_template_kwargs, vllm/renderers/params.py)
		// and transformers raises for return_assistant_tokens_mask without
		// return_dict; Python's truth: 1 and "x" are true, 0 and "" not.
		{"kwargs return_assistant_tokens_mask", ChatRequest{Kwargs: map[string]json.RawMessage{"return_assistant_tokens_mask": json.RawMessage(`true`)}}, nil, false, ErrAssistantTokensMask},
		{"kwargs return_assistant_tokens_mask 1", ChatRequest{Kwargs: map[string]json.RawMessage{"return_assistant_tokens_mask": json.RawMessage(`1`)}}, nil, false, ErrAssistantTokensMask},
		{"kwargs return_assistant_tokens_mask x", ChatRequest{Kwargs: map[string]json.RawMessage{"return_assistant_tokens_mask": json.RawMessage(`"x"`)}}, nil, false, ErrAssistantTokensMask},
		{"kwargs return_assistant_tokens_mask 0", ChatRequest{Kwargs: map[string]json.RawMessage{"return_assistant_tokens_mask": json.RawMessage(`0`)}}, nil, false, nil},
		{"kwargs return_assistant_tokens_mask empty", ChatRequest{Kwargs: map[string]json.RawMessage{"return_assistant_tokens_mask": json.RawMessage(`""`)}}, nil, false, nil},
		{"kwargs return_assistant_tokens_mask auto", ChatRequest{Kwargs: map[string]json.RawMessage{"return_assistant_tokens_mask": json.RawMessage(`"auto"`)}}, nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := ChatOptions{ToolsAsGiven: true, JSONVars: map[string]json.RawMessage{"stale": nil}}
			err := tc.req.Vars(&opts)
			if !errors.Is(err, tc.err) {
				t.Fatalf("Vars: error %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			got := map[string]string{}
			for k, v := range opts.JSONVars {
				got[k] = string(v)
			}
			if tc.want == nil {
				tc.want = map[string]string{}
			}
			if !maps.Equal(got, tc.want) || opts.ToolsAsGiven != tc.asGiven {
				t.Errorf("Vars: %v (tools as given %v), want %v (%v)", got, opts.ToolsAsGiven, tc.want, tc.asGiven)
			}
		})
	}
}

// TestRenderToolsAsGiven: tools given as they are reach the template
// without vLLM's request model dump.
func TestRenderToolsAsGiven(t *testing.T) {
	tmpl, err := NewChatTemplate("{{ tools | tojson }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	tools := json.RawMessage(`[{"function":{"x":1,"name":"f"}}]`)
	for _, tc := range []struct {
		asGiven bool
		want    string
	}{
		{false, `[{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}]`},
		{true, `[{"function": {"x": 1, "name": "f"}}]`},
	} {
		got, err := tmpl.RenderJSON(json.RawMessage(`[]`), ChatOptions{JSONVars: map[string]json.RawMessage{"tools": tools}, ToolsAsGiven: tc.asGiven})
		if err != nil || got != tc.want {
			t.Errorf("ToolsAsGiven %v: %q, %v; want %q", tc.asGiven, got, err, tc.want)
		}
	}
}

// FuzzChatRequestVars: any chat_template_kwargs, tools and documents
// resolve without a panic, and the variables never hold a kwargs value
// vLLM unsets (null, "auto") nor the generation options, and hold the
// request's documents when given.
func FuzzChatRequestVars(f *testing.F) {
	f.Add([]byte(`{"tools": null, "x": "auto", "y": 1, "add_generation_prompt": false}`), []byte(`[{"function": {"name": "f"}}]`), []byte(`[1]`))
	f.Add([]byte(`{"tools": [], "documents": "auto", "chat_template": null}`), []byte(`null`), []byte(``))
	f.Add([]byte(`{"messages": null, "conversation": "auto", "z": " \"auto\""}`), []byte(``), []byte(`null`))
	f.Add([]byte(`{"tokenize": 1, "padding": "do_not_pad", "truncation": false, "tokenizer_kwargs": {}, "max_length": 3}`), []byte(``), []byte(``))
	f.Add([]byte(`{"tokenize": "x", "return_tensors": "pt", "return_assistant_tokens_mask": [0]}`), []byte(``), []byte(``))
	f.Fuzz(func(t *testing.T, kwargs, tools, documents []byte) {
		var kw map[string]json.RawMessage
		if json.Unmarshal(kwargs, &kw) != nil {
			return
		}
		var opts ChatOptions
		req := ChatRequest{Tools: tools, Documents: documents, Kwargs: kw}
		if err := req.Vars(&opts); err != nil {
			return
		}
		self, encErr := req.TransformersEncodes()
		if encErr != nil && !self {
			t.Fatalf("TransformersEncodes: %v without tokenize", encErr)
		}
		if tok, ok := kw["tokenize"]; self != (ok && !jsonUnset(tok) && jsonTruthy(tok)) {
			t.Fatalf("TransformersEncodes %v for tokenize %s", self, tok)
		}
		for k, v := range opts.JSONVars {
			if applyChatTemplateArgs[k] {
				t.Fatalf("vars hold %s, an argument of apply_chat_template", k)
			}
			if jsonUnset(v) && !(k == "tools" && !opts.ToolsAsGiven) && k != "documents" {
				t.Fatalf("vars hold %s = %s, which vLLM unsets", k, v)
			}
		}
		if !jsonNull(documents) && string(opts.JSONVars["documents"]) != string(documents) {
			t.Fatalf("documents %s, want the request's %s", opts.JSONVars["documents"], documents)
		}
	})
}

// TestChatRequestTokenizeNotAVariable: chat_template_kwargs' tokenize is
// no template variable in vLLM, which passes it as the tokenize argument
// of transformers' apply_chat_template (TestChatRequestVars' "kwargs
// tokenize" says where), so a template that looks for it finds it
// undefined whatever its value.
func TestChatRequestTokenizeNotAVariable(t *testing.T) {
	tmpl, err := NewChatTemplate("{{ tokenize is defined }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{`true`, `false`, `1`} {
		opts := ChatOptions{}
		req := ChatRequest{Kwargs: map[string]json.RawMessage{"tokenize": json.RawMessage(v)}}
		if err := req.Vars(&opts); err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(nil, opts)
		if err != nil || got != "False" {
			t.Errorf("tokenize %s: got %q (%v), want %q", v, got, err, "False")
		}
	}
}

// TestChatRequestTransformersEncodes: chat_template_kwargs' tokenize, true
// in Python's sense, has vLLM's transformers encode the rendering itself;
// with encoding arguments that may change the ids it is not followed.
func TestChatRequestTransformersEncodes(t *testing.T) {
	for _, tc := range []struct {
		kwargs string
		want   bool
		err    error
	}{
		{`{}`, false, nil},
		{`{"tokenize": false}`, false, nil},
		{`{"tokenize": null}`, false, nil},
		{`{"tokenize": "auto"}`, false, nil}, // merge_kwargs unsets it
		{`{"tokenize": 0}`, false, nil},
		{`{"tokenize": ""}`, false, nil},
		{`{"tokenize": true}`, true, nil},
		{`{"tokenize": 1}`, true, nil},
		{`{"tokenize": "no"}`, true, nil}, // a non-empty string is true
		{`{"tokenize": true, "padding": false, "truncation": "do_not_truncate", "max_length": 4, "return_tensors": null, "tokenizer_kwargs": {}}`, true, nil},
		{`{"tokenize": true, "padding": "do_not_pad", "truncation": false, "tokenizer_kwargs": null}`, true, nil},
		{`{"tokenize": true, "truncation": true, "max_length": 4}`, true, ErrEncodingKwargs},
		{`{"tokenize": true, "padding": "max_length", "max_length": 64}`, true, ErrEncodingKwargs},
		{`{"tokenize": true, "padding": true}`, true, ErrEncodingKwargs},
		{`{"tokenize": true, "return_tensors": "np"}`, true, ErrEncodingKwargs},
		{`{"tokenize": true, "tokenizer_kwargs": {"add_special_tokens": true}}`, true, ErrEncodingKwargs},
		{`{"tokenize": false, "truncation": true, "max_length": 4}`, false, nil}, // no encoding, no effect
	} {
		var kw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.kwargs), &kw); err != nil {
			t.Fatal(err)
		}
		req := ChatRequest{Kwargs: kw}
		got, err := req.TransformersEncodes()
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("%s: got %v, %v; want %v, %v", tc.kwargs, got, err, tc.want, tc.err)
		}
	}
}

// TestJSONTruthy: the truth of a JSON value as Python's bool(json.loads(x))
// (python3 -c 'import json; print(bool(json.loads(x)))' for each x).
func TestJSONTruthy(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{`true`, true}, {`false`, false}, {`null`, false}, {`0`, false}, {`0.0`, false}, {`-0.0`, false},
		{`0e5`, false}, {`1e-400`, false}, {`1`, true}, {`""`, false}, {`"a"`, true}, {`[]`, false},
		{`[0]`, true}, {`{}`, false}, {`{"a":0}`, true}, {` [ ] `, false},
	} {
		if got := jsonTruthy(json.RawMessage(tc.raw)); got != tc.want {
			t.Errorf("jsonTruthy(%s) = %v, want %v", tc.raw, got, tc.want)
		}
	}
}

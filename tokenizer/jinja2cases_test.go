package tokenizer

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// jinjaSemanticsFile is testdata/expected/jinja-semantics.json, written by
// testdata/npm/render_semantics.py: small templates whose jinja2 rendering
// the Go engine's semantics would change, and that rendering (or the
// error jinja2 raises) in transformers' apply_chat_template environment.
type jinjaSemanticsFile struct {
	Renderer string `json:"renderer"`
	Cases    []struct {
		Name             string                     `json:"name"`
		Template         string                     `json:"template"`
		Config           map[string]json.RawMessage `json:"config"`
		SpecialTokensMap json.RawMessage            `json:"special_tokens_map"`
		Vars             map[string]json.RawMessage `json:"vars"`
		Prompt           *string                    `json:"prompt"`
		Error            string                     `json:"error"`
	} `json:"cases"`
}

// TestJinjaSemanticsMatchJinja2 renders each case of jinja-semantics.json
// with its variables and wants jinja2's rendering byte for byte, or an
// error where jinja2 raises one. A case with a tokenizer_config.json
// ("config") is the chat template of testdata/tiny's tokenizer.json
// loaded with that config (and its special_tokens_map.json).
func TestJinjaSemanticsMatchJinja2(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "expected", "jinja-semantics.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp jinjaSemanticsFile
	if err := json.Unmarshal(data, &exp); err != nil {
		t.Fatal(err)
	}
	if len(exp.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range exp.Cases {
		t.Run(c.Name, func(t *testing.T) {
			got, err := renderCase(t, c.Template, c.Config, c.SpecialTokensMap, c.Vars)
			switch {
			case c.Prompt == nil && err == nil:
				t.Errorf("%q: got %q, want an error like jinja2's %s", c.Template, got, c.Error)
			case c.Prompt != nil && err != nil:
				t.Errorf("%q: %v, want %q", c.Template, err, *c.Prompt)
			case c.Prompt != nil && got != *c.Prompt:
				t.Errorf("%q:\n got %q\nwant %q", c.Template, got, *c.Prompt)
			}
		})
	}
}

// renderCase compiles and renders template src with the variables vars
// (JSON texts), a compile error being a render error; with config, src is
// the chat_template of that tokenizer_config.json, beside the
// special_tokens_map.json stm (nil for none).
func renderCase(t *testing.T, src string, config map[string]json.RawMessage, stm json.RawMessage, vars map[string]json.RawMessage) (string, error) {
	t.Helper()
	var ct *ChatTemplate
	var err error
	if config == nil {
		ct, err = NewChatTemplate(src, "", "")
	} else {
		ct, err = configTemplate(t, src, config, stm)
	}
	if err != nil {
		return "", err
	}
	return ct.RenderJSON([]byte(`[]`), ChatOptions{JSONVars: vars})
}

// configTemplate loads testdata/tiny's tokenizer.json with config and src
// as its tokenizer_config.json's chat_template, and stm as its
// special_tokens_map.json (nil for none), and returns that template.
func configTemplate(t *testing.T, src string, config map[string]json.RawMessage, stm json.RawMessage) (*ChatTemplate, error) {
	t.Helper()
	tj, err := os.ReadFile(filepath.Join("testdata", "tiny", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := maps.Clone(config)
	if cfg["chat_template"], err = json.Marshal(src); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := LoadFiles(Files{Tokenizer: tj, Config: data, SpecialTokensMap: stm})
	if err != nil {
		t.Fatal(err)
	}
	return tok.ChatTemplate()
}

// TestSpecialTokensNotShared: a render that changes the
// additional_special_tokens list (the Go engine's append, which jinja2's
// sandbox refuses) does not change it for the next render.
func TestSpecialTokensNotShared(t *testing.T) {
	const src = "{% set _ = additional_special_tokens.append('x') %}{{ additional_special_tokens | length }}"
	ct, err := configTemplate(t, src, map[string]json.RawMessage{"additional_special_tokens": json.RawMessage(`["<a>"]`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got, err := ct.Render(nil, ChatOptions{}); err != nil || got != "2" {
			t.Fatalf("got %q (%v), want 2", got, err)
		}
	}
}

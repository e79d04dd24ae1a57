package tokenizer

import (
	"encoding/json"
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
		Name     string                     `json:"name"`
		Template string                     `json:"template"`
		Vars     map[string]json.RawMessage `json:"vars"`
		Prompt   *string                    `json:"prompt"`
		Error    string                     `json:"error"`
	} `json:"cases"`
}

// TestJinjaSemanticsMatchJinja2 renders each case of jinja-semantics.json
// with its variables and wants jinja2's rendering byte for byte, or an
// error where jinja2 raises one.
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
			got, err := renderCase(c.Template, c.Vars)
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
// (JSON texts), a compile error being a render error.
func renderCase(src string, vars map[string]json.RawMessage) (string, error) {
	ct, err := NewChatTemplate(src, "", "")
	if err != nil {
		return "", err
	}
	return ct.RenderJSON([]byte(`[]`), ChatOptions{JSONVars: vars})
}

package tokenizer

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestChatTemplateWhitespaceMatchesJinja2 renders templates whose tags
// sit next to each other with every mix of whitespace control ("-"
// markers, trim_blocks, lstrip_blocks, comments, a final newline) and
// compares them with Python jinja2 in apply_chat_template's environment.
// testdata/jinja-whitespace.json was written by
//
//	e = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
//	e.from_string(template).render(messages=[{"role": "a", "content": "A"},
//	    {"role": "user", "content": "B"}], add_generation_prompt=True,
//	    eos_token="</s>", bos_token="<s>")
//
// for 12 hand-written templates and 150 random ones. Without
// jinjaTrimGuard, 74 of them render differently.
func TestChatTemplateWhitespaceMatchesJinja2(t *testing.T) {
	data, err := os.ReadFile("testdata/jinja-whitespace.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct{ Template, Jinja2 string }
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "a", Content: "A"}, {Role: "user", Content: "B"}}
	for i, tc := range cases {
		tmpl, err := NewChatTemplate(tc.Template, "<s>", "</s>")
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		got, err := tmpl.Render(msgs, ChatOptions{AddGenerationPrompt: true})
		if err != nil || got != tc.Jinja2 {
			t.Errorf("case %d %q:\n got %q (%v)\nwant %q (jinja2)", i, tc.Template, got, err, tc.Jinja2)
		}
	}
}

// FuzzJinjaTrimGuard: any template source goes through jinjaTrimGuard
// without a panic, and what it adds is whitespace and "-" markers only.
func FuzzJinjaTrimGuard(f *testing.F) {
	for _, s := range []string{"{% for m in messages %}{{ m.role }}\n{% endfor %}", "{{", "{%}", "{{'}}'}}{#", "{#-#}{{-}}\n", "a{%-%}{{ \"\\\"\" -}}{#x#}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := jinjaTrimGuard(src)
		strip := func(s string) string {
			return strings.NewReplacer("\n", "", "\r", "", " ", "", "-", "").Replace(s)
		}
		if strip(out) != strip(src) {
			t.Fatalf("jinjaTrimGuard(%q) = %q: more than whitespace and markers added", src, out)
		}
	})
}

// TestJinjaTrimGuardRawWord: a template is left unguarded only for a
// {% raw %} tag, not for "raw" in its text, comments or names (this one
// lost its "\n", which jinja2 keeps).
func TestJinjaTrimGuardRawWord(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{# draw #}{% if x %}{{ y }}\n{% endif %}", "Y\n"},
		{"{% set raw_y = y %}{% if x %}{{ raw_y }}\n{% endif %}", "Y\n"},
		{"{% raw %}{{ y }}{% endraw %}", "{{ y }}"},
	} {
		tmpl, err := NewChatTemplate(tc.src, "", "")
		if err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(nil, ChatOptions{Vars: map[string]any{"x": true, "y": "Y"}})
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q (%v), want %q (jinja2)", tc.src, got, err, tc.want)
		}
	}
}

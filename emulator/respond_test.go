package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
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
				finish: tc.finish, stopReason: tc.stop, generated: 9, hdr: openai.ChunkHeader{Created: 1700000000, Model: s.cfg.Model}}
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
		choice := func(text string, fr *string, sr any) {
			got.WriteString(text)
			if fr != nil {
				finish, stopReason = *fr, sr
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
				for _, ch := range c.Choices {
					choice(ch.Text, ch.FinishReason, ch.StopReason)
				}
			}
		} else {
			var c openai.Completion
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
				t.Fatal(err)
			}
			for _, ch := range c.Choices {
				choice(ch.Text, ch.FinishReason, ch.StopReason)
			}
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

// TestStopStringListOrder checks which stop string ends a request when a
// token's text holds several: vLLM's check_stop_strings takes the first
// one of the request's list that occurs in the new text, not the one
// starting first.
func TestStopStringListOrder(t *testing.T) {
	_, hs := testServer(t, Config{})
	for seed := 1; seed < 100; seed++ {
		_, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":"abc","max_tokens":1,"seed":%d}`, seed))
		var one openai.Completion
		if err := json.Unmarshal(body, &one); err != nil {
			t.Fatal(err)
		}
		text := one.Choices[0].Text // one token: " " and two syllables
		if len(text) != 5 || text[1:3] == text[3:5] {
			continue
		}
		first, second := text[1:3], text[3:5]
		req, _ := json.Marshal(map[string]any{"prompt": "abc", "max_tokens": 1, "seed": seed, "stop": []string{second, first}})
		_, body = post(t, hs.URL+"/v1/completions", string(req))
		var got openai.Completion
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		c := got.Choices[0]
		if want := text[:3]; c.Text != want || c.StopReason != second {
			t.Errorf("token %q, stop [%q %q]: got text %q stop_reason %v, want %q %q", text, second, first, c.Text, c.StopReason, want, second)
		}
		return
	}
	t.Fatal("no seed gave a token of two different syllables")
}

// TestStopStringTokensBatched checks a handler that takes several tokens
// at one wake-up (the loop ran ahead of it): the stop string is looked for
// token by token, as vLLM's detokenizer does at every step, so the match
// that completes first wins and usage counts the tokens up to the one that
// completed it, not those the handler took after it.
func TestStopStringTokensBatched(t *testing.T) {
	s, err := New(Config{Model: "tiny", Engine: tinyEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	toks := []uint32{101, 202, 303, 404, 505, 606}
	var words []string
	for _, tk := range toks {
		w, _ := s.render(nil, []uint32{tk}, nil)
		words = append(words, string(w))
	}
	all := strings.Join(words, "")
	// A stop string completed by token 2, and one that starts before it
	// but is completed only by token 4.
	early := strings.TrimSpace(words[2])
	late := words[1] + words[2] + words[3] + words[4]
	if strings.Count(all, early) != 1 || len(words[4]) == 0 {
		t.Skipf("words %q: %q is not unique", words, early)
	}
	st := newStream("r", 1, 100)
	st.toks = append([]uint32(nil), toks...)
	st.generated = len(toks)
	j := &job{req: &apiRequest{stops: []string{late, early}}, st: st}
	j.maxStop = len(late)
	if !s.advance(j) {
		t.Fatal("advance: got not done, want a stop-string match")
	}
	want := words[0] + words[1] + words[2][:strings.Index(words[2], early)]
	if string(j.text) != want || j.stopReason != early || j.generated != 3 {
		t.Errorf("got text %q stop %q generated %d, want %q %q 3", j.text, j.stopReason, j.generated, want, early)
	}
}

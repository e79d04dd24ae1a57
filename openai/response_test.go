package openai

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func strp(s string) *string { return &s }

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAppendChunksMatchEncodingJSON checks the hand-written chunk appenders
// against encoding/json on the exported types (differential test).
func TestAppendChunksMatchEncodingJSON(t *testing.T) {
	h := &ChunkHeader{ID: "chatcmpl-0123456789abcdef0123456789abcdef", Model: "meta-llama/Llama-3.1-8B-Instruct", Created: 1737893394}
	null := json.RawMessage("null")
	base := func(choices []ChatChunkChoice, u *Usage) ChatChunk {
		return ChatChunk{ID: h.ID, Object: ObjectChatCompletionChunk, Created: h.Created, Model: h.Model, Choices: choices, Usage: u}
	}
	first := func(role string, u *Usage) ChatChunk {
		c := base([]ChatChunkChoice{{Delta: ChatDelta{Role: role, Content: strp("")}}}, u)
		c.PromptTokenIDs = null
		return c
	}
	cbase := func(choices []CompletionChunkChoice, u *Usage) CompletionChunk {
		return CompletionChunk{ID: h.ID, Object: ObjectTextCompletion, Created: h.Created, Model: h.Model, Choices: choices, Usage: u}
	}
	running := &ChunkUsage{PromptTokens: 7, CompletionTokens: 2}
	tests := []struct {
		name string
		got  []byte
		want any
	}{
		{"chat role", AppendChatRoleChunk(nil, h, "assistant", nil, nil), first("assistant", nil)},
		{"chat role user", AppendChatRoleChunk(nil, h, "user", nil, nil), first("user", nil)},
		{"chat role usage", AppendChatRoleChunk(nil, h, "assistant", nil, &ChunkUsage{PromptTokens: 7}), first("assistant", &Usage{PromptTokens: 7, TotalTokens: 7})},
		{"chat content", AppendChatContentChunk(nil, h, " hello \"<world>\"\n", "", nil, nil, nil),
			base([]ChatChunkChoice{{Delta: ChatDelta{Content: strp(" hello \"<world>\"\n")}, TokenIDs: null}}, nil)},
		{"chat content usage", AppendChatContentChunk(nil, h, "x", "", nil, nil, running),
			base([]ChatChunkChoice{{Delta: ChatDelta{Content: strp("x")}, TokenIDs: null}}, &Usage{PromptTokens: 7, TotalTokens: 9, CompletionTokens: 2})},
		{"chat final length", AppendChatContentChunk(nil, h, " end", FinishLength, nil, nil, nil),
			base([]ChatChunkChoice{{Delta: ChatDelta{Content: strp(" end")}, FinishReason: strp(FinishLength), StopReason: null, TokenIDs: null}}, nil)},
		{"chat final stop string", AppendChatContentChunk(nil, h, "", FinishStop, StopReasonJSON(nil, "###", 0, false), nil, nil),
			base([]ChatChunkChoice{{Delta: ChatDelta{Content: strp("")}, FinishReason: strp(FinishStop), StopReason: json.RawMessage(`"###"`), TokenIDs: null}}, nil)},
		{"chat final stop token", AppendChatContentChunk(nil, h, "", FinishStop, StopReasonJSON(nil, "", 128009, true), nil, nil),
			base([]ChatChunkChoice{{Delta: ChatDelta{Content: strp("")}, FinishReason: strp(FinishStop), StopReason: json.RawMessage(`128009`), TokenIDs: null}}, nil)},
		{"chat usage", AppendUsageChunk(nil, h, ObjectChatCompletionChunk, 4096, 10, 4080),
			base([]ChatChunkChoice{}, &Usage{PromptTokens: 4096, TotalTokens: 4106, CompletionTokens: 10, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 4080}})},
		{"chat usage no details", AppendUsageChunk(nil, h, ObjectChatCompletionChunk, 5, 0, -1),
			base([]ChatChunkChoice{}, &Usage{PromptTokens: 5, TotalTokens: 5})},
		{"completion text", AppendCompletionChunk(nil, h, " tok", "", nil, nil, nil, nil),
			cbase([]CompletionChunkChoice{{Text: " tok"}}, nil)},
		{"completion final", AppendCompletionChunk(nil, h, " tok", FinishStop, StopReasonJSON(nil, "\n\n", 0, false), nil, nil, nil),
			cbase([]CompletionChunkChoice{{Text: " tok", FinishReason: strp(FinishStop), StopReason: "\n\n"}}, nil)},
		{"completion usage", AppendUsageChunk(nil, h, ObjectTextCompletion, 7, 3, 0),
			cbase([]CompletionChunkChoice{}, &Usage{PromptTokens: 7, TotalTokens: 10, CompletionTokens: 3, PromptTokensDetails: &PromptTokensDetails{}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := mustJSON(t, tt.want)
			if !bytes.Equal(tt.got, want) {
				t.Errorf("got  %s\nwant %s", tt.got, want)
			}
		})
	}
}

// TestChunkGolden pins the exact bytes of the chunks against current
// vLLM's shapes (vllm/entrypoints/openai/chat_completion/serving.py and
// completion/serving.py: chat chunks dumped with exclude_unset=True, so
// the first has the top-level prompt_token_ids and the others token_ids
// in their choice, as the serving code passes them; completions chunks
// dumped whole, usage null included).
func TestChunkGolden(t *testing.T) {
	h := &ChunkHeader{ID: "chatcmpl-e4eb", Model: "m", Created: 1737893394}
	tests := []struct{ got, want string }{
		{string(AppendChatRoleChunk(nil, h, "assistant", nil, nil)), `{"id":"chatcmpl-e4eb","object":"chat.completion.chunk","created":1737893394,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}`},
		{string(AppendChatContentChunk(nil, h, "Hi", "", nil, nil, nil)), `{"id":"chatcmpl-e4eb","object":"chat.completion.chunk","created":1737893394,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`},
		{string(AppendChatContentChunk(nil, h, "!", "length", nil, nil, nil)), `{"id":"chatcmpl-e4eb","object":"chat.completion.chunk","created":1737893394,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}`},
		{string(AppendUsageChunk(nil, h, ObjectChatCompletionChunk, 3, 2, 0)), `{"id":"chatcmpl-e4eb","object":"chat.completion.chunk","created":1737893394,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`},
		{string(AppendCompletionChunk(nil, &ChunkHeader{ID: "cmpl-1", Model: "m", Created: 1}, "a", "", nil, nil, nil, nil)), `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}`},
		{string(AppendCompletionChunk(nil, &ChunkHeader{ID: "cmpl-1", Model: "m", Created: 1}, "a", "", nil, nil, nil, &ChunkUsage{PromptTokens: 3, CompletionTokens: 1})), `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1,"prompt_tokens_details":null}}`},
	}
	for i, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%d: got  %s\nwant %s", i, tt.got, tt.want)
		}
	}
}

func TestNewID(t *testing.T) {
	tests := []struct {
		got string
		re  string
	}{
		{NewChatID(), `^chatcmpl-[0-9a-f]{32}$`},
		{NewCompletionID(), `^cmpl-[0-9a-f]{32}$`},
	}
	for _, tt := range tests {
		if !regexp.MustCompile(tt.re).MatchString(tt.got) {
			t.Errorf("got %q, want match %s", tt.got, tt.re)
		}
	}
	if a, b := NewChatID(), NewChatID(); a == b {
		t.Errorf("got two equal ids %q", a)
	}
	// The emulator makes one per request: the string is its only allocation.
	if n := testing.AllocsPerRun(100, func() { _ = NewChatID() }); n != 1 {
		t.Errorf("NewChatID: %v allocations, want 1", n)
	}
}

func TestUsageCachedTokens(t *testing.T) {
	var nilU *Usage
	tests := []struct {
		u    *Usage
		want int
	}{
		{nilU, -1},
		{&Usage{}, -1},
		{&Usage{PromptTokensDetails: &PromptTokensDetails{CachedTokens: 32}}, 32},
	}
	for _, tt := range tests {
		if got := tt.u.CachedTokens(); got != tt.want {
			t.Errorf("got %d, want %d", got, tt.want)
		}
	}
}

func TestNonStreamingShapes(t *testing.T) {
	c := Completion{ID: "cmpl-1", Object: ObjectTextCompletion, Created: 1, Model: "m",
		Choices: []CompletionChoice{{Text: "x", FinishReason: strp("length")}},
		Usage:   &Usage{PromptTokens: 1, TotalTokens: 2, CompletionTokens: 1, PromptTokensDetails: &PromptTokensDetails{}}}
	got := string(mustJSON(t, c))
	want := `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}},"kv_transfer_params":null}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	cc := ChatCompletion{ID: "chatcmpl-1", Object: ObjectChatCompletion, Created: 1, Model: "m",
		Choices: []ChatChoice{{Message: ChatMessage{Role: "assistant", Content: "hi", ToolCalls: []any{}}, FinishReason: "stop"}},
		Usage:   &Usage{PromptTokens: 1, TotalTokens: 2, CompletionTokens: 1}}
	got = string(mustJSON(t, cc))
	want = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning":null},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1},"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "a\"b\\c", "<&>", "\x00\x01\x1f\x7f", "\u2028\u2029", "\xff\xfe", "日本語", "\b\f\t\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := AppendJSONString(nil, s)
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}

func BenchmarkAppendChatContentChunk(b *testing.B) {
	b.ReportAllocs()
	h := &ChunkHeader{ID: NewChatID(), Model: "meta-llama/Llama-3.1-8B-Instruct", Created: 1737893394}
	buf := make([]byte, 0, 512)
	for b.Loop() {
		buf = AppendChatContentChunk(buf[:0], h, " token", "", nil, nil, nil)
	}
}

// BenchmarkAppendJSONString: a whole response's generated text, plain
// words and punctuation (the emulator's), and text with something to
// escape every 40 bytes.
func BenchmarkAppendJSONString(b *testing.B) {
	for _, tc := range []struct{ name, unit string }{
		{"plain", " bako tiru, mepa sodi. Dilo kani wuze"},
		{"quoted", " bako tiru, mepa so. Dilo \"quoted\" kani"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			text := strings.Repeat(tc.unit, 120)
			buf := make([]byte, 0, 2*len(text))
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendJSONString(buf[:0], text)
			}
		})
	}
}

// TestAppendJSONStringPositions compares AppendJSONString with
// encoding/json on strings of every length up to 24 with a byte to
// escape, or a multi-byte character, at each position: the eight-byte
// checks, the last eight bytes' and the byte-by-byte path all meet them.
func TestAppendJSONStringPositions(t *testing.T) {
	for n := range 25 {
		base := strings.Repeat("x", n)
		for i := range n {
			for _, c := range []string{"\"", "\\", "<", "&", "\x00", "\x1f", "\x7f", "\xff", "é", "\u2028", " "} {
				s := base[:i] + c + base[i+1:]
				want, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				if got := AppendJSONString(nil, s); !bytes.Equal(got, want) {
					t.Errorf("AppendJSONString(%q) = %s, want %s", s, got, want)
				}
			}
		}
	}
}

// TestChunkHeaderReuse: a header's JSON kept from one chunk is made again
// when the object or a field changes: every chunk equals the one a fresh
// header writes.
func TestChunkHeaderReuse(t *testing.T) {
	h := &ChunkHeader{ID: "chatcmpl-1", Model: "m", Created: 1}
	check := func(step string, got []byte, want func(*ChunkHeader) []byte) {
		t.Helper()
		fresh := *h
		fresh.pre = nil
		if w := want(&fresh); !bytes.Equal(got, w) {
			t.Errorf("%s: got %s, want %s", step, got, w)
		}
	}
	content := func(h *ChunkHeader) []byte { return AppendChatContentChunk(nil, h, "x", "", nil, nil, nil) }
	usage := func(h *ChunkHeader) []byte { return AppendUsageChunk(nil, h, ObjectTextCompletion, 1, 2, 3) }
	check("first", content(h), content)
	check("again", content(h), content)
	check("other object", usage(h), usage)
	check("object back", content(h), content)
	h.ID = "chatcmpl-2"
	check("id", content(h), content)
	h.Model = "n<&>"
	check("model", content(h), content)
	h.Created = 7
	check("created", content(h), content)
}

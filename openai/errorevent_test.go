package openai

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestEndsWithErrorEvent: a stream's last event before [DONE] is told an
// error event, with its HTTP status when its code is one, in the forms
// vLLM, SGLang and llama.cpp write, with each line ending SSE allows.
func TestEndsWithErrorEvent(t *testing.T) {
	chunk := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"an \"error\": here"}}]}` + "\n\n"
	for _, tc := range []struct {
		name   string
		stream string
		status int
		ok     bool
	}{
		{"vLLM generation error after tokens", chunk + `data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}` + "\n\ndata: [DONE]\n\n", 500, true},
		{"vLLM refusal", `data: {"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}` + "\n\ndata: [DONE]\n\n", 400, true},
		{"SGLang json.dumps", `data: {"error": {"object": "error", "message": "The following requested LoRA adapters are not loaded", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\ndata: [DONE]\n\n", 400, true},
		{"no [DONE]", chunk + `data: {"error":{"code":503,"message":"x"}}` + "\n\n", 503, true},
		{"CRLF", chunk + "data: {\"error\":{\"code\":500}}\r\n\r\ndata: [DONE]\r\n\r\n", 500, true},
		{"CR", "data: {}\r\rdata: {\"error\":{\"code\":502}}\r\rdata: [DONE]\r\r", 502, true},
		{"data lines joined", "data: {\"error\":\ndata: {\"code\":504}}\n\ndata: [DONE]\n\n", 504, true},
		{"comment and event field", "event: error\n: note\ndata: {\"error\":{\"code\":500}}\n\n", 500, true},
		{"llama.cpp's error: field (before PR 16109)", chunk + `error: {"code":500,"message":"x","type":"server_error"}` + "\n\n", 500, true},
		{"string code", `data: {"error":{"message":"x","type":"invalid_request_error","code":"context_length_exceeded"}}` + "\n\n", 0, true},
		{"code out of range", `data: {"error":{"code":42}}` + "\n\n", 0, true},
		{"error text", `data: {"error":"model not loaded"}` + "\n\n", 0, true},
		{"no trailing blank line", chunk + `data: {"error":{"code":500}}`, 500, true},
		{"whole stream", chunk + "data: [DONE]\n\n", 0, false},
		{"usage last", chunk + `data: {"id":"x","choices":[],"usage":{"prompt_tokens":3}}` + "\n\ndata: [DONE]\n\n", 0, false},
		{"error before the last event", `data: {"error":{"code":500}}` + "\n\n" + chunk + "data: [DONE]\n\n", 0, false},
		{"null error", `data: {"error":null}` + "\n\n", 0, false},
		{"error not at top level", `data: {"choices":[{"error":{"code":500}}]}` + "\n\n", 0, false},
		{"not JSON", "data: \"error\"\n\n", 0, false},
		{"cut mid-line", `ror":{"code":500}}` + "\n\ndata: [DONE]\n\n", 0, false},
		{"only [DONE]", "data: [DONE]\n\n", 0, false},
		{"empty", "", 0, false},
	} {
		status, ok := EndsWithErrorEvent([]byte(tc.stream))
		if status != tc.status || ok != tc.ok {
			t.Errorf("%s: EndsWithErrorEvent = %d, %v; want %d, %v", tc.name, status, ok, tc.status, tc.ok)
		}
	}
}

// TestEndsWithErrorEventInTail: the router's own error events
// (AppendErrorEvent) are found in a UsageTail after a long stream.
func TestEndsWithErrorEventInTail(t *testing.T) {
	var tail UsageTail
	for range 200 {
		tail.Add([]byte(`data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n"))
	}
	tail.Add(AppendErrorEvent([]byte("\n\n"), &kvroute.Error{Status: http.StatusBadGateway, Type: kvroute.TypeUpstream, Message: "broke"}))
	if status, ok := EndsWithErrorEvent(tail.Bytes()); !ok || status != http.StatusBadGateway {
		t.Fatalf("EndsWithErrorEvent = %d, %v; want 502, true", status, ok)
	}
	tail.Add([]byte(`data: {"choices":[]}` + "\n\ndata: [DONE]\n\n"))
	if status, ok := EndsWithErrorEvent(tail.Bytes()); ok {
		t.Fatalf("EndsWithErrorEvent after a chunk = %d, %v; want false", status, ok)
	}
}

// FuzzEndsWithErrorEvent builds a stream of events, the last one an error
// event or not, with fuzzed payload text, line endings and a cut of its
// start, and checks the answer against the construction. Any bytes at all
// must not panic.
func FuzzEndsWithErrorEvent(f *testing.F) {
	f.Add("hello", uint8(0), 500, true, true, 0)
	f.Add("a\"error\"b", uint8(1), 400, false, false, 3)
	f.Add("\r\n\n", uint8(2), 42, true, false, 100)
	f.Fuzz(func(t *testing.T, text string, eol uint8, code int, isErr, done bool, cut int) {
		EndsWithErrorEvent([]byte(text)) // raw bytes: no panic
		nl := []string{"\n", "\r\n", "\r"}[eol%3]
		content := AppendJSONString(nil, text)
		var b strings.Builder
		b.WriteString("data: {\"choices\":[{\"delta\":{\"content\":" + string(content) + "}}]}" + nl + nl)
		last := b.Len()
		if isErr {
			b.WriteString(`data: {"error":{"message":` + string(content) + `,"code":` + strconv.Itoa(code) + "}}" + nl + nl)
		} else {
			b.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":` + strconv.Itoa(code) + "}}" + nl + nl)
		}
		if done {
			b.WriteString("data: [DONE]" + nl + nl)
		}
		s := b.String()
		if cut < 0 {
			cut = -cut
		}
		cut %= last + 1 // never into the last event
		status, ok := EndsWithErrorEvent([]byte(s[cut:]))
		want := 0
		if code >= 100 && code <= 599 {
			want = code
		}
		if ok != isErr || ok && status != want {
			t.Fatalf("%q: EndsWithErrorEvent = %d, %v; want %d, %v", s[cut:], status, ok, want, isErr)
		}
	})
}

// BenchmarkEndsWithErrorEvent: the check every stream passed on whole
// gets at its end, on a usual stream's tail (a usage chunk, then [DONE]).
func BenchmarkEndsWithErrorEvent(b *testing.B) {
	var tail UsageTail
	for range 20 {
		tail.Add([]byte(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}` + "\n\n"))
	}
	tail.Add([]byte(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":512,"total_tokens":612,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":256}}}` + "\n\ndata: [DONE]\n\n"))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := EndsWithErrorEvent(tail.Bytes()); ok {
			b.Fatal("an error event")
		}
	}
}

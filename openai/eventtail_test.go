package openai

import (
	"bytes"
	"testing"
)

// TestEventTail: the end of an event and the final [DONE] event are told
// with each line ending the SSE format allows, across writes of any size.
func TestEventTail(t *testing.T) {
	for _, tc := range []struct {
		stream         string
		boundary, done bool
	}{
		{"", false, false},
		{"data: {}\n\n", true, false},
		{"data: {}\r\n\r\n", true, false},
		{"data: {}\r\r", true, false},
		{"data: {}\n", false, false},
		{"data: {}\r\n", false, false},
		{"data: {\"a\":", false, false},
		{"data: {}\n\ndata: [DONE]\n\n", true, true},
		{"data: {}\r\n\r\ndata: [DONE]\r\n\r\n", true, true},
		{"data: {}\r\rdata: [DONE]\r\r", true, true},
		{"data: [DONE]\n\n", true, true},
		{"data: [DONE]\n", false, false},
		{"data: [DONE]\n\ndata: {}\n\n", true, false},
	} {
		for _, size := range []int{1, 3, 1000} {
			var tail EventTail
			for s := tc.stream; s != ""; {
				n := min(size, len(s))
				tail.Add([]byte(s[:n]))
				s = s[n:]
			}
			if got := tail.AtBoundary(); got != tc.boundary {
				t.Errorf("%q in writes of %d: AtBoundary = %v, want %v", tc.stream, size, got, tc.boundary)
			}
			if got := tail.SawDone(); got != tc.done {
				t.Errorf("%q in writes of %d: SawDone = %v, want %v", tc.stream, size, got, tc.done)
			}
		}
	}
}

// TestEventHead: a stream opens with an error event when its first event's
// data is a JSON object whose first member is "error", in vLLM's compact
// form or SGLang's json.dumps form, however the bytes arrive.
func TestEventHead(t *testing.T) {
	for _, tc := range []struct {
		chunks []string
		want   bool
	}{
		{[]string{`data: {"error": {"object": "error", "message": "The following requested LoRA adapters are not loaded"}}` + "\n\n"}, true},
		{[]string{`data: {"error":{"message":"x","code":400}}` + "\n\n"}, true},
		{[]string{"da", "ta:", ` {`, ` "err`, `or"`, ` :`, ` {}}` + "\n\n"}, true},
		{[]string{"data:{\"error\":null}\n\n"}, true},
		{[]string{`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[]}` + "\n\n"}, false},
		{[]string{`data: {"errors":[]}` + "\n\n"}, false},
		{[]string{`data: {"id":"x","error":{}}` + "\n\n"}, false}, // not its first member
		{[]string{`data: [DONE]` + "\n\n"}, false},
		{[]string{`: comment` + "\n\n" + `data: {"error":{}}` + "\n\n"}, false},
		{[]string{`{"error":{}}`}, false}, // not an event stream
		{nil, false},
	} {
		var h EventHead
		for _, c := range tc.chunks {
			h.Add([]byte(c))
		}
		if got := h.StartsWithError(); got != tc.want {
			t.Errorf("%q: got %v, want %v", tc.chunks, got, tc.want)
		}
	}
}

// FuzzEventHead: EventHead's answer does not depend on how the stream's
// bytes are split into writes, and it says a stream opens with an error
// event only when the stream starts with a data field whose value is a
// JSON object beginning with the member "error".
func FuzzEventHead(f *testing.F) {
	for _, s := range []string{
		`data: {"error": {"object": "error", "message": "m", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\n",
		`data: {"error":{"message":"x"}}` + "\n\n",
		`data: {"id":"x","error":{}}` + "\n\n",
		"data:\t{ \"error\" :null}",
		": c\n\ndata: {\"error\":1}\n\n",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, split uint8) {
		var whole, parts EventHead
		whole.Add(stream)
		for rest, n := stream, int(split%16)+1; len(rest) > 0; rest = rest[min(n, len(rest)):] {
			parts.Add(rest[:min(n, len(rest))])
		}
		got := whole.StartsWithError()
		if parts.StartsWithError() != got {
			t.Fatalf("%q: %v whole, %v in writes of %d", stream, got, !got, int(split%16)+1)
		}
		if !got {
			return
		}
		p, ok := bytes.CutPrefix(stream, []byte("data:"))
		if !ok {
			t.Fatalf("%q: an error event without a data field first", stream)
		}
		p = bytes.TrimLeft(p, " \t")
		if !bytes.HasPrefix(p, []byte("{")) || !bytes.Contains(p, []byte(`"error"`)) {
			t.Fatalf("%q: an error event whose data is not an object with \"error\" first", stream)
		}
	})
}

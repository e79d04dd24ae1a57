package openai

import (
	"bytes"
	"testing"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name               string
		tail               string
		wantPrompt, wantCa int
		wantOK             bool
	}{
		{"non-streaming", `{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":120,"total_tokens":124,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":96}}}`, 120, 96, true},
		{"no details", `{"choices":[],"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}}`, 7, -1, true},
		{"spaces", `{"usage": { "prompt_tokens" : 5, "prompt_tokens_details": {"cached_tokens": 3} } }`, 0, -1, false},
		{"spaces after colon", `{"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3}}}`, 5, 3, true},
		{"stream usage chunk", "data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"total_tokens\":65,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\ndata: [DONE]\n\n", 64, 48, true},
		{"last usage null", "data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":null}\n\n", 0, -1, false},
		{"no usage", `{"choices":[{"text":"hi"}]}`, 0, -1, false},
		{"cut off", `{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached`, 0, -1, false},
		{"escaped in text", `{"choices":[{"text":"say \"usage\":{\"prompt_tokens\":9}"}]}`, 0, -1, false},
		{"empty", ``, 0, -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, c, ok := ParseUsage([]byte(tc.tail))
			if p != tc.wantPrompt || c != tc.wantCa || ok != tc.wantOK {
				t.Errorf("got (%d, %d, %v), want (%d, %d, %v)", p, c, ok, tc.wantPrompt, tc.wantCa, tc.wantOK)
			}
		})
	}
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":120,"prompt_tokens_details":{"cached_tokens":96}}}`))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`"usage":{{{{`))
	f.Add([]byte(`"usage":{"prompt_tokens":99999999999999999999999}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, c, ok := ParseUsage(b)
		if p < 0 || (!ok && (p != 0 || c != -1)) || c < -1 {
			t.Fatalf("ParseUsage(%q) = (%d, %d, %v)", b, p, c, ok)
		}
	})
}

// TestUsageTail: the tail holds exactly the last UsageTailSize bytes, whatever
// the write sizes.
func TestUsageTail(t *testing.T) {
	var all []byte
	var tail UsageTail
	for i, n := range []int{10, 3000, 1, 2047, 2048, 5, 700, 1500} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		p[len(p)-1] = byte('0' + i)
		all = append(all, p...)
		tail.Add(p)
		want := all[max(0, len(all)-UsageTailSize):]
		if !bytes.Equal(tail.Bytes(), want) {
			t.Fatalf("after write %d (%d bytes): tail differs from the last %d bytes", i, n, len(want))
		}
	}
}

// TestCachedTokensOf: an engine's absent count is unknown until it has
// reported one, then 0 (vLLM leaves prompt_tokens_details out when no
// token was cached).
func TestCachedTokensOf(t *testing.T) {
	var c CachedTokens
	for i, step := range []struct{ in, want int }{{-1, -1}, {0, 0}, {-1, 0}, {256, 256}, {-1, 0}} {
		if got := c.Of(step.in); got != step.want {
			t.Errorf("step %d: Of(%d) = %d, want %d", i, step.in, got, step.want)
		}
	}
}

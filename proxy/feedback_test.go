package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
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
			p, c, ok := parseUsage([]byte(tc.tail))
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
		p, c, ok := parseUsage(b)
		if p < 0 || (!ok && (p != 0 || c != -1)) || c < -1 {
			t.Fatalf("parseUsage(%q) = (%d, %d, %v)", b, p, c, ok)
		}
	})
}

// TestUsageTail: the tail holds exactly the last tailSize bytes, whatever
// the write sizes.
func TestUsageTail(t *testing.T) {
	var all []byte
	var tail usageTail
	for i, n := range []int{10, 3000, 1, 2047, 2048, 5, 700, 1500} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		p[len(p)-1] = byte('0' + i)
		all = append(all, p...)
		tail.write(p)
		want := all[max(0, len(all)-tailSize):]
		if !bytes.Equal(tail.bytes(), want) {
			t.Fatalf("after write %d (%d bytes): tail differs from the last %d bytes", i, n, len(want))
		}
	}
}

// engineUsage answers like vLLM with prompt_tokens_details: a completion
// whose usage ends the body, or a stream whose last chunk carries usage.
func engineUsage(prompt, cached int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		if !strings.Contains(body.String(), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			b := []byte(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":`)
			b = openai.AppendUsage(b, prompt, 2, cached)
			w.Write(append(b, '}'))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		// A long stream: the usage chunk arrives well past any buffer.
		for i := range 200 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"token %d of a long answer\"}],\"usage\":null}\n\n", i)
		}
		b := []byte(`data: {"choices":[],"usage":`)
		b = openai.AppendUsage(b, prompt, 200, cached)
		fmt.Fprintf(w, "%s}\n\ndata: [DONE]\n\n", b)
	}
}

// TestCachedTokensFeedback: the engine's cached tokens reach learning
// policies (kvroute.Outcome) and the per-endpoint counters, from
// non-streaming bodies and from the final usage chunk of streams.
func TestCachedTokensFeedback(t *testing.T) {
	be := newBackend(t, "a", engineUsage(300, 256))
	pickers := map[string]*learner{}
	tp := newTestProxyWith(t, testConfig("learn", be.URL), func(name string, params map[string]any, seed uint64) (kvroute.Picker, error) {
		l := &learner{}
		pickers[name] = l
		return l, nil
	})
	for _, body := range []string{
		`{"model":"m","prompt":"hello","max_tokens":2}`,
		`{"model":"m","prompt":"hello","max_tokens":200,"stream":true,"stream_options":{"include_usage":true}}`,
	} {
		resp := tp.post(t, "/v1/completions", body)
		if got := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(got, `"cached_tokens":256`) {
			t.Fatalf("status %d body %.200s", resp.StatusCode, got)
		}
	}
	waitFor(t, "two outcomes", func() bool { return len(pickers["learn"].got()) == 2 })
	outs := pickers["learn"].got()
	if len(outs) != 2 {
		t.Fatalf("got %d outcomes, want 2", len(outs))
	}
	for i, o := range outs {
		if o.PromptTokens != 300 || o.CachedTokens != 256 {
			t.Errorf("outcome %d: prompt %d cached %d, want 300 and 256", i, o.PromptTokens, o.CachedTokens)
		}
	}
	if got := tp.metric(t, tp.fb.cached, "m", be.URL); got != 512 {
		t.Errorf("kvroute_prefix_cached_tokens_total: got %v, want 512", got)
	}
	if got := tp.metric(t, tp.fb.prompt, "m", be.URL); got != 600 {
		t.Errorf("kvroute_prompt_tokens_total: got %v, want 600", got)
	}
}

// TestNoUsageLeavesCachedUnknown: an engine that reports no usage leaves
// Outcome.CachedTokens at -1 and the counters untouched.
func TestNoUsageLeavesCachedUnknown(t *testing.T) {
	be := newBackend(t, "a", okHandler("a"))
	var l *learner
	tp := newTestProxyWith(t, testConfig("learn", be.URL), func(string, map[string]any, uint64) (kvroute.Picker, error) {
		l = &learner{}
		return l, nil
	})
	readAll(t, tp.post(t, "/v1/completions", `{"model":"m","prompt":"hello"}`))
	waitFor(t, "an outcome", func() bool { return len(l.got()) == 1 })
	outs := l.got()
	if len(outs) != 1 || outs[0].CachedTokens != -1 {
		t.Fatalf("outcomes %+v, want one with CachedTokens -1", outs)
	}
	if got := tp.metric(t, tp.fb.prompt, "m", be.URL); got != 0 {
		t.Errorf("kvroute_prompt_tokens_total: got %v, want 0", got)
	}
}

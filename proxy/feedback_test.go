package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

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

// TestAbsentCachedTokensAfterReported: vLLM with
// --enable-prompt-tokens-details leaves prompt_tokens_details out of an
// answer that had no prompt token cached. Before the endpoint has reported
// a count, an answer without one is unknown (-1, not counted); once it
// has, an answer without one cached 0 tokens, in the outcome and in the
// counters (the hit rate's denominator). Before, every such miss was left
// out of the denominator and the hit rate read high.
func TestAbsentCachedTokensAfterReported(t *testing.T) {
	cached := []int{-1, 256, -1, -1} // the engine's answers, in order
	var n atomic.Int32
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		engineUsage(300, cached[int(n.Add(1))-1])(w, r)
	})
	var l *learner
	tp := newTestProxyWith(t, testConfig("learn", be.URL), func(string, map[string]any, uint64) (kvroute.Picker, error) {
		l = &learner{}
		return l, nil
	})
	for i := range cached {
		stream := i%2 == 1
		body := `{"model":"m","prompt":"hello","max_tokens":2}`
		if stream {
			body = `{"model":"m","prompt":"hello","max_tokens":200,"stream":true,"stream_options":{"include_usage":true}}`
		}
		readAll(t, tp.post(t, "/v1/completions", body))
		waitFor(t, "an outcome", func() bool { return len(l.got()) == i+1 })
	}
	var got []int
	for _, o := range l.got() {
		got = append(got, o.CachedTokens)
	}
	if want := []int{-1, 256, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("outcomes' cached tokens %v, want %v", got, want)
	}
	if got := tp.metric(t, tp.fb.cached, "m", be.URL); got != 256 {
		t.Errorf("kvroute_prefix_cached_tokens_total: got %v, want 256", got)
	}
	if got := tp.metric(t, tp.fb.prompt, "m", be.URL); got != 900 {
		t.Errorf("kvroute_prompt_tokens_total: got %v, want 900 (the three answers after the first count)", got)
	}
}

// TestStreamErrorEventFails: a stream the engine opens with an error event
// in a 200 (vLLM's error before the first token; SGLang's refusal of an
// adapter it does not serve) is passed on as it is, but is a failed
// outcome with no TTFT: its first bytes are no first token, and a policy
// that learns its rates from TTFTs must not take it for a fast prefill.
// A stream whose error comes after its first token keeps its TTFT.
func TestStreamErrorEventFails(t *testing.T) {
	const refusal = `data: {"error": {"object": "error", "message": "not loaded", "type": "BadRequestError", "param": null, "code": 400}}` +
		"\n\ndata: [DONE]\n\n"
	const late = `data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n" +
		`data: {"error":{"message":"engine died","type":"InternalServerError","code":500}}` + "\n\ndata: [DONE]\n\n"
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(body.String(), "late") {
			w.Write([]byte(late))
			return
		}
		w.Write([]byte(refusal))
	})
	var l *learner
	tp := newTestProxyWith(t, testConfig("learn", be.URL), func(string, map[string]any, uint64) (kvroute.Picker, error) {
		l = &learner{}
		return l, nil
	})
	for i, c := range []struct{ prompt, want string }{{"hello", refusal}, {"late", late}} {
		resp := tp.post(t, "/v1/completions", `{"model":"m","prompt":"`+c.prompt+`","stream":true}`)
		if got := readAll(t, resp); resp.StatusCode != http.StatusOK || got != c.want {
			t.Fatalf("%s: got %d %q, want 200 %q", c.prompt, resp.StatusCode, got, c.want)
		}
		waitFor(t, "an outcome", func() bool { return len(l.got()) == i+1 })
	}
	// (The test proxy's clock stands still: a TTFT is 0 either way.)
	outs := l.got()
	if o := outs[0]; !o.Failed || o.TTFT != 0 {
		t.Errorf("a stream opening with an error event: Failed %v, TTFT %v; want a failure with no TTFT", o.Failed, o.TTFT)
	}
	if o := outs[1]; o.Failed {
		t.Errorf("a stream whose error follows its first token: a failed outcome, want one with its TTFT")
	}
}

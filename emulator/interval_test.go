package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

// TestStreamInterval checks --stream-interval on the wire: a streamed
// completion sends its first token at once, then a chunk every interval
// tokens, and the rest with the finish reason (vLLM's output processor:
// first token, every stream_interval tokens, last). Chunks may only merge
// (a handler woken late takes what accumulated), so with interval k every
// chunk but the last ends at a token count 1 + m*k; the text is the same
// as without streaming.
func TestStreamInterval(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	const maxTokens = 25
	for _, tc := range []struct {
		interval  int
		stop      string
		maxChunks int
	}{
		{1, "", maxTokens},
		{10, "", 4},
		{10, "never matches", 4},
		{7, "", 5},
		{40, "", 2},
	} {
		t.Run(fmt.Sprintf("interval%d/stop=%q", tc.interval, tc.stop), func(t *testing.T) {
			_, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1, StreamInterval: tc.interval})
			stop := ""
			if tc.stop != "" {
				stop = fmt.Sprintf(`,"stop":[%q]`, tc.stop)
			}
			body := `{"prompt":"the interval test","max_tokens":25,"ignore_eos":true,"seed":7` + stop
			code, whole := post(t, hs.URL+"/v1/completions", body+`}`)
			if code != http.StatusOK {
				t.Fatalf("non-streamed: status %d: %s", code, whole)
			}
			var want openai.Completion
			if err := json.Unmarshal(whole, &want); err != nil {
				t.Fatal(err)
			}
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(
				body+`,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			events := readStream(t, resp.Body)
			var text strings.Builder
			var counts []int
			finish := ""
			for _, e := range events {
				if e == openai.Done {
					break
				}
				var c openai.CompletionChunk
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("chunk %q: %v", e, err)
				}
				if len(c.Choices) == 0 {
					continue // the usage chunk
				}
				text.WriteString(c.Choices[0].Text)
				counts = append(counts, c.Usage.CompletionTokens)
				if c.Choices[0].FinishReason != nil {
					finish = *c.Choices[0].FinishReason
				}
			}
			if got, want := text.String(), want.Choices[0].Text; got != want {
				t.Errorf("streamed text %q, want the non-streamed %q", got, want)
			}
			if len(counts) == 0 || counts[len(counts)-1] != maxTokens || finish != "length" {
				t.Fatalf("chunk token counts %v, finish %q: want the last at %d with length", counts, finish, maxTokens)
			}
			if len(counts) > tc.maxChunks {
				t.Errorf("%d content chunks %v, want at most %d", len(counts), counts, tc.maxChunks)
			}
			for i, c := range counts[:len(counts)-1] {
				if (c-1)%tc.interval != 0 || i > 0 && c <= counts[i-1] {
					t.Errorf("chunk %d ends at token %d (all: %v): want 1 + a multiple of %d, increasing", i, c, counts, tc.interval)
				}
			}
		})
	}
}

// TestQuietRunWakes checks that the loop sleeps through the plain decode
// steps nobody observes: a non-streamed request costs a few wake-ups, not
// one per step, while a streamed one is woken for every token (or every
// interval tokens) it is sent.
func TestQuietRunWakes(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		stream           bool
		interval         int
		minWake, maxWake int64
	}{
		{"whole", false, 1, 1, 6},
		{"stream", true, 1, 50, 70},
		{"stream-interval-10", true, 10, 6, 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1, StreamInterval: tc.interval})
			code, body := post(t, hs.URL+"/v1/completions",
				fmt.Sprintf(`{"prompt":"sleep through","max_tokens":60,"ignore_eos":true,"stream":%v}`, tc.stream))
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			steps := s.metrics.stats().st.Steps
			if got := s.timerSleeps.Load(); got < tc.minWake || got > tc.maxWake {
				t.Errorf("%d timed wake-ups for %d steps, want %d..%d", got, steps, tc.minWake, tc.maxWake)
			}
			if steps < 60 {
				t.Errorf("%d steps, want at least 60", steps)
			}
		})
	}
}

// TestQuietRunDefers: a non-streamed request arriving while the loop sleeps
// through another one's decode run joins the model at its arrival step
// without a wake-up of its own; both complete with their tokens, and the
// loop still wakes only a few times.
func TestQuietRunDefers(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	s, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
	type result struct {
		code int
		body []byte
	}
	first := make(chan result, 1)
	go func() {
		code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"the long one","max_tokens":80,"ignore_eos":true}`)
		first <- result{code, body}
	}()
	time.Sleep(100 * time.Millisecond) // into the first one's decode run
	code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"the short one","max_tokens":30,"ignore_eos":true}`)
	r := <-first
	for i, got := range []result{r, {code, body}} {
		var c openai.Completion
		if got.code != http.StatusOK || json.Unmarshal(got.body, &c) != nil || c.Usage == nil {
			t.Fatalf("request %d: status %d: %s", i, got.code, got.body)
		}
		if want := []int{80, 30}[i]; c.Usage.CompletionTokens != want {
			t.Errorf("request %d: %d completion tokens, want %d", i, c.Usage.CompletionTokens, want)
		}
	}
	steps := s.metrics.stats().st.Steps
	if got := s.timerSleeps.Load(); got > 10 || steps < 80 {
		t.Errorf("%d timed wake-ups for %d steps, want at most 10 for at least 80", got, steps)
	}
}

// TestQuietRunInProgress: requests arriving one after another while the
// loop sleeps through decode runs (each arrival joins the model at its step
// without a wake-up, and lengthens the run being slept through). When the
// loop wakes at the old end of a run, the step then in progress and the
// rest of the run are slept through at once: about one timed wake-up per
// request (its finish), not one more per arrival. All complete with their
// tokens.
func TestQuietRunInProgress(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	s, hs := testServer(t, Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
	const n = 8
	type result struct {
		code int
		body []byte
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			code, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":"request %d","max_tokens":60,"ignore_eos":true}`, i))
			results <- result{code, body}
		}()
		time.Sleep(40 * time.Millisecond) // a few steps: the arrival lands in a run being slept through
	}
	for range n {
		r := <-results
		var c openai.Completion
		if r.code != http.StatusOK || json.Unmarshal(r.body, &c) != nil || c.Usage == nil {
			t.Fatalf("status %d: %s", r.code, r.body)
		}
		if c.Usage.CompletionTokens != 60 {
			t.Errorf("%d completion tokens, want 60", c.Usage.CompletionTokens)
		}
	}
	steps := s.metrics.stats().st.Steps
	t.Logf("%d timed wake-ups for %d steps", s.timerSleeps.Load(), steps)
	if got := s.timerSleeps.Load(); got > n+n/2 || steps < 60 {
		t.Errorf("%d timed wake-ups for %d steps and %d requests, want at most %d for at least 60 steps", got, steps, n, n+n/2)
	}
}

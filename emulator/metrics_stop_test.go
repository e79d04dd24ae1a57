package emulator

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

// TestMetricsStopStringTokens: vLLM counts a request's generated tokens,
// and records its finish, in its front end's output processor, which also
// matches the stop strings after each engine step; a request a stop string
// ended is gone there, so the tokens the engine produced after that step
// (before its abort reached the engine) are counted nowhere:
// vllm:generation_tokens_total and request_generation_tokens have the
// tokens up to the match, the usage's completion_tokens. The emulator
// counted what its engine produced: one step more (Speed 1), or at a high
// Speed every token up to max_tokens (the engine runs ahead of the
// handler that matches) with the finish counted as length; and it
// observed an inter-token latency for each of those tokens.
func TestMetricsStopStringTokens(t *testing.T) {
	for _, speed := range []float64{1, 1000} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("speed %v stream %v", speed, stream), func(t *testing.T) {
				_, hs := testServer(t, Config{Speed: speed})
				_, body := post(t, hs.URL+"/v1/completions", `{"prompt":"abc","max_tokens":30,"seed":9,"ignore_eos":true}`)
				var full openai.Completion
				if err := json.Unmarshal(body, &full); err != nil {
					t.Fatal(err)
				}
				words := strings.Fields(full.Choices[0].Text)
				if len(words) < 6 {
					t.Fatalf("got %q, want 6+ words", full.Choices[0].Text)
				}
				stopAt := countStop(t, hs.URL, words[4], false)
				if stream {
					// The streamed response's tokens are the same as the
					// whole one's (same seed).
					if got := countStop(t, hs.URL, words[4], true); got != stopAt {
						t.Fatalf("streamed completion_tokens %d, whole %d", got, stopAt)
					}
				}
				reqs := 2
				if stream {
					reqs = 3
				}
				var mfs map[string]*dto.MetricFamily
				waitFor(t, "the finishes recorded", func() bool {
					mfs = scrape(t, hs.URL)
					n := 0
					for _, m := range mfs["vllm:request_success_total"].GetMetric() {
						n += int(value(m))
					}
					return n == reqs
				})
				gen := 30 + (reqs-1)*stopAt
				if got := value(mfs["vllm:generation_tokens_total"].GetMetric()[0]); got != float64(gen) {
					t.Errorf("generation_tokens_total: got %v, want %d (30 + %d x %d up to the stop string)", got, gen, reqs-1, stopAt)
				}
				// vLLM's iteration_tokens_total counts, step by step, the
				// same prompt and generated tokens as the two counters.
				prompt := value(mfs["vllm:prompt_tokens_total"].GetMetric()[0])
				iter := mfs["vllm:iteration_tokens_total"].GetMetric()[0].GetHistogram()
				if want := prompt + float64(gen); iter.GetSampleSum() != want {
					t.Errorf("iteration_tokens_total: got sum %v, want %v (prompt_tokens_total + generation_tokens_total)", iter.GetSampleSum(), want)
				}
				// vLLM observes an inter-token latency for each token it
				// counted after a request's first: none after the match.
				itl := mfs["vllm:inter_token_latency_seconds"].GetMetric()[0].GetHistogram()
				if want := uint64(29 + (reqs-1)*(stopAt-1)); itl.GetSampleCount() != want {
					t.Errorf("inter_token_latency_seconds: got count %d, want %d (29 + %d x %d up to the stop string)", itl.GetSampleCount(), want, reqs-1, stopAt-1)
				}
				// Its finish ends at the match too: a request's decode time
				// is the sum of its inter-token latencies, its end-to-end
				// latency its queue, prefill and decode times.
				sum := func(name string) float64 { return mfs[name].GetMetric()[0].GetHistogram().GetSampleSum() }
				if dec := sum("vllm:request_decode_time_seconds"); math.Abs(dec-itl.GetSampleSum()) > 1e-9 {
					t.Errorf("request_decode_time_seconds: got sum %v, want %v (inter_token_latency_seconds' sum)", dec, itl.GetSampleSum())
				}
				phases := sum("vllm:request_queue_time_seconds") + sum("vllm:request_prefill_time_seconds") + sum("vllm:request_decode_time_seconds")
				if e2e := sum("vllm:e2e_request_latency_seconds"); math.Abs(e2e-phases) > 1e-9 {
					t.Errorf("e2e_request_latency_seconds: got sum %v, want %v (queue + prefill + decode)", e2e, phases)
				}
				h := mfs["vllm:request_generation_tokens"].GetMetric()[0].GetHistogram()
				if h.GetSampleCount() != uint64(reqs) || h.GetSampleSum() != float64(gen) {
					t.Errorf("request_generation_tokens: got count %d sum %v, want %d and %d", h.GetSampleCount(), h.GetSampleSum(), reqs, gen)
				}
				for _, m := range mfs["vllm:request_success_total"].GetMetric() {
					reason, want := labelsOf(m)["finished_reason"], 0.0
					switch reason {
					case "length":
						want = 1
					case "stop":
						want = float64(reqs - 1)
					}
					if got := value(m); got != want {
						t.Errorf("request_success_total{finished_reason=%q}: got %v, want %v", reason, got, want)
					}
				}
			})
		}
	}
}

// countStop sends the seed's request with stop string stop and returns its
// completion tokens.
func countStop(t *testing.T, url, stop string, stream bool) int {
	t.Helper()
	r := map[string]any{"prompt": "abc", "max_tokens": 30, "seed": 9, "ignore_eos": true, "stop": []string{stop}}
	if stream {
		r["stream"], r["stream_options"] = true, map[string]any{"include_usage": true}
	}
	req, _ := json.Marshal(r)
	code, body := post(t, url+"/v1/completions", string(req))
	if code != 200 {
		t.Fatalf("got %d %s", code, body)
	}
	if stream {
		i := strings.LastIndex(string(body), `"usage":`)
		if i < 0 {
			t.Fatalf("no usage in %s", body)
		}
		var u struct {
			Usage openai.Usage `json:"usage"`
		}
		line := string(body)[strings.LastIndex(string(body[:i]), "data: ")+len("data: "):]
		line = line[:strings.Index(line, "\n")]
		if err := json.Unmarshal([]byte(line), &u); err != nil {
			t.Fatalf("usage chunk %q: %v", line, err)
		}
		return u.Usage.CompletionTokens
	}
	var c openai.Completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	if *c.Choices[0].FinishReason != "stop" {
		t.Fatalf("finish %q, want stop", *c.Choices[0].FinishReason)
	}
	return c.Usage.CompletionTokens
}

// TestMetricsStoppedOutputs: the loop's outputs of a request whose stop
// string its handler already matched (computed before the abort reached
// the engine) are not observed, as vLLM's front end, which forgot the
// request at the match, ignores them: vllm:iteration_tokens_total counts
// the step's other tokens, and inter_token_latency_seconds has no latency
// of theirs (a stopped request's latencies wait for its finish, which
// records those of its tokens up to the match).
func TestMetricsStoppedOutputs(t *testing.T) {
	s, err := New(Config{Model: "tiny", Engine: tinyEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	stopped := newStream("a", 1, 30)
	stopped.stop = &stopState{m: s.metrics, match: "x", counted: 5}
	plain := newStream("b", 1, 30)
	ls := &loopState{live: map[string]*stream{"a": stopped, "b": plain}, notifying: 2, stops: 1}
	res := engine.StepResult{Outputs: []engine.Output{{ID: "a", Index: 6, ITL: time.Millisecond}, {ID: "b", Index: 3, ITL: time.Millisecond}}}
	s.deliver(&res, ls)
	m := s.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.iteration.count != 1 || m.iteration.sum != 1 {
		t.Errorf("iteration_tokens_total: got count %d sum %v, want 1 and 1 (b's token alone)", m.iteration.count, m.iteration.sum)
	}
	if m.itl.count != 1 {
		t.Errorf("inter_token_latency_seconds: got count %d, want 1 (b's latency alone)", m.itl.count)
	}
}

// TestMetricsHeldOutputs: a step's outputs of a request with stop strings
// that the handler has not searched yet count in vllm:iteration_tokens_total
// as vLLM's front end counts them once it processed the step: those up to
// the output whose token completed a match, not those after (the engine
// computed them before its abort arrived), and all of them when the
// client left. The emulator counted the outputs it delivered before the
// handler matched, whichever side of the match they were.
func TestMetricsHeldOutputs(t *testing.T) {
	type search struct {
		generated int  // tokens the handler searched
		match     bool // the last of them completed a stop string
		abort     bool // instead, the client left
	}
	for _, tc := range []struct {
		name     string
		steps    int // steps delivered: a's outputs 5, 6, ...; b's 3, 4, ... beside
		searches []search
		// after each search: observations and their sum
		count []uint64
		sum   []float64
	}{
		// a's token 6 (index 5) completes the match: step 1 counts it
		// (1+1), step 2 leaves a's out (1).
		{"match", 2, []search{{generated: 6, match: true}}, []uint64{2}, []float64{3}},
		// Token 6 searched without a match: step 1 is decided (2); token 7
		// matches: step 2 counts it (2), step 3 not (1).
		{"search then match", 3, []search{{generated: 6}, {generated: 7, match: true}}, []uint64{1, 3}, []float64{2, 5}},
		// The client left: every token counts.
		{"client left", 2, []search{{abort: true}}, []uint64{2}, []float64{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Model: "tiny", Engine: tinyEngine(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			a := newStream("a", 1, 30)
			a.stop = &stopState{m: s.metrics}
			b := newStream("b", 1, 30)
			ls := &loopState{live: map[string]*stream{"a": a, "b": b}, notifying: 2, stops: 1}
			for k := range tc.steps {
				res := engine.StepResult{Outputs: []engine.Output{
					{ID: "a", Index: 5 + k, ITL: time.Millisecond}, {ID: "b", Index: 3 + k, ITL: time.Millisecond}}}
				s.deliver(&res, ls)
			}
			m := s.metrics
			m.mu.Lock()
			if m.iteration.count != 0 {
				t.Errorf("before the search: got %d observations, want 0 (held)", m.iteration.count)
			}
			m.mu.Unlock()
			j := &job{st: a, engineID: "a"}
			for i, sr := range tc.searches {
				if sr.abort {
					s.abort(j)
				} else {
					j.generated, j.stopped = sr.generated, sr.match
					if sr.match {
						s.stopMatched(j, "x")
					}
					s.settleStop(j)
				}
				m.mu.Lock()
				if m.iteration.count != tc.count[i] || m.iteration.sum != tc.sum[i] {
					t.Errorf("after search %d: got count %d sum %v, want %d and %v", i, m.iteration.count, m.iteration.sum, tc.count[i], tc.sum[i])
				}
				m.mu.Unlock()
			}
		})
	}
}

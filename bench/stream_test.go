package bench

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/report"
)

func TestReadStream(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		err        string
		tokens     int
		cached     int
	}{
		{"chat", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n", "", 2, -1},
		{"completions crlf", "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\r\n\r\ndata: [DONE]\r\n\r\n", "", 1, 8},
		{"no usage", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n", "", 2, -1},
		{"truncated", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", ErrMidstream, 1, -1},
		{"error event", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n", ErrMidstream, 1, -1},
		{"not json", "data: hello\n\n", ErrBadReply, 0, -1},
		{"string error event", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":\"Input validation error\",\"error_type\":\"validation\"}\n\n", ErrMidstream, 1, -1},
		{"null error", "data: {\"choices\":[{\"text\":\"a\"}],\"error\":null}\n\ndata: [DONE]\n\n", "", 1, -1},
		{"reasoning", "data: {\"choices\":[{\"delta\":{\"reasoning\":\"hm\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", "", 2, -1},
		{"empty", "", ErrMidstream, 0, -1},
		// vLLM ends a request its engine aborted with finish_reason
		// "abort", usage and [DONE]: a failure, not a shorter answer.
		{"aborted", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":\"abort\"}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\ndata: [DONE]\n\n", ErrMidstream, 1, -1},
		{"finished", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n", "", 1, -1},
		// llama.cpp before PR 16109 (2025-09) sent a mid-stream error as an
		// "error:" field, which the SSE format does not know, then [DONE]:
		// the request failed, though no data event says so.
		{"llama.cpp error field", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n" +
			"error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"invalid_request_error\"}\n\ndata: [DONE]\n\n", ErrMidstream, 0, -1},
		// vLLM ends a request that failed before its first token with
		// data: [DONE] alone (its empty-chunk filter drops the error,
		// vllm-project/vllm#40978): no answer at all is no success.
		{"done only", "data: [DONE]\n\n", ErrMidstream, 0, -1},
		{"role then done", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n", ErrMidstream, 0, -1},
		// An empty answer that finished, or one in usage only, is one.
		{"empty answer finished", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", "", 0, -1},
		{"answer in usage only", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\ndata: [DONE]\n\n", "", 3, -1},
		// An event of type error (the SSE way to say it), whatever its data.
		{"error event type", "data: {\"choices\":[{\"text\":\"a\"}]}\n\nevent: error\ndata: {\"message\":\"engine dead\"}\n\ndata: [DONE]\n\n", ErrMidstream, 1, -1},
		// Other event types and comments are no error.
		{"ping and named events", ": ping\n\nevent: message\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata:{\"choices\":[{\"text\":\"b\"}]}\r\n\r\ndata:[DONE]\n\n", "", 2, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{}
			s := report.Sample{CachedTokens: -1}
			r.readStream(context.Background(), bytes.NewReader([]byte(tc.body)), openai.ContentTypeEventStream, time.Now(), &s)
			if s.Err != tc.err || s.OutputTokens != tc.tokens || s.CachedTokens != tc.cached {
				t.Errorf("got err %q tokens %d cached %d, want %q %d %d", s.Err, s.OutputTokens, s.CachedTokens, tc.err, tc.tokens, tc.cached)
			}
			if s.Err != "" && r.examples[s.Err] == "" {
				t.Errorf("no example for error kind %q", s.Err)
			}
		})
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\"}}\n\n"))
	f.Add([]byte(": ping\r\nevent: x\r\ndata: [DONE]\r\n\r\n"))
	f.Add([]byte("error: {\"message\":\"x\"}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"abort\"}]}\n\ndata: {\"choi"))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := &runner{}
		s := report.Sample{CachedTokens: -1}
		r.readStream(context.Background(), bytes.NewReader(body), "", time.Now(), &s)
		if s.Err == "" {
			if s.TTFT < 0 || s.TTFT > s.E2E {
				t.Fatalf("TTFT %v outside [0, E2E %v]", s.TTFT, s.E2E)
			}
			var sum time.Duration
			for _, g := range s.ITL {
				if g < 0 {
					t.Fatalf("negative gap %v", g)
				}
				sum += g
			}
			if s.TTFT+sum > s.E2E {
				t.Fatalf("TTFT %v + gaps %v > E2E %v", s.TTFT, sum, s.E2E)
			}
		}
	})
}

func BenchmarkReadStream(b *testing.B) {
	var body bytes.Buffer
	for i := range 256 {
		fmt.Fprintf(&body, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" w%d\"},\"finish_reason\":null}]}\n\n", i)
	}
	body.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":256,\"total_tokens\":265}}\n\ndata: [DONE]\n\n")
	data := body.Bytes()
	r := &runner{}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		s := report.Sample{CachedTokens: -1}
		r.readStream(context.Background(), bytes.NewReader(data), openai.ContentTypeEventStream, time.Now(), &s)
		if s.OutputTokens != 256 {
			b.Fatalf("tokens %d", s.OutputTokens)
		}
	}
}

// TestReadStreamErrorFieldMessage: llama.cpp's old "error:" line fails the
// request with the server's message as the example.
func TestReadStreamErrorFieldMessage(t *testing.T) {
	r := &runner{}
	s := report.Sample{CachedTokens: -1}
	body := "error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"invalid_request_error\"}\n\ndata: [DONE]\n\n"
	r.readStream(context.Background(), bytes.NewReader([]byte(body)), openai.ContentTypeEventStream, time.Now(), &s)
	if want := "error event: the request exceeds the available context size"; s.Err != ErrMidstream || r.examples[ErrMidstream] != want {
		t.Errorf("got err %q example %q, want %q %q", s.Err, r.examples[ErrMidstream], ErrMidstream, want)
	}
}

// TestReadStreamAbsentCachedTokens: vLLM with --enable-prompt-tokens-details
// leaves prompt_tokens_details out of a usage that had no token cached. An
// engine's usage without it is unknown (-1) until that engine has reported
// a count in the run, then 0; another engine (X-Kvroute-Endpoint) keeps
// its own record. Before, every miss was -1 and fell out of the hit rate.
func TestReadStreamAbsentCachedTokens(t *testing.T) {
	const (
		with    = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n"
		without = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\ndata: [DONE]\n\n"
		noUsage = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"
	)
	r := &runner{}
	for i, step := range []struct {
		engine, body string
		want         int
	}{
		{"e1", without, -1}, // e1 has reported nothing yet
		{"e1", with, 8},
		{"e1", without, 0},
		{"e1", noUsage, -1}, // no usage at all: unknown
		{"e2", without, -1}, // e2 has reported nothing
	} {
		s := report.Sample{CachedTokens: -1, Engine: step.engine}
		r.readStream(context.Background(), strings.NewReader(step.body), openai.ContentTypeEventStream, time.Now(), &s)
		if s.Err != "" || s.CachedTokens != step.want {
			t.Errorf("step %d (%s): err %q cached %d, want %d", i, step.engine, s.Err, s.CachedTokens, step.want)
		}
	}
}

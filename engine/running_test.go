package engine_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
)

// TestAppendRunning follows two requests through their steps: each one is
// listed while it runs, with the tokens its KV holds growing by its
// prefill and then by one per output.
func TestAppendRunning(t *testing.T) {
	p, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Profile: p})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]uint32, 40)
	for i := range prompt {
		prompt[i] = uint32(100 + i)
	}
	if got := e.AppendRunning(nil); len(got) != 0 {
		t.Fatalf("idle engine: AppendRunning = %+v, want none", got)
	}
	var now time.Duration
	for _, id := range []string{"a", "b"} {
		if err := e.Add(now, &engine.Request{ID: id, Prompt: prompt, MaxTokens: 3}); err != nil {
			t.Fatal(err)
		}
	}
	r := e.Step(now)
	now += r.Duration
	got := e.AppendRunning(nil)
	if len(got) != 2 {
		t.Fatalf("after the first step: %d running (%+v), want 2", len(got), got)
	}
	for _, s := range got {
		if s.PromptTokens != 40 || s.MaxTokens != 3 || s.Outputs != 1 || s.Tokens != 40 {
			t.Errorf("after the first step: %+v, want 40 prompt tokens, 3 max, 1 output, 40 tokens held", s)
		}
	}
	r = e.Step(now)
	now += r.Duration
	got = e.AppendRunning(got[:0])
	if len(got) != 2 || got[0].Tokens != 41 || got[0].Outputs != 2 {
		t.Fatalf("after the second step: %+v, want 2 running, 41 tokens held and 2 outputs each", got)
	}
	for e.HasWork() {
		now += e.Step(now).Duration
	}
	if got := e.AppendRunning(nil); len(got) != 0 {
		t.Fatalf("finished: AppendRunning = %+v, want none", got)
	}
}

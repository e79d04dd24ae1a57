package sim

import (
	"testing"
)

// TestScrapeDuringStepSeesStateBeforeIt: a scrape taken while an engine's
// step is in progress reports the engine as it was when the step started,
// as the emulator's /metrics does (and vLLM's, whose stats are logged after
// each step): the step's outcome (the request admitted and running, its KV
// blocks allocated) is released when the step ends, like its outputs.
func TestScrapeDuringStepSeesStateBeforeIt(t *testing.T) {
	reqs := smallChat(t, 1, 1, 1)
	cfg := Config{Fleet: tinyFleet(1), ScrapeInterval: -1}
	cfg.applyDefaults()
	s, err := newSimulation(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	s.schedule(reqs[0].Arrival, evArrival, -1, 0)
	s.next = 1
	for !e.inStep && s.q.Len() > 0 {
		s.handle(s.q.pop())
	}
	if !e.inStep {
		t.Fatal("the engine never started a step")
	}
	m := metricsOf(e)
	if m.Waiting != 1 || m.Running != 0 || m.KVUsage != 0 {
		t.Errorf("scrape during the first step: waiting %v, running %v, kv usage %v; want 1, 0, 0 (the state before the step)",
			m.Waiting, m.Running, m.KVUsage)
	}
	// At the step's end the scrape sees its outcome.
	for s.q.Len() > 0 {
		ev := s.q.pop()
		s.handle(ev)
		if ev.kind == evStep {
			break
		}
	}
	if m := metricsOf(e); m.Running != 1 || m.Waiting != 0 || m.KVUsage == 0 {
		t.Errorf("scrape after the first step: waiting %v, running %v, kv usage %v; want 0, 1, > 0", m.Waiting, m.Running, m.KVUsage)
	}
}

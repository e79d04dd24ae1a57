package router

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// BenchmarkDecisionLogAdd is the decision log's part of a decision: 64
// candidates with kv-aware's nine-part explanation (copied: no recycler),
// into a ring of 256, trading the candidates as Route does.
func BenchmarkDecisionLogAdd(b *testing.B) {
	l := newDecisionLog(256)
	endpoints := eps(64)
	cands := make([]kvroute.Candidate, len(endpoints))
	scores := make([]kvroute.Score, len(endpoints))
	for i := range cands {
		cands[i] = kvroute.Candidate{Endpoint: &endpoints[i], Healthy: true, Load: kvroute.Load{Waiting: i, Running: 2 * i, ObservedAt: t0}, CachedBlocks: i}
		parts := make([]kvroute.Part, 9)
		for j := range parts {
			parts[j] = kvroute.Part{Name: "part", Value: float64(j)}
		}
		scores[i] = kvroute.Score{Endpoint: endpoints[i].ID, Value: float64(i), Eligible: true, Parts: parts}
	}
	req := &kvroute.Request{ID: "r", Model: "m", PromptTokens: 8192}
	d := kvroute.Decision{Index: 3, Endpoint: "e3", Policy: "kv-aware", Reason: "affinity", Scores: scores}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		cands = l.take(now, req, d, cands, nil, nil, nil)
		now = now.Add(time.Millisecond)
	}
}

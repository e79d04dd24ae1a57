package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// explainHook is a picker that defers its explanations and calls explain
// on each Explain, with the number of Explain calls so far.
type explainHook struct {
	calls   int
	explain func(call int)
}

func (p *explainHook) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	return kvroute.Chose("hook", cands, 0, "first")
}
func (p *explainHook) DeferExplanations()      {}
func (p *explainHook) KeepExplanation(any) any { return struct{}{} }
func (p *explainHook) Explain(_ any, cands []kvroute.Candidate) ([]kvroute.Score, string) {
	p.calls++
	if p.explain != nil {
		p.explain(p.calls)
	}
	return []kvroute.Score{{Endpoint: cands[0].Endpoint.ID, Eligible: true}}, ""
}

// TestDecisionsLetRoutingIn: reading the decision log (/debug/decisions,
// the dashboard) renders one decision at a time under the router's lock,
// so routing goes on between them. It held the lock for the whole read:
// 256 kv-aware decisions over 64 endpoints took about 17 ms, every request
// of the model waiting meanwhile (seconds with a large decision_log).
//
// A goroutine asks for the lock while the first decision is rendered; each
// rendering then takes a few milliseconds, so that the goroutine, woken
// at an unlock, finds it has waited past a millisecond and the mutex hands
// it the lock at the next unlock (sync.Mutex's starvation mode): by the
// last decision it must have had it, and made a decision (the ninth, in
// the first's slot of eight). (The sleeps are no measurement.)
func TestDecisionsLetRoutingIn(t *testing.T) {
	p := &explainHook{}
	r, err := New(Config{Model: "m", Endpoints: eps(2), Policy: "hook", Picker: p, DecisionLog: 8})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(t0, f, kvroute.Outcome{})
	}
	asking, done := make(chan struct{}), make(chan struct{})
	p.explain = func(call int) {
		switch call {
		case 1:
			go func() {
				close(asking)
				// A decision made meanwhile: the ninth, in the first's slot.
				f, err := r.Route(t0, &kvroute.Request{ID: "8", Model: "m", PromptTokens: 10}, nil)
				if err == nil {
					r.Done(t0, f, kvroute.Outcome{})
				}
				close(done)
			}()
			<-asking
			time.Sleep(3 * time.Millisecond)
		case 7:
			select {
			case <-done:
			default:
				t.Error("the seventh decision is rendered and another caller has not had the router's lock since the first: Decisions holds it throughout")
			}
		default:
			time.Sleep(2 * time.Millisecond)
		}
	}
	recs := r.Decisions(0)
	<-done
	// The decisions logged when Decisions was called, newest first, but
	// the first: the ninth took its slot before its turn.
	if len(recs) != 7 {
		t.Fatalf("Decisions: got %d records, want 7", len(recs))
	}
	for i, rec := range recs {
		if want := uint64(8 - i); rec.Seq != want || rec.RequestID != fmt.Sprint(want-1) {
			t.Errorf("record %d: seq %d request %q, want seq %d request %q", i, rec.Seq, rec.RequestID, want, fmt.Sprint(want-1))
		}
	}
}

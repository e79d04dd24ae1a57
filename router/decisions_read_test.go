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
// A goroutine asks for the lock while the first of 64 decisions is
// rendered; each rendering then takes a couple of milliseconds, so that
// the goroutine, woken at an unlock, finds it has waited past a
// millisecond and the mutex hands it the lock at the next unlock
// (sync.Mutex's starvation mode): by the last decision (over 100 ms
// later, room for a loaded machine to schedule it) it must have had it,
// and made a decision (the 65th, in the first's slot). (The sleeps are no
// measurement.)
func TestDecisionsLetRoutingIn(t *testing.T) {
	const logSize = 64
	p := &explainHook{}
	r, err := New(Config{Model: "m", Endpoints: eps(2), Policy: "hook", Picker: p, DecisionLog: logSize})
	if err != nil {
		t.Fatal(err)
	}
	for i := range logSize {
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
				// A decision made meanwhile, in the first's slot.
				f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(logSize), Model: "m", PromptTokens: 10}, nil)
				if err == nil {
					r.Done(t0, f, kvroute.Outcome{})
				}
				close(done)
			}()
			<-asking
			time.Sleep(3 * time.Millisecond)
		case logSize - 1:
			select {
			case <-done:
			default:
				t.Errorf("decision %d is rendered and another caller has not had the router's lock since the first: Decisions holds it throughout", call)
			}
		default:
			time.Sleep(2 * time.Millisecond)
		}
	}
	recs := r.Decisions(0)
	<-done
	// The decisions logged when Decisions was called, newest first, but
	// the first: the one made meanwhile took its slot before its turn.
	if len(recs) != logSize-1 {
		t.Fatalf("Decisions: got %d records, want %d", len(recs), logSize-1)
	}
	for i, rec := range recs {
		if want := uint64(logSize - i); rec.Seq != want || rec.RequestID != fmt.Sprint(want-1) {
			t.Errorf("record %d: seq %d request %q, want seq %d request %q", i, rec.Seq, rec.RequestID, want, fmt.Sprint(want-1))
		}
	}
}

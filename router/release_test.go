package router

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// excludedPicker chooses endpoint 0 whether it is eligible or not (a buggy
// policy), and records what it is told to release.
type excludedPicker struct{ released []string }

func (p *excludedPicker) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	return kvroute.Chose("test", cands, 0, "always e0")
}

func (p *excludedPicker) Release(_ time.Time, req *kvroute.Request, endpoint string) {
	p.released = append(p.released, req.ID+"@"+endpoint)
}

// TestRouteReleasesUndispatchedChoice: a decision Route refuses (the
// policy chose an excluded endpoint) is answered 500 bad_decision, and the
// picker is told at once that nothing was dispatched, so that per-request
// state it keeps (kv-aware's pending load) does not charge the endpoint.
func TestRouteReleasesUndispatchedChoice(t *testing.T) {
	p := &excludedPicker{}
	r := newTestRouter(t, 2, p)
	_, err := r.Route(t0, &kvroute.Request{ID: "r1", Model: "m", Prompt: "hello", PromptTokens: 2}, []string{"e0"})
	var ke *kvroute.Error
	if !errors.As(err, &ke) || ke.Status != http.StatusInternalServerError || ke.Code != "bad_decision" {
		t.Fatalf("got %v, want 500 bad_decision", err)
	}
	if len(p.released) != 1 || p.released[0] != "r1@e0" {
		t.Fatalf("picker heard releases %v, want [r1@e0]", p.released)
	}
}

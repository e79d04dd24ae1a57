package router

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// TestEmptyPool: a router built with AllowEmpty and no endpoints (a
// discovered pool before its first engine is ready) answers 503 with a
// Retry-After naming the model, under every policy, without calling the
// picker; it routes once SetEndpoints gives it an endpoint, and answers 503
// again when they are all gone, while a flight routed before ends normally.
func TestEmptyPool(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, name := range policy.Names() {
		t.Run(name, func(t *testing.T) {
			pk, err := policy.New(name, nil, 1)
			if err != nil {
				t.Fatal(err)
			}
			r, err := New(Config{Model: "llama", Picker: pk, Policy: name, AllowEmpty: true})
			if err != nil {
				t.Fatalf("New with no endpoints and AllowEmpty: %v", err)
			}
			checkEmpty := func(when string) {
				t.Helper()
				_, err := r.Route(now, &kvroute.Request{Model: "llama", Prompt: "hello"}, nil)
				var ue *UnavailableError
				if !errors.As(err, &ue) {
					t.Fatalf("%s: Route error = %v, want *UnavailableError", when, err)
				}
				if ue.Err.Status != http.StatusServiceUnavailable || ue.RetryAfter < 1 || ue.Err.Code != "no_endpoints" ||
					!strings.Contains(ue.Err.Message, `"llama"`) {
					t.Errorf("%s: got %d %q %q retry-after %d, want 503 no_endpoints naming the model with a Retry-After",
						when, ue.Err.Status, ue.Err.Code, ue.Err.Message, ue.RetryAfter)
				}
				if st := r.Status(now); len(st) != 0 {
					t.Errorf("%s: Status = %v, want none", when, st)
				}
			}
			checkEmpty("at start")
			if d := r.Decisions(0); len(d) != 0 {
				t.Errorf("decisions of an empty pool: got %d, want 0", len(d))
			}
			if err := r.SetEndpoints(now, epsOf(1), nil); err != nil {
				t.Fatal(err)
			}
			f, err := r.Route(now, &kvroute.Request{Model: "llama", Prompt: "hello"}, nil)
			if err != nil {
				t.Fatalf("Route with one endpoint: %v", err)
			}
			if err := r.SetEndpoints(now, nil, nil); err != nil {
				t.Fatalf("SetEndpoints(nil) with AllowEmpty: %v", err)
			}
			checkEmpty("after all left")
			r.FirstToken(now, f)
			r.Done(now, f, kvroute.Outcome{})
		})
	}
}

// TestEmptyPoolRefusedByDefault: without AllowEmpty an empty list is an
// error, at New and at SetEndpoints (a static pool never runs empty).
func TestEmptyPoolRefusedByDefault(t *testing.T) {
	if _, err := New(Config{Model: "m", Picker: &pickFirstHealthy{}}); err == nil {
		t.Error("New with no endpoints: got nil error, want one")
	}
	r := newTestRouter(t, 2, &pickFirstHealthy{})
	if err := r.SetEndpoints(time.Unix(0, 0), nil, nil); err == nil {
		t.Error("SetEndpoints(nil): got nil error, want one")
	}
	if got := len(r.Endpoints()); got != 2 {
		t.Errorf("endpoints after a refused SetEndpoints: got %d, want 2", got)
	}
}

// TestPickersWithoutCandidates: the router never calls Pick without a
// healthy candidate, but a picker handed none must not panic either.
func TestPickersWithoutCandidates(t *testing.T) {
	for _, name := range policy.Names() {
		pk, err := policy.New(name, nil, 1)
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%s: Pick with no candidates panicked: %v", name, v)
				}
			}()
			if d := pk.Pick(time.Unix(0, 0), &kvroute.Request{Model: "m"}, nil); d.Index >= 0 && !d.Shed {
				t.Errorf("%s: Pick with no candidates chose index %d", name, d.Index)
			}
		}()
	}
}

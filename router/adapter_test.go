package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// pickRandomHealthy picks a healthy candidate at random (seeded), so that
// a property test reaches every candidate the router offers.
type pickRandomHealthy struct{ rng *rand.Rand }

func (p *pickRandomHealthy) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	var healthy []int
	for i := range cands {
		if cands[i].Healthy {
			healthy = append(healthy, i)
		}
	}
	if len(healthy) == 0 {
		return kvroute.None("test", "none healthy")
	}
	return kvroute.Chose("test", cands, healthy[p.rng.IntN(len(healthy))], "random")
}

// TestRouteAdapter: over random pools (each endpoint serving every
// adapter of the model, or a subset), random health and random exclude
// lists, a request for a LoRA adapter goes only to a healthy, untried
// endpoint that serves it, a base-model request to any; when none is
// left, Route answers 503 no_adapter_endpoint (no_healthy_endpoint for the
// base model) with a Retry-After.
func TestRouteAdapter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	adapters := []string{"a", "b", "c"}
	for trial := range 300 {
		n := 1 + rng.IntN(6)
		list := eps(n)
		for i := range list {
			if rng.IntN(3) > 0 {
				for _, a := range adapters {
					if rng.IntN(2) == 0 {
						list[i].Adapters = append(list[i].Adapters, a)
					}
				}
				if list[i].Adapters == nil {
					list[i].Adapters = []string{"b"}
				}
			}
		}
		r, err := New(Config{Model: "m", Endpoints: list, Policy: "test", Picker: &pickRandomHealthy{rng: rng}})
		if err != nil {
			t.Fatal(err)
		}
		down := map[string]bool{}
		for _, e := range list {
			if rng.IntN(4) == 0 {
				r.SetActiveHealth(t0, e.ID, false)
				down[e.ID] = true
			}
		}
		for k := range 20 {
			adapter := []string{"", "a", "b", "c", "d"}[rng.IntN(5)]
			var exclude []string
			for _, e := range list {
				if rng.IntN(5) == 0 {
					exclude = append(exclude, e.ID)
				}
			}
			var want []string // the endpoints that may take the request
			for _, e := range list {
				if e.ServesAdapter(adapter) && !down[e.ID] && !contains(exclude, e.ID) {
					want = append(want, e.ID)
				}
			}
			req := &kvroute.Request{ID: fmt.Sprint(k), Model: "m", Adapter: adapter, Prompt: "p", PromptTokens: 1}
			f, err := r.Route(t0, req, exclude)
			desc := fmt.Sprintf("trial %d, request %d: adapter %q, pool %v, down %v, exclude %v", trial, k, adapter, list, down, exclude)
			if len(want) == 0 {
				var ue *UnavailableError
				code := "no_healthy_endpoint"
				if adapter != "" {
					code = "no_adapter_endpoint"
				}
				if !errors.As(err, &ue) || ue.Err.Status != http.StatusServiceUnavailable || ue.Err.Code != code || ue.RetryAfter < 1 {
					t.Fatalf("%s: got %v, %v; want a 503 %s with Retry-After", desc, f, err, code)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: got %v, want one of %v", desc, err, want)
			}
			if !contains(want, f.Endpoint.ID) {
				t.Fatalf("%s: routed to %s, want one of %v", desc, f.Endpoint.ID, want)
			}
			r.Done(t0, f, kvroute.Outcome{})
		}
	}
}

// TestAdapterUnavailableMessage: the 503 names the model and the adapter,
// how many endpoints serve it, and how many of those were tried.
func TestAdapterUnavailableMessage(t *testing.T) {
	list := eps(3)
	list[0].Adapters = []string{"sql"}
	list[1].Adapters = []string{"sql"}
	list[2].Adapters = []string{"chat"}
	r, err := New(Config{Model: "m", Endpoints: list, Policy: "test", Picker: &pickFirstHealthy{}})
	if err != nil {
		t.Fatal(err)
	}
	r.SetActiveHealth(t0, "e0", false)
	for _, tc := range []struct {
		adapter string
		exclude []string
		want    string
	}{
		{"sql", []string{"e1"}, `no healthy endpoint of model "m" serving adapter "sql" left after trying 1 (2 serve it)`},
		{"fr", nil, `no endpoint of model "m" serves adapter "fr"`},
	} {
		_, err := r.Route(t0, &kvroute.Request{Model: "m", Adapter: tc.adapter, Prompt: "p"}, tc.exclude)
		var ue *UnavailableError
		if !errors.As(err, &ue) || ue.Err.Message != tc.want || ue.Err.Code != "no_adapter_endpoint" {
			t.Errorf("adapter %q: got %v, want %q", tc.adapter, err, tc.want)
		}
	}
	r.SetActiveHealth(t0, "e0", true)
	_, err = r.Route(t0, &kvroute.Request{Model: "m", Adapter: "sql", Prompt: "p"}, []string{"e1"})
	if err != nil {
		t.Errorf("e0 healthy again: %v", err)
	}
}

// TestApproximateAdapterKeys: the approximate index keys an adapter's
// prompt apart from the base model's and another adapter's, as the
// engine shares no cached block between them: the same prompt routed for
// adapter sql finds its blocks on the endpoint it went to only when it
// names sql again.
func TestApproximateAdapterKeys(t *testing.T) {
	r := newTestRouter(t, 3, &pickFirstHealthy{})
	prompt := strings.Repeat("You are a helpful assistant. ", 40)
	route := func(id, adapter string) (string, int) {
		t.Helper()
		f, err := r.Route(t0, &kvroute.Request{ID: id, Model: "m", Adapter: adapter, Prompt: prompt, PromptTokens: 300}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(t0, f, kvroute.Outcome{})
		cached := 0
		for _, c := range r.Decisions(1)[0].Candidates {
			cached = max(cached, c.CachedBlocks)
		}
		return f.Endpoint.ID, cached
	}
	first, _ := route("1", "sql")
	for _, adapter := range []string{"", "chat"} {
		if _, cached := route("x"+adapter, adapter); cached != 0 {
			t.Errorf("adapter %q: %d blocks cached, want none (they are adapter sql's)", adapter, cached)
		}
	}
	if ep, cached := route("2", "sql"); ep != first || cached != len(prompt)/128 {
		t.Errorf("adapter sql again: %s with %d blocks cached, want %s with %d", ep, cached, first, len(prompt)/128)
	}
}

// TestSetEndpointsAdapters: an endpoint's adapters change live, like its
// other fields, and an unsorted list is searched correctly.
func TestSetEndpointsAdapters(t *testing.T) {
	r := newTestRouter(t, 2, &pickFirstHealthy{})
	route := func(adapter string) string {
		t.Helper()
		f, err := r.Route(t0, &kvroute.Request{Model: "m", Adapter: adapter, Prompt: "p"}, nil)
		if err != nil {
			return err.(*UnavailableError).Err.Code
		}
		r.Done(t0, f, kvroute.Outcome{})
		return f.Endpoint.ID
	}
	if got := route("sql"); got != "e0" {
		t.Fatalf("before: sql went to %s, want e0 (every endpoint serves every adapter)", got)
	}
	list := eps(2)
	list[0].Adapters = []string{"sql", "chat"}
	list[1].Adapters = []string{"fr"}
	if err := r.SetEndpoints(t0, list, nil); err != nil {
		t.Fatal(err)
	}
	if st := r.Status(t0); strings.Join(st[0].Adapters, ",") != "chat,sql" || st[1].Adapters[0] != "fr" {
		t.Errorf("Status adapters: %q, %q; want chat,sql and fr", st[0].Adapters, st[1].Adapters)
	}
	for adapter, want := range map[string]string{"chat": "e0", "sql": "e0", "fr": "e1", "de": "no_adapter_endpoint", "": "e0"} {
		if got := route(adapter); got != want {
			t.Errorf("after: adapter %q went to %s, want %s", adapter, got, want)
		}
	}
}

// TestDecisionAdapter: the decision log names a request's adapter, and the
// explanation says why an endpoint that does not serve it was no
// candidate.
func TestDecisionAdapter(t *testing.T) {
	list := eps(2)
	list[1].Adapters = []string{"chat"}
	r, err := New(Config{Model: "m", Endpoints: list, Policy: "test", Picker: &pickFirstHealthy{}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m", Adapter: "sql", Prompt: "p"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Done(t0, f, kvroute.Outcome{})
	d := r.Decisions(1)[0]
	if d.Adapter != "sql" || d.Decision.Scores[0].Why != "" || d.Decision.Scores[1].Why != `does not serve adapter "sql"` {
		t.Errorf("decision: adapter %q, whys %q, %q; want sql, none, does not serve", d.Adapter, d.Decision.Scores[0].Why, d.Decision.Scores[1].Why)
	}
}

// pickFirstDecoder stands in for the P/D disagg.Planner: the request ends
// on a healthy endpoint that decodes, or on none. Its explanation starts
// with a score of its own (the plan's), then one per candidate ("unhealthy"
// for those offered as not healthy).
type pickFirstDecoder struct{}

func (pickFirstDecoder) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	scores := []kvroute.Score{{Endpoint: "plan", Eligible: true}}
	for i := range cands {
		s := kvroute.Score{Endpoint: cands[i].Endpoint.ID, Eligible: cands[i].Healthy}
		if !cands[i].Healthy {
			s.Why = "unhealthy"
		}
		scores = append(scores, s)
	}
	for i := range cands {
		if cands[i].Healthy && cands[i].Endpoint.Role.CanDecode() {
			d := kvroute.Chose("test", cands, i, "first decoder")
			d.Scores = scores
			return d
		}
	}
	return kvroute.None("test", "no decoder")
}

// TestAdapterUnavailableMessagePD: in a P/D pool the 503 for an adapter
// speaks of the decode endpoints, where a request ends: an adapter only a
// prefill endpoint serves has none (and the pool's healthy prefill
// endpoint does not make it a matter of health), and the decode
// endpoints that serve one are counted and tried.
func TestAdapterUnavailableMessagePD(t *testing.T) {
	list := []kvroute.Endpoint{
		{ID: "p0", URL: "http://p0:1", Role: kvroute.RolePrefill, Adapters: []string{"solo", "sql"}},
		{ID: "d0", URL: "http://d0:1", Role: kvroute.RoleDecode, Adapters: []string{"sql"}},
		{ID: "d1", URL: "http://d1:1", Role: kvroute.RoleDecode, Adapters: []string{"sql"}},
	}
	r, err := New(Config{Model: "m", Endpoints: list, Policy: "test", Picker: pickFirstDecoder{}})
	if err != nil {
		t.Fatal(err)
	}
	r.SetActiveHealth(t0, "d1", false)
	for _, tc := range []struct {
		adapter    string
		exclude    []string
		want       string
		retryAfter int
	}{
		{"solo", nil, `no decode endpoint of model "m" serves adapter "solo" (only 1 prefill endpoint does)`, emptyRetryAfter},
		{"sql", []string{"d0"}, `no healthy decode endpoint of model "m" serving adapter "sql" left after trying 1 (2 serve it)`, 1},
		{"fr", nil, `no endpoint of model "m" serves adapter "fr"`, emptyRetryAfter},
	} {
		_, err := r.Route(t0, &kvroute.Request{Model: "m", Adapter: tc.adapter, Prompt: "p"}, tc.exclude)
		var ue *UnavailableError
		if !errors.As(err, &ue) || ue.Err.Message != tc.want || ue.Err.Code != "no_adapter_endpoint" || ue.RetryAfter != tc.retryAfter {
			t.Errorf("adapter %q: got %v (Retry-After %v), want %q, Retry-After %d", tc.adapter, err, ue, tc.want, tc.retryAfter)
		}
	}
}

// TestDecisionAdapterScoresByID: the explanation of a decision whose
// scores are not one per candidate in pool order (the P/D planner's: the
// plan's first) says of the right endpoints that they do not serve the
// adapter.
func TestDecisionAdapterScoresByID(t *testing.T) {
	list := []kvroute.Endpoint{
		{ID: "p0", URL: "http://p0:1", Role: kvroute.RolePrefill},
		{ID: "d0", URL: "http://d0:1", Role: kvroute.RoleDecode, Adapters: []string{"chat"}},
		{ID: "d1", URL: "http://d1:1", Role: kvroute.RoleDecode},
	}
	r, err := New(Config{Model: "m", Endpoints: list, Policy: "test", Picker: pickFirstDecoder{}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m", Adapter: "sql", Prompt: "p"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Done(t0, f, kvroute.Outcome{})
	var got []string
	for _, s := range r.Decisions(1)[0].Decision.Scores {
		got = append(got, s.Endpoint+": "+s.Why)
	}
	want := []string{"plan: ", "p0: ", `d0: does not serve adapter "sql"`, "d1: "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("whys: got %q, want %q", got, want)
	}
}

package router

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/signals"
)

// observeLlama makes endpoint id of r a llama.cpp server whose GET
// /lora-adapters listed the files of paths (ids in order).
func observeLlama(t *testing.T, r *Router, id string, paths ...string) {
	t.Helper()
	list := make([]signals.LlamaAdapter, len(paths))
	for i, p := range paths {
		list[i] = signals.LlamaAdapter{ID: i, Path: p, Scale: 1}
	}
	r.View(id).Observe(t0, signals.Metrics{Flavor: signals.FlavorLlamaCPP, LlamaAdapters: signals.NewLlamaAdapters(list)})
}

// TestRouteLlamaAdapterList: an endpoint whose llama.cpp server does not
// list the request's adapter (its last GET /lora-adapters) is no
// candidate for it, and the decision log says why; one whose list is not
// known yet stays one, and so do all for the base model and for an
// adapter they list. With the one endpoint that lists it down, Route
// answers 503 no_adapter_endpoint counting the others; with none listing
// it, 404 model_not_found naming what each lists.
func TestRouteLlamaAdapterList(t *testing.T) {
	list := eps(5)
	list[4].Adapters = []string{"chat"} // the config does not give e4 sql: not in the 404
	r, err := New(Config{Model: "m", Endpoints: list, Policy: "test", Picker: &pickFirstHealthy{}})
	if err != nil {
		t.Fatal(err)
	}
	observeLlama(t, r, "e0", "/m/chat.gguf")
	observeLlama(t, r, "e1") // lists none
	// e2: not scraped yet
	observeLlama(t, r, "e3", "/m/chat.gguf", "/m/sql.gguf")
	route := func(adapter string, exclude ...string) (string, error) {
		t.Helper()
		f, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m", Adapter: adapter, Prompt: "p"}, exclude)
		if err != nil {
			return "", err
		}
		r.Done(t0, f, kvroute.Outcome{})
		return f.Endpoint.ID, nil
	}
	for _, tc := range []struct {
		adapter string
		exclude []string
		want    string
	}{
		{"sql", nil, "e2"}, // list not known: still a candidate
		{"sql", []string{"e2"}, "e3"},
		{"", nil, "e0"},
		{"chat", nil, "e0"},
		{"chat", []string{"e0"}, "e2"}, // e1 lists none
	} {
		if got, err := route(tc.adapter, tc.exclude...); got != tc.want || err != nil {
			t.Errorf("adapter %q, exclude %v: routed to %q (%v), want %s", tc.adapter, tc.exclude, got, err, tc.want)
		}
	}
	route("sql", "e2")
	whys := []string{}
	for _, s := range r.Decisions(1)[0].Decision.Scores {
		whys = append(whys, s.Endpoint+": "+s.Why)
	}
	const unlisted = `its llama.cpp server does not list adapter "sql" (GET /lora-adapters)`
	want := []string{"e0: " + unlisted, "e1: " + unlisted, "e2: ", "e3: ", `e4: does not serve adapter "sql"`}
	if strings.Join(whys, "|") != strings.Join(want, "|") {
		t.Errorf("explanation:\n got %q\nwant %q", whys, want)
	}

	observeLlama(t, r, "e2", "/m/chat.gguf")
	if got, err := route("sql"); got != "e3" || err != nil {
		t.Errorf("e2's list read: routed to %q (%v), want e3", got, err)
	}
	r.SetActiveHealth(t0, "e3", false)
	_, err = route("sql")
	var ue *UnavailableError
	if !errors.As(err, &ue) || ue.Err.Code != "no_adapter_endpoint" ||
		!strings.Contains(ue.Err.Message, "(1 serve it); the llama.cpp servers of 3 more endpoints do not list it") {
		t.Errorf("e3 down: got %v, want 503 no_adapter_endpoint, 1 serving, 3 not listing it", err)
	}
	r.SetActiveHealth(t0, "e3", true)
	observeLlama(t, r, "e3", "/m/chat.gguf")
	_, err = route("sql")
	var ke *kvroute.Error
	if !errors.As(err, &ke) || errors.As(err, &ue) || ke.Status != http.StatusNotFound || ke.Code != "model_not_found" ||
		!strings.Contains(ke.Message, "`sql`") || !strings.Contains(ke.Message, "e0 lists chat; e1 lists none; e2 lists chat; e3 lists chat.") {
		t.Errorf("none lists sql: got %v, want 404 model_not_found naming each list but e4's", err)
	}
	r.View("e1").ResetSignals() // the list is not known again
	if got, err := route("sql"); got != "e1" || err != nil {
		t.Errorf("e1's list forgotten: routed to %q (%v), want e1", got, err)
	}
}

// TestRouteLlamaAdapterAllocs: reading the engines' adapter lists, and
// logging which did not list the adapter, allocates nothing at steady
// state: a decision for an adapter allocates only its Flight.
func TestRouteLlamaAdapterAllocs(t *testing.T) {
	first := kvroute.PickerFunc(func(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
		for i := range cands {
			if cands[i].Healthy {
				return kvroute.Chose("first", cands, i, "first healthy")
			}
		}
		return kvroute.None("first", "none healthy")
	})
	r, err := New(Config{Model: "m", Endpoints: eps(4), Policy: "first", Picker: first, DecisionLog: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"e0", "e1", "e2"} {
		observeLlama(t, r, id, "/m/chat.gguf")
	}
	observeLlama(t, r, "e3", "/m/sql.gguf")
	req := kvroute.Request{ID: "1", Model: "m", Adapter: "sql", Prompt: "p"}
	step := func() {
		f, err := r.Route(t0, &req, nil)
		if err != nil || f.Endpoint.ID != "e3" {
			t.Fatalf("routed to %v (%v), want e3", f, err)
		}
		r.Done(t0, f, kvroute.Outcome{})
	}
	for range 100 { // until the decision log's slots have grown
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 1 {
		t.Errorf("a decision allocated %v times, want 1 (its Flight)", n)
	}
}

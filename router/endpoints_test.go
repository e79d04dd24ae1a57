package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/signals"
)

// ep returns endpoint i of eps(n).
func ep(i int) kvroute.Endpoint {
	return kvroute.Endpoint{ID: fmt.Sprintf("e%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i)}
}

func epsOf(ids ...int) []kvroute.Endpoint {
	out := make([]kvroute.Endpoint, len(ids))
	for i, id := range ids {
		out[i] = ep(id)
	}
	return out
}

func ids(r *Router) []string {
	var out []string
	for _, e := range r.Endpoints() {
		out = append(out, e.ID)
	}
	return out
}

func statusOf(t *testing.T, r *Router, now time.Time, id string) EndpointStatus {
	t.Helper()
	for _, st := range r.Status(now) {
		if st.ID == id {
			return st
		}
	}
	t.Fatalf("no status for %s in %v", id, ids(r))
	return EndpointStatus{}
}

// recordingPicker is pickFirstHealthy that keeps the candidates of its
// last Pick.
type recordingPicker struct {
	pickFirstHealthy
	last []kvroute.Candidate
}

func (p *recordingPicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.last = append(p.last[:0], cands...)
	return p.pickFirstHealthy.Pick(now, req, cands)
}

func (p *recordingPicker) cand(t *testing.T, id string) kvroute.Candidate {
	t.Helper()
	for _, c := range p.last {
		if c.Endpoint.ID == id {
			return c
		}
	}
	t.Fatalf("no candidate %s in the last Pick", id)
	return kvroute.Candidate{}
}

// TestSetEndpointsKeepsSurvivors: endpoints whose ID and engine stay keep
// their ejection, their View (with the flights it counts) and their
// approximate-index entries, whatever the new order; removed ones leave;
// new ones start fresh.
func TestSetEndpointsKeepsSurvivors(t *testing.T) {
	p := &recordingPicker{}
	r, err := New(Config{Model: "m", Endpoints: eps(3), Policy: "test", Picker: p,
		Health: HealthConfig{FailThreshold: 1, BaseEjection: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.ReportResult(t0, "e1", false) {
		t.Fatal("e1 not ejected")
	}
	prompt := strings.Repeat("a shared system prompt, long enough for blocks. ", 20)
	f, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m", Prompt: prompt, PromptTokens: 200}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Endpoint.ID != "e0" {
		t.Fatalf("first request: got %s, want e0", f.Endpoint.ID)
	}
	view0 := r.View("e0")
	ejectedUntil := statusOf(t, r, t0, "e1").EjectedUntil

	now := t0.Add(time.Second)
	if err := r.SetEndpoints(now, epsOf(1, 3, 0), nil); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(r), []string{"e1", "e3", "e0"}; !slices.Equal(got, want) {
		t.Fatalf("endpoints: got %v, want %v", got, want)
	}
	if st := statusOf(t, r, now, "e1"); st.Healthy || !st.EjectedUntil.Equal(ejectedUntil) {
		t.Errorf("e1 after the change: healthy %v, ejected until %v; want still ejected until %v", st.Healthy, st.EjectedUntil, ejectedUntil)
	}
	if r.View("e0") != view0 {
		t.Error("e0 has a new View")
	}
	if got := r.View("e0").Load(now).InFlight; got != 1 {
		t.Errorf("e0 in flight after the change: got %d, want 1", got)
	}
	if r.View("e2") != nil {
		t.Error("e2 still has a View")
	}
	if st := statusOf(t, r, now, "e3"); !st.Healthy || st.Ejections != 0 {
		t.Errorf("e3: got healthy %v, %d ejections; want a fresh endpoint", st.Healthy, st.Ejections)
	}
	// The prompt is still known on e0; the request goes there.
	f2, err := r.Route(now, &kvroute.Request{ID: "2", Model: "m", Prompt: prompt, PromptTokens: 200}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := p.cand(t, "e0"); c.CachedBlocks == 0 {
		t.Errorf("e0's approximate hits after the change: got %d blocks, want > 0", c.CachedBlocks)
	}
	if c := p.cand(t, "e3"); c.CachedBlocks != 0 {
		t.Errorf("e3's approximate hits: got %d blocks, want 0", c.CachedBlocks)
	}
	if f2.Endpoint.ID != "e0" {
		t.Errorf("second request: got %s, want e0 (its prefix)", f2.Endpoint.ID)
	}
	r.Done(now, f, kvroute.Outcome{})
	r.Done(now, f2, kvroute.Outcome{})
	if got := r.View("e0").Load(now).InFlight; got != 0 {
		t.Errorf("e0 in flight at the end: got %d, want 0", got)
	}
}

// servedThenReadded routes prompt (to e0, the first healthy) and ends it,
// then removes e0 from r's pool and adds it back after e1.
func servedThenReadded(t *testing.T, r *Router, prompt string) {
	t.Helper()
	f, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m", Prompt: prompt}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Done(t0, f, kvroute.Outcome{})
	if err := r.SetEndpoints(t0, epsOf(1), nil); err != nil {
		t.Fatal(err)
	}
	if err := r.SetEndpoints(t0, epsOf(1, 0), nil); err != nil {
		t.Fatal(err)
	}
}

// TestSetEndpointsDropsRemovedEntries: a removed endpoint's approximate
// entries go with it; the same engine added back later starts with none.
func TestSetEndpointsDropsRemovedEntries(t *testing.T) {
	p := &recordingPicker{}
	r := newTestRouter(t, 2, p)
	prompt := strings.Repeat("a prompt that will be forgotten. ", 20)
	servedThenReadded(t, r, prompt)
	if _, err := r.Route(t0, &kvroute.Request{ID: "2", Model: "m", Prompt: prompt}, nil); err != nil {
		t.Fatal(err)
	}
	if c := p.cand(t, "e0"); c.CachedBlocks != 0 {
		t.Errorf("e0 added back: got %d cached blocks, want 0", c.CachedBlocks)
	}
}

// TestSetEndpointsChangedEndpoint: another URL under the same ID is
// another engine (fresh state); other fields change in place.
func TestSetEndpointsChangedEndpoint(t *testing.T) {
	p := &recordingPicker{}
	r, err := New(Config{Model: "m", Endpoints: eps(3), Policy: "test", Picker: p,
		Health: HealthConfig{FailThreshold: 1, BaseEjection: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m"}, nil); err != nil {
		t.Fatal(err)
	}
	r.ReportResult(t0, "e0", false)
	r.ReportResult(t0, "e1", false)
	r.ReportResult(t0, "e2", false)
	view1, view2 := r.View("e1"), r.View("e2")

	list := epsOf(0, 1, 2)
	list[0].Labels = map[string]string{"zone": "b"}
	list[0].Weight, list[0].KVCapacityTokens = 3, 1000
	list[1].URL = "http://127.0.0.1:9999"
	list[2].Role = kvroute.RoleDecode // a prefill/decode pool's engine changing role
	if err := r.SetEndpoints(t0, list, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route(t0, &kvroute.Request{ID: "2", Model: "m"}, nil); err != nil {
		t.Fatal(err)
	}
	st0, c0 := statusOf(t, r, t0, "e0"), p.cand(t, "e0")
	if st0.Healthy || st0.Labels["zone"] != "b" || c0.Load.KVCapacityTokens != 1000 {
		t.Errorf("e0 (labels, weight, capacity changed): healthy %v, labels %v, capacity %d; want still ejected, zone b, 1000",
			st0.Healthy, st0.Labels, c0.Load.KVCapacityTokens)
	}
	if w := r.Endpoints()[0].Weight; w != 3 {
		t.Errorf("e0 weight: got %d, want 3", w)
	}
	st1 := statusOf(t, r, t0, "e1")
	if !st1.Healthy || st1.URL != "http://127.0.0.1:9999" || r.View("e1") == view1 {
		t.Errorf("e1 (URL changed): healthy %v, url %s, same View %v; want a fresh endpoint", st1.Healthy, st1.URL, r.View("e1") == view1)
	}
	if st2 := statusOf(t, r, t0, "e2"); !st2.Healthy || st2.Role != "decode" || r.View("e2") == view2 {
		t.Errorf("e2 (role changed): healthy %v, role %s, same View %v; want a fresh endpoint", st2.Healthy, st2.Role, r.View("e2") == view2)
	}
}

func TestSetEndpointsValidates(t *testing.T) {
	r := newTestRouter(t, 2, &pickFirstHealthy{})
	for _, tc := range []struct {
		name string
		eps  []kvroute.Endpoint
		want string
	}{
		{"none", nil, "has no endpoints"},
		{"duplicate", []kvroute.Endpoint{{ID: "a"}, {ID: "a"}}, `duplicate id "a"`},
		{"empty id", []kvroute.Endpoint{{}}, "id or url is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.SetEndpoints(t0, tc.eps, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if got, want := ids(r), []string{"e0", "e1"}; !slices.Equal(got, want) {
				t.Fatalf("endpoints after the error: got %v, want %v", got, want)
			}
		})
	}
}

// TestSetEndpointsInFlightOnRemoved: a flight on an endpoint removed
// meanwhile gets its first token and ends normally, on its own View: the
// same engine added back under its ID counts only its own flights.
func TestSetEndpointsInFlightOnRemoved(t *testing.T) {
	k, err := policy.New(policy.Default, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRouter(t, 2, k)
	var flights []*Flight
	for i := range 4 {
		f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 100, MaxTokens: 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		flights = append(flights, f)
	}
	old := r.View("e0")
	n := old.Load(t0).InFlight
	if n == 0 {
		t.Fatal("no flight on e0")
	}
	if err := r.SetEndpoints(t0, epsOf(1), nil); err != nil {
		t.Fatal(err)
	}
	if err := r.SetEndpoints(t0, epsOf(1, 0), nil); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Second)
	for _, f := range flights {
		r.FirstToken(now, f)
	}
	fresh, err := r.Route(now, &kvroute.Request{ID: "new", Model: "m", PromptTokens: 100}, []string{"e1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flights {
		r.Done(now, f, kvroute.Outcome{PromptTokens: 100, TTFT: time.Second})
	}
	if got := old.Load(now).InFlight; got != 0 {
		t.Errorf("the removed e0's View: %d in flight, want 0", got)
	}
	if got := r.View("e0").Load(now).InFlight; got != 1 {
		t.Errorf("e0 added back: %d in flight, want 1 (its own)", got)
	}
	if got := r.View("e1").Load(now).InFlight; got != 0 {
		t.Errorf("e1: %d in flight, want 0", got)
	}
	r.Done(now, fresh, kvroute.Outcome{})
}

// TestSetEndpointsAddedGetsTraffic: an endpoint added to a busy pool takes
// requests.
func TestSetEndpointsAddedGetsTraffic(t *testing.T) {
	for _, name := range []string{policy.Default, "least_request", "round_robin"} {
		t.Run(name, func(t *testing.T) {
			pk, err := policy.New(name, nil, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := newTestRouter(t, 2, pk)
			if err := r.SetEndpoints(t0, epsOf(0, 1, 2), nil); err != nil {
				t.Fatal(err)
			}
			got := 0
			for i := range 30 {
				f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 100}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if f.Endpoint.ID == "e2" {
					got++
				}
			}
			if got < 5 {
				t.Fatalf("e2 took %d of 30 requests in flight, want at least 5", got)
			}
		})
	}
}

// TestSetEndpointsRemovedNeverPicked is a property over random pools,
// changes and policies: no decision after a change names an endpoint the
// change removed, every flight ends cleanly, and the pool's Views count
// exactly the flights in progress on them.
func TestSetEndpointsRemovedNeverPicked(t *testing.T) {
	for _, name := range policy.Names() {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(name))))
			pk, err := policy.New(name, nil, 7)
			if err != nil {
				t.Fatal(err)
			}
			r, err := New(Config{Model: "m", Endpoints: eps(4), Policy: name, Picker: pk,
				Health: HealthConfig{FailThreshold: 1, BaseEjection: 50 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			next := 4 // the next new endpoint's number
			now := t0
			type live struct {
				f    *Flight
				view *signals.View
			}
			var inflight []live
			for step := range 300 {
				now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
				switch op := rng.IntN(10); {
				case op == 0: // change the pool: drop some, keep some, add some
					cur := r.Endpoints()
					var list []kvroute.Endpoint
					for _, e := range cur {
						if rng.IntN(3) > 0 {
							list = append(list, e)
						}
					}
					for range rng.IntN(3) {
						list = append(list, ep(next))
						next++
					}
					if len(list) == 0 {
						list = append(list, ep(next))
						next++
					}
					rng.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
					if err := r.SetEndpoints(now, list, nil); err != nil {
						t.Fatal(err)
					}
				case op == 1 && len(inflight) > 0: // end a flight
					i := rng.IntN(len(inflight))
					r.FirstToken(now, inflight[i].f)
					r.Done(now, inflight[i].f, kvroute.Outcome{PromptTokens: 100, TTFT: 10 * time.Millisecond})
					inflight = slices.Delete(inflight, i, i+1)
				case op == 2: // a failure, maybe an ejection
					cur := r.Endpoints()
					r.ReportResult(now, cur[rng.IntN(len(cur))].ID, false)
				default:
					req := &kvroute.Request{ID: fmt.Sprint(step), Model: "m", PromptTokens: 50 + rng.IntN(500), MaxTokens: 16,
						Prompt:     fmt.Sprintf("system %d. %s", rng.IntN(3), strings.Repeat("x", rng.IntN(600))),
						SessionKey: fmt.Sprint(rng.IntN(8))}
					f, err := r.Route(now, req, nil)
					if err != nil {
						continue // shed or none healthy
					}
					if !slices.Contains(ids(r), f.Endpoint.ID) {
						t.Fatalf("step %d: routed to %s, not in the pool %v", step, f.Endpoint.ID, ids(r))
					}
					if f.Endpoint != &r.byID[f.Endpoint.ID].ep {
						t.Fatalf("step %d: routed to a stale %s", step, f.Endpoint.ID)
					}
					req.Prompt = "" // the caller's buffer goes back
					inflight = append(inflight, live{f, r.View(f.Endpoint.ID)})
				}
			}
			want := map[*signals.View]int{}
			for _, l := range inflight {
				want[l.view]++
			}
			for _, e := range r.Endpoints() {
				v := r.View(e.ID)
				if got := v.Load(now).InFlight; got != want[v] {
					t.Errorf("%s: %d in flight, want %d", e.ID, got, want[v])
				}
			}
			for _, l := range inflight {
				r.Done(now, l.f, kvroute.Outcome{})
			}
			for _, l := range inflight {
				if got := l.view.Load(now).InFlight; got != 0 {
					t.Fatalf("a View still counts %d in flight after every Done", got)
				}
			}
		})
	}
}

// TestSetEndpointsConcurrent changes the pool while requests are routed
// and finished (run with -race).
func TestSetEndpointsConcurrent(t *testing.T) {
	pk, err := policy.New(policy.Default, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRouter(t, 3, pk)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(g, "-", i), Model: "m", PromptTokens: 100,
					Prompt: strings.Repeat("p", 300)}, nil)
				if err != nil {
					continue
				}
				_ = f.Endpoint.ID + f.Endpoint.URL
				r.ReportResult(t0, f.Endpoint.ID, true)
				r.FirstToken(t0, f)
				r.Done(t0, f, kvroute.Outcome{})
			}
		})
	}
	for i := range 200 {
		list := epsOf(i%2, 2, 3+i%3)
		list[1].Labels = map[string]string{"round": fmt.Sprint(i)}
		if err := r.SetEndpoints(t0, list, nil); err != nil {
			t.Fatal(err)
		}
		_ = r.Status(t0)
		_ = r.View("e2")
	}
	close(stop)
	wg.Wait()
	for _, e := range r.Endpoints() {
		if n := r.View(e.ID).Load(t0).InFlight; n != 0 {
			t.Errorf("%s: %d in flight at the end, want 0", e.ID, n)
		}
	}
}

// TestSetEndpointsConsistentHashing: with consistent hashing (kv-aware's
// session ring, kubeai-chwbl's prefix ring) adding or removing one of n
// endpoints moves only the keys that must move: to the new endpoint, or
// off the removed one, about 1/n of them.
func TestSetEndpointsConsistentHashing(t *testing.T) {
	const n, keys = 8, 400
	for _, tc := range []struct {
		name string
		req  func(i int) *kvroute.Request
	}{
		{policy.Default, func(i int) *kvroute.Request {
			return &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 100, SessionKey: fmt.Sprint("session-", i)}
		}},
		{"kubeai-chwbl", func(i int) *kvroute.Request {
			return &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 100, Prompt: fmt.Sprintf("prompt %d", i)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pk, err := policy.New(tc.name, nil, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := newTestRouter(t, n, pk)
			place := func() map[int]string {
				out := make(map[int]string, keys)
				for i := range keys {
					f, err := r.Route(t0, tc.req(i), nil)
					if err != nil {
						t.Fatal(err)
					}
					out[i] = f.Endpoint.ID
					r.Done(t0, f, kvroute.Outcome{})
				}
				return out
			}
			before := place()
			all := make([]int, n+1)
			for i := range all {
				all[i] = i
			}
			if err := r.SetEndpoints(t0, epsOf(all...), nil); err != nil {
				t.Fatal(err)
			}
			added := place()
			moved := 0
			for i := range keys {
				if added[i] != before[i] {
					moved++
					if added[i] != fmt.Sprint("e", n) {
						t.Fatalf("key %d moved from %s to %s, not to the new endpoint", i, before[i], added[i])
					}
				}
			}
			if moved == 0 || moved > 2*keys/(n+1) {
				t.Errorf("adding one endpoint to %d moved %d of %d keys, want 1..%d", n, moved, keys, 2*keys/(n+1))
			}
			if err := r.SetEndpoints(t0, epsOf(all[1:]...), nil); err != nil { // remove e0
				t.Fatal(err)
			}
			removed := place()
			moved = 0
			for i := range keys {
				if removed[i] != added[i] {
					moved++
					if added[i] != "e0" {
						t.Fatalf("key %d moved from %s to %s, though %s stays", i, added[i], removed[i], added[i])
					}
				}
			}
			if moved > 2*keys/(n+1) {
				t.Errorf("removing one endpoint of %d moved %d of %d keys, want at most %d", n+1, moved, keys, 2*keys/(n+1))
			}
		})
	}
}

// TestSetEndpointsForgetsPickerState: a picker that keeps state per
// endpoint (sglang-cache-aware's radix tree) forgets a removed endpoint, so
// that an engine added back under its ID inherits nothing.
func TestSetEndpointsForgetsPickerState(t *testing.T) {
	pk, err := policy.New("sglang-cache-aware", nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRouter(t, 1, pk)
	prompt := strings.Repeat("a prompt only e0 has seen. ", 10)
	servedThenReadded(t, r, prompt)
	// A miss goes to the smallest tree, the first on ties: e1. Had the
	// tree kept e0's prompt, the request would follow it to e0.
	f, err := r.Route(t0, &kvroute.Request{ID: "2", Model: "m", Prompt: prompt}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Endpoint.ID != "e1" {
		t.Fatalf("got %s, want e1 (e0's tree forgotten)", f.Endpoint.ID)
	}
}

// observingPicker is pickFirstHealthy that counts the outcomes it learns
// from, by endpoint.
type observingPicker struct {
	pickFirstHealthy
	observed map[string]int
}

func (p *observingPicker) Observe(_ time.Time, o kvroute.Outcome) { p.observed[o.Endpoint]++ }

// TestSetEndpointsRemovedTeachesNothing: a flight that ends after its
// engine left the pool is not learned from, even when the endpoint was
// first updated in place (the flight holds the copy from before) and only
// then removed; one whose engine stays, updated in place, is.
func TestSetEndpointsRemovedTeachesNothing(t *testing.T) {
	p := &observingPicker{observed: map[string]int{}}
	r := newTestRouter(t, 2, p)
	route := func(id string) *Flight {
		t.Helper()
		f, err := r.Route(t0, &kvroute.Request{ID: id, Model: "m", Prompt: "x"}, []string{"e1"})
		if err != nil || f.Endpoint.ID != "e0" {
			t.Fatalf("route %s: %v, %v; want e0", id, f, err)
		}
		return f
	}
	kept, gone := route("kept"), route("gone")
	heavier := epsOf(0, 1)
	heavier[0].Weight = 3 // e0 updated in place: the flights hold its old copy
	if err := r.SetEndpoints(t0, heavier, nil); err != nil {
		t.Fatal(err)
	}
	r.Done(t0, kept, kvroute.Outcome{})
	if p.observed["e0"] != 1 {
		t.Fatalf("the flight on e0, updated in place, was not learned from: %v", p.observed)
	}
	if err := r.SetEndpoints(t0, epsOf(1), nil); err != nil {
		t.Fatal(err)
	}
	r.Done(t0, gone, kvroute.Outcome{})
	if p.observed["e0"] != 1 {
		t.Errorf("a flight on e0 after e0 was removed was learned from: %v", p.observed)
	}
}

// TestRouteWeights: endpoint weights reach the policy through the
// candidates, from New and from SetEndpoints: round_robin routes 1:2:1,
// then, after the weights change to 3:1:1, 3:1:1.
func TestRouteWeights(t *testing.T) {
	pk, _ := policy.New(policy.NameRoundRobin, nil, 1)
	list := eps(3)
	list[1].Weight = 2
	r, err := New(Config{Model: "m", Endpoints: list, Policy: policy.NameRoundRobin, Picker: pk})
	if err != nil {
		t.Fatal(err)
	}
	count := func(n int) map[string]int {
		got := map[string]int{}
		for i := range n {
			f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 10}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got[f.Endpoint.ID]++
			r.Done(t0, f, kvroute.Outcome{Endpoint: f.Endpoint.ID})
		}
		return got
	}
	if got := count(400); got["e0"] != 100 || got["e1"] != 200 || got["e2"] != 100 {
		t.Errorf("weights 1:2:1: got %v, want e0 100, e1 200, e2 100", got)
	}
	list[0].Weight, list[1].Weight = 3, 1
	if err := r.SetEndpoints(t0, list, nil); err != nil {
		t.Fatal(err)
	}
	if got := count(500); got["e0"] != 300 || got["e1"] != 100 || got["e2"] != 100 {
		t.Errorf("weights 3:1:1: got %v, want e0 300, e1 100, e2 100", got)
	}
}

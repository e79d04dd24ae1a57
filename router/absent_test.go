package router

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/signals"
)

// dpEndpoints are the ranks of one data-parallel server of size n.
func dpEndpoints(n int) []kvroute.Endpoint {
	out := make([]kvroute.Endpoint, n)
	for r := range out {
		out[r] = kvroute.Endpoint{ID: kvroute.DataParallelID("dp", r), URL: "http://127.0.0.1:8000",
			DataParallelSize: n, DataParallelRank: r}
	}
	return out
}

// TestAbsentNeverPicked: an absent data-parallel rank is never picked, even
// passing its health checks and looking idle to kv-aware (its signals
// stale, the others' busy), until it is present again; its status says
// why it is out.
func TestAbsentNeverPicked(t *testing.T) {
	k, err := policy.New(policy.Default, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Model: "m", Endpoints: dpEndpoints(4), Policy: policy.Default, Picker: k})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	busy := signals.Metrics{Have: signals.HasWaiting | signals.HasRunning, Waiting: 8, Running: 32}
	for _, id := range []string{"dp#dp0", "dp#dp1"} {
		r.View(id).Observe(now, busy)
	}
	for _, id := range []string{"dp#dp2", "dp#dp3"} {
		if !r.SetAbsent(now, id, true) {
			t.Errorf("SetAbsent(%s, true): no change reported", id)
		}
		r.SetActiveHealth(now, id, true) // the server's probe passes for every rank
	}
	if r.SetAbsent(now, "dp#dp2", true) || r.SetAbsent(now, "nope", true) {
		t.Error("SetAbsent reported a change for an endpoint already absent, or an unknown one")
	}
	route := func(i int) string {
		t.Helper()
		f, err := r.Route(now, &kvroute.Request{Model: "m", Prompt: fmt.Sprintf("prompt %d", i), PromptTokens: 100}, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		r.Done(now, f, kvroute.Outcome{TTFT: 10 * time.Millisecond, PromptTokens: 100, CachedTokens: -1})
		return f.Endpoint.ID
	}
	for i := range 200 {
		now = now.Add(time.Millisecond)
		if id := route(i); id != "dp#dp0" && id != "dp#dp1" {
			t.Fatalf("request %d went to absent %s", i, id)
		}
	}
	st := statusOf(t, r, now, "dp#dp2")
	if st.Healthy || !st.ActiveOK || !st.Absent || st.Out != OutAbsent {
		t.Errorf("absent rank's status: healthy %v, active ok %v, absent %v, out %q; want false, true, true, %q",
			st.Healthy, st.ActiveOK, st.Absent, st.Out, OutAbsent)
	}
	if st := statusOf(t, r, now, "dp#dp0"); !st.Healthy || st.Absent || st.Out != "" {
		t.Errorf("present rank's status: healthy %v, absent %v, out %q; want true, false, \"\"", st.Healthy, st.Absent, st.Out)
	}

	// Present again: the idle rank takes requests.
	if !r.SetAbsent(now, "dp#dp2", false) {
		t.Error("SetAbsent(dp#dp2, false): no change reported")
	}
	seen := map[string]int{}
	for i := range 20 {
		now = now.Add(time.Millisecond)
		seen[route(1000+i)]++
	}
	if seen["dp#dp2"] == 0 || seen["dp#dp3"] != 0 {
		t.Errorf("got requests per rank %v, want some on dp#dp2 (back) and none on dp#dp3 (still absent)", seen)
	}

	// Every rank absent: 503, as with no healthy endpoint.
	for _, id := range []string{"dp#dp0", "dp#dp1", "dp#dp2"} {
		r.SetAbsent(now, id, true)
	}
	_, err = r.Route(now, &kvroute.Request{Model: "m", Prompt: "x"}, nil)
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Errorf("every rank absent: got %v, want an UnavailableError", err)
	}
}

// TestAbsentOtherReasons: Out names the first reason that applies.
func TestAbsentOtherReasons(t *testing.T) {
	r := newTestRouter(t, 3, &pickFirstHealthy{})
	now := time.Unix(1000, 0)
	r.SetActiveHealth(now, "e0", false)
	r.SetAbsent(now, "e0", true)
	r.SetActiveHealth(now, "e1", false)
	for range 10 {
		r.ReportResult(now, "e2", false)
	}
	var got []string
	for _, st := range r.Status(now) {
		got = append(got, st.ID+"="+st.Out)
	}
	if want := fmt.Sprint([]string{"e0=" + OutAbsent, "e1=" + OutActive, "e2=" + OutEjected}); fmt.Sprint(got) != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

// TestSetEndpointsAbsent: an absent rank that stays in the pool stays
// absent; one removed and added again starts present.
func TestSetEndpointsAbsent(t *testing.T) {
	all := dpEndpoints(4)
	r, err := New(Config{Model: "m", Endpoints: all, Policy: "test", Picker: &pickFirstHealthy{}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r.SetAbsent(now, "dp#dp2", true)
	r.SetAbsent(now, "dp#dp3", true)
	// dp#dp3 leaves; dp#dp2 stays, with a new weight (updated as a copy).
	next := append([]kvroute.Endpoint(nil), all[:3]...)
	next[2].Weight = 2
	if err := r.SetEndpoints(now, next, nil); err != nil {
		t.Fatal(err)
	}
	if st := statusOf(t, r, now, "dp#dp2"); !st.Absent || st.Healthy {
		t.Errorf("dp#dp2 after a reload that keeps it: absent %v, healthy %v; want still absent", st.Absent, st.Healthy)
	}
	if err := r.SetEndpoints(now, all, nil); err != nil {
		t.Fatal(err)
	}
	if st := statusOf(t, r, now, "dp#dp3"); st.Absent || !st.Healthy {
		t.Errorf("dp#dp3 added again: absent %v, healthy %v; want present and healthy", st.Absent, st.Healthy)
	}
	if st := statusOf(t, r, now, "dp#dp2"); !st.Absent {
		t.Error("dp#dp2 lost its absence on a reload that kept it")
	}
}

package policy

import (
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// TestForgetEndpoint: kv-aware's learned rates and preble-e2's load window
// of an endpoint ID do not pass to another engine that a reload puts
// under the ID (router.SetEndpoints calls ForgetEndpoint), and a request
// still in flight on the old engine does not touch the new one's sums
// when it ends.
func TestForgetEndpoint(t *testing.T) {
	now := time.Unix(1e9, 0)
	eps := []kvroute.Endpoint{{ID: "gpu-0", URL: "http://10.0.0.1:8000"}, {ID: "gpu-1", URL: "http://10.0.0.2:8000"}}
	moved := []kvroute.Endpoint{{ID: "gpu-0", URL: "http://10.0.0.9:8000"}, eps[1]}

	k, err := NewKVAware(map[string]any{"learn": true}, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "m", Endpoints: eps, Policy: NameKVAware, Picker: k})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		k.Observe(now, kvroute.Outcome{Endpoint: "gpu-0", PromptTokens: 4000, TTFT: 3 * time.Second})
	}
	if k.eps["gpu-0"] == nil {
		t.Fatal("no learned stats for gpu-0")
	}
	// A request in flight on the old gpu-0 when it is replaced.
	req := &kvroute.Request{ID: "r", Model: "m", Prompt: "x", PromptTokens: 4000}
	var f *router.Flight
	for f == nil || f.Endpoint.ID != "gpu-0" {
		req.ID += "x"
		if f, err = r.Route(now, req, []string{"gpu-1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.SetEndpoints(now, moved, nil); err != nil {
		t.Fatal(err)
	}
	if s := k.eps["gpu-0"]; s != nil {
		t.Errorf("the new engine under gpu-0 inherited the old one's stats: %+v", *s)
	}
	k.stat("gpu-0") // the new engine's own stats, empty
	r.Done(now, f, kvroute.Outcome{PromptTokens: 4000, TTFT: time.Hour})
	if s := k.eps["gpu-0"]; s == nil || !reflect.DeepEqual(*s, epStats{}) {
		t.Errorf("the old engine's request, ending, changed the new engine's stats: %+v", s)
	}

	pb, err := New(NamePrebleE2, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	pr := pb.(*Preble)
	r2, err := router.New(router.Config{Model: "m", Endpoints: eps, Policy: NamePrebleE2, Picker: pr})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		f, err := r2.Route(now, &kvroute.Request{ID: string(rune('a' + i)), Model: "m", Prompt: "hello", PromptTokens: 100}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r2.Done(now, f, kvroute.Outcome{})
	}
	if pr.hist["gpu-0"] == nil {
		t.Fatal("preble kept no history of gpu-0")
	}
	if err := r2.SetEndpoints(now, moved, nil); err != nil {
		t.Fatal(err)
	}
	if pr.hist["gpu-0"] != nil {
		t.Error("preble's new engine under gpu-0 inherited the old one's load window")
	}
}

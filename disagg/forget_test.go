package disagg

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// forgettingPicker places the prefill stage on the first healthy
// candidate and records the endpoints it is told to forget.
type forgettingPicker struct{ forgot []string }

func (p *forgettingPicker) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	for i := range cands {
		if cands[i].Healthy {
			return kvroute.Chose("first", cands, i, "first healthy")
		}
	}
	return kvroute.None("first", "none healthy")
}

func (p *forgettingPicker) ForgetEndpoint(id string) { p.forgot = append(p.forgot, id) }

// TestPlannerForgetsEndpoint: the planner passes ForgetEndpoint on to its
// prefill picker, and drops the fabric's bookings on the endpoint's own
// GPU links (an engine added under the ID later queues behind none of
// them) while keeping the others'.
func TestPlannerForgetsEndpoint(t *testing.T) {
	fp := &forgettingPicker{}
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "llama-3.1-8b-h100"), Mode: ModeAlways, Prefill: fp})
	if err != nil {
		t.Fatal(err)
	}
	p1, p2, d1, d2 := pool() // p1 and d1 share node n1: NVLink, booked on their GPU links
	now := time.Unix(0, 0)
	ready := now.Add(time.Second) // the transfers are still ahead at now
	fab := pl.Fabric()
	fab.Reserve(now, ready, p1, d1, 1<<30)
	fab.Reserve(now, ready, p2, d2, 1<<30) // across nodes: on the nodes' ports
	if n, _ := fab.InFlight(now); n != 2 {
		t.Fatalf("booked %d transfers, want 2", n)
	}
	pl.ForgetEndpoint("d1")
	if !slices.Equal(fp.forgot, []string{"d1"}) {
		t.Errorf("prefill picker forgot %v, want [d1]", fp.forgot)
	}
	if n, _ := fab.InFlight(now); n != 1 {
		t.Errorf("after forgetting d1: %d transfers booked, want 1 (p2 -> d2)", n)
	}
	if e := fab.Estimate(now, ready, p1, d1, 1<<30); e.Queue != 0 {
		t.Errorf("a transfer into d1 after it was forgotten queues %v, want 0", e.Queue)
	}
}

// TestPlannerPinEndpointFollowsChanges: a pin made with PinEndpoint
// chooses its endpoint only while the ID names the same engine in the same
// role; after an endpoint change it is not available (the handoff then
// places the decode stage again), never another role's engine.
func TestPlannerPinEndpointFollowsChanges(t *testing.T) {
	pl := newPlanner(t, ModeAlways, Links{})
	p1, _, d1, d2 := pool()
	now := time.Unix(0, 0)
	asPrefill := *d1
	asPrefill.Role = kvroute.RolePrefill
	moved := *d1
	moved.URL = "http://elsewhere"
	for _, tc := range []struct {
		name string
		d1   *kvroute.Endpoint // d1's ID in the pool now
		want int               // candidate chosen, -1 none
	}{
		{"unchanged", d1, 1},
		{"role changed", &asPrefill, -1},
		{"another engine", &moved, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := req("r", 512, 16)
			pl.PinEndpoint(r, d1)
			d := pl.Pick(now, r, cands(candSpec{ep: p1}, candSpec{ep: tc.d1}, candSpec{ep: d2}))
			if d.Index != tc.want {
				t.Errorf("got candidate %d (%s), want %d", d.Index, d.Reason, tc.want)
			}
		})
	}
}

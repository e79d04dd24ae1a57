package proxy

import (
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// TestPDDecisionLatencyObserved: a P/D pool's placements are timed in
// kvroute_decision_duration_seconds as an aggregated pool's routings are.
// The handoff's first placement went through admit without the pool's
// metrics, so the histogram of a P/D model stayed empty whatever it
// served.
func TestPDDecisionLatencyObserved(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, ds.URL), policy.New)
	tp.postOK(t, 2, PathCompletions, `{"model":"tiny","prompt":"a prompt handed off to decode","max_tokens":2}`)
	mfs, err := tp.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "kvroute_decision_duration_seconds" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "model" && l.GetValue() == "tiny" {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if n != 2 {
		t.Errorf("kvroute_decision_duration_seconds{model=tiny} count: got %d, want 2", n)
	}
}

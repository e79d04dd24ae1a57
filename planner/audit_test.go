package planner

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/disagg"
)

// TestBadInputNaNAndCrawlingFabric: a NaN target utilisation passed every
// comparison and planned nonsense ("no aggregated fleet up to 512 engines
// meets the SLO in the analytical model"); a fabric of 1e-300 Gbps made the
// simulator panic. Both are bad input now, found before any simulation.
func TestBadInputNaNAndCrawlingFabric(t *testing.T) {
	p := mustProfile(t, "llama-3.1-8b-h100")
	w := constWorkload(50, 10, 1000, 100)
	slo := SLO{TTFT: Target{0.99, 2 * time.Second}}
	for _, tc := range []struct {
		name string
		in   Input
		msg  string
	}{
		{"max util NaN", Input{Profile: p, Workload: w, SLO: slo, MaxUtilisation: math.NaN()}, "max utilisation"},
		{"fabric 1e-300 Gbps", Input{Profile: p, Workload: w, SLO: slo, Fabric: disagg.Link{Gbps: 1e-300}}, "fabric bandwidth"},
		{"fabric efficiency NaN", Input{Profile: p, Workload: w, SLO: slo, Fabric: disagg.Link{Gbps: 50, Efficiency: math.NaN()}}, "fabric efficiency"},
		// 1 Gbps at 0.5% efficiency is 0.005 Gbps effective, as the simulator sees it.
		{"fabric slow after efficiency", Input{Profile: p, Workload: w, SLO: slo, Fabric: disagg.Link{Gbps: 1, Efficiency: 0.005}}, "effective"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(t.Context(), tc.in)
			if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want %v containing %q", err, ErrBadInput, tc.msg)
			}
		})
	}
}

package proxy

import (
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/disagg"
)

// TestPDPlannerProtocol: a P/D model's planner prices transfers for its
// pd.protocol (sglang: the whole prompt moves; nixl: only what the decode
// node lacks), so it is handed the configured protocol.
func TestPDPlannerProtocol(t *testing.T) {
	for _, proto := range []string{disagg.ProtocolNixl, disagg.ProtocolSGLang} {
		m := &config.Model{Name: "m", PD: config.PD{Protocol: proto, Profile: "llama-3.1-8b-h100"}}
		pl, err := newPlanner(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := pl.Config().Protocol; got != proto {
			t.Errorf("pd.protocol %s: planner got protocol %q", proto, got)
		}
	}
}

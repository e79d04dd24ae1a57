package policy

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestPendingSweepAmortized: with more requests in flight than
// pendingSweepMin (none released, none stale), a Pick does not sweep the
// per-request state every time: each sweep passed over every entry, so
// the last 4,464 of 70,000 Picks each swept every entry (4,480
// sweeps in all, the test 36s instead of 1.4s); now the size
// triggers a sweep again only once the state doubled (and every 4096th
// Pick sweeps as before). Stale entries still go: after PendingTTL a
// sweep drops them all.
func TestPendingSweepAmortized(t *testing.T) {
	const n = pendingSweepMin + 4464
	now := time.Unix(1_700_000_000, 0)
	cands := []kvroute.Candidate{cand("a", kvroute.Load{}, 0, 0), cand("b", kvroute.Load{}, 0, 0)}
	for _, name := range []string{NameKVAware, NameDynamo} {
		t.Run(name, func(t *testing.T) {
			p, err := New(name, map[string]any{}, 1)
			if err != nil {
				t.Fatal(err)
			}
			sweeps := func() int {
				if k, ok := p.(*KVAware); ok {
					return k.sweeps
				}
				return p.(*Dynamo).sweeps
			}
			pending := func() int {
				if k, ok := p.(*KVAware); ok {
					return len(k.pending)
				}
				return len(p.(*Dynamo).pending)
			}
			for i := range n {
				p.Pick(now, &kvroute.Request{ID: strconv.Itoa(i), PromptTokens: 100}, cands)
			}
			if got, most := sweeps(), n/4096+1; got > most {
				t.Errorf("%d Picks, %d in flight: got %d sweeps, want at most %d", n, pending(), got, most)
			}
			// After the TTL (10m for both) the next sweep drops them all.
			later := now.Add(11 * time.Minute)
			for i := 0; pending() > 1 && i < 4096; i++ {
				p.Pick(later, &kvroute.Request{ID: "late" + strconv.Itoa(i), PromptTokens: 100}, cands)
			}
			if got := pending(); got > 4096 {
				t.Errorf("after the TTL: %d requests still pending, want the stale ones swept", got)
			}
		})
	}
}

package signals

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestObserveRepeatDifferential: ObserveRepeat leaves a View no method can
// tell from one that made the n Observe calls: random histories of
// scrapes with moving prefix counters, dispatches, first tokens, ends and
// runs of identical scrapes (n of them at one interval, as a simulator's
// idle engine gives), applied to two Views, one through ObserveRepeat, the
// other through the calls, give the same Load at every probe (now, within
// the staleness limit, past it, past the hit-rate window) and the same
// Snapshot, and the same number of Gen changes. Intervals from 1ms (the
// fallback) to 2s.
func TestObserveRepeatDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		every := []time.Duration{time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond, 2 * time.Second}[trial%4]
		a, b := NewView(ViewConfig{}), NewView(ViewConfig{})
		now := t0
		var q, h float64
		var tickets []Ticket
		m := func() Metrics {
			x := vllmMetrics(float64(rng.IntN(4)), float64(rng.IntN(8)), rng.Float64())
			x.Have |= HasPrefixCounters
			x.PrefixQueries, x.PrefixHits = q, h
			return x
		}
		for op := range 60 {
			// Later observations are at least every apart, as a
			// simulator's scrapes of one engine are.
			now = now.Add(every * time.Duration(1+rng.IntN(3)))
			switch rng.IntN(5) {
			case 0, 1:
				if rng.IntN(8) == 0 {
					q, h = 0, 0 // an engine restart
				}
				q += float64(rng.IntN(2000))
				h += float64(rng.IntN(int(q-h) + 1))
				x := m()
				a.Observe(now, x)
				b.Observe(now, x)
			case 2:
				n := 1 + rng.IntN(400)
				x := m()
				a.ObserveRepeat(now, every, n, x)
				for i := range n {
					b.Observe(now.Add(time.Duration(i)*every), x)
				}
				now = now.Add(time.Duration(n-1) * every)
			case 3:
				tk := a.Dispatch(now, 100+rng.IntN(1000))
				b.Dispatch(now, tk.PromptTokens)
				tickets = append(tickets, tk)
			case 4:
				if len(tickets) > 0 {
					k := rng.IntN(len(tickets))
					if rng.IntN(2) == 0 {
						a.FirstToken(now, tickets[k])
						b.FirstToken(now, tickets[k])
					} else {
						a.Done(now, tickets[k])
						b.Done(now, tickets[k])
						tickets = append(tickets[:k], tickets[k+1:]...)
					}
				}
			}
			if ga, gb := a.Gen(), b.Gen(); ga != gb {
				t.Fatalf("trial %d (every %v) op %d: Gen %d, want %d", trial, every, op, ga, gb)
			}
			for _, d := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 9 * time.Second, 11 * time.Second} {
				if la, lb := a.Load(now.Add(d)), b.Load(now.Add(d)); la != lb {
					t.Fatalf("trial %d (every %v) op %d: Load(now+%v) = %+v, want %+v", trial, every, op, d, la, lb)
				}
			}
			if sa, sb := a.Snapshot(), b.Snapshot(); !reflect.DeepEqual(sa, sb) {
				t.Fatalf("trial %d (every %v) op %d: Snapshot %+v, want %+v", trial, every, op, sa, sb)
			}
		}
	}
}

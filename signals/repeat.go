package signals

import "time"

// ObserveRepeat is n calls of Observe(from + i x every, m), i = 0..n-1:
// a caller that knows its endpoint cannot have changed between the
// scrapes (a simulator skipping over an idle engine, whose scrapes would
// all read m) records them at once. When the calls are in order, every is
// at least HitRateWindow/(maxHitSamples-3) and the kept samples leave room
// for the window's, it takes two observations, the first and the last, and
// counts the others (Snapshot's Scrapes, Gen): the samples between have
// the counters of those two, so the hit rate, the only thing they feed, is
// the one the n calls give, now and after any later calls spaced as
// widely (the cap on kept samples never applies to either). Otherwise it
// makes the n calls. from + (n-1) x every must fit in a time.Time.
func (v *View) ObserveRepeat(from time.Time, every time.Duration, n int, m Metrics) {
	if n <= 0 {
		return
	}
	v.mu.Lock()
	compact := n > 2 && every > 0 && (v.observedAt.IsZero() || !from.Before(v.observedAt)) &&
		v.cfg.HitRateWindow/every+3 < maxHitSamples && len(v.hits)+int(v.cfg.HitRateWindow/every)+3 < maxHitSamples
	v.mu.Unlock()
	if !compact {
		for i := range n {
			v.Observe(from.Add(time.Duration(i)*every), m)
		}
		return
	}
	v.Observe(from, m)
	v.mu.Lock()
	v.gen.Add(uint64(n - 2))
	v.scrapes += uint64(n - 2)
	v.mu.Unlock()
	v.Observe(from.Add(time.Duration(n-1)*every), m)
}

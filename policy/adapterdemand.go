package policy

import (
	"math"
	"time"
)

// AdapterDemandTau is the time constant over which AdapterDemand forgets
// an adapter's requests.
const AdapterDemandTau = 30 * time.Second

// AdapterDemand counts each LoRA adapter's recent requests, decayed with
// AdapterDemandTau, for the wait of another adapter's request behind
// them (SlotBusyPeriod): kv-aware counts the requests it places, and the
// P/D decode picker (package disagg) the decode legs. The zero value is
// ready to use; not safe for concurrent use.
type AdapterDemand struct {
	m map[string]decayedCount
}

// decayedCount is a count at a time, decaying from then.
type decayedCount struct {
	n  float64
	at time.Time
}

// value is c's count at now.
func (c decayedCount) value(now time.Time) float64 {
	if c.at.IsZero() {
		return c.n
	}
	return c.n * math.Exp(-now.Sub(c.at).Seconds()/AdapterDemandTau.Seconds())
}

// Seen counts a request for adapter x at now.
func (d *AdapterDemand) Seen(now time.Time, x string) {
	if d.m == nil {
		d.m = make(map[string]decayedCount)
	}
	d.m[x] = decayedCount{n: d.m[x].value(now) + 1, at: now}
}

// Rate is adapter x's recent arrival rate at now, per second.
func (d *AdapterDemand) Rate(now time.Time, x string) float64 {
	return d.m[x].value(now) / AdapterDemandTau.Seconds()
}

// maxSlotDecodes bounds SlotBusyPeriod, in decodes: past it every such
// engine is as bad (and e^(lambda D) stays finite).
const maxSlotDecodes = 100

// SlotBusyPeriod is how long an engine running requests of adapters that
// arrive at rate lambda (per second, all together), each staying a decode
// of d, takes on average to have none left in its batch, freeing their
// slot for another adapter (vLLM admits their new requests ahead of a
// waiting one of an adapter that needs a slot): the busy period of an
// M/G/inf queue, (e^(lambda d) - 1) / lambda, short behind a rarely used
// adapter and very long behind a busy one; d when lambda is 0 (no
// arrival counted: the one request running), at most maxSlotDecodes
// decodes.
func SlotBusyPeriod(lambda float64, d time.Duration) time.Duration {
	s := d.Seconds()
	if lambda <= 0 || s <= 0 {
		return d
	}
	return time.Duration(math.Min(math.Expm1(lambda*s)/lambda, maxSlotDecodes*s) * float64(time.Second))
}

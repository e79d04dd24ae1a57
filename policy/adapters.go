package policy

import (
	"iter"
	"math"
	"slices"
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

// AdapterUses keeps, per endpoint, the LoRA adapters last placed there,
// most recent first, each once, at most maxAdapterUses: an engine keeps
// an adapter in its GPU slots until another takes its place, and its
// signals show an adapter only once its requests arrive, so a picker
// takes an engine to hold the last ones it placed there for a while
// (Held): the P/D decode picker for the decode legs (package disagg);
// kv-aware keeps its own per endpoint with its other stats (adapterUses),
// for the requests it routes (adapter_hold). The zero value is ready to
// use; not safe for concurrent use.
type AdapterUses struct {
	m map[string]adapterUses
}

// maxAdapterUses bounds AdapterUses's list per endpoint.
const maxAdapterUses = 8

// adapterUse is an adapter placed on an endpoint, and when.
type adapterUse struct {
	adapter string
	at      time.Time
}

// adapterUses is one endpoint's list of AdapterUses: most recent first,
// each adapter once, at most maxAdapterUses.
type adapterUses []adapterUse

// noted returns the list with a placement of adapter x at now.
func (list adapterUses) noted(now time.Time, x string) adapterUses {
	if i := slices.IndexFunc(list, func(a adapterUse) bool { return a.adapter == x }); i >= 0 {
		list = slices.Delete(list, i, i+1)
	} else if len(list) == maxAdapterUses {
		list = list[:maxAdapterUses-1]
	}
	return slices.Insert(list, 0, adapterUse{adapter: x, at: now})
}

// held returns how many of the list's adapters, from the first, the
// endpoint holds: the last slots placed there, those placed at from or
// after (holdFrom).
func (list adapterUses) held(from time.Time, slots int) int {
	for j, a := range list {
		if j >= slots || a.at.Before(from) {
			return j
		}
	}
	return len(list)
}

// holdFrom returns the earliest time a placement may have been made at and
// still hold its slot at now, for hold: now - hold. A placement at is
// within hold, now.Sub(at) <= hold, when !at.Before(holdFrom(now, hold))
// (for times less than 292 years apart, within a Duration): a comparison
// is cheaper than a Sub per placement, which for times without a
// monotonic reading (the simulator's, the benchmarks') is an Add and an
// Equal besides.
func holdFrom(now time.Time, hold time.Duration) time.Time { return now.Add(-hold) }

// Note records that a request for adapter x was placed on endpoint ep at
// now.
func (u *AdapterUses) Note(now time.Time, ep, x string) {
	if u.m == nil {
		u.m = make(map[string]adapterUses)
	}
	u.m[ep] = u.m[ep].noted(now, x)
}

// Held yields the adapters endpoint ep holds by its placements at now:
// the last slots placed there, those placed within hold of now.
func (u *AdapterUses) Held(now time.Time, ep string, slots int, hold time.Duration) iter.Seq[string] {
	return func(yield func(string) bool) {
		list := u.m[ep]
		for _, a := range list[:list.held(holdFrom(now, hold), slots)] {
			if !yield(a.adapter) {
				return
			}
		}
	}
}

// Forget drops endpoint ep's placements (removed from the pool, or
// another engine under its ID).
func (u *AdapterUses) Forget(ep string) { delete(u.m, ep) }

// AdapterHomes keeps each LoRA adapter's home: the endpoint it was placed
// on most, its placements there counted with decay (AdapterDemandTau).
// With more adapters than an engine's slots, the adapters placed on an
// engine lately (AdapterUses) change with every request of another, so
// they say little of which adapters an engine serves; the home changes only
// once an adapter goes elsewhere more often than home. The zero value is
// ready to use; not safe for concurrent use.
type AdapterHomes struct {
	n    map[adapterKey]decayedCount
	home map[string]string   // adapter -> endpoint
	at   map[string][]string // endpoint -> the adapters at home there, in the order they came
}

// Note records that a request for adapter x was placed on endpoint ep at
// now. The counts all decay at one rate, so their order changes only
// here: the home is kept, not searched for.
func (h *AdapterHomes) Note(now time.Time, ep, x string) {
	if h.n == nil {
		h.n, h.home, h.at = make(map[adapterKey]decayedCount), make(map[string]string), make(map[string][]string)
	}
	key := adapterKey{ep, x}
	c := decayedCount{n: h.n[key].value(now) + 1, at: now}
	h.n[key] = c
	if cur, ok := h.home[x]; !ok || cur != ep && c.n > h.n[adapterKey{cur, x}].value(now) {
		h.move(x, ep)
	}
}

// move makes ep adapter x's home.
func (h *AdapterHomes) move(x, ep string) {
	if cur, ok := h.home[x]; ok {
		h.at[cur] = slices.DeleteFunc(h.at[cur], func(a string) bool { return a == x })
	}
	h.home[x] = ep
	h.at[ep] = append(h.at[ep], x)
}

// Home is adapter x's home ("": none placed yet).
func (h *AdapterHomes) Home(x string) string { return h.home[x] }

// AtHome returns the adapters whose home is endpoint ep, in the order they
// came (not to be modified).
func (h *AdapterHomes) AtHome(ep string) []string { return h.at[ep] }

// Forget drops endpoint ep's placements; the adapters at home there move to
// the endpoint each was placed on most after it, if any.
func (h *AdapterHomes) Forget(ep string) {
	for key := range h.n {
		if key.endpoint == ep {
			delete(h.n, key)
		}
	}
	for _, x := range h.at[ep] {
		delete(h.home, x)
		var ref time.Time // the counts compare at one time: the last of theirs
		for key, c := range h.n {
			if key.adapter == x && c.at.After(ref) {
				ref = c.at
			}
		}
		best, to := 0.0, ""
		for key, c := range h.n {
			if v := c.value(ref); key.adapter == x && (v > best || v == best && to != "" && key.endpoint < to) {
				best, to = v, key.endpoint
			}
		}
		if to != "" {
			h.move(x, to)
		}
	}
	delete(h.at, ep)
}

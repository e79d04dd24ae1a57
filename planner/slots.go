package planner

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// slotsBound returns the closed-form bound on engines from LoRA adapter
// slots (Bounds.Slots; decode for Bounds.DecodeSlots), or nil when no
// request names an adapter.
//
// An engine's step batches at most MaxLoRAs distinct adapters (vLLM's
// --max-loras), and a request holds its adapter's slot on its engine from
// its first step to its last (vLLM does not preempt a running request for
// another adapter). So at every instant the adapters with a request
// running number at most engines x MaxLoRAs. Waiting is what lets a small
// fleet take turns between adapters, and only a TTFT target limits it:
// request i (arrival a, prefill floor pf on an idle engine with every
// shared prefix cached, the TTFT floor less the round trip; o output
// tokens, each decode step at least s1, one sequence's at its prompt's
// context) that meets TTFT limit L starts by a + L - pf, and cannot end
// before a + pf + (o-1) s1, so it surely runs over [a + L - pf, a + pf +
// (o-1) s1] when that is not empty (its sure stretch). On a decode node
// of a disaggregated fleet a handed-off request's decode leg starts by a +
// L - s1 (its first step gives the first token), so the decode pool's
// stretches start at a + L - min(pf, s1). The SLO lets the 1 - q share of
// the requests miss TTFT: taking any k requests away shortens an
// adapter's union of stretches by at most their lengths, so the k longest
// stretches are subtracted. Over the span H from the first stretch's
// start to the last one's end, engines x MaxLoRAs x H is at least the
// adapter-seconds the stretches cover (each adapter's union, summed), so
// engines >= (covered - the k longest) / H / MaxLoRAs. It is a floor: the
// stretches are the least each request must run, and the span the
// longest the fleet could spread them over. Without a TTFT target there
// is no bound (a request may wait any time for a slot: slots then bound
// latency, not the fleet), and the bound says so with Need 0.
func slotsBound(in *Input, d *Demand, floors []time.Duration, decode bool) *Bound {
	if d.Adapters == 0 {
		return nil
	}
	b := &Bound{Name: "slots"}
	pool := "engines"
	if decode {
		b.Name, pool = "decode slots", "decode nodes"
	}
	m := in.MaxLoRAs
	t := in.SLO.TTFT
	if !t.Set() {
		b.Explain = fmt.Sprintf("no bound: %d adapters at --max-loras %d, but with no TTFT target a request may wait any time for a slot, so the slots bound its latency, not the fleet", d.Adapters, m)
		return b
	}
	p := in.Profile
	type stretch struct {
		adapter  string
		from, to time.Duration
	}
	var st []stretch
	for i := range d.reqs {
		r := &d.reqs[i]
		if r.Adapter == "" {
			continue
		}
		pf := max(floors[i]-netRTT, 0)
		s1 := p.DecodeTime(1, r.PromptLen)
		dec := time.Duration(max(r.OutputLen-1, 0)) * s1
		lead := pf
		if decode {
			lead = min(pf, s1)
		}
		from, to := r.Arrival+t.Limit-lead, r.Arrival+pf+dec
		if to > from {
			st = append(st, stretch{r.Adapter, from, to})
		}
	}
	n := len(d.reqs)
	k := n - int(math.Ceil(t.Quantile*float64(n)-1e-9)) // the requests the SLO lets miss
	if len(st) == 0 {
		b.Explain = fmt.Sprintf("%d adapters at --max-loras %d: no adapter request surely runs at a fixed time (a + TTFT limit %s - prefill floor is past a + prefill floor + (output-1) one-sequence decode steps for every one): the TTFT target leaves room to take turns, so no engines follow from the slots",
			d.Adapters, m, fmtDur(t.Limit))
		return b
	}
	lens := make([]time.Duration, len(st))
	lo, hi := st[0].from, st[0].to
	for i, s := range st {
		lens[i] = s.to - s.from
		lo, hi = min(lo, s.from), max(hi, s.to)
	}
	slices.SortFunc(lens, func(a, b time.Duration) int { return cmp.Compare(b, a) })
	var dropped time.Duration
	for _, l := range lens[:min(k, len(lens))] {
		dropped += l
	}
	// Each adapter's union of stretches.
	slices.SortFunc(st, func(a, b stretch) int {
		if c := cmp.Compare(a.adapter, b.adapter); c != 0 {
			return c
		}
		return cmp.Compare(a.from, b.from)
	})
	var covered, end time.Duration
	for i, s := range st {
		if i == 0 || s.adapter != st[i-1].adapter {
			end = s.from
		}
		if from := max(s.from, end); s.to > from {
			covered += s.to - from
		}
		end = max(end, s.to)
	}
	span := hi - lo
	resident := max(covered-dropped, 0).Seconds() / span.Seconds()
	b.Engines = resident / float64(m)
	b.Need = int(math.Ceil(b.Engines - 1e-9))
	start := "a + TTFT limit - prefill floor"
	if decode {
		start = "a + TTFT limit - min(prefill floor, one decode step) (a handed-off decode leg's first step gives the first token)"
	}
	b.Explain = fmt.Sprintf("%d adapters at --max-loras %d: a request holds its adapter's slot from its first step to its last, so one that meets TTFT %s surely runs from %s to a + prefill floor + (output-1) one-sequence decode steps; "+
		"%d of the %d requests have such a stretch, whose union per adapter covers %.1f adapter-seconds, less the %d longest (%.1f s: the %s%% the SLO lets miss) = %.1f over the %.1fs they span = %.2f adapters resident at once / %s per engine = %.2f %s",
		d.Adapters, m, t, start, len(st), n, covered.Seconds(), min(k, len(lens)), dropped.Seconds(), qName(1-t.Quantile),
		max(covered-dropped, 0).Seconds(), span.Seconds(), resident, plural(m, "slot"), b.Engines, pool)
	return b
}

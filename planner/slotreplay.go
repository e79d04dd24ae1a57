package planner

import (
	"slices"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// adapterLoad is the kv-aware policy's default price of loading an adapter
// an engine has no request of (policy.KVAwareParams.AdapterLoad), seconds.
var adapterLoad = policy.DefaultKVAwareParams().AdapterLoad.Seconds()

// slotBook is the analytical replay's view of one node's LoRA adapter
// slots: the requests it runs, each holding its adapter's slot from the
// start of its prefill (or decode leg) to its last token, on the replay's
// clock (seconds). An engine batches at most max distinct adapters (vLLM's
// --max-loras); a request of another adapter waits until one of them has
// no request left running (see wait).
//
// A prefill-only node's book (prefill) holds prefills, each from its start
// to its end (a prefill leg leaves with its first token), which the node
// computes one after the other: an adapter stays there while its requests
// keep arriving before the last one's prefill is done, each adding its
// prefill (see stay), and holds its slot over that stay even between two
// of its prefills (see running).
type slotBook struct {
	max     int
	prefill bool
	holds   []hold
	// streams are every adapter's requests in arrival order, shared by
	// the nodes: the requests not placed yet extend a running adapter's
	// stay (see stay).
	streams map[string]*adapterStream
}

// hold is one request's slot: its adapter, from its start to its end;
// ready is when it reached the node (from then to its start it waits
// there).
type hold struct {
	adapter         string
	from, to, ready float64
}

// adapterStream is one adapter's requests in the replay: their arrivals,
// how long each runs unqueued (dur: prefill, then a decode step a token)
// and its prefill alone (pre), and the first one the replay has not
// placed yet. homes is, in a P/D replay, the decode nodes the adapter
// runs or waits on when the request being placed arrives (0: not
// counted, as one): the router's decode picker (disagg.DecodePicker)
// sends its requests to any of them at no slot cost, ties in turn, so a
// decode node foresees one in homes of them (see stay).
type adapterStream struct {
	at, dur, pre []float64
	next         int
	homes        int
}

// drop forgets the requests done by t (the replay's arrivals come in
// order, so nothing asks about an earlier time again).
func (b *slotBook) drop(t float64) {
	b.holds = slices.DeleteFunc(b.holds, func(h hold) bool { return h.to <= t })
}

// add books a request of adapter x that reaches the node at ready and
// runs from..to.
func (b *slotBook) add(x string, ready, from, to float64) {
	b.holds = append(b.holds, hold{x, from, to, ready})
}

// has reports whether the node has a request of adapter x booked.
func (b *slotBook) has(x string) bool {
	return slices.ContainsFunc(b.holds, func(h hold) bool { return h.adapter == x })
}

// running returns the distinct adapters with a request running at t,
// sorted (as kvroute.LoRALoad.Running). On a prefill-only node an adapter
// with a request started by t runs until its stay ends: the requests that
// arrive while its prefills run join its batch (vLLM admits them ahead of
// a waiting request of another adapter), so it does not leave between two
// of them.
func (b *slotBook) running(t float64) []string { return b.runningTo(nil, t) }

// runningTo is running, appending to out.
func (b *slotBook) runningTo(out []string, t float64) []string {
	for _, h := range b.holds {
		if h.from <= t && !slices.Contains(out, h.adapter) && (t < h.to || b.prefill && t < b.stay(h.adapter)) {
			out = append(out, h.adapter)
		}
	}
	slices.Sort(out)
	return out
}

// load returns the node's load at t as the router reads it from the
// engine's metrics: the requests running and those waiting there (they
// reached it and wait for a slot or for their prefill to start), with
// the adapters of each in lora (kvroute.LoRALoad, vllm:lora_requests_info;
// a new one when nil, else its slices reused).
func (b *slotBook) load(t float64, lora *kvroute.LoRALoad) (running, waiting int, _ *kvroute.LoRALoad) {
	if lora == nil {
		lora = &kvroute.LoRALoad{}
	}
	lora.Running, lora.Waiting, lora.Max = b.runningTo(lora.Running[:0], t), lora.Waiting[:0], b.max
	for _, h := range b.holds {
		switch {
		case h.from <= t && t < h.to:
			running++
		case h.ready <= t && t < h.from:
			waiting++
			if !slices.Contains(lora.Waiting, h.adapter) {
				lora.Waiting = append(lora.Waiting, h.adapter)
			}
		}
	}
	slices.Sort(lora.Waiting)
	return running, waiting, lora
}

// stay returns when adapter a stops running on the node: its last booked
// request's end, later while requests of a not placed yet arrive before
// then (vLLM's scheduler lets a request of a running adapter join the
// batch, and skips a waiting request of another: an adapter that keeps
// receiving requests keeps its slot). Those requests are taken to come
// to this node, where their adapter runs, as the kv-aware policy sends
// them (it prices a load and a slot wait elsewhere); on a P/D fleet's
// decode node, one in the adapter's homes of them (every homes-th, from
// the next), as the decode picker spreads them over the nodes it runs on.
// On a prefill-only node each of them adds its prefill to the stay: the
// node computes them one after the other.
func (b *slotBook) stay(a string) float64 {
	end := 0.0
	for _, h := range b.holds {
		if h.adapter == a {
			end = max(end, h.to)
		}
	}
	if s := b.streams[a]; s != nil {
		n := max(1, s.homes)
		if b.prefill {
			n = 1
		}
		for k := s.next; k < len(s.at) && s.at[k] < end; k += n {
			if b.prefill {
				end += s.pre[k]
			} else {
				end = max(end, s.at[k]+s.dur[k])
			}
		}
	}
	return end
}

// wait returns when a request of adapter x ready at s can start: the
// first time from s when x runs there or fewer than max adapters do,
// each running adapter holding its slot for its stay.
func (b *slotBook) wait(x string, s float64) float64 {
	if x == "" {
		return s
	}
	t := s
	for range 1000 { // each round passes an adapter's stay: bounded by the requests booked
		run := b.running(t)
		if len(run) < b.max || slices.Contains(run, x) {
			return t
		}
		ends := make([]float64, len(run))
		for i, a := range run {
			ends[i] = b.stay(a)
		}
		slices.Sort(ends)
		next := ends[len(run)-b.max] // len(run)-max+1 adapters must leave
		for _, h := range b.holds {  // or a request of x booked to start sooner
			if h.adapter == x && h.from > t && h.from < next {
				next = h.from
			}
		}
		if next <= t {
			return t
		}
		t = next
	}
	return t
}

package disagg

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// Fabric tracks the KV transfers the router has planned or has in flight
// and prices the queueing they imply, so that two big handoffs into one
// decode node are not each planned as if they had the whole link.
//
// # Model
//
// A transfer from endpoint a to endpoint b uses two resources: the sending
// side and the receiving side. Between different nodes these are the
// nodes' network ports (all cross-node links of a node share them); inside
// one node (NVLink) they are the two endpoints' own GPU links. A planned
// transfer of B bytes becomes ready at a time at (when its prefill is
// expected to finish); at that time each of its resources still carries
// the bytes other transfers have not moved yet (a transfer not started
// carries all of its bytes; one in progress carries the part left,
// linearly). The new transfer waits for the larger of those backlogs to
// drain at its own link's bandwidth (FIFO), then pays its setup and its
// own wire time:
//
//	queue    = max(backlog(send side, at), backlog(receive side, at)) / bandwidth
//	start    = at + setup + queue
//	end      = start + bytes / bandwidth
//
// Transfers leave the books when released or when their planned end has
// passed. The Fabric does no I/O and never reads the clock: every method
// takes now. It is safe for concurrent use.
type Fabric struct {
	links Links

	mu    sync.Mutex // protects next and xfers
	next  uint64
	xfers map[uint64]*transfer
}

type transfer struct {
	res        [2]string
	bytes      float64
	start, end time.Time // when bytes begin and finish moving
	link       string
}

// Estimate is the planned cost of one transfer.
type Estimate struct {
	// Link is the link the transfer crosses.
	Link Link
	// Bytes is the KV size moved.
	Bytes int64
	// Setup is the link's fixed cost, Queue the wait behind transfers
	// already planned on the same sides, Wire the time the bytes occupy
	// the link.
	Setup, Queue, Wire time.Duration
}

// Total is Setup + Queue + Wire.
func (e Estimate) Total() time.Duration { return e.Setup + e.Queue + e.Wire }

// Ticket identifies a reserved transfer; the zero Ticket reserves nothing.
type Ticket uint64

// NewFabric returns a Fabric over links (zero Links: DefaultLinks).
func NewFabric(links Links) *Fabric {
	if len(links.Rules) == 0 && links.Default.Gbps == 0 {
		links = DefaultLinks()
	}
	return &Fabric{links: links, xfers: make(map[uint64]*transfer)}
}

// Links returns the fabric's link configuration.
func (f *Fabric) Links() Links { return f.links }

// resources names the two sides a transfer from a to b uses.
func resources(a, b *kvroute.Endpoint) [2]string {
	na, nb := NodeOf(a), NodeOf(b)
	if na == nb {
		return [2]string{"gpu-out|" + a.ID, "gpu-in|" + b.ID}
	}
	return [2]string{"net-out|" + na, "net-in|" + nb}
}

// Estimate prices moving bytes from a to b, ready at time at (>= now),
// against the transfers already reserved. It reserves nothing. Moving KV
// from an endpoint to itself costs nothing.
func (f *Fabric) Estimate(now, at time.Time, a, b *kvroute.Endpoint, bytes int64) Estimate {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.estimate(now, at, a, b, bytes)
	return e
}

func (f *Fabric) estimate(now, at time.Time, a, b *kvroute.Endpoint, bytes int64) (Estimate, [2]string) {
	if a == nil || b == nil || a.ID == b.ID || bytes <= 0 {
		return Estimate{}, [2]string{}
	}
	if at.Before(now) {
		at = now
	}
	l := f.links.Between(a, b)
	res := resources(a, b)
	f.purge(now)
	backlog := 0.0
	for _, r := range res {
		if q := f.backlog(r, at); q > backlog {
			backlog = q
		}
	}
	return Estimate{Link: l, Bytes: bytes, Setup: l.Setup, Queue: l.wire(backlog), Wire: l.wire(float64(bytes))}, res
}

// Reserve prices a transfer like Estimate and books it, so later estimates
// queue behind it. Release the ticket when the transfer is over (or will
// not happen); an unreleased transfer leaves the books at its planned end.
func (f *Fabric) Reserve(now, at time.Time, a, b *kvroute.Endpoint, bytes int64) (Ticket, Estimate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, res := f.estimate(now, at, a, b, bytes)
	if e.Bytes == 0 {
		return 0, e
	}
	if at.Before(now) {
		at = now
	}
	start := at.Add(e.Setup + e.Queue)
	f.next++
	f.xfers[f.next] = &transfer{res: res, bytes: float64(bytes), start: start, end: start.Add(e.Wire), link: e.Link.Name}
	return Ticket(f.next), e
}

// Release removes a reserved transfer. Unknown and zero tickets are
// ignored, so Release is idempotent.
func (f *Fabric) Release(t Ticket) {
	if t == 0 {
		return
	}
	f.mu.Lock()
	delete(f.xfers, uint64(t))
	f.mu.Unlock()
}

// forgetEndpoint drops the transfers booked on endpoint id's own GPU
// links (same-node transfers into or out of it): the endpoint left the
// pool, or another engine took its ID.
func (f *Fabric) forgetEndpoint(id string) {
	out, in := "gpu-out|"+id, "gpu-in|"+id
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, x := range f.xfers {
		for _, r := range x.res {
			if r == out || r == in {
				delete(f.xfers, t)
				break
			}
		}
	}
}

// InFlight returns the number of reserved transfers not yet over at now
// and the bytes they still have to move.
func (f *Fabric) InFlight(now time.Time) (n int, bytes float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.purge(now)
	for _, x := range f.xfers {
		n++
		bytes += x.remaining(now)
	}
	return n, bytes
}

// backlog is the bytes still to move on resource r at time t.
func (f *Fabric) backlog(r string, t time.Time) float64 {
	sum := 0.0
	for _, x := range f.xfers {
		if x.res[0] == r || x.res[1] == r {
			sum += x.remaining(t)
		}
	}
	return sum
}

// purge drops transfers that ended before now.
func (f *Fabric) purge(now time.Time) {
	for id, x := range f.xfers {
		if !x.end.After(now) {
			delete(f.xfers, id)
		}
	}
}

// remaining is the part of x's bytes not moved by t.
func (x *transfer) remaining(t time.Time) float64 {
	switch {
	case !t.After(x.start):
		return x.bytes
	case !t.Before(x.end):
		return 0
	}
	return x.bytes * float64(x.end.Sub(t)) / float64(x.end.Sub(x.start))
}

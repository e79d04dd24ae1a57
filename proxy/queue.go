package proxy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// admit routes the first attempt of a request on pl. While requests wait
// in the pool's line it does not route the request but puts it in line
// behind them (hold): one arriving just as room frees does not overtake
// those that waited longer. A request the policy sheds with the "queue"
// action is held too (queue). m records the routing decision's latency
// (nil: not recorded). With the line empty, admit costs one atomic load
// more than routing.
func (p *Proxy) admit(ctx context.Context, pl *pool, req *kvroute.Request, m *poolMetrics) (*router.Flight, error) {
	if pl.line.busy() {
		return p.hold(ctx, pl, req, nil)
	}
	t0 := p.now()
	f, err := pl.router.Route(t0, req, nil)
	if m != nil {
		m.decision.Observe(p.now().Sub(t0).Seconds())
	}
	if err != nil {
		return p.queue(ctx, pl, req, err)
	}
	return f, nil
}

// queue holds a request that the policy shed with the "queue" action (every
// endpoint over its load cap) and routes it again as load drains, for at
// most retry.queue_wait (see hold). Any other error, or a "shed" action,
// is returned as it is.
func (p *Proxy) queue(ctx context.Context, pl *pool, req *kvroute.Request, err error) (*router.Flight, error) {
	var se *router.ShedError
	if !errors.As(err, &se) || policy.OverloadAction(se.Decision) != policy.OverloadQueue {
		return nil, err
	}
	if p.cfg.Retry.QueueWait <= 0 {
		p.metrics.queued.WithLabelValues(pl.model).Inc()
		return nil, err
	}
	return p.hold(ctx, pl, req, se)
}

// hold keeps a request in pl's line for at most retry.queue_wait (> 0) and
// routes it when its turn comes. se is the error with which the policy
// shed the request, nil when the request was not routed yet (it arrived
// while others waited, see admit). The held requests of a pool wait in
// line, first come first served within a tenant and in turn across
// tenants (see router.Line): only the one at the head routes, at once when
// its turn comes after others' (or when it was never routed), then again
// when the router signals that load drained (a flight got its first token
// or ended: Router.Drained) or after a growing pause (10 ms doubling to
// 200 ms: load that drains in the engines' signals); when it leaves
// (routed, out of time, or its client gone) the next one routes at once.
// A request not routed before is answered as it would have been at an
// empty line when its first routing fails otherwise than by a "queue"
// shed. When the wait runs out the last shed error is returned, saying
// how long the request waited (the client then gets 429 with
// Retry-After). The client going away ends the wait and frees its place
// in line; so does the drain deadline, and the request is answered as the
// others then in progress are (503, errShutdown), not as shed.
func (p *Proxy) hold(ctx context.Context, pl *pool, req *kvroute.Request, se *router.ShedError) (*router.Flight, error) {
	wait := p.cfg.Retry.QueueWait
	// The wait is real time, whatever clock routing uses.
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	w := pl.line.join(req.Tenant)
	defer pl.line.leave(w)
	// Counted once in line: a reader that sees the count sees the
	// request's place (the queue tests order requests by it).
	p.metrics.queued.WithLabelValues(pl.model).Inc()
	routed := se != nil
	if !routed {
		se = router.BehindShed(pl.model)
	}
	expired := func() error { return router.WaitedOut(se, wait) }
	ended := func() error {
		if errors.Is(context.Cause(ctx), errShutdown) {
			return errShutdown
		}
		return se // the client went away: nobody reads the answer
	}

	pause := p.queuePause.first
	if !routed {
		pause = 0
	}
	select {
	case <-w.turn:
		// At the head from the start: the fleet just shed the request
		// (if it was routed), so pause before routing it again.
	default:
		// Behind others: routing again is the head's business until it
		// leaves; then there may be room at once.
		select {
		case <-ctx.Done():
			return nil, ended()
		case <-timeout.C:
			return nil, expired()
		case <-w.turn:
			pause = 0
		}
	}
	for {
		if pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ended()
			case <-timeout.C:
				t.Stop()
				return nil, expired()
			case <-t.C:
			case <-pl.router.Drained():
				// A flight ended or got its first token: there may be
				// room now rather than at the end of the pause.
				t.Stop()
			}
		}
		f, err := pl.router.Route(p.now(), req, nil)
		if err == nil || !errors.As(err, &se) {
			return f, err
		}
		if !routed && policy.OverloadAction(se.Decision) != policy.OverloadQueue {
			return nil, err // shed, not queued: as at an empty line
		}
		routed = true
		pause = min(max(2*pause, p.queuePause.first), p.queuePause.max)
	}
}

// waitLine is one pool's held requests, in a router.Line's fair order by
// tenant, with each waiter's turn to signal.
// It is safe for concurrent use; the zero value is an empty line.
type waitLine struct {
	mu   sync.Mutex // guards line
	line router.Line[*waiter]
	// n is line.Len(), written under mu and read without it (busy): a
	// request arriving at an empty line takes no lock.
	n atomic.Int32
}

// waiter is one held request's place in line; turn is closed when it
// reaches the head.
type waiter struct {
	turn chan struct{}
}

// join puts a new waiter of tenant in the line.
func (line *waitLine) join(tenant string) *waiter {
	w := &waiter{turn: make(chan struct{})}
	line.mu.Lock()
	defer line.mu.Unlock()
	if line.line.Join(w, tenant) {
		close(w.turn)
	}
	line.n.Store(int32(line.line.Len()))
	return w
}

// leave takes w out of the line; when w was at the head, the next
// waiter's turn comes.
func (line *waitLine) leave(w *waiter) {
	line.mu.Lock()
	defer line.mu.Unlock()
	if next, ok := line.line.Leave(w); ok {
		close(next.turn)
	}
	line.n.Store(int32(line.line.Len()))
}

// busy reports whether requests wait in the line, without taking its lock.
func (line *waitLine) busy() bool { return line.n.Load() > 0 }

// waiting returns how many requests wait in the line.
func (line *waitLine) waiting() int {
	line.mu.Lock()
	defer line.mu.Unlock()
	return line.line.Len()
}

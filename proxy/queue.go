package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// queue holds a request that the policy shed with the "queue" action (every
// endpoint over its load cap) and routes it again as load drains, for at
// most retry.queue_wait. The held requests of a pool wait in line, first
// come first served within a tenant and in turn across tenants (see
// waitLine): only the one at the head routes again, with a growing
// pause (10 ms doubling to 200 ms), and when it leaves (routed, out of
// time, or its client gone) the next one routes at once. Any other error,
// or a "shed" action, is returned as it is; when the wait runs out the last
// shed error is, saying how long the request waited (the client then gets
// 429 with Retry-After). The client going away ends the wait and frees its
// place in line; so does the drain deadline, and the request is answered
// as the others then in progress are (503, errShutdown), not as shed.
func (p *Proxy) queue(ctx context.Context, pl *pool, req *kvroute.Request, err error) (*router.Flight, error) {
	var se *router.ShedError
	if !errors.As(err, &se) || policy.OverloadAction(se.Decision) != policy.OverloadQueue {
		return nil, err
	}
	p.metrics.queued.WithLabelValues(pl.model).Inc()
	wait := p.cfg.Retry.QueueWait
	if wait <= 0 {
		return nil, err
	}
	// The wait is real time, whatever clock routing uses.
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	w := pl.line.join(req.Tenant)
	defer pl.line.leave(w)
	expired := func() error { return waitedOut(se, wait) }
	ended := func() error {
		if errors.Is(context.Cause(ctx), errShutdown) {
			return errShutdown
		}
		return err // the client went away: nobody reads the answer
	}

	pause := 10 * time.Millisecond
	select {
	case <-w.turn:
		// At the head from the start: the fleet just shed the request,
		// so pause before routing it again.
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
			}
		}
		var f *router.Flight
		if f, err = pl.router.Route(p.now(), req, nil); err == nil || !errors.As(err, &se) {
			return f, err
		}
		pause = min(max(2*pause, 10*time.Millisecond), 200*time.Millisecond)
	}
}

// waitedOut is the answer to a request whose queue_wait ran out: the last
// shed error, saying so.
func waitedOut(se *router.ShedError, wait time.Duration) error {
	out := *se
	out.Err.Message = fmt.Sprintf("%s; still overloaded after the request waited %v in the router's queue (retry.queue_wait)",
		se.Err.Message, wait)
	return &out
}

// waitLine is one pool's held requests, served in turn by tenant (fair
// queuing): a request joining the line is tagged one past the later of its
// tenant's last tag and the head's tag, and the lowest tag (then the
// earliest) goes next. Within a tenant that is first come first served;
// across tenants, one tenant's burst queued ahead does not keep another's
// request behind all of it: that request waits for at most one request of
// each other tenant in line (besides the head).
// It is safe for concurrent use; the zero value is an empty line.
type waitLine struct {
	mu      sync.Mutex        // guards the fields below
	q       []*waiter         // in arrival order
	head    *waiter           // the one whose turn it is
	vnow    uint64            // the tag of the last head
	last    map[string]uint64 // per tenant with requests in line, its last tag
	tenants map[string]int    // per tenant, its requests in line
}

// waiter is one held request's place in line; turn is closed when it
// reaches the head.
type waiter struct {
	turn   chan struct{}
	tenant string
	tag    uint64
}

// join puts a new waiter of tenant in the line.
func (line *waitLine) join(tenant string) *waiter {
	w := &waiter{turn: make(chan struct{}), tenant: tenant}
	line.mu.Lock()
	defer line.mu.Unlock()
	if line.last == nil {
		line.last, line.tenants = map[string]uint64{}, map[string]int{}
	}
	w.tag = max(line.vnow, line.last[tenant]) + 1
	line.last[tenant] = w.tag
	line.tenants[tenant]++
	line.q = append(line.q, w)
	if line.head == nil {
		line.next()
	}
	return w
}

// leave takes w out of the line; when w was at the head, the next
// waiter's turn comes.
func (line *waitLine) leave(w *waiter) {
	line.mu.Lock()
	defer line.mu.Unlock()
	i := slices.Index(line.q, w)
	if i < 0 {
		return
	}
	line.q = slices.Delete(line.q, i, i+1)
	if line.tenants[w.tenant]--; line.tenants[w.tenant] == 0 {
		delete(line.tenants, w.tenant)
		delete(line.last, w.tenant)
	}
	if len(line.q) == 0 {
		line.head = nil
		return
	}
	if line.head == w {
		line.next()
	}
}

// next gives the turn to the waiter with the lowest tag, the earliest
// among equals. Called with line.mu held and the line not empty.
func (line *waitLine) next() {
	h := line.q[0]
	for _, w := range line.q[1:] {
		if w.tag < h.tag {
			h = w
		}
	}
	line.head, line.vnow = h, max(line.vnow, h.tag)
	close(h.turn)
}

// waiting returns how many requests wait in the line.
func (line *waitLine) waiting() int {
	line.mu.Lock()
	defer line.mu.Unlock()
	return len(line.q)
}

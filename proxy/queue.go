package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// queue holds a request that the policy shed with the "queue" action (every
// endpoint over its load cap) and routes it again as load drains, with a
// growing pause (10 ms doubling to 200 ms), for at most retry.queue_wait.
// Any other error, or a "shed" action, is returned as it is; so is the last
// shed error when the wait runs out (the client then gets 429 with
// Retry-After). The client going away ends the wait.
func (p *Proxy) queue(ctx context.Context, pl *pool, req *kvroute.Request, err error) (*router.Flight, error) {
	var se *router.ShedError
	if !errors.As(err, &se) || policy.OverloadAction(se.Decision) != policy.OverloadQueue {
		return nil, err
	}
	p.metrics.queued.WithLabelValues(pl.model).Inc()
	// The wait is real time, whatever clock routing uses.
	deadline := time.Now().Add(p.cfg.Retry.QueueWait)
	pause := 10 * time.Millisecond
	for {
		wait := min(pause, time.Until(deadline))
		if wait <= 0 {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		var f *router.Flight
		if f, err = pl.router.Route(p.now(), req, nil); err == nil || !errors.As(err, &se) {
			return f, err
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

package sim

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
)

// The router's queue escape hatch, as kvroute serve's proxy runs it
// (proxy.hold): a request the policy sheds with the "queue" action (kv-aware's
// overload: queue, every endpoint over its cap) is held in its router
// replica's line for at most Config.QueueWait, and so is one arriving while
// others are held (it is not routed: it waits its turn). Only the line's
// head (router.Line: fair by tenant) routes again: at once when its turn
// comes after another's, else after a pause of router.LinePauseFirst
// doubling to router.LinePauseMax, or as soon as a flight of its replica
// gets its first token or ends (the router's Drained, which keeps one such
// signal for a head that was not pausing yet). When the wait runs out the
// request is rejected with 429.

// heldLine is one router replica's line and its head's retry.
type heldLine struct {
	line  router.Line[int32] // request indices
	pause time.Duration      // the head's current pause
	// gen numbers the head's retries: an evRetry event of an older
	// generation was superseded (the head routed at a drain, or left).
	gen     int32
	pausing bool // the head waits for its pause to end (or a drain)
	signal  bool // a drain no pausing head took yet (Drained's buffer)
}

// held is a request's place in a line (reqState.held).
type held struct {
	since  time.Duration     // when it joined the line
	routed bool              // the policy shed it at least once (else it waited behind others)
	shed   *router.ShedError // the last shed, for the 429
}

// queueable reports whether err is a shed the proxy would hold the request
// for: the "queue" action, with a wait configured.
func (s *simulation) queueable(err error) (*router.ShedError, bool) {
	var se *router.ShedError
	if s.cfg.QueueWait <= 0 || !errors.As(err, &se) || policy.OverloadAction(se.Decision) != policy.OverloadQueue {
		return nil, false
	}
	return se, true
}

// hold puts request i in its replica's line: se is the shed that queued it,
// nil when it arrived behind others (not routed).
func (s *simulation) hold(i int32, se *router.ShedError) {
	st := &s.st[i]
	k := st.rt
	ln := &s.lines[k]
	st.held = &held{since: s.now, routed: se != nil, shed: se}
	s.schedule(s.now+s.cfg.QueueWait, evHoldTimeout, -1, i)
	if ln.line.Join(i, st.rreq.Tenant) {
		// At the head from the start: the fleet just shed it, so it
		// pauses before routing again.
		ln.pause = router.LinePauseFirst
		s.retryAfter(k, ln.pause)
	}
}

// retryAfter schedules the head of line k to route again after d,
// superseding the retry scheduled before. A pause ends at once on a drain
// signalled before it (Drained's buffer).
func (s *simulation) retryAfter(k int32, d time.Duration) {
	ln := &s.lines[k]
	if d > 0 && ln.signal {
		d, ln.signal = 0, false
	}
	ln.gen++
	ln.pausing = d > 0
	s.schedule(s.now+d, evHoldRetry, k, ln.gen)
}

// drained is the router's Drained for replica k (a flight got its first
// token or ended): a head that pauses routes again now; else the signal
// waits for the next pause.
func (s *simulation) drained(k int32) {
	if s.lines == nil {
		return
	}
	if ln := &s.lines[k]; ln.pausing {
		s.retryAfter(k, 0)
	} else {
		ln.signal = true
	}
}

// holdRetry routes the head of line k again (an evHoldRetry of generation
// gen).
func (s *simulation) holdRetry(k, gen int32) {
	ln := &s.lines[k]
	if gen != ln.gen {
		return // superseded
	}
	ln.pausing = false
	i, ok := ln.line.Head()
	if !ok {
		return
	}
	st := &s.st[i]
	f, err := s.rts[k].Route(wall(s.now), &st.rreq, nil)
	var se *router.ShedError
	switch {
	case err == nil:
		st.heldFor = s.now - st.held.since
		s.unhold(i)
		s.routed(i, f)
		return
	case !errors.As(err, &se), !st.held.routed && policy.OverloadAction(se.Decision) != policy.OverloadQueue:
		// Not a shed, or a first routing that sheds without queueing: as
		// at an empty line.
		s.unhold(i)
		s.reject(i, err)
		return
	}
	st.held.routed, st.held.shed = true, se
	ln.pause = min(max(2*ln.pause, router.LinePauseFirst), router.LinePauseMax)
	s.retryAfter(k, ln.pause)
}

// holdTimeout ends the wait of request i when it is still held: 429, with
// the last shed's answer.
func (s *simulation) holdTimeout(i int32) {
	st := &s.st[i]
	if st.held == nil {
		return // routed or rejected meanwhile
	}
	se := st.held.shed
	if se == nil {
		se = router.BehindShed(s.cfg.Model)
	}
	s.unhold(i)
	s.reject(i, router.WaitedOut(se, s.cfg.QueueWait))
}

// unhold takes request i out of its line; when it was the head, the next
// one's turn comes and it routes at once.
func (s *simulation) unhold(i int32) {
	st := &s.st[i]
	st.held = nil
	if _, next := s.lines[st.rt].line.Leave(i); next {
		s.lines[st.rt].pause = 0
		s.retryAfter(st.rt, 0)
	}
}

// reject records request i as rejected by routing error err.
func (s *simulation) reject(i int32, err error) {
	st := &s.st[i]
	st.status, st.errMsg = kvroute.StatusOf(err), err.Error()
	s.finish(i)
}

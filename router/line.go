package router

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
)

// Line orders a pool's held requests: those the policy shed with the
// "queue" action (kv-aware's overload: queue), and those that arrived while
// others were held. Only its head is routed again; when the head leaves
// (routed, out of time, or gone) the next one's turn comes. The proxy holds
// live requests in one (kvroute serve's retry.queue_wait) and the
// simulator models them with one, so both serve the same order.
//
// The order is fair queuing by tenant: a request joining is tagged one past
// the later of its tenant's last tag and the head's tag, and the lowest tag
// (then the earliest to join) is the next head. Within a tenant that is
// first come first served; across tenants, one tenant's burst queued ahead
// does not keep another's request behind all of it: a request with none of
// its tenant's in line waits for at most two of each other tenant's (one
// whose tag ties the head's, one after), besides the head.
//
// A Line is a pure value, not safe for concurrent use. The zero value is an
// empty line.
type Line[T comparable] struct {
	q       []lineEntry[T]    // in the order they joined
	head    int               // q's index of the head; meaningless when q is empty
	vnow    uint64            // the tag of the last head
	last    map[string]uint64 // per tenant with requests in line, its last tag
	tenants map[string]int    // per tenant, its requests in line
}

type lineEntry[T comparable] struct {
	v      T
	tenant string
	tag    uint64
}

// Join puts v, a request of tenant, at its place in line. It reports
// whether v is the head (the line was empty).
func (l *Line[T]) Join(v T, tenant string) (head bool) {
	if l.last == nil {
		l.last, l.tenants = map[string]uint64{}, map[string]int{}
	}
	tag := max(l.vnow, l.last[tenant]) + 1
	l.last[tenant] = tag
	l.tenants[tenant]++
	l.q = append(l.q, lineEntry[T]{v: v, tenant: tenant, tag: tag})
	if len(l.q) == 1 {
		l.next()
		return true
	}
	return false
}

// Leave takes v out of the line (nothing happens when v is not in it).
// When v was the head and others wait, the next head is returned with ok
// true: its turn has come.
func (l *Line[T]) Leave(v T) (next T, ok bool) {
	i := slices.IndexFunc(l.q, func(e lineEntry[T]) bool { return e.v == v })
	if i < 0 {
		return next, false
	}
	e := l.q[i]
	l.q = slices.Delete(l.q, i, i+1)
	if l.tenants[e.tenant]--; l.tenants[e.tenant] == 0 {
		delete(l.tenants, e.tenant)
		delete(l.last, e.tenant)
	}
	switch {
	case len(l.q) == 0:
		return next, false
	case i == l.head:
		l.next()
		return l.q[l.head].v, true
	case i < l.head:
		l.head--
	}
	return next, false
}

// Head returns the request whose turn it is (ok false when the line is
// empty).
func (l *Line[T]) Head() (v T, ok bool) {
	if len(l.q) == 0 {
		return v, false
	}
	return l.q[l.head].v, true
}

// Len returns the number of requests in line.
func (l *Line[T]) Len() int { return len(l.q) }

// next makes the request with the lowest tag, the earliest among equals,
// the head. The line is not empty.
func (l *Line[T]) next() {
	h := 0
	for k := 1; k < len(l.q); k++ {
		if l.q[k].tag < l.q[h].tag {
			h = k
		}
	}
	l.head, l.vnow = h, max(l.vnow, l.q[h].tag)
}

// The pauses of a line's head between its routings (see Line): the first,
// then each twice the last, up to the longest. A flight that gets its
// first token or ends (Router.Drained) ends a pause at once.
const (
	LinePauseFirst = 10 * time.Millisecond
	LinePauseMax   = 200 * time.Millisecond
)

// BehindShed is the shed error of a request that waited in a line behind
// others and was never routed (its wait ran out first, or its client went
// away).
func BehindShed(model string) *ShedError {
	return &ShedError{Err: kvroute.Error{Status: http.StatusTooManyRequests, Type: kvroute.TypeOverloaded, Code: "overloaded",
		Message: fmt.Sprintf("model %q is overloaded: requests held before this one were still waiting for room", model)}}
}

// WaitedOut is the answer to a held request whose wait ran out: the last
// shed error (BehindShed for one never routed), saying how long it waited
// (retry.queue_wait).
func WaitedOut(se *ShedError, wait time.Duration) *ShedError {
	out := *se
	out.Err.Message = fmt.Sprintf("%s; still overloaded after the request waited %v in the router's queue (retry.queue_wait)",
		se.Err.Message, wait)
	return &out
}

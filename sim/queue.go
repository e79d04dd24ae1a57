package sim

import "time"

// eventKind says what an event does when its time comes.
type eventKind uint8

const (
	evArrival       eventKind = iota // a request reaches the router
	evDeliver                        // a routed request reaches its engine (after the network latency)
	evStep                           // an engine's step ends (or an idle engine wakes): emit outputs, start the next
	evScrape                         // a periodic scrape of one engine's metrics is taken
	evObserve                        // a scrape's result reaches the router (after the network latency)
	evFirstToken                     // a request's first token reaches the router
	evDone                           // a request's last token reaches the router
	evKVEvents                       // a batch of an engine's KV events reaches the precise index
	evSample                         // the utilisation timeline samples an engine's state
	evPDPrefilled                    // P/D: a prefill leg's reply reaches the router (pd.go)
	evPDTransferred                  // P/D: a decode leg's KV has arrived on its engine (pd.go)
	evHoldRetry                      // the head of a router replica's line routes again (hold.go; eng: the replica, arg: the retry's generation)
	evHoldTimeout                    // a held request's wait runs out (hold.go)
)

// event is one entry of the simulator's agenda. Events are ordered by time,
// then by the order they were scheduled in, so a run is deterministic.
type event struct {
	at   time.Duration
	seq  uint64
	kind eventKind
	eng  int32 // engine index, for engine-bound events
	arg  int32 // request index, or an index into a side table
}

// agenda is a binary min-heap of events. It is hand-written rather than
// container/heap so that pushing and popping do not box values in interfaces:
// the simulator pushes millions of events per run.
type agenda struct {
	ev  []event
	seq uint64
}

func (q *agenda) Len() int { return len(q.ev) }

func less(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// push schedules an event.
func (q *agenda) push(at time.Duration, kind eventKind, eng, arg int32) {
	q.seq++
	q.ev = append(q.ev, event{at: at, seq: q.seq, kind: kind, eng: eng, arg: arg})
	// sift up
	h := q.ev
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(&h[i], &h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

// pop removes and returns the earliest event. The agenda must not be empty.
func (q *agenda) pop() event {
	h := q.ev
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	q.ev = h[:n]
	h = q.ev
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && less(&h[r], &h[l]) {
			m = r
		}
		if !less(&h[m], &h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top
}

// peek returns the earliest event's time; ok is false when the agenda is empty.
func (q *agenda) peek() (time.Duration, bool) {
	if len(q.ev) == 0 {
		return 0, false
	}
	return q.ev[0].at, true
}

// Package silence bounds how long a proxy waits on an upstream for the
// next bytes of a response it is passing on: a stream from an engine that
// hangs after its headers (SIGSTOP, a wedged GPU, a partition that drops
// packets) would otherwise hold its client, and the proxy's state for it,
// for as long as the engine hangs. Only time spent waiting on the upstream
// counts: a client slow to read stalls the copy, not the engine. The
// proxy's aggregated path and the P/D handoff both use it.
package silence

import (
	"io"
	"sync/atomic"
	"time"
)

// Watch bounds the silence of one response. Arm it when the response's
// headers arrive, mark each read from the upstream with Waiting(true) and
// Waiting(false), and Stop it when the response ends; when a read has
// waited Limit, Cut is called (it should cancel the request, which ends
// the read with an error) and Fired reports it. A nil *Watch does nothing,
// so callers without a bound need no checks. Its methods are safe for
// concurrent use: the timer fires on its own goroutine while the reads
// mark their waits (an atomic store each, no timer operation).
type Watch struct {
	Limit time.Duration
	Cut   func()

	since atomic.Int64 // ns after epoch (+1) the current read began; 0 = not reading
	hit   atomic.Bool  // the limit was reached
	done  atomic.Bool  // stopped: check re-arms nothing
	epoch time.Time    // set by Arm, before t
	t     atomic.Pointer[time.Timer]
}

// Arm starts the watch (at the response's headers).
func (w *Watch) Arm() {
	if w == nil {
		return
	}
	w.epoch = time.Now()
	t := time.AfterFunc(time.Duration(1<<62), w.check) // armed below, once check can see it
	w.t.Store(t)
	t.Reset(w.Limit)
}

// Waiting marks the start (true) and the end (false) of a read from the
// upstream.
func (w *Watch) Waiting(on bool) {
	if w == nil {
		return
	}
	if !on {
		w.since.Store(0)
		return
	}
	w.since.Store(int64(time.Since(w.epoch)) + 1)
}

// check runs when the timer fires: re-arm it for the rest of the limit of
// the read in progress (or a whole limit between reads), or cut.
func (w *Watch) check() {
	if w.done.Load() {
		return
	}
	began := w.since.Load()
	if began == 0 {
		w.t.Load().Reset(w.Limit)
		return
	}
	silent := time.Since(w.epoch) - time.Duration(began-1)
	if silent < w.Limit {
		w.t.Load().Reset(w.Limit - silent)
		return
	}
	w.hit.Store(true)
	w.Cut()
}

// Fired reports whether a read waited Limit and the response was cut.
func (w *Watch) Fired() bool { return w != nil && w.hit.Load() }

// Stop disarms the watch (an unarmed one too).
func (w *Watch) Stop() {
	if w == nil {
		return
	}
	w.done.Store(true)
	if t := w.t.Load(); t != nil {
		t.Stop()
	}
}

// Reader returns r with each of its reads marked as a wait on the
// upstream for w (r itself when w is nil): for a body read whole before
// anything is passed on, such as an error answer to keep.
func Reader(r io.Reader, w *Watch) io.Reader {
	if w == nil {
		return r
	}
	return watched{r, w}
}

type watched struct {
	r io.Reader
	w *Watch
}

func (r watched) Read(p []byte) (int, error) {
	r.w.Waiting(true)
	n, err := r.r.Read(p)
	r.w.Waiting(false)
	return n, err
}

package workload

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Workload is an ordered list of requests (by Arrival, ties by position).
type Workload struct {
	// Name says where the workload came from (a trace path or generator).
	Name     string
	Requests []Request
}

// Validate checks every request and that arrivals do not go backwards.
func (w *Workload) Validate() error {
	var last time.Duration
	for i := range w.Requests {
		r := &w.Requests[i]
		if err := r.Validate(); err != nil {
			return err
		}
		if r.Arrival < last {
			return fmt.Errorf("workload: request %q arrives at %v, before the previous one (%v)", r.ID, r.Arrival, last)
		}
		last = r.Arrival
	}
	return nil
}

// MaxSpan is the longest arrival span a workload may be stretched to
// (ScaleRate) and that the simulator accepts: virtual time is an int64 of
// nanoseconds (292 years), and the requests still have to run after the
// last arrival.
const MaxSpan = 100 * 365 * 24 * time.Hour

// ScaleRate multiplies the arrival rate by x (>0): every arrival's offset
// from the first arrival is divided by x, so x=2 replays the workload twice
// as fast. The first arrival stays where it is: a trace with absolute
// timestamps (Unix milliseconds) is replayed from its first request, and
// dividing the timestamps themselves would move it decades away. x is at
// most 1e9, and may not stretch the last arrival beyond MaxSpan. The
// requests are in arrival order (as Generate and ReadTrace return them).
func (w *Workload) ScaleRate(x float64) error {
	if !(x > 0) || x > 1e9 {
		return fmt.Errorf("workload: rate scale %v must be in (0, 1e9]", x)
	}
	if x == 1 || len(w.Requests) == 0 {
		return nil
	}
	first := w.Requests[0].Arrival
	if last := float64(first) + float64(w.Span()-first)/x; last > float64(MaxSpan) {
		return fmt.Errorf("workload: rate scale %v would stretch the last arrival (%v) beyond the %.0f years a workload may span",
			x, w.Span(), MaxSpan.Hours()/(365*24))
	}
	for i := range w.Requests {
		r := &w.Requests[i]
		r.Arrival = first + time.Duration(float64(r.Arrival-first)/x)
	}
	return nil
}

// Limit keeps only the requests that arrive within d of the first one (0 =
// no limit) and at most n of them (0 = no limit). A trace's timestamps may
// be absolute (a production log in Unix milliseconds, which the simulator
// replays from its first request): d counts from the first arrival, not
// from 0.
func (w *Workload) Limit(d time.Duration, n int) {
	if d > 0 && len(w.Requests) > 0 {
		if first := w.Requests[0].Arrival; d <= math.MaxInt64-first {
			d += first
		} else {
			d = 0 // past the end of the clock: no limit
		}
	}
	w.limitAt(d, n)
}

// limitAt keeps only the requests that arrive at or before d (0 = no
// limit) and at most n of them (0 = no limit).
func (w *Workload) limitAt(d time.Duration, n int) {
	if d > 0 {
		i, _ := slices.BinarySearchFunc(w.Requests, d, func(r Request, d time.Duration) int {
			if r.Arrival <= d {
				return -1
			}
			return 1
		})
		w.Requests = w.Requests[:i]
	}
	if n > 0 && len(w.Requests) > n {
		w.Requests = w.Requests[:n]
	}
}

// Span returns the arrival offset of the last request.
func (w *Workload) Span() time.Duration {
	if len(w.Requests) == 0 {
		return 0
	}
	return w.Requests[len(w.Requests)-1].Arrival
}

// sortByArrival orders requests by arrival, stably.
func sortByArrival(reqs []Request) {
	slices.SortStableFunc(reqs, func(a, b Request) int {
		switch {
		case a.Arrival < b.Arrival:
			return -1
		case a.Arrival > b.Arrival:
			return 1
		}
		return 0
	})
}

// Stats summarises a workload.
type Stats struct {
	Requests       int
	Span           time.Duration
	MeanPromptLen  float64
	MeanOutputLen  float64
	MaxPromptLen   int
	PromptTokens   int64
	OutputTokens   int64
	Sessions       int
	Tenants        int
	OracleHitRate  float64 // at the block size Stats was asked for
	BlockSize      int
	UniqueBlocks   int
	TotalBlocks    int
	RequestsPerSec float64
}

// Stats computes the workload's statistics; blockSize (e.g. 16) sets the
// granularity of the oracle hit rate and block counts.
func (w *Workload) Stats(blockSize int) Stats {
	s := Stats{Requests: len(w.Requests), Span: w.Span(), BlockSize: blockSize}
	sessions := map[string]bool{}
	tenants := map[string]bool{}
	for i := range w.Requests {
		r := &w.Requests[i]
		s.PromptTokens += int64(r.PromptLen)
		s.OutputTokens += int64(r.OutputLen)
		s.MaxPromptLen = max(s.MaxPromptLen, r.PromptLen)
		if r.Session != "" {
			sessions[r.Session] = true
		}
		if r.Tenant != "" {
			tenants[r.Tenant] = true
		}
	}
	s.Sessions, s.Tenants = len(sessions), len(tenants)
	if s.Requests > 0 {
		s.MeanPromptLen = float64(s.PromptTokens) / float64(s.Requests)
		s.MeanOutputLen = float64(s.OutputTokens) / float64(s.Requests)
	}
	if s.Span > 0 {
		s.RequestsPerSec = float64(s.Requests) / s.Span.Seconds()
	}
	o := NewOracle(blockSize)
	var buf []uint64
	for i := range w.Requests {
		buf = o.Observe(&w.Requests[i], buf[:0])
	}
	s.OracleHitRate = o.HitRate()
	s.UniqueBlocks, s.TotalBlocks = len(o.seen), o.blocks
	return s
}

// Oracle computes the upper bound on the prefix-cache hit rate of a request
// stream: an infinite cache shared by all engines (equivalently, perfect
// affinity), filled by every prompt it sees. Feed requests in arrival order.
// Not safe for concurrent use.
type Oracle struct {
	blockSize  int
	seen       map[uint64]struct{}
	hit, total int64
	blocks     int
}

// NewOracle returns an oracle at the given block size (<=0 means 16).
func NewOracle(blockSize int) *Oracle {
	if blockSize <= 0 {
		blockSize = 16
	}
	return &Oracle{blockSize: blockSize, seen: map[uint64]struct{}{}}
}

// Observe records r (its cached tokens under the oracle count in
// CachedTokens); buf is scratch space for block hashes, returned for
// reuse.
func (o *Oracle) Observe(r *Request, buf []uint64) []uint64 {
	buf = r.BlockHashes(o.blockSize, buf[:0])
	lead := true
	for _, h := range buf {
		if _, ok := o.seen[h]; ok {
			if lead {
				o.hit += int64(o.blockSize)
			}
		} else {
			lead = false
			o.seen[h] = struct{}{}
		}
	}
	o.blocks += len(buf)
	o.total += int64(r.PromptLen)
	return buf
}

// CachedTokens returns the prompt tokens the oracle had cached, over every
// request observed so far.
func (o *Oracle) CachedTokens() int64 { return o.hit }

// HitRate returns cached prompt tokens over all prompt tokens so far (0
// before any token).
func (o *Oracle) HitRate() float64 {
	if o.total == 0 {
		return 0
	}
	return float64(o.hit) / float64(o.total)
}

package sim

import "time"

// timeline records per-engine utilisation over virtual time in fixed-width
// buckets: the fraction of the bucket the engine spent stepping, and the
// mean KV usage and queue (waiting + running) of samples taken four times
// per bucket.
type timeline struct {
	step    time.Duration
	engines int
	busy    [][]time.Duration // [bucket][engine]
	kv      [][]float64       // [bucket][engine] sum of KV usage samples
	queue   [][]float64       // [bucket][engine] sum of waiting+running samples
	samples [][]int32         // [bucket][engine]
}

func newTimeline(step, span time.Duration, engines int) *timeline {
	if step <= 0 {
		step = span / 100
		if step < time.Second {
			step = time.Second
		}
		step = step.Round(time.Second)
	}
	return &timeline{step: step, engines: engines}
}

// maxTimelineBuckets bounds the timeline: a run that lasts far longer than
// its arrivals (an overloaded fleet, a crawling KV link) coarsens it instead
// of growing it without end.
const maxTimelineBuckets = 4096

// index returns the bucket holding virtual time at (>= 0), first doubling
// the step (merging pairs of buckets) until at falls within
// maxTimelineBuckets buckets, and allocating buckets up to it.
func (t *timeline) index(at time.Duration) int {
	for at/t.step >= maxTimelineBuckets {
		t.coarsen()
	}
	b := int(at / t.step)
	for len(t.busy) <= b {
		t.busy = append(t.busy, make([]time.Duration, t.engines))
		t.kv = append(t.kv, make([]float64, t.engines))
		t.queue = append(t.queue, make([]float64, t.engines))
		t.samples = append(t.samples, make([]int32, t.engines))
	}
	return b
}

// coarsen doubles the step: buckets 2i and 2i+1 become bucket i (busy time,
// sample sums and counts add up, so the fractions and means stay exact).
func (t *timeline) coarsen() {
	n := (len(t.busy) + 1) / 2
	for i := 0; i < n; i++ {
		lo, hi := 2*i, 2*i+1
		if hi < len(t.busy) {
			for e := 0; e < t.engines; e++ {
				t.busy[lo][e] += t.busy[hi][e]
				t.kv[lo][e] += t.kv[hi][e]
				t.queue[lo][e] += t.queue[hi][e]
				t.samples[lo][e] += t.samples[hi][e]
			}
		}
		t.busy[i], t.kv[i], t.queue[i], t.samples[i] = t.busy[lo], t.kv[lo], t.queue[lo], t.samples[lo]
	}
	t.busy, t.kv, t.queue, t.samples = t.busy[:n], t.kv[:n], t.queue[:n], t.samples[:n]
	t.step *= 2
}

// addBusy adds a step of engine e from start lasting d, split across buckets.
func (t *timeline) addBusy(e int, start, d time.Duration) {
	for d > 0 {
		b := t.index(start)
		end := time.Duration(b+1) * t.step
		part := min(d, end-start)
		t.busy[b][e] += part
		start += part
		d -= part
	}
}

// sample records engine e's KV usage and queue (waiting + running) at now.
func (t *timeline) sample(e int, now time.Duration, kv float64, queue int) {
	b := t.index(now)
	t.kv[b][e] += kv
	t.queue[b][e] += float64(queue)
	t.samples[b][e]++
}

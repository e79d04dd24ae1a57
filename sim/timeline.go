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

func (t *timeline) bucket(b int) {
	for len(t.busy) <= b {
		t.busy = append(t.busy, make([]time.Duration, t.engines))
		t.kv = append(t.kv, make([]float64, t.engines))
		t.queue = append(t.queue, make([]float64, t.engines))
		t.samples = append(t.samples, make([]int32, t.engines))
	}
}

// addBusy adds a step of engine e from start lasting d, split across buckets.
func (t *timeline) addBusy(e int, start, d time.Duration) {
	for d > 0 {
		b := int(start / t.step)
		t.bucket(b)
		end := time.Duration(b+1) * t.step
		part := min(d, end-start)
		t.busy[b][e] += part
		start += part
		d -= part
	}
}

// sample records engine e's KV usage and queue (waiting + running) at now.
func (t *timeline) sample(e int, now time.Duration, kv float64, queue int) {
	b := int(now / t.step)
	t.bucket(b)
	t.kv[b][e] += kv
	t.queue[b][e] += float64(queue)
	t.samples[b][e]++
}

package engine

import "time"

// DecodeStepsStarted is DecodeStepsBefore for a real-time driver that woke
// at woke: it computes the plain decode steps that start before woke (and
// before before) and end by until, the step in progress at woke included,
// which ends after it, unless a request finishes in that step (its output
// is due at the step's end: the driver steps it and waits). The driver then
// delivers the step in progress with the steps before it in one run, as
// their outputs reach nobody before they end, rather than stepping it
// alone. It returns the number of steps computed; run describes them as
// DecodeSteps describes its run.
func (e *Engine) DecodeStepsStarted(now, woke, until, before time.Duration, limit int, run *DecodedRun) int {
	whole, ctx, finished := e.decodeRun(limit)
	run.reset()
	if whole <= 0 {
		return 0
	}
	start := min(woke, before)
	r := len(e.running)
	b := Batch{Seqs: r, Sampled: r, DecodeTokens: r}
	n, end := 0, now
	for n < whole && end < start {
		b.DecodeContext = ctx + n*r
		d := e.stepTime(&b)
		if end+d > until || end+d > woke && finished && n+1 == whole {
			break
		}
		end += d
		n++
		run.Durations = append(run.Durations, d)
	}
	if n == 0 {
		return 0
	}
	// Those steps, computed (decodeTimed stops short of a step whose
	// blocks do not fit: StepInto preempts in it), as decodeSteps computes
	// the run of n (decodeRun(n) would return n, ctx, and finished when n
	// is the whole run).
	return e.decodeTimed(now, run, n, finished && n == whole)
}

package engine

import "time"

// A plain decode step is one in which every running request decodes one
// token and nothing is admitted, preempted or reported but tokens (and the
// KV events of the blocks they fill). A real-time driver does not need to
// be awake for a run of them when nobody observes their tokens: DecodeRun
// says how long the run is, and DecodeSteps computes it in one call.

// DecodeRun looks ahead without changing anything: it returns how many of
// the next steps (at most limit) are plain decode steps, and their total
// modelled duration, if no request is added, aborted or released
// meanwhile. The run ends with the first step in which a request finishes
// (that step is counted, and finished reports it), or at limit steps. It
// returns 0 when the next step is anything else (a prefill chunk, a
// waiting request, pending abort outputs or events, or KV blocks too short
// to decode the run without preemption).
//
// A real-time driver uses it to sleep through steps whose outputs nobody
// observes: it can step the engine later, at the true start times (each
// step's StepInto(start) gives the same result whenever it runs), and only
// needs to be awake when an output must be delivered or an input arrives.
func (e *Engine) DecodeRun(limit int) (steps int, d time.Duration, finished bool) {
	n, ctx, finished := e.decodeRun(limit)
	if n <= 0 || e.runBlocks(n) > e.pool.numFree {
		return 0, 0, false
	}
	r := len(e.running)
	b := Batch{Seqs: r, Sampled: r, DecodeTokens: r}
	for i := range n {
		b.DecodeContext = ctx + i*r
		d += e.stepTime(&b)
	}
	return n, d, finished
}

// decodeRun returns the length of the plain decode run ahead (at most
// limit steps, the step finishing a request included, finished then true;
// 0 when the next step is not a plain decode step) and the running
// requests' total context, ignoring KV blocks (see runBlocks).
func (e *Engine) decodeRun(limit int) (n, ctx int, finished bool) {
	if limit <= 0 || len(e.running) == 0 || len(e.running) > e.budget || e.waiting.len() > 0 ||
		len(e.aborted) > 0 || e.pendingClear {
		return 0, 0, false
	}
	n = limit
	for _, s := range e.running {
		if s.outputs == 0 || s.computed != s.numTokens-1 {
			return 0, 0, false // a prefill chunk (or the token after it) is pending
		}
		left := min(int(s.maxTokens)-s.outputs, e.maxLen-s.numTokens) // steps to finish, the last included
		if eos := int(s.eosAt); eos > s.outputs {
			left = min(left, eos-s.outputs)
		}
		if left <= n {
			n, finished = left, true
		}
		ctx += s.numTokens
	}
	return n, ctx, finished
}

// runBlocks returns the blocks the next n plain decode steps allocate:
// they decode without preemption only when the free queue covers them.
func (e *Engine) runBlocks(n int) int {
	need := 0
	for _, s := range e.running {
		need += (s.computed+n+e.bs-1)/e.bs - len(s.blocks)
	}
	return need
}

// stepTime is the modelled duration of a step of shape b, as StepInto
// computes it.
func (e *Engine) stepTime(b *Batch) time.Duration {
	return secondsToDuration(e.cost.seconds(b) / e.speed)
}

// DecodedRun is what DecodeSteps did. Its slices are reused by the next
// DecodeSteps given the same DecodedRun.
type DecodedRun struct {
	// Durations are the steps' modelled durations, in order: the run's
	// k-th step starts at now plus the sum of the durations before it.
	Durations []time.Duration
	// Seqs are the requests running when the run started, in the order
	// StepInto reports their outputs; each produced one token in every
	// step of the run.
	Seqs []DecodedSeq
	// Finished are the outputs of the requests that finished in the run's
	// last step (their Seqs are marked Finished), in Seqs' order, exactly
	// as StepInto reports them. Those requests have left the engine as
	// after StepInto (a HoldKV one holds its blocks).
	Finished []Output
	// Events are the run's KV events in order, as the steps' StepResults
	// would report them (BlockStored for the blocks the new tokens fill,
	// BlockRemoved for the cached blocks their allocation evicts).
	Events []KVEvent

	res StepResult // collects the events (and their hashes' slab)
}

// DecodedSeq is one request's part in a DecodedRun.
type DecodedSeq struct {
	ID string
	// From is the index of the request's first output token in the run:
	// the run produced its tokens From .. From+len(Durations)-1 (a
	// Sampler recomputes them).
	From int
	// FirstITL is the latency of the run's first token after the
	// request's previous one; each later token's is its step's duration.
	FirstITL time.Duration
	// Finished marks a request whose last token is the run's last: its
	// output is the next one in the run's Finished.
	Finished bool
}

// DecodeSteps computes the plain decode steps ahead at once, starting at
// virtual time now, exactly as that many StepInto calls at their start
// times would (same tokens, block allocations, evictions, prefix-cache
// entries, finishes, events and Stats), without building a StepResult per
// step. It computes at most limit steps and none that ends after until;
// a step in which requests finish ends the run (their outputs are the
// run's Finished, the others' are summarised by Seqs). It returns the
// number of steps computed, 0 when the next step is not a plain decode
// step (see DecodeRun) or does not end by until; run describes them.
//
// A real-time driver that slept through a quiet run uses it to catch up
// with the steps whose outputs nobody was waiting for, and the finish that
// ends the run: the cost is a few nanoseconds per request and step instead
// of a StepResult's.
func (e *Engine) DecodeSteps(now, until time.Duration, limit int, run *DecodedRun) int {
	run.Durations, run.Seqs, run.Finished, run.Events = run.Durations[:0], run.Seqs[:0], run.Finished[:0], nil
	whole, ctx, finished := e.decodeRun(limit)
	if whole <= 0 {
		return 0
	}
	r := len(e.running)
	b := Batch{Seqs: r, Sampled: r, DecodeTokens: r}
	end := now
	for i := range whole {
		b.DecodeContext = ctx + i*r
		d := e.stepTime(&b)
		if end+d > until {
			break
		}
		end += d
		run.Durations = append(run.Durations, d)
	}
	n := len(run.Durations)
	if e.runBlocks(n) > e.pool.numFree {
		// The most steps whose blocks fit (runBlocks grows with n): the
		// step that would preempt is StepInto's.
		lo, hi := 0, n // runBlocks(lo) fits, runBlocks(hi) does not
		for hi-lo > 1 {
			if mid := (lo + hi) / 2; e.runBlocks(mid) <= e.pool.numFree {
				lo = mid
			} else {
				hi = mid
			}
		}
		n = lo
	}
	run.Durations = run.Durations[:n]
	if n == 0 {
		return 0
	}
	finished = finished && n == whole // the finishing step is in the run
	first := now + run.Durations[0]
	for _, s := range e.running {
		run.Seqs = append(run.Seqs, DecodedSeq{ID: s.id, From: s.outputs, FirstITL: first - s.lastToken})
	}

	res := &run.res
	res.Events, res.removed = res.Events[:0], res.removed[:0]
	e.res = res
	defer func() { e.res = nil }()
	t := now
	for k, d := range run.Durations {
		t += d
		if e.caching && !e.deferKeys {
			e.keysAhead()
		}
		last := finished && k == n-1
		// StepInto's schedule allocates in running order, then each
		// request's token is emitted: a request's allocation only needs
		// its own earlier tokens, so one pass does both, keeping the
		// pool's order of operations (the finished requests' blocks are
		// freed after the pass, as StepInto frees them after schedule).
		for i, s := range e.running {
			e.allocate(s, 1) // cannot fail: runBlocks fit
			s.computed++
			if last {
				e.emitLast(s, t, run, i)
				continue
			}
			if e.keepGen && s.tokenMode {
				s.tokens = append(s.tokens, e.token(s, s.outputs))
			}
			s.outputs++
			s.numTokens++
			s.lastToken = t
		}
		e.stats.Steps++
		e.stats.BusyTime += d
		e.stats.GenerationTokens += int64(r)
	}
	if finished {
		for i := range run.Seqs {
			if run.Seqs[i].Finished {
				e.retireFinished(e.running[i])
			}
		}
		e.dropFinished()
	}
	run.Events = res.Events
	return n
}

// emitLast is emit for request i of a run's finishing step, at time t:
// only a finishing request's output is built (into run.Finished); the
// caller retires it after the step's allocations.
func (e *Engine) emitLast(s *sequence, t time.Duration, run *DecodedRun, i int) {
	idx := s.outputs
	s.outputs++
	s.numTokens++
	if e.keepGen && s.tokenMode {
		s.tokens = append(s.tokens, e.token(s, idx))
	}
	reason := e.finishReason(s)
	if reason == "" {
		s.lastToken = t
		return
	}
	run.Finished = append(run.Finished, Output{})
	o := &run.Finished[len(run.Finished)-1]
	e.fillOutput(o, s, e.token(s, idx), idx, t)
	e.finishOutput(s, o, reason)
	run.Seqs[i].Finished = true
}

// keysAhead computes the keys of the blocks the coming decode step fills
// and loads their table slots, before the step, so that the step's
// cacheFull finds the keys computed (blockKey) and the slots in the cache.
// In a busy fleet each is a cache miss (a request's chain state, then a
// random slot); loaded in this short loop rather than between the step's
// allocations they can overlap a little (perf on the fleet soak: the
// table's find under insert went from 15% of the engine loop to 4%, this
// loop took 9%).
func (e *Engine) keysAhead() {
	var sink uint64
	t := e.pool.cached
	for _, s := range e.running {
		if s.computed+1 != (s.numStored+1)*e.bs || s.numStored != len(s.hashes) {
			continue
		}
		k := e.nextKey(s)
		sink += t.slots[tag(k)&t.mask]
	}
	e.ahead = sink
}

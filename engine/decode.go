package engine

import (
	"math"
	"math/bits"
	"time"
)

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
// requests' total context, ignoring KV blocks (see runBlocks). Waiting
// requests end a run before it starts unless Config.MaxLoRAs keeps every
// one of them out (loraBlocked).
func (e *Engine) decodeRun(limit int) (n, ctx int, finished bool) {
	if limit <= 0 || len(e.running) == 0 || len(e.running) > e.budget || (e.waiting.len() > 0 && !e.loraBlocked()) ||
		len(e.loaded) > 0 || len(e.aborted) > 0 || e.pendingClear {
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
// they decode without preemption only when the free queue covers them. A
// request's blocks hold its computed tokens, so its n tokens overflow them
// by at most n tokens: one block when they overflow by at most bs, as in
// the usual run, counted without a division (a 64-bit division per running
// request, in each of a wake-up's passes, was a tenth of
// DecodeStepsBefore's own time in the fleet soak).
func (e *Engine) runBlocks(n int) int {
	need := 0
	for _, s := range e.running {
		if over := s.computed + n - len(s.blocks)*e.bs; over > e.bs {
			need += (over + e.bs - 1) / e.bs
		} else if over > 0 {
			need++
		}
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
	// step of the run. Empty with Summarize.
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

	// Summarize is the caller's: set before a run, it leaves Seqs empty
	// (a driver that wakes no one before a request finishes needs no entry
	// per request, only the latencies) and reports FirstITLs instead.
	Summarize bool
	// Running is the number of requests running when the run started:
	// each produced a token in every step of the run.
	Running int
	// FinishedAt are the positions in the running order (Seqs' order) of
	// the requests that finished in the run's last step, one per Finished
	// output.
	FinishedAt []int
	// FirstITLs are, with Summarize, the latencies of the run's first
	// tokens in the running order, a run of equal ones in one entry, each
	// entry coming before Finished[Before]. In a run of one step, the
	// requests that finish in it have their latency in their Finished
	// output instead; in a longer one, Before is 0.
	FirstITLs []ITLRun

	res   StepResult     // collects the events (and their hashes' slab)
	sched decodeSchedule // the steps at which each request is visited
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
// ends the run: a request costs a few nanoseconds per run and per block
// boundary its tokens reach (decodePlain), not a StepResult's entry per
// step.
func (e *Engine) DecodeSteps(now, until time.Duration, limit int, run *DecodedRun) int {
	return e.DecodeStepsBefore(now, until, math.MaxInt64, limit, run)
}

// DecodeStepsBefore is DecodeSteps computing no step that starts at or
// after before either: a driver catching up with steps after an input
// arrived at before (a request, an abort) includes the step in progress
// then, which the input does not change (it joins the next step), and
// stops at the step that must see it.
func (e *Engine) DecodeStepsBefore(now, until, before time.Duration, limit int, run *DecodedRun) int {
	whole, ctx, finished := e.decodeRun(limit)
	return e.decodeSteps(now, until, before, run, whole, ctx, finished)
}

// decodeSteps is DecodeStepsBefore given what decodeRun returned for its
// limit.
func (e *Engine) decodeSteps(now, until, before time.Duration, run *DecodedRun, whole, ctx int, finished bool) int {
	run.reset()
	if whole <= 0 {
		return 0
	}
	r := len(e.running)
	b := Batch{Seqs: r, Sampled: r, DecodeTokens: r}
	end := now
	for i := range whole {
		if end >= before { // the step would start at or after before
			break
		}
		b.DecodeContext = ctx + i*r
		d := e.stepTime(&b)
		if end+d > until {
			break
		}
		end += d
		run.Durations = append(run.Durations, d)
	}
	return e.decodeTimed(now, run, whole, finished)
}

// decodeTimed is decodeSteps given the durations of the steps to compute
// (run.Durations, the first len(run.Durations) of the whole run ahead).
func (e *Engine) decodeTimed(now time.Duration, run *DecodedRun, whole int, finished bool) int {
	r := len(e.running)
	n := len(run.Durations)
	need := e.runBlocks(n)
	if need > e.pool.numFree {
		// The most steps whose blocks fit (runBlocks grows with n): the
		// step that would preempt is StepInto's.
		lo, hi := 0, n // runBlocks(lo) fits, runBlocks(hi) does not
		need = 0
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if m := e.runBlocks(mid); m <= e.pool.numFree {
				lo, need = mid, m
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
	run.Running = r
	switch {
	case !run.Summarize:
		for _, s := range e.running {
			run.Seqs = append(run.Seqs, DecodedSeq{ID: s.id, From: s.outputs, FirstITL: first - s.lastToken})
		}
	case !finished || n > 1: // (else in the finishing step, which leaves out those finishing)
		for _, s := range e.running {
			run.FirstITLs = addITL(run.FirstITLs, first-s.lastToken, 0)
		}
	}

	e.pool.loadAhead(need) // the blocks the run pops, their misses at once
	res := &run.res
	res.Events, res.removed = res.Events[:0], res.removed[:0]
	e.res = res
	defer func() { e.res = nil }()
	plain := n // the steps in which nobody finishes
	if finished {
		plain--
	}
	t := e.decodePlain(now, run.Durations[:plain], &run.sched)
	if finished {
		// The finishing step visits every request, as StepInto would:
		// its allocations in running order, each request's token (and
		// output, when it finishes) after its own allocation; the
		// finished requests' blocks are freed after the pass, as StepInto
		// frees them after schedule.
		t += run.Durations[n-1]
		if e.caching && !e.deferKeys {
			e.keysAhead()
		}
		firsts := run.Summarize && n == 1 // the first tokens' latencies, from this step
		for i, s := range e.running {
			e.allocate(s, 1) // cannot fail: runBlocks fit
			s.computed++
			prev, done := s.lastToken, len(run.Finished)
			e.emitLast(s, t, run, i)
			if firsts && len(run.Finished) == done {
				run.FirstITLs = addITL(run.FirstITLs, t-prev, done)
			}
		}
		for _, i := range run.FinishedAt {
			e.retireFinished(e.running[i])
		}
		e.dropFinished()
	}
	e.stats.Steps += int64(n)
	e.stats.BusyTime += t - now
	e.stats.GenerationTokens += int64(n * r)
	run.Events = res.Events
	return n
}

// reset empties run for the next run.
func (run *DecodedRun) reset() {
	run.Durations, run.Seqs, run.Finished, run.Events = run.Durations[:0], run.Seqs[:0], run.Finished[:0], nil
	run.Running, run.FinishedAt, run.FirstITLs = 0, run.FinishedAt[:0], run.FirstITLs[:0]
}

// addITL adds a latency d, placed before output before, to runs: to the
// last run when it is the same latency in the same place.
func addITL(runs []ITLRun, d time.Duration, before int) []ITLRun {
	if n := len(runs); n > 0 && runs[n-1].ITL == d && runs[n-1].Before == before {
		runs[n-1].N++
		return runs
	}
	return append(runs, ITLRun{ITL: d, N: 1, Before: before})
}

// decodeSchedule is DecodeSteps' scratch (see decodePlain), reused by the
// next run given the same DecodedRun.
type decodeSchedule struct {
	// due is a ring of bitmaps over the running requests' indices, one
	// per step of a window of steps: the requests a step visits. Each bit
	// is set for a step of the run and cleared by it, so due is all zero
	// between runs.
	due []uint64
	// at counts, per running request, the run's steps applied to it
	// (decodeTokens).
	at []int32
}

// decodePlain computes the plain decode steps durs (none of which
// finishes a request), the first starting at now, and returns when the
// last ends.
//
// Each step gives every running request a token, but only a few steps
// touch more than the request: allocate takes its slow path (allocN,
// cacheFull: the shared block pool, the prefix cache, deferred keys,
// events) only when a request's tokens reach a block boundary, and only
// that path changes what its fast path tests (fastSteps). So a request is
// visited only at the steps where it takes that path: it is first brought
// to its state before the step (the tokens of the steps since its last
// visit at once), so that the slow path sees what it would after stepping,
// and is scheduled for its next visit. Within a step the visits go in
// running order and the steps in order, which keeps the pool's order of
// operations StepInto's. Every request gets the rest of its tokens at
// the end. So the cost is per request and block boundary rather than per
// request and step (with KV events, a request's tokens are still appended
// one by one, to sequence.tokens).
//
// No step looks ahead as keysAhead does for a whole step: the visits of a
// step are few, and loading their keys first was no faster (measured with
// events on, one engine and sixteen interleaved; without events, as the
// emulator runs it, there is nothing to load).
func (e *Engine) decodePlain(now time.Duration, durs []time.Duration, sc *decodeSchedule) time.Duration {
	r := len(e.running)
	words := (r + 63) / 64
	// A request is due again within bs+1 steps (fastSteps <= bs), so a
	// window of bs+2 steps holds all its visits. One due beyond it would
	// be made at the window's last step instead (a guard only: a visit on
	// the fast path changes nothing).
	window := e.bs + 2
	// Sized for max_num_seqs once: the running list grows a request at a
	// time, and reallocating as it does would allocate at every new high.
	most := max(r, e.maxSeqs)
	sc.due = sized(sc.due, window*words, window*((most+63)/64))
	sc.at = sized(sc.at, r, most)
	m := len(durs)
	for i, s := range e.running {
		sc.at[i] = 0
		if k := min(e.fastSteps(s), window-1); k < m {
			sc.due[k*words+i/64] |= 1 << (i % 64)
		}
	}
	t, slot := now, 0
	for k, d := range durs {
		start := t
		t += d
		row := sc.due[slot*words : (slot+1)*words]
		for w := range row {
			for due := row[w]; due != 0; due &= due - 1 {
				i := w*64 + bits.TrailingZeros64(due)
				s := e.running[i]
				e.decodeTokens(s, k-int(sc.at[i]), start)
				e.allocate(s, 1) // cannot fail: runBlocks fit
				e.decodeTokens(s, 1, t)
				sc.at[i] = int32(k + 1)
				if next := 1 + min(e.fastSteps(s), window-2); k+next < m {
					sl := slot + next
					if sl >= window {
						sl -= window
					}
					sc.due[sl*words+w] |= 1 << (i % 64)
				}
			}
			row[w] = 0
		}
		if slot++; slot == window {
			slot = 0
		}
	}
	for i, s := range e.running {
		e.decodeTokens(s, m-int(sc.at[i]), t)
	}
	return t
}

// fastSteps returns how many plain decode steps s takes next on
// allocate's fast path: the one after them reaches a block boundary (its
// token needs a new block, or fills one for the prefix cache). It is at
// most bs, as numStored*bs <= numTokens.
func (e *Engine) fastSteps(s *sequence) int {
	return max(0, min(len(s.blocks)*e.bs-s.computed, (s.numStored+1)*e.bs-1-s.computed))
}

// decodeTokens applies n plain decode steps to s, the last ending at t,
// past its allocations: the tokens they compute and generate.
func (e *Engine) decodeTokens(s *sequence, n int, t time.Duration) {
	if n <= 0 {
		return
	}
	if e.keepGen && s.tokenMode {
		for idx := s.outputs; idx < s.outputs+n; idx++ {
			s.tokens = append(s.tokens, e.token(s, idx))
		}
	}
	s.computed += n
	s.outputs += n
	s.numTokens += n
	s.lastToken = t
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
	run.FinishedAt = append(run.FinishedAt, i)
	if !run.Summarize {
		run.Seqs[i].Finished = true
	}
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

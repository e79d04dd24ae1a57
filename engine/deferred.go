package engine

// Deferred keys.
//
// Without KV events nobody learns the key of a block of generated tokens
// when it fills, and the only lookup that can find such a block is one
// whose chain of keys passes through it: a later prompt that repeats the
// request's prompt and outputs (a conversation's next turn sent as token
// ids), or the request itself resumed after a preemption. Computing the key
// of every output block and inserting it in the prefix-cache table as it
// fills costs the engine loop a random memory access or two per block, for
// keys that are almost never looked up.
//
// So with prefix caching and Config.NoEvents the engine keys a request's
// output blocks (the first block holding an output token and every later
// one) when a lookup could reach them instead: the first such block's key
// is computed when it fills and indexes the request's run of deferred
// blocks (runByKey); the run grows as blocks fill. A lookup of that key
// (admit, PrefixHit) first inserts the whole run in the table (materialize:
// the keys computed as blockKey would have, the blocks that are still in
// the pool), so it finds them as it would have found blocks keyed when they
// filled. A preempted request's run is inserted before its blocks are freed
// (so that its recomputation finds them); a finished, aborted or released
// request's run stays findable while its first block is in the pool (the
// retired sequence keeps its key chain: its tail tokens and digest).
// Eviction takes a freed request's blocks from its last one, so a retired
// run loses blocks from its end; a block records the retired run that holds
// it (kvBlock.run), and eviction clears that, which is how materialize
// tells a block still in the pool from a reused one. Retired runs whose
// first block was evicted can no longer be reached; sweepRuns drops them.
//
// Everything observable is as if each block were keyed when it filled:
// hits, evictions, Stats (CachedBlocks counts deferred blocks), outputs,
// and the copies each key has and their order. The table caches every copy
// of a key and a lookup returns the copy cached first, so copies must be
// keyed in the order they filled in. Copies of a key are blocks at the
// same place in equal chains, so a request whose block copies another
// passes every key of that block's chain before it. The engine keeps a
// deferred block the only copy of its key, and keys the other copies in
// fill order around it:
//
//   - A run does not start when its first key has a copy already, cached
//     or first in another run (deferBlocks looks in runByKey and the
//     table, once per run started): that block is keyed when it fills,
//     after the run that starts with its key (findDeferred), as any block
//     keyed when it fills, and the request's next block tries again. So
//     no two runs share a first key, and a run starts only where no other
//     request's chain has been. (A retired run whose first block was
//     evicted keeps its key in runByKey until sweepRuns drops it, while
//     another chain may cache that key: it holds no copy, and checkRuns,
//     which checks that a reachable run's first key is not cached, allows
//     for it.)
//   - A request whose chain reaches a run's later blocks afterwards
//     passes its first key on the way: keying a block (cacheFull) or
//     looking a key up (admit, PrefixHit) first materializes the run that
//     starts with that key, ending it, so the run's blocks, all filled
//     before, are keyed before the request's own copies of the blocks
//     after (the request's next block starts a run of its own only if the
//     other request has not filled that block yet, and the other's copy,
//     filled later, materializes it in turn).
//   - No copy of a run's later block filled before the run started: its
//     chain would have passed the run's first key before then too, and
//     that copy of the first key would still be in the pool (eviction
//     takes a freed chain from its end: the blocks before a block in its
//     chain are freed after it), cached or deferred, so the run would not
//     have started (a deferred copy that is a run's later block is the
//     only copy of its key: the same holds for it, by induction).
//
// A preempted request's run is materialized before its blocks are freed,
// and its recomputation keys the blocks after it when they fill.
// FuzzDeferredKeys compares an engine with KV events (every block keyed
// when it fills) step by step, the copies each key has and their order
// included.
//
// Until 2026-12-05 a run started when its first key had a copy, and runs
// sharing a first key were materialized oldest first; a later block of a
// run whose key was the first key of another run was then cached when its
// own run was materialized, in materialization order rather than fill
// order (a fuzz run found it: 4 keys with their two copies in the other
// order). The check that fixed it costs a table probe per run started
// (once per request in the soak, and after each materialization), and
// requests with equal chains (equal prompts and seeds) key the blocks
// they copy when they fill, as with events; no per-block write. Side by
// side on a shared 2-core machine (6 runs each, medians) no change stood
// out of the noise: LoopWake -7% ns/request, StepBatch64 noEvents -3%,
// DecodeStepsCold cpu-ns/op +11%, +6%, -4% (arrival false, true, shared;
// paired again, false -3%), Interleaved16 +18% (paired again +11%, the
// pairs split 4 up, 4 down; one probe per request is under 1% of its op;
// five more pairs, cpu-ns/op medians 26.2 us before and 27.2 after, ranges
// 21.2-31.2 and 20.7-29.9).

// deferredRun is a request's run of blocks whose keys are deferred: blocks
// from..from+n of its sequence. A live run's n is not kept: its blocks are
// all the full ones from on (from..s.numStored), and filling one touches
// nothing but the sequence (see runLen).
type deferredRun struct {
	s       *sequence
	key     uint64 // the key of the run's first block
	from, n int32  // n: set when the run retires
	retired bool   // s finished: its blocks are free, s.blocks keeps their ids (s is nil for a free run)
}

// deferBlocks records that blocks j..full-1 of s filled with their keys
// deferred, starting (or growing) s's run, and reports whether it did.
// Block j is the first output block or a later one, and the blocks before
// it are keyed or in the run. A run does not start when block j's key has
// a copy already, cached or first in a run: block j is keyed now (the
// caller does), and the next block tries again (see the top comment).
func (e *Engine) deferBlocks(s *sequence, j, full int) bool {
	if s.run == 0 {
		key := e.blockKey(s, j)
		if _, ok := e.runByKey[key]; ok {
			return false
		}
		if _, ok := e.pool.lookup(key); ok {
			return false
		}
		r := e.newRun()
		e.runs[r] = deferredRun{s: s, key: key, from: int32(j)}
		e.runByKey[key] = r + 1
		e.keyCount[key>>keyCountShift]++
		s.run = r + 1
	}
	e.pool.deferred += full - j
	return true
}

// runLen returns the number of blocks in run r.
func (e *Engine) runLen(r int32) int32 {
	if run := &e.runs[r]; !run.retired {
		return int32(run.s.numStored) - run.from
	}
	return e.runs[r].n
}

// keyCountShift keeps a key's top 12 bits: Engine.keyCount counts the
// runs whose first key has each, so that findDeferred skips the map for
// most keys.
const keyCountShift = 52

// deferring reports whether block j of s is keyed later: an output block
// (or one after it) whose key nobody has asked for.
func (e *Engine) deferring(s *sequence, j int) bool {
	return e.deferKeys && (s.run != 0 || j >= len(s.hashes) && (j+1)*e.bs > int(s.promptLen))
}

func (e *Engine) newRun() int32 {
	if k := len(e.freeRuns); k > 0 {
		r := e.freeRuns[k-1]
		e.freeRuns = e.freeRuns[:k-1]
		return r
	}
	e.runs = append(e.runs, deferredRun{})
	return int32(len(e.runs) - 1)
}

// findDeferred makes the deferred run whose first block has key findable
// in the table, before a lookup of key (deferBlocks starts no run on a
// first key in use, so there is at most one).
func (e *Engine) findDeferred(key uint64) {
	if e.keyCount == nil || e.keyCount[key>>keyCountShift] == 0 {
		return
	}
	r, ok := e.runByKey[key]
	if !ok {
		return
	}
	delete(e.runByKey, key)
	e.keyCount[key>>keyCountShift]--
	e.materialize(r - 1)
}

// materialize inserts run r's blocks that are still in the pool in the
// table, under the keys blockKey gives them, and ends the run. The caller
// has taken r off runByKey.
func (e *Engine) materialize(r int32) {
	run := &e.runs[r]
	s := run.s
	end := int(run.from + e.runLen(r))
	for j := int(run.from); j < end; j++ {
		id := s.blocks[j]
		if run.retired {
			b := &e.pool.blocks[id]
			if b.run != r+1 {
				// Evicted (and maybe reused): no lookup can pass it, so
				// the blocks after it (evicted before it, as a rule) are
				// out of reach.
				e.forgetRun(r, j)
				break
			}
			b.run = 0
		}
		e.pool.deferred--
		e.pool.cache(id, e.blockKey(s, j))
	}
	e.endRun(r)
}

// endRun frees run r (off runByKey already), recycling its sequence when
// it had finished.
func (e *Engine) endRun(r int32) {
	run := e.runs[r]
	run.s.run = 0
	if run.retired {
		e.retired--
		run.s.blocks = run.s.blocks[:0]
		e.recycle(run.s)
	}
	e.runs[r] = deferredRun{}
	e.freeRuns = append(e.freeRuns, r)
}

// unlinkRun takes run r off runByKey.
func (e *Engine) unlinkRun(r int32) {
	key := e.runs[r].key
	e.keyCount[key>>keyCountShift]--
	if e.runByKey[key] == r+1 {
		delete(e.runByKey, key)
	}
}

// retire keeps the run of s, a request whose blocks are being freed for
// good, findable: its deferred blocks record the run (eviction clears
// that), and s keeps its block ids and key chain until the run ends.
func (e *Engine) retire(s *sequence) {
	r := s.run - 1
	run := &e.runs[r]
	run.n = e.runLen(r)
	run.retired = true
	for _, id := range s.blocks[run.from : run.from+run.n] {
		e.pool.blocks[id].run = r + 1
	}
	e.retired++
	if e.retired > e.sweepAt {
		e.sweepRuns()
	}
}

// sweepRuns ends the retired runs whose first block was evicted (no lookup
// can reach their blocks). It runs when the retired runs double since the
// last sweep, so its cost per run is constant.
func (e *Engine) sweepRuns() {
	for r := range e.runs {
		run := &e.runs[r]
		if run.s == nil || !run.retired {
			continue
		}
		if id := run.s.blocks[run.from]; e.pool.blocks[id].run == int32(r)+1 {
			continue
		}
		e.forgetRun(int32(r), int(run.from))
		e.unlinkRun(int32(r))
		e.endRun(int32(r))
	}
	e.sweepAt = max(e.minSweep, 2*e.retired)
}

// forgetRun clears the mark of retired run r's blocks from j on that are
// still in the pool (evicted ones were cleared by alloc): their keys are
// out of reach.
func (e *Engine) forgetRun(r int32, j int) {
	run := &e.runs[r]
	for _, id := range run.s.blocks[j : run.from+run.n] {
		if b := &e.pool.blocks[id]; b.run == r+1 {
			b.run = 0
			e.pool.deferred--
		}
	}
}

// minSweep is the fewest retired runs that start a sweep (Engine.minSweep;
// tests lower it).
const minSweep = 256

// dropRuns ends every run (ResetPrefixCache: no block is in use, so all
// are retired).
func (e *Engine) dropRuns() {
	if !e.deferKeys {
		return
	}
	clear(e.runByKey)
	clear(e.keyCount[:])
	for r := range e.runs {
		if run := &e.runs[r]; run.s != nil {
			e.forgetRun(int32(r), int(run.from))
			e.endRun(int32(r))
		}
	}
}

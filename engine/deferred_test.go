package engine

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// materializeAll inserts every deferred run's blocks in the table, as a
// lookup of each run's first key does: the table then holds every key an
// engine that keys blocks when they fill would hold.
func materializeAll(e *Engine) {
	for len(e.runByKey) > 0 {
		for k := range e.runByKey {
			e.findDeferred(k)
			break
		}
	}
}

// checkRuns verifies the deferred runs against the sequences and the pool:
// each run in use is the one runByKey holds for its first key, which no
// cached block has while the run's first block is in the pool (a deferred
// block is the only copy of its key; a retired run whose first block was
// evicted holds none), and its sequence names it; a live run's sequence
// is live and holds its blocks, a retired one's is gone; a marked block is
// in its retired run; pool.deferred counts the live runs' blocks and the
// marked ones.
func checkRuns(t testing.TB, e *Engine) {
	t.Helper()
	if !e.deferKeys {
		if len(e.runs) != 0 || e.pool.deferred != 0 {
			t.Fatalf("runs without deferred keys")
		}
		return
	}
	listed := map[int32]bool{}
	for k, x := range e.runByKey {
		if listed[x-1] || e.runs[x-1].s == nil || e.runs[x-1].key != k {
			t.Fatalf("run %d for key %d: twice, unused or with key %d", x-1, k, e.runs[x-1].key)
		}
		run := &e.runs[x-1]
		reachable := !run.retired || int(run.from) < len(run.s.blocks) && e.pool.blocks[run.s.blocks[run.from]].run == x
		if _, ok := e.pool.lookup(k); ok && reachable {
			t.Fatalf("run %d's first key %d is cached too", x-1, k)
		}
		listed[x-1] = true
	}
	deferred, retired := 0, 0
	var counted [1 << (64 - keyCountShift)]uint32
	marked := map[int32]int32{} // block -> run
	for r := range e.runs {
		run := &e.runs[r]
		if run.s == nil {
			continue
		}
		n := e.runLen(int32(r))
		if !listed[int32(r)] || run.s.run != int32(r)+1 || n <= 0 {
			t.Fatalf("run %d: in runByKey %v, its sequence names run %d, %d blocks", r, listed[int32(r)], run.s.run, n)
		}
		counted[run.key>>keyCountShift]++
		blocks := run.s.blocks[run.from : run.from+n]
		if live := e.seqs[run.s.id] == run.s; live == run.retired {
			t.Fatalf("run %d: retired %v, but its request is live %v", r, run.retired, live)
		}
		if !run.retired {
			deferred += len(blocks)
			continue
		}
		retired++
		for _, id := range blocks {
			if e.pool.blocks[id].run == int32(r)+1 {
				marked[id] = int32(r)
			}
		}
	}
	for id := range e.pool.size() {
		if m := e.pool.blocks[id].run; m != 0 {
			if r, ok := marked[int32(id)]; !ok || r != m-1 {
				t.Fatalf("block %d marked for run %d, which does not hold it", id, m-1)
			}
			if e.pool.blocks[id].hashed {
				t.Fatalf("block %d is both keyed and deferred", id)
			}
			deferred++
		}
	}
	if counted != *e.keyCount {
		t.Fatalf("keyCount does not count the runs' first keys")
	}
	if deferred != e.pool.deferred || retired != e.retired {
		t.Fatalf("pool.deferred %d, %d deferred blocks found; %d retired runs, counted %d", e.pool.deferred, deferred, retired, e.retired)
	}
}

// FuzzDeferredKeys runs one stream of operations on two engines, one with
// KV events (every full block keyed when it fills) and one without (output
// blocks keyed when a lookup could reach them: deferred.go), and checks
// that nothing observable differs: each step's outputs and batch, Stats
// (CachedBlocks included), PrefixHit probes, and in the end the keys the
// cache holds and the blocks that hold each, in the order a lookup meets
// them. Requests continue earlier ones (their prompt and outputs as the
// next prompt), so lookups reach deferred blocks and requests compute
// copies of cached blocks; some share a seed, so equal prompts give equal
// output blocks; some are served by one of two LoRA adapters, one adapter
// a step (MaxLoRAs 1); some are decode legs (RemoteKV) whose admission looks up
// their prompt and whose KV arrives (or fails to) later, caching blocks
// then; the cache is small, so requests are preempted and runs evicted,
// and sweeps run often.
func FuzzDeferredKeys(f *testing.F) {
	f.Add([]byte{0, 40, 30, 1, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 0, 0, 0, 3, 3, 3, 3, 3, 3, 0, 0, 3, 3, 3, 3, 3})
	f.Add([]byte{0, 100, 60, 1, 0, 200, 50, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1, 0, 3, 3, 3, 3, 0, 1, 3, 3, 3, 2, 3, 3, 3, 3})
	f.Add([]byte{0, 20, 90, 3, 0, 20, 90, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 3, 4, 0, 3, 3, 3, 3, 3, 5, 3, 3})
	f.Add([]byte{0, 5, 40, 0, 3, 3, 3, 3, 4, 0, 0, 3, 3, 3, 3, 3, 6, 2, 0, 3, 3, 3, 3, 3, 3, 3, 3})
	// A later block of a run whose key is the first key of another run
	// (found by a fuzz run on 2026-12-05: 4 keys' two copies cached in the
	// other order).
	f.Add([]byte(">\xa5x\xb0\xb0\x15\x15\x15HHHH00Y\x18NN\xf57\xb7\xdd>\xa5x\x81\bP\x18ND70N\x10\xf8\x7f\xff\x00\x04ԇ \xf5#\xc5\xdd>\xa5x@\xee\bP\x18NNNNN\xff\x19\x1310NN\x03"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		mod := func(noEvents bool) func(*Config) {
			return func(c *Config) {
				c.NumGPUBlocks, c.MaxModelLen, c.MaxNumBatchedTokens, c.NoEvents, c.MaxLoRAs = 40, 512, 96, noEvents, 1
			}
		}
		eager, lazy := mustEngine(t, "tiny", mod(false)), mustEngine(t, "tiny", mod(true))
		lazy.sweepAt, lazy.minSweep = 2, 2
		next := func() int {
			if len(ops) == 0 {
				return 0
			}
			b := ops[0]
			ops = ops[1:]
			return int(b)
		}
		var now time.Duration
		var ids []string
		prompts := map[string][]uint32{}
		reqs := map[string]*Request{}
		outs := map[string][]uint32{}
		var re, rl StepResult
		var loads []KVLoad // RemoteKV requests admitted, their KV not arrived yet
		var runE, runL DecodedRun
		step := func() {
			if next()%3 == 0 { // a real-time driver's decode run
				until, limit := now+time.Duration(next()+1)*eager.MinStepTime(), next()%8+1
				n := eager.DecodeSteps(now, until, limit, &runE)
				if got := lazy.DecodeSteps(now, until, limit, &runL); got != n || !slices.Equal(runE.Durations, runL.Durations) || !slices.Equal(runE.Seqs, runL.Seqs) ||
					!slices.Equal(runE.Finished, runL.Finished) {
					t.Fatalf("DecodeSteps at %v: %d steps %v %v %+v, without events %d %v %v %+v", now, n, runE.Durations, runE.Seqs, runE.Finished, got, runL.Durations, runL.Seqs, runL.Finished)
				}
				if n > 0 {
					for _, d := range runE.Durations {
						now += d
					}
					for _, sq := range runE.Seqs {
						outs[sq.ID] = eager.Sampler().AppendTokens(outs[sq.ID][:0], reqs[sq.ID], sq.From+n)
					}
					checkInvariants(t, lazy)
					return
				}
			}
			eager.StepInto(now, &re)
			lazy.StepInto(now, &rl)
			if re.Duration != rl.Duration || re.Batch != rl.Batch || re.Preempted != rl.Preempted || !slices.Equal(re.Outputs, rl.Outputs) ||
				!slices.Equal(re.Loads, rl.Loads) {
				t.Fatalf("step at %v differs:\n events: %v %+v %d %+v %+v\n none:   %v %+v %d %+v %+v", now, re.Duration, re.Batch, re.Preempted, re.Outputs, re.Loads,
					rl.Duration, rl.Batch, rl.Preempted, rl.Outputs, rl.Loads)
			}
			now += re.Duration
			loads = append(loads, re.Loads...)
			for _, o := range re.Outputs {
				if o.FinishReason != FinishAbort {
					outs[o.ID] = append(outs[o.ID], o.Token)
				}
			}
			checkInvariants(t, lazy)
		}
		compare := func(when string) {
			se, sl := eager.Stats(), lazy.Stats()
			if se != sl {
				t.Fatalf("%s: stats differ:\n events: %+v\n none:   %+v", when, se, sl)
			}
		}
		for n := 0; len(ops) > 0 && n < 300; n++ {
			switch next() % 8 {
			case 0: // a new request, or the next turn of an earlier one
				id := fmt.Sprint("r", len(ids))
				var prompt []uint32
				seed := uint64(len(ids) + 1)
				if k := next(); k%2 == 1 && len(ids) > 0 {
					prev := ids[k/2%len(ids)]
					prompt = concat(prompts[prev], outs[prev])
					prompt = concat(prompt, tokens(1000*len(ids), next()%20))
				} else {
					prompt = tokens(next()%4*100, next()%120+1) // few distinct prefixes
					if k%4 == 0 {
						seed = 1000 // equal prompts generate equal output blocks
					}
				}
				if len(prompt) > 400 {
					prompt = prompt[len(prompt)-400:]
				}
				r := &Request{ID: id, Prompt: prompt, MaxTokens: next()%80 + 1, Seed: seed}
				if next()%4 == 0 {
					r.EOSAt = next()%30 + 1
				}
				h := next()
				switch h % 7 { // LoRA adapters, one a step (MaxLoRAs 1)
				case 3:
					r.LoRA = "a"
				case 4:
					r.LoRA = "b"
				}
				r.HoldKV = h%6 == 0
				r.RemoteKV = h%6 == 5 // a decode leg: its KV arrives (op 6)
				probe := eager.PrefixHit(r)
				if got := lazy.PrefixHit(r); got != probe {
					t.Fatalf("PrefixHit(%s): events %d, none %d", id, probe, got)
				}
				errE, errL := eager.Add(now, r), lazy.Add(now, r)
				if (errE == nil) != (errL == nil) {
					t.Fatalf("Add: %v vs %v", errE, errL)
				}
				if errE == nil {
					ids = append(ids, id)
					prompts[id] = prompt
					reqs[id] = r
				}
			case 1:
				if len(ids) > 0 {
					id := ids[next()%len(ids)]
					eager.Abort(now, id)
					lazy.Abort(now, id)
				}
			case 2:
				if len(ids) > 0 {
					id := ids[next()%len(ids)]
					eager.Release(id)
					lazy.Release(id)
				}
			case 4:
				if a, b := eager.ResetPrefixCache(), lazy.ResetPrefixCache(); a != b {
					t.Fatalf("ResetPrefixCache: %v vs %v", a, b)
				}
			case 6:
				if len(loads) > 0 { // a RemoteKV request's KV arrives, or fails to
					k := next() % len(loads)
					ok := next()%4 != 0
					eager.LoadedKV(loads[k].ID, ok)
					lazy.LoadedKV(loads[k].ID, ok)
					loads = slices.Delete(loads, k, k+1)
				} else if eager.HasWork() {
					step()
				}
			default:
				if eager.HasWork() {
					step()
				}
			}
			compare(fmt.Sprint("op ", n))
		}
		for i := 0; eager.HasWork() || lazy.HasWork() || len(loads) > 0; i++ {
			if i > 20000 {
				t.Fatal("engines do not finish")
			}
			for _, id := range ids {
				eager.Release(id)
				lazy.Release(id)
			}
			for _, l := range loads {
				eager.LoadedKV(l.ID, true)
				lazy.LoadedKV(l.ID, true)
			}
			loads = loads[:0]
			step()
		}
		materializeAll(lazy)
		compare("end")
		if ke, kl := cachedCopies(eager), cachedCopies(lazy); !maps.EqualFunc(ke, kl, slices.Equal) {
			t.Fatalf("cached keys or the blocks holding them (in hit order) differ: events %d keys, none %d", len(ke), len(kl))
		}
		checkInvariants(t, lazy)
	})
}

// cachedCopies returns the blocks caching each key of e, in the order a
// lookup meets them.
func cachedCopies(e *Engine) map[uint64][]int32 {
	m := map[uint64][]int32{}
	e.pool.cached.each(func(k uint64, _ int32) {
		if _, ok := m[k]; !ok {
			e.pool.cached.copies(k, func(id int32) { m[k] = append(m[k], id) })
		}
	})
	return m
}

// TestDeferredContinuation: a conversation's next turn, its prompt the
// first turn's prompt and outputs as token ids, finds the first turn's
// output blocks cached with and without KV events (without, their keys
// were deferred until this lookup).
func TestDeferredContinuation(t *testing.T) {
	for _, noEvents := range []bool{false, true} {
		e := mustEngine(t, "tiny", func(c *Config) { c.NoEvents = noEvents })
		d := newDriver(t, e)
		first := &Request{ID: "turn1", Prompt: tokens(0, 70), MaxTokens: 60, Seed: 9}
		d.add(first)
		d.run()
		var outs []uint32
		for _, o := range d.byID("turn1") {
			outs = append(outs, o.Token)
		}
		if noEvents && (len(e.runByKey) != 1 || e.retired != 1 || e.Stats().CachedBlocks != 129/16) {
			t.Fatalf("after turn 1: %d runs, %d retired, %d cached blocks; want 1, 1, %d", len(e.runByKey), e.retired, e.Stats().CachedBlocks, 129/16)
		}
		second := &Request{ID: "turn2", Prompt: concat(concat(first.Prompt, outs), tokens(5000, 10)), MaxTokens: 5}
		if got, want := e.PrefixHit(second), 128; got != want {
			t.Errorf("NoEvents=%v: PrefixHit %d, want %d (the 8 full blocks of turn 1's prompt and outputs)", noEvents, got, want)
		}
		d.add(second)
		d.run()
		if o := d.byID("turn2"); len(o) == 0 || o[0].CachedTokens != 128 {
			t.Errorf("NoEvents=%v: turn 2 cached tokens %v, want 128", noEvents, o)
		}
		if noEvents && (len(e.runs) == 0 || e.retired != 1) {
			t.Errorf("after turn 2: %d retired runs, want 1 (turn 2's)", e.retired)
		}
	}
}

// TestDeferredSweep: finished requests' runs whose blocks were evicted
// are dropped by sweeps (as retired runs double), their sequences
// recycled; a run whose first block is still cached stays.
func TestDeferredSweep(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.NoEvents = true; c.NumGPUBlocks = 17; c.MaxModelLen = 256 })
	e.sweepAt, e.minSweep = 1, 1
	d := newDriver(t, e)
	most := 0
	for i := range 20 {
		// Each request takes 14 of the 16 blocks: the previous one's
		// output blocks are evicted, last first.
		d.add(&Request{ID: fmt.Sprint(i), Prompt: tokens(1000*i, 100), MaxTokens: 120})
		d.run()
		most = max(most, e.retired)
	}
	if most > 4 {
		t.Errorf("up to %d retired runs, want at most 4 (swept when they double)", most)
	}
	e.sweepRuns()
	if e.retired != 1 || len(e.runByKey) != 1 {
		t.Fatalf("after a sweep: %d retired runs, %d keys; want only the last request's", e.retired, len(e.runByKey))
	}
	for _, run := range e.runs {
		if run.s != nil && run.s.id != "19" {
			t.Errorf("%s's run is left, want only 19's", run.s.id)
		}
	}
	checkInvariants(t, e)
}

// TestDeferredRecyclesSequences: at steady state an engine with deferred
// keys allocates nothing per request: a sweep returns hundreds of retired
// sequences at once, and the spare list keeps them for the requests after
// it (capped at maxSpare it dropped most: 1.9 allocations per request here).
func TestDeferredRecyclesSequences(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.NoEvents = true; c.NumGPUBlocks = 4000; c.MaxModelLen = 512 })
	sys := tokens(0, 100)
	reqs := make([]Request, 6000) // AllocsPerRun runs its function twice
	for i := range reqs {
		reqs[i] = Request{ID: fmt.Sprint(i), Prompt: concat(sys, tokens(1000+i*20, 20)), MaxTokens: 100}
	}
	var now time.Duration
	var res StepResult
	run := func(from, to int) {
		for i := from; i < to; i++ {
			if err := e.Add(now, &reqs[i]); err != nil {
				t.Fatal(err)
			}
			for range 16 { // about a request's share of the steps: the queue stays short
				e.StepInto(now, &res)
				now += res.Duration
			}
		}
	}
	run(0, 3000) // warm up: the cache fills, runs retire, sweeps start
	if st := e.Stats(); e.sweepAt <= 2*maxSpare || st.Waiting > 10 || st.CachedBlocks < 3300 {
		t.Fatalf("not at steady state: sweep threshold %d (want more than twice maxSpare %d), %d waiting, %d of 4000 blocks cached",
			e.sweepAt, maxSpare, st.Waiting, st.CachedBlocks)
	}
	next := 3000
	allocs := testing.AllocsPerRun(1, func() { run(next, next+1500); next += 1500 })
	if per := allocs / 1500; per > 0.05 {
		t.Errorf("%.2f allocations per request at steady state, want none", per)
	}
}

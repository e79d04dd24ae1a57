package engine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestDecodeSteps runs two engines in lockstep on one random workload
// (shared prefixes, EOS, held KV, aborts, caller-given hashes, a cache small
// enough to evict and preempt): one only steps, the other computes every
// plain decode run it is offered with DecodeSteps (random limits and time
// bounds), both resuming late now and then. After each of its runs the
// stepping engine takes as many steps, and the two must agree on every
// token, time and latency, every KV event, the Stats, each request's
// blocks and the whole block pool (free-queue order included). With and
// without events, and in two shapes: the tiny profile's 8 requests at
// most, and a wide batch of up to 200 requests arriving in bursts
// (DecodeSteps visits a request only at its block boundaries: many
// requests at different phases, more than a 64-bit word of them, in runs
// longer than its window of steps).
func TestDecodeSteps(t *testing.T) {
	shapes := []decodeShape{
		{name: "narrow", seeds: 4, blocks: 40, burst: 3, minRun: 2},
		{name: "wide", seeds: 2, blocks: 1200, seqs: 200, budget: 8192, burst: 64, minRun: 65, together: true},
		{name: "lora", seeds: 3, blocks: 60, burst: 3, minRun: 2, loras: true},
	}
	for _, shape := range shapes {
		for _, noEvents := range []bool{false, true} {
			for seed := range uint64(shape.seeds) {
				t.Run(fmt.Sprintf("%s/noEvents=%v/seed%d", shape.name, noEvents, seed), func(t *testing.T) {
					testDecodeSteps(t, seed, noEvents, shape)
				})
			}
		}
	}
}

// decodeShape is one of TestDecodeSteps' workloads.
type decodeShape struct {
	name                 string
	seeds                int  // workloads (random seeds)
	blocks, seqs, budget int  // the cache (+40% a seed), max_num_seqs and the step's tokens (0: the profile's)
	burst                int  // the most requests arriving at once
	minRun               int  // the most requests some run must have
	together             bool // a burst's requests have the same length and no EOS (they finish together)
	// loras: requests of three LoRA adapters and the base model, one
	// adapter a step (MaxLoRAs 1), so that runs go on while requests of
	// other adapters wait.
	loras bool
}

func testDecodeSteps(t *testing.T, seed uint64, noEvents bool, sh decodeShape) {
	mod := func(c *Config) {
		c.NumGPUBlocks, c.MaxNumSeqs, c.MaxNumBatchedTokens = sh.blocks+int(seed)*sh.blocks*2/5, sh.seqs, sh.budget
		c.MaxModelLen, c.NoEvents = 512, noEvents
		if sh.loras {
			c.MaxLoRAs = 1
		}
	}
	stepper, bulk := mustEngine(t, "tiny", mod), mustEngine(t, "tiny", mod)
	a, b := newDriver(t, stepper), newDriver(t, bulk)
	rng := rand.New(rand.NewPCG(seed, 3))
	gaps := rand.New(rand.NewPCG(seed, 4)) // apart, so that the workload is the same
	adapters := rand.New(rand.NewPCG(seed, 5))
	prefixes := [][]uint32{tokens(1, 64), tokens(5000, 200), tokens(9000, 33)}
	var live []string
	last := map[string]Output{} // each request's latest output (the bulk engine's)
	var run DecodedRun
	runs, bulkSteps, removed, finishes := 0, 0, 0, 0
	waitingRuns := 0        // runs computed while requests waited (kept out by MaxLoRAs)
	widest, longest := 0, 0 // the most requests and steps in a run
	for i := 0; i < 300 || stepper.HasWork() || bulk.HasWork(); i++ {
		if i > 1e5 {
			t.Fatal("engines do not finish")
		}
		if i < 300 && rng.IntN(10) == 0 {
			burst, maxTokens := 1+rng.IntN(sh.burst), 0
			if sh.together {
				maxTokens = 60 + rng.IntN(120)
			}
			for range burst {
				id := fmt.Sprint("q", i, "-", rng.IntN(1e6))
				prompt := concat(prefixes[rng.IntN(3)], tokens(rng.IntN(1e5), 1+rng.IntN(120)))
				req := func() *Request {
					return &Request{ID: id, Prompt: prompt, MaxTokens: 1 + rng.IntN(120), EOSAt: rng.IntN(100)}
				}
				r := req()
				if sh.together {
					r.MaxTokens, r.EOSAt = maxTokens, 0
				}
				switch rng.IntN(10) {
				case 0:
					r.HoldKV = true
				case 1:
					r.Prompt, r.PromptLen = nil, len(prompt)
					r.BlockHashes = []uint64{uint64(rng.IntN(20)) + 1, uint64(rng.IntN(20)) + 100}
				case 2:
					r.Seed = rng.Uint64()
				}
				if sh.loras {
					r.LoRA = [...]string{"", "a", "b", "c"}[adapters.IntN(4)]
				}
				if addBoth(t, stepper, bulk, a.now, b.now, r) {
					live = append(live, id)
				}
			}
		}
		if len(live) > 0 && rng.IntN(12) == 0 {
			id := live[rng.IntN(len(live))]
			stepper.Abort(a.now, id)
			bulk.Abort(b.now, id)
		}
		if rng.IntN(3) == 0 {
			for id, s := range stepper.seqs {
				if s.status == statusHeld {
					stepper.Release(id)
					bulk.Release(id)
				}
			}
		}

		if gaps.IntN(4) == 0 {
			// The driver resumes late (a real-time loop behind its
			// clock): the next step starts after the last one ended, and
			// its tokens' latencies count from the tokens before the gap.
			gap := time.Duration(1 + gaps.IntN(int(stepper.MinStepTime())))
			a.now += gap
			b.now += gap
		}
		until := b.now + time.Duration(rng.IntN(400))*stepper.MinStepTime()
		running := len(bulk.running)
		type sampled struct {
			seed  uint64
			eosAt int
		}
		samples := map[string]sampled{} // finished requests leave bulk.seqs
		for _, s := range bulk.running {
			samples[s.id] = sampled{s.seed, int(s.eosAt)}
		}
		waiting := bulk.waiting.len()
		n := bulk.DecodeSteps(b.now, until, 1+rng.IntN(60), &run)
		if n > 0 && waiting > 0 {
			waitingRuns++
		}
		if n == 0 {
			if bulk.HasWork() {
				ra, rb := a.step(), b.step()
				if !reflect.DeepEqual(ra.Outputs, rb.Outputs) || ra.Duration != rb.Duration {
					t.Fatalf("step %d: outputs differ:\n%+v\n%+v", i, ra.Outputs, rb.Outputs)
				}
				for _, o := range rb.Outputs {
					last[o.ID] = o
				}
			}
			compareEngines(t, stepper, bulk, a, b)
			a.forget()
			b.forget()
			continue
		}
		runs++
		bulkSteps += n
		widest, longest = max(widest, running), max(longest, n)
		if len(run.Durations) != n || len(run.Seqs) != running {
			t.Fatalf("run of %d steps: %d durations, %d requests (%d running)", n, len(run.Durations), len(run.Seqs), running)
		}
		if len(run.Finished) > 0 {
			finishes++
		}
		from := len(a.outputs)
		a.stepN(n)
		// The run's outputs, as Steps would have reported them.
		var want []Output
		now := b.now
		fin := run.Finished
		for k, d := range run.Durations {
			now += d
			for _, sq := range run.Seqs {
				if sq.Finished && k == n-1 {
					if len(fin) == 0 {
						t.Fatalf("run of %d steps: %s marked finished, no output left", n, sq.ID)
					}
					want = append(want, fin[0])
					fin = fin[1:]
					continue
				}
				o := last[sq.ID]
				sm := samples[sq.ID]
				o.First, o.Index, o.Time = false, sq.From+k, now
				o.Token = bulk.sampler.token(sm.seed, sm.eosAt, o.Index)
				o.ITL = d
				if k == 0 {
					o.ITL = sq.FirstITL
				}
				last[sq.ID] = o
				want = append(want, o)
			}
		}
		if len(fin) > 0 {
			t.Fatalf("run of %d steps: %d finished outputs for no request", n, len(fin))
		}
		if until < now {
			t.Fatalf("run ends at %v, after until %v", now, until)
		}
		if got := a.outputs[from:]; !reflect.DeepEqual(got, want) {
			t.Fatalf("run of %d steps at %v: stepping gave\n%+v\nthe run says\n%+v", n, b.now, got, want)
		}
		b.now = now
		b.outputs = append(b.outputs, want...)
		for _, ev := range run.Events { // the hashes' slab is the run's, reused
			if ev.Kind == BlockRemoved {
				removed++
			}
			ev.BlockHashes = slices.Clone(ev.BlockHashes)
			b.events = append(b.events, ev)
		}
		b.mirrorEvents(run.Events)
		if i := slices.IndexFunc(run.sched.due, func(w uint64) bool { return w != 0 }); i >= 0 {
			t.Fatalf("run of %d steps left requests due in its schedule (word %d)", n, i) // the next run would visit them
		}
		compareEngines(t, stepper, bulk, a, b)
		a.forget()
		b.forget()
	}
	t.Logf("DecodeSteps computed %d steps in %d runs (up to %d requests, %d steps), evicting in %d, finishing requests in %d",
		bulkSteps, runs, widest, longest, removed, finishes)
	if runs < 5 || bulkSteps < 100 || finishes < 3 {
		t.Errorf("DecodeSteps computed %d steps in %d runs, %d of them ending in finishes: it should find the plain decode runs and their finishes", bulkSteps, runs, finishes)
	}
	if sh.loras && waitingRuns == 0 {
		t.Errorf("no run while requests of other adapters waited: want some")
	}
	if window := stepper.bs + 2; widest < sh.minRun || longest <= 2*window {
		t.Errorf("runs of up to %d requests and %d steps: want some of %d requests and some longer than twice decodePlain's window (%d steps)", widest, longest, sh.minRun, window)
	}
}

// compareEngines fails unless the two engines and their drivers are in the
// same state.
func compareEngines(t *testing.T, x, y *Engine, a, b *driver) {
	t.Helper()
	if a.now != b.now {
		t.Fatalf("clock %v vs %v", a.now, b.now)
	}
	if x.Stats() != y.Stats() {
		t.Fatalf("stats differ:\n%+v\n%+v", x.Stats(), y.Stats())
	}
	if !reflect.DeepEqual(a.events, b.events) {
		t.Fatalf("KV events differ (%d vs %d)", len(a.events), len(b.events))
	}
	if !slices.Equal(x.pool.blocks, y.pool.blocks) {
		t.Fatalf("block pools differ")
	}
	checkInvariants(t, y)
	for id, s := range x.seqs {
		o := y.seqs[id]
		if o == nil || !slices.Equal(s.blocks, o.blocks) || s.numStored != o.numStored || !slices.Equal(s.hashes, o.hashes) ||
			!slices.Equal(s.tokens, o.tokens) || s.outputs != o.outputs || s.lastToken != o.lastToken ||
			s.computed != o.computed || s.numTokens != o.numTokens {
			t.Fatalf("request %s differs", id)
		}
	}
}

// stepN takes n steps, checking the pool and the event mirror after the
// last only, as after a DecodeSteps run of n steps.
func (d *driver) stepN(n int) {
	d.t.Helper()
	from := len(d.events)
	for range n {
		r := d.e.Step(d.now)
		d.now += r.Duration
		d.outputs = append(d.outputs, r.Outputs...)
		d.events = append(d.events, r.Events...)
	}
	d.mirrorEvents(d.events[from:])
}

// forget drops the outputs, events and steps d collected, compared
// already: a long lockstep run need not keep them all (nor compare them
// again).
func (d *driver) forget() {
	d.outputs, d.events, d.steps = d.outputs[:0], d.events[:0], d.steps[:0]
}

// TestDecodeStepsStopsBeforePreemption: when the free blocks run out in the
// middle of a decode run, DecodeSteps computes the steps whose blocks fit
// and leaves the one that preempts to StepInto.
func TestDecodeStepsStopsBeforePreemption(t *testing.T) {
	mod := func(c *Config) { c.NumGPUBlocks = 11; c.MaxModelLen = 160; c.DisablePrefixCaching = true }
	stepper, bulk := mustEngine(t, "tiny", mod), mustEngine(t, "tiny", mod)
	a, b := newDriver(t, stepper), newDriver(t, bulk)
	for _, e := range []*Engine{stepper, bulk} {
		for _, id := range []string{"a", "b"} {
			if err := e.Add(0, &Request{ID: id, Prompt: tokens(len(id)*1000, 60), MaxTokens: 90, IgnoreEOS: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for len(bulk.running) < 2 || bulk.running[0].outputs == 0 || bulk.running[1].outputs == 0 { // prefill both
		a.step()
		b.step()
	}
	var run DecodedRun
	n := bulk.DecodeSteps(b.now, time.Hour, 1000, &run)
	// Each request has computed 60 tokens into 4 blocks (64 slots); the 2
	// free blocks take both to 80: 20 steps, the 21st needs an 11th block.
	if n != 20 {
		t.Fatalf("DecodeSteps computed %d steps, want 20", n)
	}
	for _, d := range run.Durations {
		a.step()
		b.now += d
	}
	compareEngines(t, stepper, bulk, a, b)
	if r := b.step(); r.Preempted != 1 {
		t.Errorf("the step after the run preempted %d requests, want 1", r.Preempted)
	}
}

// TestDecodeStepsAllocs: a real-time driver calls DecodeSteps all the time
// with the same DecodedRun; once its slices have grown, a run allocates
// nothing (with and without KV events).
func TestDecodeStepsAllocs(t *testing.T) {
	for _, noEvents := range []bool{false, true} {
		t.Run(fmt.Sprint("noEvents=", noEvents), func(t *testing.T) {
			e := mustEngine(t, "llama-3.1-8b-h100", func(c *Config) { c.NoEvents = noEvents })
			for i := range 100 {
				r := &Request{ID: fmt.Sprint("r", i), Prompt: tokens(i*1000, 100+i*7), MaxTokens: 2000, IgnoreEOS: true}
				if err := e.Add(0, r); err != nil {
					t.Fatal(err)
				}
			}
			now := stepUntilDecoding(e)
			var run DecodedRun
			decode := func() {
				n := e.DecodeSteps(now, time.Hour, 24, &run)
				if n != 24 {
					t.Fatalf("DecodeSteps computed %d steps, want 24", n)
				}
				for _, d := range run.Durations {
					now += d
				}
			}
			decode() // grows the run's slices
			if a := testing.AllocsPerRun(20, decode); a != 0 {
				t.Errorf("DecodeSteps allocated %v times a run of 24 steps of %d requests, want 0", a, len(e.running))
			}
		})
	}
}

// stepUntilDecoding steps e from time 0 until no request waits and the
// last one running has an output (every request is decoding), and returns
// the time then.
func stepUntilDecoding(e *Engine) time.Duration {
	var now time.Duration
	var res StepResult
	for e.waiting.len() > 0 || e.running[len(e.running)-1].outputs == 0 {
		e.StepInto(now, &res)
		now += res.Duration
	}
	return now
}

// TestDecodeStepsBefore: DecodeStepsBefore computes the steps that start
// before before (the one in progress then included) and end by until, as
// stepping computes them.
func TestDecodeStepsBefore(t *testing.T) {
	setup := func() (*Engine, time.Duration) {
		e := mustEngine(t, "tiny", nil)
		for i := range 3 {
			if err := e.Add(0, &Request{ID: fmt.Sprint("r", i), Prompt: tokens(i*1000, 40), MaxTokens: 200, IgnoreEOS: true}); err != nil {
				t.Fatal(err)
			}
		}
		return e, stepUntilDecoding(e)
	}
	ref, now := setup()
	var run DecodedRun
	if n := ref.DecodeSteps(now, time.Hour, 10, &run); n != 10 {
		t.Fatalf("DecodeSteps computed %d steps, want 10", n)
	}
	starts := []time.Duration{now} // starts[k]: step k's start; starts[k+1] its end
	for _, d := range run.Durations {
		starts = append(starts, starts[len(starts)-1]+d)
	}
	for _, tc := range []struct {
		name          string
		before, until time.Duration
		want          int
	}{
		{"in step 4", starts[4] + 1, time.Hour, 5},
		{"at step 4's start", starts[4], time.Hour, 4},
		{"until cuts first", starts[6] + 1, starts[5], 5},
		{"before the first", now, time.Hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, now := setup()
			var got DecodedRun
			n := e.DecodeStepsBefore(now, tc.until, tc.before, 10, &got)
			if n != tc.want || !slices.Equal(got.Durations, run.Durations[:n]) {
				t.Errorf("got %d steps %v, want %d %v", n, got.Durations, tc.want, run.Durations[:tc.want])
			}
		})
	}
}

// TestRunBlocks checks runBlocks against its definition, the blocks that n
// more tokens take for each running request, for runs shorter and longer
// than a block (it counts the short ones without a division).
func TestRunBlocks(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	for i := range 6 {
		if err := e.Add(0, &Request{ID: fmt.Sprint("r", i), Prompt: tokens(i*100, 5+i*7), MaxTokens: 200}); err != nil {
			t.Fatal(err)
		}
	}
	var res StepResult
	now := time.Duration(0)
	checked := 0
	for step := 0; step < 60 && e.HasWork(); step++ {
		e.StepInto(now, &res)
		now += res.Duration
		for n := 1; n <= 3*e.bs+1; n++ {
			want := 0
			for _, s := range e.running {
				want += (s.computed+n+e.bs-1)/e.bs - len(s.blocks)
			}
			if got := e.runBlocks(n); got != want {
				t.Fatalf("step %d, n=%d: runBlocks %d, want %d", step, n, got, want)
			}
			checked++
		}
	}
	if checked == 0 || len(e.running) == 0 {
		t.Fatalf("checked %d runs, %d running: the workload never decoded", checked, len(e.running))
	}
}

package engine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestStepSummarize runs two engines in lockstep on one random workload
// (shared prefixes, EOS, held KV, aborts, late steps, a cache small enough
// to preempt), one stepping with StepResult.Summarize: it must report
// exactly the other's first, last and abort outputs, in order, and the
// rest as Summarized and ITLs (each latency in its place, runs of equal
// ones merged), and both engines must stay in the same state.
func TestStepSummarize(t *testing.T) {
	for _, noEvents := range []bool{false, true} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("noEvents=%v/seed%d", noEvents, seed), func(t *testing.T) {
				testStepSummarize(t, seed, noEvents)
			})
		}
	}
}

func testStepSummarize(t *testing.T, seed uint64, noEvents bool) {
	mod := func(c *Config) { c.NumGPUBlocks, c.MaxModelLen, c.NoEvents = 50+int(seed)*10, 512, noEvents }
	full, quiet := mustEngine(t, "tiny", mod), mustEngine(t, "tiny", mod)
	rng := rand.New(rand.NewPCG(seed, 11))
	var live []string
	var rf, rq StepResult
	rq.Summarize = true
	now := time.Duration(0)
	summarized, merged, firsts := 0, 0, 0
	for i := 0; i < 400 || full.HasWork(); i++ {
		if i > 1e5 {
			t.Fatal("engines do not finish")
		}
		if i < 400 && rng.IntN(6) == 0 {
			live = append(live, addBurst(t, rng, fmt.Sprint("q", i), now, full, quiet, 120, true)...)
		}
		if len(live) > 0 && rng.IntN(15) == 0 {
			id := live[rng.IntN(len(live))]
			full.Abort(now, id)
			quiet.Abort(now, id)
		}
		for id, s := range full.seqs {
			if s.status == statusHeld && rng.IntN(3) == 0 {
				full.Release(id)
				quiet.Release(id)
			}
		}
		if rng.IntN(5) == 0 {
			now += time.Duration(1 + rng.IntN(int(full.MinStepTime()))) // a late step
		}
		stepTwins(t, i, now, full, quiet, &rf, &rq)
		summarized += rq.Summarized
		firsts += len(rq.Outputs)
		if len(rq.ITLs) < rq.Summarized {
			merged++
		}
		now += rf.Duration
	}
	for id, s := range full.seqs {
		if o := quiet.seqs[id]; o == nil || s.outputs != o.outputs || s.lastToken != o.lastToken || s.numTokens != o.numTokens {
			t.Fatalf("request %s differs", id)
		}
	}
	pre := full.Stats().Preemptions
	t.Logf("%d tokens summarised (%d steps merging runs), %d outputs kept, %d preemptions", summarized, merged, firsts, pre)
	if summarized < 1000 || merged < 50 || firsts < 100 || pre == 0 {
		t.Errorf("%d tokens summarised, %d steps merging, %d outputs kept, %d preemptions: the workload should exercise all",
			summarized, merged, firsts, pre)
	}
}

// TestDecodeStepsSummarize runs two engines in lockstep on TestStepSummarize's
// workload, computing each plain decode run they are offered with
// DecodeSteps, one with DecodedRun.Summarize: both must compute the same
// steps and finishes, and the summary (Running, FinishedAt, FirstITLs)
// must say what the other's Seqs say, each latency in its place.
func TestDecodeStepsSummarize(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			testDecodeStepsSummarize(t, seed)
		})
	}
}

func testDecodeStepsSummarize(t *testing.T, seed uint64) {
	mod := func(c *Config) { c.NumGPUBlocks, c.MaxModelLen, c.MaxNumSeqs = 400+int(seed)*100, 512, 32 }
	full, quiet := mustEngine(t, "tiny", mod), mustEngine(t, "tiny", mod)
	rng := rand.New(rand.NewPCG(seed, 12))
	var rf, rq StepResult
	var runF, runQ DecodedRun
	rq.Summarize, runQ.Summarize = true, true
	now := time.Duration(0)
	runs, single, finishing := 0, 0, 0
	for i := 0; i < 1500 || full.HasWork(); i++ {
		if i > 1e5 {
			t.Fatal("engines do not finish")
		}
		if i < 1500 && rng.IntN(8) == 0 {
			addBurst(t, rng, fmt.Sprint("q", i), now, full, quiet, 200, false)
		}
		if rng.IntN(5) == 0 {
			now += time.Duration(1 + rng.IntN(int(full.MinStepTime()))) // a late step: first latencies differ
		}
		limit := 1 + rng.IntN(40)
		nf := full.DecodeSteps(now, now+time.Hour, limit, &runF)
		nq := quiet.DecodeSteps(now, now+time.Hour, limit, &runQ)
		if nf != nq || full.Stats() != quiet.Stats() {
			t.Fatalf("step %d: the runs differ (%d and %d steps)", i, nf, nq)
		}
		if nf == 0 {
			stepTwins(t, i, now, full, quiet, &rf, &rq)
			now += rf.Duration
			continue
		}
		runs++
		checkRunSummary(t, runs, nf, &runF, &runQ)
		at := runQ.FinishedAt
		if len(at) > 0 {
			finishing++
			if nf == 1 && len(at) < len(runF.Seqs) {
				single++
			}
		}
		for _, d := range runF.Durations {
			now += d
		}
	}
	t.Logf("%d runs, %d ending in finishes, %d of those one step long with other requests", runs, finishing, single)
	if runs < 300 || finishing < 100 || single < 10 {
		t.Errorf("%d runs, %d ending in finishes, %d one step long with others: the workload should exercise all", runs, finishing, single)
	}
}

// addBurst adds 1-4 random requests at now to both engines (prompts
// sharing one of two prefixes, up to most output tokens, an EOS position
// for most, HoldKV for some when hold) and returns the IDs both accepted.
func addBurst(t *testing.T, rng *rand.Rand, prefix string, now time.Duration, x, y *Engine, most int, hold bool) []string {
	t.Helper()
	prefixes := [][]uint32{tokens(1, 64), tokens(5000, 200)}
	var ids []string
	for range 1 + rng.IntN(4) {
		id := fmt.Sprint(prefix, "-", rng.IntN(1e6))
		r := &Request{ID: id, Prompt: concat(prefixes[rng.IntN(2)], tokens(rng.IntN(1e5), 1+rng.IntN(100))),
			MaxTokens: 1 + rng.IntN(most), EOSAt: rng.IntN(most), Seed: rng.Uint64()}
		r.HoldKV = hold && rng.IntN(8) == 0
		if addBoth(t, x, y, now, now, r) {
			ids = append(ids, id)
		}
	}
	return ids
}

// addBoth adds r to x at nowX and a copy to y at nowY; both must accept it
// or both refuse it. It reports whether they accepted it.
func addBoth(t *testing.T, x, y *Engine, nowX, nowY time.Duration, r *Request) bool {
	t.Helper()
	r2 := *r
	errX, errY := x.Add(nowX, r), y.Add(nowY, &r2)
	if (errX == nil) != (errY == nil) {
		t.Fatalf("Add %s: %v vs %v", r.ID, errX, errY)
	}
	return errX == nil
}

// stepTwins steps full into rf and quiet, its twin, into rq (rq.Summarize
// set) at now: the engines must stay in the same state, and rq say what rf
// says (checkSummary).
func stepTwins(t testing.TB, step int, now time.Duration, full, quiet *Engine, rf, rq *StepResult) {
	t.Helper()
	full.StepInto(now, rf)
	quiet.StepInto(now, rq)
	if full.Stats() != quiet.Stats() {
		t.Fatalf("step %d: the engines' stats differ", step)
	}
	checkSummary(t, step, rf, rq)
}

// checkSummary fails unless rq, a step computed with Summarize, says what
// rf, the same step in full, says: the same duration and events, every
// first, last or abort output of rf's the next of rq's, every other
// output's latency the next in rq.ITLs, placed before the same output,
// and runs of equal latencies in one place merged.
func checkSummary(t testing.TB, step int, rf, rq *StepResult) {
	t.Helper()
	if rf.Duration != rq.Duration || len(rf.Events)+len(rq.Events) > 0 && !reflect.DeepEqual(rf.Events, rq.Events) {
		t.Fatalf("step %d: durations %v and %v, or events, differ:\n%+v\n%+v", step, rf.Duration, rq.Duration, rf.Events, rq.Events)
	}
	j, runs, left := 0, rq.ITLs, 0
	for k := range rf.Outputs {
		o := &rf.Outputs[k]
		if o.First || o.Finished {
			if j >= len(rq.Outputs) || !reflect.DeepEqual(*o, rq.Outputs[j]) {
				t.Fatalf("step %d: output %d (%+v) is not the summary's next", step, k, *o)
			}
			j++
			continue
		}
		if left == 0 {
			if len(runs) == 0 || runs[0].N <= 0 {
				t.Fatalf("step %d: output %d (%+v) has no latency in the summary", step, k, *o)
			}
			left = runs[0].N
		}
		if runs[0].ITL != o.ITL || runs[0].Before != j {
			t.Fatalf("step %d: output %d has latency %v before output %d; the summary has %+v", step, k, o.ITL, j, runs[0])
		}
		if left--; left == 0 {
			runs = runs[1:]
		}
	}
	if j != len(rq.Outputs) || len(runs) != 0 || left != 0 {
		t.Fatalf("step %d: the summary has %d outputs and %d runs left over", step, len(rq.Outputs)-j, len(runs))
	}
	if want := len(rf.Outputs) - len(rq.Outputs); rq.Summarized != want {
		t.Fatalf("step %d: Summarized %d, want %d", step, rq.Summarized, want)
	}
	for k := 1; k < len(rq.ITLs); k++ {
		if a, b := rq.ITLs[k-1], rq.ITLs[k]; a.ITL == b.ITL && a.Before == b.Before {
			t.Fatalf("step %d: runs %+v and %+v not merged", step, a, b)
		}
	}
}

// checkRunSummary fails unless runQ, a run of n steps computed with
// Summarize, says what runF, the same run in full, says: the same steps,
// finishes and events, no Seqs, Running and FinishedAt as runF's Seqs
// say, and FirstITLs their FirstITL in place (in a run of one step, the
// finishing requests left out and each latency placed before the finish
// after it).
func checkRunSummary(t testing.TB, run, n int, runF, runQ *DecodedRun) {
	t.Helper()
	if !slices.Equal(runF.Durations, runQ.Durations) || !reflect.DeepEqual(runF.Finished, runQ.Finished) ||
		len(runF.Events)+len(runQ.Events) > 0 && !reflect.DeepEqual(runF.Events, runQ.Events) {
		t.Fatalf("run %d: the steps, finishes or events differ", run)
	}
	if len(runQ.Seqs) != 0 || runQ.Running != len(runF.Seqs) || runF.Running != len(runF.Seqs) {
		t.Fatalf("run %d: %d requests in Seqs, Running %d and %d", run, len(runF.Seqs), runF.Running, runQ.Running)
	}
	var at []int
	for k, sq := range runF.Seqs {
		if sq.Finished {
			at = append(at, k)
		}
	}
	if !slices.Equal(at, runF.FinishedAt) || !slices.Equal(at, runQ.FinishedAt) {
		t.Fatalf("run %d: finished at %v; FinishedAt %v and %v", run, at, runF.FinishedAt, runQ.FinishedAt)
	}
	var want []ITLRun
	done := 0
	for _, sq := range runF.Seqs {
		if sq.Finished && n == 1 {
			done++
			continue
		}
		before := 0
		if n == 1 {
			before = done
		}
		if k := len(want); k > 0 && want[k-1].ITL == sq.FirstITL && want[k-1].Before == before {
			want[k-1].N++
		} else {
			want = append(want, ITLRun{ITL: sq.FirstITL, N: 1, Before: before})
		}
	}
	if !slices.Equal(want, runQ.FirstITLs) {
		t.Fatalf("run %d of %d steps: FirstITLs %+v, want %+v", run, n, runQ.FirstITLs, want)
	}
}

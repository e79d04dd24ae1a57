package engine

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// FuzzEngine interprets the input as a sequence of operations (add with
// odd shapes, abort, release, reset, step, a decode leg's KV arriving or
// failing) on a small engine and checks the
// pool invariants and the KV-event mirror after every step: bad requests
// must be rejected with an error, never corrupt the cache or panic. A twin
// engine given the same operations steps and runs summarised
// (StepResult.Summarize, DecodedRun.Summarize): it must stay in the same
// state, its summaries saying what the full results say.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 10, 3, 0, 5, 1, 0, 4, 4, 4, 2, 0, 3})
	f.Add([]byte{0, 200, 9, 7, 0, 200, 9, 7, 4, 4, 4, 4, 1, 1, 4, 4})
	f.Add([]byte{0, 1, 1, 255, 0, 255, 255, 255, 5, 4, 4, 4, 4, 4})
	// Two requests, prefilled by steps, then decode runs at once.
	f.Add([]byte{0, 1, 40, 90, 0, 0, 1, 1, 1, 0, 1, 30, 70, 0, 1, 2, 1, 1, 4, 1, 4, 1, 4, 1, 4, 0, 255, 15, 4, 0, 255, 15, 4, 0, 9, 3})
	// RemoteKV requests: admitted, their KV arrives (one fails), aborted
	// while they wait.
	f.Add([]byte{0, 1, 100, 20, 0, 0, 1, 1, 1, 0, 0, 1, 200, 20, 0, 1, 2, 1, 1, 0, 4, 1, 6, 0, 1, 4, 1, 6, 0, 0, 4, 1, 4, 1, 4, 1})
	f.Add([]byte{0, 1, 230, 20, 0, 0, 1, 1, 1, 0, 4, 1, 1, 0, 0, 1, 60, 30, 0, 0, 1, 1, 1, 0, 4, 1, 6, 0, 3, 4, 1, 4, 1, 4, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		mod := func(c *Config) { c.NumGPUBlocks = 24; c.MaxModelLen = 256; c.MaxNumBatchedTokens = 64 }
		e, q := mustEngine(t, "tiny", mod), mustEngine(t, "tiny", mod)
		d := newDriver(t, e)
		var rq StepResult
		var runQ DecodedRun
		rq.Summarize, runQ.Summarize = true, true
		steps := 0
		// step steps both engines, checking the twin's summary.
		step := func() StepResult {
			now := d.now
			res := d.step()
			q.StepInto(now, &rq)
			if e.Stats() != q.Stats() {
				t.Fatalf("step %d: the twin's stats differ", steps)
			}
			checkSummary(t, steps, &res, &rq)
			steps++
			return res
		}
		next := func() byte {
			if len(ops) == 0 {
				return 0
			}
			b := ops[0]
			ops = ops[1:]
			return b
		}
		var ids []string
		var run DecodedRun
		var loads []KVLoad // admitted RemoteKV requests, their KV not arrived yet
		for n := 0; len(ops) > 0 && n < 200; n++ {
			switch op := next() % 7; op {
			case 6: // a RemoteKV request's KV arrives, or fails to
				if len(loads) > 0 {
					k := int(next()) % len(loads)
					ok := next()%4 != 0
					e.LoadedKV(loads[k].ID, ok)
					q.LoadedKV(loads[k].ID, ok)
					loads = slices.Delete(loads, k, k+1)
				}
			case 0, 5: // add
				id := fmt.Sprint(len(ids))
				if next()%8 == 0 && len(ids) > 0 {
					id = ids[0] // duplicate
				}
				plen := int(next())
				r := &Request{ID: id, MaxTokens: int(next()) - 8, EOSAt: int(next() % 16)}
				switch mode := next() % 4; mode {
				case 0, 1:
					r.Prompt = tokens(int(next())*7, plen)
				case 2: // fast path, hashes with repeats and zeros
					r.PromptLen = plen
					for i := 0; i < int(next()%20); i++ {
						r.BlockHashes = append(r.BlockHashes, uint64(next()%5))
					}
				case 3:
					r.Prompt = tokens(0, plen)
					r.PromptLen = int(next())
				}
				r.SkipPrefill = next()%5 == 0
				r.HoldKV = next()%5 == 0
				r.RemoteKV = next()%4 == 0
				r2 := *r
				errQ := q.Add(d.now, &r2)
				if err := e.Add(d.now, r); (err == nil) != (errQ == nil) {
					t.Fatalf("Add %+v: %v, the twin %v", r, err, errQ)
				} else if err != nil {
					var le *LengthError
					if !errors.As(err, &le) && !errors.Is(err, ErrDuplicateID) && !errors.Is(err, ErrEmptyPrompt) &&
						r.MaxTokens >= 0 && (r.Prompt == nil || r.PromptLen == 0 || r.PromptLen == len(r.Prompt)) {
						t.Fatalf("unexpected error for %+v: %v", r, err)
					}
					continue
				}
				ids = append(ids, id)
			case 1:
				if len(ids) > 0 {
					id := ids[int(next())%len(ids)]
					e.Abort(d.now, id)
					q.Abort(d.now, id)
				}
			case 2:
				if len(ids) > 0 {
					id := ids[int(next())%len(ids)]
					e.Release(id)
					q.Release(id)
				}
			case 3:
				e.ResetPrefixCache()
				q.ResetPrefixCache()
			case 4:
				// A real-time driver computes plain decode runs at once.
				if next()%2 == 0 {
					until := d.now + time.Duration(next())*e.MinStepTime()
					limit := int(next()%16) + 1
					n, nq := e.DecodeSteps(d.now, until, limit, &run), q.DecodeSteps(d.now, until, limit, &runQ)
					if n != nq || e.Stats() != q.Stats() {
						t.Fatalf("DecodeSteps: %d steps, the twin %d", n, nq)
					}
					if n > 0 {
						checkRunSummary(t, steps, n, &run, &runQ)
						for _, dur := range run.Durations {
							d.now += dur
						}
						if d.now > until {
							t.Fatalf("DecodeSteps ran to %v, past %v", d.now, until)
						}
						d.mirrorEvents(run.Events) // checks the pool and the events
						continue
					}
				}
				loads = append(loads, step().Loads...)
			}
		}
		release := func() {
			for _, id := range ids {
				e.Release(id)
				q.Release(id)
			}
		}
		release()
		for i := 0; e.HasWork() || len(loads) > 0; i++ {
			for _, l := range loads {
				e.LoadedKV(l.ID, true)
				q.LoadedKV(l.ID, true)
			}
			loads = loads[:0]
			if i > 5000 {
				release() // held requests may starve others
			}
			if i > 20000 {
				t.Fatal("engine does not finish")
			}
			loads = append(loads, step().Loads...)
			release()
		}
		if st := e.Stats(); st.FreeBlocks != st.NumGPUBlocks-1 { // all but the null block
			t.Fatalf("leak: %+v", st)
		}
	})
}

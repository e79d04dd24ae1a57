package emulator

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/coldcache"
	"github.com/kvroute/kvroute/internal/difftest"
)

// TestCatchUpMatchesStepping drives three servers' loop code in virtual
// time with the same arrivals (bursts of non-streamed requests with shared
// prefixes, EOS, aborts). The reference steps and finishes every step (the
// loop awake at every step) and delivers every output to its stream; the
// second steps too but delivers as the loop does when no handler is woken
// per chunk (only finished outputs reach their streams); the third also
// computes each plain decode run it can at once with catchUp, as the loop
// does after sleeping through one. Every stream's count and outcome and
// the whole /metrics exposition (latency histograms' buckets and sums,
// throughput gauges, the engine's Stats) must be the same.
func TestCatchUpMatchesStepping(t *testing.T) {
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			cfg := Config{Model: "m", Engine: engine.Config{Profile: prof, NumGPUBlocks: 96, MaxModelLen: 1024}, Speed: 1}
			var out [3]string
			var gens [3]map[string]string
			caught, finishing := 0, 0
			for mode := range 3 {
				s, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(seed, 9))
				var queue []command // arrivals, in time order
				at := time.Duration(0)
				streams := map[string]*stream{}
				for i := range 120 {
					at += time.Duration(rng.IntN(40)) * time.Millisecond
					id := fmt.Sprint("r", i)
					prompt := make([]uint32, 20+rng.IntN(200))
					for j := range prompt {
						prompt[j] = uint32(j)
						if j > 48 {
							prompt[j] = uint32(rng.IntN(1000))
						}
					}
					req := &engine.Request{ID: id, Prompt: prompt, MaxTokens: 1 + rng.IntN(150), EOSAt: rng.IntN(200)}
					st := newStream(id, 0, req.MaxTokens)
					streams[id] = st
					queue = append(queue, command{kind: cmdAdd, req: req, st: st, at: at})
					if rng.IntN(10) == 0 {
						queue = append(queue, command{kind: cmdAbort, id: fmt.Sprint("r", rng.IntN(i+1)), at: at + time.Millisecond})
					}
				}
				ls := driveLoop(t, s, queue, mode == 2, mode == 0)
				caught += ls.caught
				finishing += ls.finishing
				s.publishStats(&ls.acc)
				var buf bytes.Buffer
				mfs, err := s.metrics.gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, mf := range mfs {
					if err := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain)).Encode(mf); err != nil {
						t.Fatal(err)
					}
				}
				for _, line := range bytes.SplitAfter(buf.Bytes(), []byte("\n")) {
					if !bytes.Contains(line, []byte("_created")) { // the wall-clock creation times
						out[mode] += string(line)
					}
				}
				gens[mode] = map[string]string{}
				for id, st := range streams {
					gens[mode][id] = fmt.Sprintf("%d tokens, %s, %d/%d prompt tokens cached", st.generated, st.finishReason, st.cachedTokens, st.promptTokens)
					if !st.finished && st.err == nil {
						t.Fatalf("mode %d: %s did not finish", mode, id)
					}
				}
			}
			t.Logf("catchUp computed %d runs, %d of them ending in finishes", caught, finishing)
			if caught < 20 || finishing < 10 {
				t.Errorf("catchUp computed %d runs, %d ending in finishes: want at least 20 and 10", caught, finishing)
			}
			for mode, name := range []string{1: "delivering finished outputs only", 2: "catching up"} {
				if mode == 0 {
					continue
				}
				if out[mode] != out[0] {
					t.Errorf("metrics differ (%s vs the reference) at %s", name, difftest.FirstLine([]byte(out[mode]), []byte(out[0])))
				}
				for id, g := range gens[0] {
					if gens[mode][id] != g {
						t.Errorf("%s: %s %s, %s in the reference", id, gens[mode][id], name, g)
					}
				}
			}
		})
	}
}

// loopDriver drives a server's engine loop code in virtual time, without
// sleeping: each step is computed at its start and finished at once
// (finishStep without waiting), and with catchUp the plain decode runs
// before the next command are computed with catchUp, as the loop does
// after sleeping through them.
type loopDriver struct {
	*loopState
	s       *Server
	queue   []command // commands not applied yet, in time order
	catchUp bool
	caught  int // catchUp's runs
	// finishing counts the runs that ended in finishes.
	finishing int
	steps     int // advance's steps; wake's steps computed with StepInto
	wakes     int // wake's wake-ups
	// woke is when wake wakes next, unless idle (sleeping false).
	woke     time.Duration
	sleeping bool
}

func newLoopDriver(s *Server, queue []command, catchUp bool) *loopDriver {
	return &loopDriver{loopState: &loopState{live: map[string]*stream{}}, s: s, queue: queue, catchUp: catchUp}
}

// advance applies the commands due and computes one step or one run; it
// returns false when nothing is left to do.
func (ld *loopDriver) advance() bool {
	s := ld.s
	for len(ld.queue) > 0 && ld.queue[0].at <= ld.vnow {
		s.apply(ld.vnow, &ld.queue[0], ld.loopState)
		ld.queue = ld.queue[1:]
	}
	if !s.eng.HasWork() {
		if len(ld.queue) == 0 {
			return false
		}
		ld.vnow = ld.queue[0].at
		return true
	}
	ld.steps++
	if ld.catchUp {
		ld.loopState.queue = ld.queue // catchUp stops before the next arrival
		ok := s.catchUp(ld.loopState, time.Duration(1<<62))
		ld.loopState.queue = nil
		if ok {
			ld.caught++
			if len(ld.run.Finished) > 0 {
				ld.finishing++
			}
			return true
		}
	}
	s.step(ld.loopState)
	s.finishStep(context.Background(), ld.loopState, false, ld.vnow)
	return true
}

// driveLoop runs a loopDriver to the end (fullDeliver: see loopState).
func driveLoop(t testing.TB, s *Server, queue []command, catchUp, fullDeliver bool) *loopDriver {
	ld := newLoopDriver(s, queue, catchUp)
	ld.fullDeliver = fullDeliver
	for ld.advance() {
		if ld.steps > 1e7 {
			t.Fatal("the loop does not finish")
		}
	}
	return ld
}

// BenchmarkLoop is the engine loop's CPU per request (model, deliver,
// metrics; no HTTP) on TestFleetCPU's load: 12.5 non-streamed requests a
// second per engine, 1,000 output tokens each, on the 8B profile, stepping
// at every step or catching up with the runs slept through. With 16
// engines the loops are interleaved in virtual time, as in one process
// hosting a fleet: each engine's state has left the CPU caches by the time
// it runs again, as after a real sleep. With full=true each engine's KV
// cache is filled first (fillKV), so every block the load allocates evicts
// a cached one, as in an engine that has served for a while (200 requests
// alone do not fill the 8B profile's cache).
func BenchmarkLoop(b *testing.B) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		b.Fatal(err)
	}
	const n = 200 // requests per engine
	for _, engines := range []int{1, 16} {
		for _, catchUp := range []bool{false, true} {
			for _, full := range []bool{false, true} {
				b.Run(fmt.Sprintf("engines=%d/catchUp=%v/full=%v", engines, catchUp, full), func(b *testing.B) {
					b.ReportAllocs()
					steps := int64(0)
					for b.Loop() {
						b.StopTimer()
						lds := make([]*loopDriver, engines)
						for k := range lds {
							s, err := New(Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
							if err != nil {
								b.Fatal(err)
							}
							queue := fleetShare(uint64(k), n)
							var start time.Duration
							if full {
								start = fillKV(b, s.eng, prof, uint64(k))
								for i := range queue {
									queue[i].at += start
								}
							}
							lds[k] = newLoopDriver(s, queue, catchUp)
							lds[k].vnow = start
							steps -= s.eng.Stats().Steps
						}
						b.StartTimer()
						for live := engines; live > 0; {
							next := 0 // the engine furthest behind in virtual time
							for k, ld := range lds {
								if ld != nil && (lds[next] == nil || ld.vnow < lds[next].vnow) {
									next = k
								}
							}
							if !lds[next].advance() {
								steps += lds[next].s.eng.Stats().Steps
								lds[next] = nil
								live--
							}
						}
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n*engines), "ns/request")
					b.ReportMetric(float64(steps)/float64(b.N*n*engines), "steps/request")
				})
			}
		}
	}
}

// fillKV fills e's KV cache with the blocks of distinct prompts of one
// output token each, stepping it from time 0, and returns the time it
// ends: every block is then cached and unreferenced, so each later
// allocation evicts one.
func fillKV(tb testing.TB, e *engine.Engine, prof engine.Profile, seed uint64) time.Duration {
	rng := rand.New(rand.NewPCG(seed, 7))
	size := min(prof.MaxModelLen-1, 32<<10)
	for i, filled := 0, 0; filled < prof.KVCapacityTokens()+prof.KVCapacityTokens()/8; i++ {
		prompt := make([]uint32, size)
		for j := range prompt {
			prompt[j] = uint32(rng.IntN(30000))
		}
		if err := e.Add(0, &engine.Request{ID: fmt.Sprint("fill", i), Prompt: prompt, MaxTokens: 1}); err != nil {
			tb.Fatal(err)
		}
		filled += size
	}
	var now time.Duration
	var res engine.StepResult
	for e.HasWork() {
		e.StepInto(now, &res)
		now += res.Duration
	}
	if st := e.Stats(); st.CachedBlocks < prof.NumGPUBlocks*9/10 {
		tb.Fatalf("fillKV: %d blocks cached of %d", st.CachedBlocks, prof.NumGPUBlocks)
	}
	return now
}

// fleetShare returns n request arrivals for one engine: Poisson at 12.5 a
// second, 200-token prompts, 1,000 output tokens.
func fleetShare(seed uint64, n int) []command {
	rng := rand.New(rand.NewPCG(seed, 2))
	queue := make([]command, n)
	at := time.Duration(0)
	for i := range queue {
		at += time.Duration(rng.ExpFloat64() * float64(80*time.Millisecond))
		prompt := make([]uint32, 200)
		for j := range prompt {
			prompt[j] = uint32(rng.IntN(30000))
		}
		id := fmt.Sprint("r", i)
		req := &engine.Request{ID: id, Prompt: prompt, MaxTokens: 1000, IgnoreEOS: true}
		queue[i] = command{kind: cmdAdd, req: req, st: newStream(id, 0, 1000), at: at}
	}
	return queue
}

// BenchmarkLoopCold is BenchmarkLoop's one engine (catching up, its KV
// cache full) with the CPU caches and TLB emptied before each turn of the
// loop, as in a fleet soak where every engine's memory has gone cold by the
// time it wakes: between two turns (a step, or a run caught up) a 64 MB
// buffer is read, one load per cache line, with the timer stopped. After
// each turn the engine looks ahead for the next quiet run (DecodeRun), as
// the loop does before it sleeps (quietRun); that is timed. ns/request is
// the loop's time per request, the evictions excluded, split in the turns
// that caught up with a run (catchUp-ns), those that stepped (step-ns) and
// the looks ahead (DecodeRun-ns); turns/request is how often it woke.
func BenchmarkLoopCold(b *testing.B) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		b.Fatal(err)
	}
	const n = 200 // requests
	b.ReportAllocs()
	turns := 0
	var caughtUp, stepped, ahead time.Duration // turns that caught up, that stepped; the looks ahead
	for b.Loop() {
		b.StopTimer()
		s, ld := coldLoop(b, prof, n)
		coldcache.Evict()
		b.StartTimer()
		for {
			t0, caught := time.Now(), ld.caught
			if !ld.advance() {
				break
			}
			t1 := time.Now()
			s.eng.DecodeRun(256)
			t2 := time.Now()
			if ld.caught > caught {
				caughtUp += t1.Sub(t0)
			} else {
				stepped += t1.Sub(t0)
			}
			ahead += t2.Sub(t1)
			turns++
			b.StopTimer()
			coldcache.Evict()
			b.StartTimer()
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*n) }
	b.ReportMetric(per(b.Elapsed()), "ns/request")
	b.ReportMetric(per(caughtUp), "catchUp-ns/request")
	b.ReportMetric(per(stepped), "step-ns/request")
	b.ReportMetric(per(ahead), "DecodeRun-ns/request")
	b.ReportMetric(float64(turns)/float64(b.N*n), "turns/request")
}

// TestCatchUpStepInProgress: a command that arrives during a step the
// loop slept through joins the next step, so catchUp computes the step in
// progress at its arrival too (it stopped at the step before, and the
// loop stepped that one alone: one more pass over the running requests'
// cold memory per arriving request).
func TestCatchUpStepInProgress(t *testing.T) {
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
	if err != nil {
		t.Fatal(err)
	}
	queue := []command{{kind: cmdAdd, req: &engine.Request{ID: "a", Prompt: make([]uint32, 40), MaxTokens: 100, IgnoreEOS: true},
		st: newStream("a", 0, 100)}}
	ld := newLoopDriver(s, queue, false)
	for ld.steps < 3 { // admitted and decoding
		ld.advance()
	}
	at := ld.vnow + 1 // during the next step
	ld.queue = []command{{kind: cmdAdd, req: &engine.Request{ID: "b", Prompt: make([]uint32, 40), MaxTokens: 100, IgnoreEOS: true},
		st: newStream("b", 0, 100), at: at}}
	ld.loopState.queue = ld.queue
	if !s.catchUp(ld.loopState, time.Hour) {
		t.Fatal("catchUp computed nothing: the step in progress when the command arrived was left to StepInto")
	}
	if got := s.caughtUp.Load(); got != 1 || ld.vnow <= at {
		t.Errorf("catchUp computed %d steps, up to %v: want 1, the step in progress at %v", got, ld.vnow, at)
	}
}

// TestCatchUpStepInProgressAtWake: woken in the middle of a plain decode
// step, with no command queued, catchUp computes that step too, whose
// outputs nobody observes before it ends (the loop then sleeps through its
// end), rather than leaving it to StepInto: one pass over the running
// requests fewer per wake-up. A step in which a request finishes is left to
// the loop, which delivers the finish at the step's end.
func TestCatchUpStepInProgressAtWake(t *testing.T) {
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
	if err != nil {
		t.Fatal(err)
	}
	queue := []command{
		{kind: cmdAdd, req: &engine.Request{ID: "a", Prompt: make([]uint32, 40), MaxTokens: 100, IgnoreEOS: true}, st: newStream("a", 0, 100)},
		{kind: cmdAdd, req: &engine.Request{ID: "b", Prompt: make([]uint32, 40), MaxTokens: 20, IgnoreEOS: true}, st: newStream("b", 0, 20)},
	}
	ld := newLoopDriver(s, queue, false)
	for ld.steps < 4 { // admitted and decoding
		ld.advance()
	}
	start := ld.vnow
	n, d, _ := s.eng.DecodeRun(1)
	if n != 1 {
		t.Fatal("the next step is not a plain decode step")
	}
	if !s.catchUp(ld.loopState, start+d/2) || ld.vnow != start+d || s.caughtUp.Load() != 1 {
		t.Fatalf("woken in a step: catchUp computed %d steps, up to %v: want the step in progress, up to %v", s.caughtUp.Load(), ld.vnow, start+d)
	}
	for { // up to b's last step
		if _, _, fin := s.eng.DecodeRun(1); fin {
			break
		}
		ld.advance()
	}
	start = ld.vnow
	_, d, _ = s.eng.DecodeRun(1)
	if s.catchUp(ld.loopState, start+d/2) || ld.vnow != start {
		t.Fatalf("woken in the step b finishes in: catchUp computed it (up to %v)", ld.vnow)
	}
	if !s.catchUp(ld.loopState, start+d) || ld.vnow != start+d || ld.live["b"] != nil {
		t.Fatalf("woken at the end of the step b finishes in: catchUp did not finish b (up to %v)", ld.vnow)
	}
}

// wake drives the loop code in virtual time as the loop runs it when no
// handler is woken before its request finishes and arrivals do not wake
// it (non-streamed requests, deferrable): woken at the time the last call
// planned (or, idle, by the next arrival), it takes the arrivals before
// then and computes the steps that started meanwhile as sleepThrough
// does, a step still in progress included (delivered at once, as
// completeStep delivers a step it sleeps through); then, as the loop before
// it sleeps, it plans the next wake-up: the end of the quiet run ahead
// (quietRun), or of the next step, computed now, when none follows. It
// returns false when nothing is left to do; ld.wakes counts its wake-ups.
func (ld *loopDriver) wake() bool {
	s, ls := ld.s, ld.loopState
	ctx := context.Background()
	woke := ld.woke
	if !ld.sleeping { // idle until the next arrival
		if len(ld.queue) == 0 {
			return false
		}
		ls.vnow = max(ls.vnow, ld.queue[0].at)
		woke = ls.vnow
	}
	ld.wakes++
	for len(ld.queue) > 0 && ld.queue[0].at <= woke {
		ls.queue = append(ls.queue, ld.queue[0])
		ld.queue = ld.queue[1:]
	}
	for ls.vnow < woke && s.eng.HasWork() {
		if s.catchUp(ls, woke) {
			continue
		}
		kept := ls.queue[:0]
		for i := range ls.queue {
			if c := ls.queue[i]; c.at <= ls.vnow {
				s.apply(ls.vnow, &ls.queue[i], ls)
			} else {
				kept = append(kept, c)
			}
		}
		ls.queue = kept
		s.step(ls)
		ld.steps++
		inProgress := ls.vnow+ls.res.Duration > woke
		s.finishStep(ctx, ls, false, woke)
		if inProgress {
			break
		}
	}
	for i := range ls.queue { // they join the next step
		s.apply(ls.vnow, &ls.queue[i], ls)
	}
	ls.queue = ls.queue[:0]
	if ld.sleeping = s.eng.HasWork(); ld.sleeping {
		until, ok := s.quietRun(ls, ls.vnow, 1)
		if !ok { // a step the loop wakes at the end of
			s.step(ls)
			ld.steps++
			until = ls.vnow + ls.res.Duration
			s.finishStep(ctx, ls, false, until)
		}
		ld.woke = until
	}
	return true
}

// BenchmarkLoopWake is BenchmarkLoopCold's engine driven as the loop runs
// it (loopDriver.wake): the CPU caches and TLB are emptied before each
// wake-up only, and the work of a wake-up (catching up, the arrivals'
// steps, the step in progress) runs warm after its first pass, as in the
// soak. ns/request is the loop's time per request, the evictions excluded;
// wakes/request how often it woke, stepped/request the steps it computed
// with StepInto after waking (the others were caught up).
func BenchmarkLoopWake(b *testing.B) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		b.Fatal(err)
	}
	const n = 200 // requests
	b.ReportAllocs()
	wakes, stepped := 0, 0
	for b.Loop() {
		b.StopTimer()
		_, ld := coldLoop(b, prof, n)
		coldcache.Evict()
		b.StartTimer()
		for ld.wake() {
			b.StopTimer()
			coldcache.Evict()
			b.StartTimer()
		}
		wakes += ld.wakes
		stepped += ld.steps
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/request")
	b.ReportMetric(float64(wakes)/float64(b.N*n), "wakes/request")
	b.ReportMetric(float64(stepped)/float64(b.N*n), "stepped/request")
}

// coldLoop is the cold loop benchmarks' engine and driver: an 8B/H100
// server whose KV cache is full of other prompts' blocks (fillKV), and a
// driver of n requests of one engine's share of the soak's load, arriving
// from the end of the fill.
func coldLoop(b *testing.B, prof engine.Profile, n int) (*Server, *loopDriver) {
	b.Helper()
	s, err := New(Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1})
	if err != nil {
		b.Fatal(err)
	}
	queue := fleetShare(0, n)
	start := fillKV(b, s.eng, prof, 0)
	for i := range queue {
		queue[i].at += start
	}
	ld := newLoopDriver(s, queue, true)
	ld.vnow = start
	return s, ld
}

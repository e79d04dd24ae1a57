package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/cputime"
)

// Environment of the soak run (TestFleetCPU) and of its engine processes.
const (
	envSoak          = "KVROUTE_SOAK"             // 1: run TestFleetCPU
	envSoakSeconds   = "KVROUTE_SOAK_SECONDS"     // load duration, default 10
	envSoakStream    = "KVROUTE_SOAK_STREAM"      // share of streamed requests in percent, default 50
	envSoakTokens    = "KVROUTE_SOAK_TOKENS"      // output tokens per request, default 200
	envSoakRate      = "KVROUTE_SOAK_RATE"        // requests per second in total, default 200
	envSoakEngines   = "KVROUTE_SOAK_ENGINES"     // engine processes, default 16
	envSoakInterval  = "KVROUTE_SOAK_INTERVAL"    // engines' stream interval, default 1
	envSoakProcs     = "KVROUTE_SOAK_PROCS"       // GOMAXPROCS of the engine processes (default: Go's)
	envSoakTrivial   = "KVROUTE_SOAK_TRIVIAL"     // 1: the engines are a trivial server (the floor; see TestSoakEngineChild)
	envSoakChild     = "KVROUTE_SOAK_CHILD"       // set in an engine process
	envSoakProfile   = "KVROUTE_SOAK_PROFILE"     // directory: each engine process writes a CPU profile of the load there
	envSoakConns     = "KVROUTE_SOAK_CONNS"       // keep-alive connections opened per engine before measuring, default 0
	envSoakPerProc   = "KVROUTE_SOAK_PER_PROCESS" // engines hosted by one process, default 1
	envSoakFloor     = "KVROUTE_SOAK_FLOOR"       // 1: a fleet of trivial servers side by side, fed the same load (first: that fleet first)
	envSoakAgainst   = "KVROUTE_SOAK_AGAINST"     // another build's emulator test binary: its fleet side by side, fed the same load
	envSoakFill      = "KVROUTE_SOAK_FILL"        // 0: skip filling the engines' KV caches before measuring (default: fill)
	envSoakFloorStep = "KVROUTE_SOAK_FLOOR_STEP"  // the floor's delay per output token, default 6.5ms
	envSoakRounds    = "KVROUTE_SOAK_ROUNDS"      // measure n windows of KVROUTE_SOAK_SECONDS one after the other, with the fleets kept up; report each and the median
	envSoakWarm      = "KVROUTE_SOAK_WARM"        // seconds of load before the first round, not measured (default 0): the engines reach steady state (spare sequences, heap)
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

// setSoakInterval sets the engine's stream interval.
func setSoakInterval(cfg *Config, n int) { cfg.StreamInterval = n }

// TestFleetCPU is the speed target as a soak run (KVROUTE_SOAK=1):
// 16 engines with the 8B/H100 profile at --speed 1, each in its own process
// (this test binary re-run as an engine: the emulator's handler behind a
// net/http server, as `kvroute engine` serves it), fed 200 requests/s in
// total over loopback HTTP by this process (Poisson arrivals, ~500-token
// chat prompts sharing 8 system prompts, 200 output tokens, half of them
// streamed). The engines' CPU is read from each engine process's own
// getrusage, so the load generator is not counted; it is reported
// separately. The figures are logged: CPU per request and per 1,000
// generated tokens, the engines' idle CPU over the same time, and their
// wake-ups: their threads' context switches (getrusage), the engine loops'
// timed sleeps and the connections they accepted, per request. A short
// run of long requests opens a new connection for most of them (the
// client's pool grows to the concurrency); KVROUTE_SOAK_CONNS=n opens n
// per engine first, as a router's pool would hold them in steady state.
// KVROUTE_SOAK_PER_PROCESS=16 hosts all 16 engines in one process (each on
// its own port), which shares one Go runtime's wake-ups between them.
// KVROUTE_SOAK_FLOOR=1 runs a second fleet of trivial servers (see
// TestSoakEngineChild) side by side, fed the same requests at the same
// moments: on a shared machine the difference between the two, measured
// in one run, is the emulator's own cost above what any HTTP server that
// sleeps and answers costs. KVROUTE_SOAK_AGAINST=path runs one more
// fleet from another build's test binary (`go test -c` of this package at
// another commit), fed the same load, so that a comparison shares the
// machine's state. Each request goes to the fleets in turn first (the first
// receiver found its bytes warmer: with a fixed order the third fleet
// measured 35-70 us per request more than the first, whichever build ran
// it; rotated, the same build against itself measured medians of -17.7,
// -9.0 and -7.4 us). Some bias remains: run both orders and take half the
// difference of the two results. KVROUTE_SOAK_FLOOR=first puts the floor's
// fleet first, for the other order of the floor comparison: the mean of the
// two orders' figures cancels a bias of the fleet's place.
// Before measuring, each engine's KV cache is filled with the blocks of
// long distinct prompts (fillCache), so that every block the load
// allocates evicts a cached one, as in an engine that has been serving for
// a while; KVROUTE_SOAK_FILL=0 skips it (the load then fills the 8B
// profile's caches only after about half a minute, and a shorter run
// measures engines that never evict).
// KVROUTE_SOAK_WARM=s first sends s seconds of the load unmeasured: an
// engine reaches its steady state after several hundred requests (until
// then Add allocates each request's arrays, as no finished sequence is
// spare yet, and the heap grows to its peak, each new page a fault).
// KVROUTE_SOAK_ROUNDS=n measures n windows one after the other on the same
// fleets (filled once) and reports each and, side by side, the median and
// range of the differences: a single window's figure moves with the
// machine's other load by more than the changes it is used to measure.
// It reports them again over the rounds in which no fleet's heap grew
// (steadyFaults), the steady state of a fleet that has served a while.
// Each fleet's mean latency is logged with the requests it held in flight
// per engine (Little's law). The floor sleeps 6.5 ms per output token,
// shorter than the 8B engines' ~11 ms steps at this load: it holds about
// 81 requests per engine to their ~138, fewer goroutines and connections.
// KVROUTE_SOAK_FLOOR_STEP=11ms holds it as long (over three rounds each
// the two floors measured medians of 114.9 and 109.2 us above them, within
// the rounds' spread). The floor streams a streamed request at the same
// pace: an SSE chunk of an engine chunk's size per token, written and
// flushed at the tick of a ticker all its open streams share, as an engine
// step hands every stream its token (floorTicker), so with streamed
// requests the difference is the emulator's cost per token above writing
// the stream.
// The KVROUTE_SOAK_* variables above change the load.
func TestFleetCPU(t *testing.T) {
	if os.Getenv(envSoak) == "" {
		t.Skip("soak test: set KVROUTE_SOAK=1")
	}
	secs := envInt(envSoakSeconds, 10)
	streamPct := envInt(envSoakStream, 50)
	outTokens := max(1, envInt(envSoakTokens, 200))
	rate := float64(max(1, envInt(envSoakRate, 200)))
	engines := max(1, envInt(envSoakEngines, 16))
	interval := max(1, envInt(envSoakInterval, 1))
	perProc := max(1, envInt(envSoakPerProc, 1))

	fleets := []*soakFleet{{name: "engines", trivial: os.Getenv(envSoakTrivial) != ""}}
	floor, eng := -1, 0 // the indices in fleets of the floor (-1: none) and of this build's engines
	switch os.Getenv(envSoakFloor) {
	case "":
	case "first":
		fleets, floor, eng = []*soakFleet{{name: "floor", trivial: true}, {name: "engines"}}, 0, 1
	default:
		fleets, floor = []*soakFleet{{name: "engines"}, {name: "floor", trivial: true}}, 1
	}
	if bin := os.Getenv(envSoakAgainst); bin != "" {
		fleets = append(fleets, &soakFleet{name: "against", bin: bin})
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	for _, f := range fleets {
		f.start(t, engines, perProc, interval)
		f.warmUp(t, client, envInt(envSoakConns, 0))
	}
	if envInt(envSoakFill, 1) != 0 {
		prof, err := engine.LookupProfile("llama-3.1-8b-h100")
		if err != nil {
			t.Fatal(err)
		}
		start, rounds := time.Now(), 0
		for _, f := range fleets {
			if !f.trivial {
				rounds = max(rounds, f.fillCache(t, client, prof, 0))
			}
		}
		for _, f := range fleets {
			if f.trivial {
				f.fillCache(t, client, prof, rounds)
			}
		}
		t.Logf("KV caches filled in %v with %d prompts per engine (KVROUTE_SOAK_FILL=0 skips it)", time.Since(start).Round(time.Millisecond), rounds)
	}
	time.Sleep(500 * time.Millisecond)
	for _, f := range fleets {
		f.idle0, _, _ = f.cpu(t, client)
	}
	idleStart := time.Now()
	time.Sleep(2 * time.Second)
	idleWall := time.Since(idleStart)
	for _, f := range fleets {
		c, _, _ := f.cpu(t, client)
		f.idle = c - f.idle0
	}

	systems := make([]string, 8)
	for i := range systems {
		systems[i] = strings.Repeat(fmt.Sprintf("System prompt %d sets the rules for this assistant. ", i), 30)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	if os.Getenv(envSoakProfile) != "" {
		for _, f := range fleets {
			for _, p := range f.procs {
				if err := p.startProfile(client); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// load sends the soak's requests to every fleet for secs seconds (a new
	// question in every round; round -1 is the warm-up) and waits for them.
	load := func(round, secs int) {
		start := time.Now()
		next := start
		for i := 0; time.Since(start) < time.Duration(secs)*time.Second; i++ {
			next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			time.Sleep(time.Until(next))
			sys := systems[rng.IntN(len(systems))]
			stream := i%100 < streamPct
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d about the rules"}],"max_tokens":%d,"ignore_eos":true,"stream":%v}`,
				sys, round<<32+i, outTokens, stream) // a new question in every round
			for k := range fleets {
				// Each fleet in turn is sent a request first: the first
				// receiver may find its bytes warmer in the shared cache.
				f := fleets[(i+k)%len(fleets)]
				url := f.urls[i%engines] + "/v1/chat/completions"
				wg.Go(func() {
					sent := time.Now()
					resp, err := client.Post(url, "application/json", strings.NewReader(body))
					if err != nil {
						f.failed.Add(1)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						f.failed.Add(1)
						return
					}
					f.done.Add(1)
					f.tokens.Add(int64(outTokens))
					f.latency.Add(int64(time.Since(sent)))
				})
			}
		}
		wg.Wait()
	}
	if warm := envInt(envSoakWarm, 0); warm > 0 {
		t0 := time.Now()
		load(-1, warm)
		t.Logf("warm-up: %ds of load, not measured (%v with its last requests)", warm, time.Since(t0).Round(time.Second))
		for _, f := range fleets {
			if n := f.failed.Load(); n > 0 {
				t.Errorf("%s: %d requests of the warm-up failed", f.name, n)
			}
		}
	}
	rounds := max(1, envInt(envSoakRounds, 1))
	var overFloor, overAgainst []float64 // per round, side by side
	var steadyRound []bool               // per round: no fleet's heap grew in it (steadyFaults)
	for round := range rounds {
		if rounds > 1 {
			t.Logf("round %d of %d", round+1, rounds)
		}
		for _, f := range fleets {
			f.done.Store(0)
			f.failed.Store(0)
			f.tokens.Store(0)
			f.latency.Store(0)
		}
		for _, f := range fleets {
			f.cpu0, f.sys0, f.counts0 = f.cpu(t, client)
		}
		gen0, start := cputime.Process(), time.Now()
		load(round, secs)
		wall := time.Since(start)
		gen := cputime.Process() - gen0
		perReq := make([]struct{ total, user float64 }, len(fleets))
		steady := true // no fleet's heap grew in the round
		for k, f := range fleets {
			cpu, sys, counts := f.cpu(t, client)
			eng, sys := cpu-f.cpu0, sys-f.sys0
			counts.sub(f.counts0)
			n, tok := f.done.Load(), float64(f.tokens.Load())/1000
			perReq[k].total = float64(eng.Microseconds()) / float64(max(n, 1))
			perReq[k].user = float64((eng - sys).Microseconds()) / float64(max(n, 1))
			kind := "emulated engines"
			if f.trivial {
				kind = "trivial servers (the floor)"
			}
			t.Logf("%s: %d %s in %d processes, %.0f req/s offered (%d%% streamed, stream interval %d), %d output tokens each, %v: %d requests done, %d failed, %.0f tokens",
				f.name, engines, kind, len(f.procs), rate, streamPct, interval, outTokens, wall.Round(time.Millisecond), n, f.failed.Load(), tok*1000)
			t.Logf("%s' CPU %v = %.1f%% of one core: %.1f us per request, %.1f us per 1,000 generated tokens (all of it charged to either)",
				f.name, eng.Round(time.Millisecond), 100*eng.Seconds()/wall.Seconds(), perReq[k].total, float64(eng.Microseconds())/tok)
			t.Logf("of which system (kernel) time %v = %.0f%% (user %.1f us per request); idle: %.2f%% of one core (all %d together, included above)",
				sys.Round(time.Millisecond), 100*sys.Seconds()/eng.Seconds(), perReq[k].user, 100*f.idle.Seconds()/idleWall.Seconds(), engines)
			perEngine := func(v int64) float64 { return float64(v) / float64(engines) / wall.Seconds() }
			per := func(v int64) float64 { return float64(v) / float64(max(n, 1)) }
			t.Logf("wake-ups: threads' context switches %.0f/s per engine = %.1f per request (%.1f voluntary); engine loop's timed sleeps %.0f/s per engine = %.1f per request; steps %.0f/s per engine (%.0f%% computed at once by catch-up); %d connections accepted (%.2f per request)",
				perEngine(counts.nvcsw+counts.nivcsw), per(counts.nvcsw+counts.nivcsw), per(counts.nvcsw),
				perEngine(counts.sleeps), per(counts.sleeps), perEngine(counts.steps), 100*float64(counts.caught)/float64(max(counts.steps, 1)),
				counts.conns, per(counts.conns))
			// A process whose heap grows (a short soak ramps up to the steady
			// concurrency) touches fresh memory: each page's first touch is a
			// fault, costly in a VM. A long-running engine reuses its heap instead.
			t.Logf("page faults (first touches of fresh memory): %.1f per request", per(counts.minflt))
			steady = steady && per(counts.minflt) < steadyFaults
			lat := time.Duration(f.latency.Load() / max(n, 1))
			t.Logf("latency: mean %v, so %.0f requests in flight per engine", lat.Round(time.Millisecond), rate/float64(engines)*lat.Seconds())
			if f.failed.Load() > 0 {
				t.Errorf("%s: %d requests failed", f.name, f.failed.Load())
			}
		}
		t.Logf("load generator (this process, not counted above): %v = %.1f%% of one core",
			gen.Round(time.Millisecond), 100*gen.Seconds()/wall.Seconds())
		if floor >= 0 {
			for k, f := range fleets {
				if k == floor {
					continue
				}
				t.Logf("side by side: the emulator (%s) costs %.1f us per request above the floor (%.1f vs %.1f), user time %.1f us (%.1f vs %.1f)",
					f.name, perReq[k].total-perReq[floor].total, perReq[k].total, perReq[floor].total, perReq[k].user-perReq[floor].user, perReq[k].user, perReq[floor].user)
			}
		}
		if k := len(fleets) - 1; fleets[k].bin != "" {
			t.Logf("side by side: this build costs %+.1f us per request against %s (%.1f vs %.1f), user time %+.1f us",
				perReq[eng].total-perReq[k].total, fleets[k].bin, perReq[eng].total, perReq[k].total, perReq[eng].user-perReq[k].user)
		}
		if floor >= 0 {
			overFloor = append(overFloor, perReq[eng].total-perReq[floor].total)
		}
		if k := len(fleets) - 1; fleets[k].bin != "" {
			overAgainst = append(overAgainst, perReq[eng].total-perReq[k].total)
		}
		steadyRound = append(steadyRound, steady)
	}
	if rounds > 1 {
		against := "against " + os.Getenv(envSoakAgainst)
		// v's steady rounds (v has one value per round, or none); taken
		// before the loop below sorts v.
		steadyOf := func(v []float64) []float64 {
			var s []float64
			for i, x := range v {
				if steadyRound[i] {
					s = append(s, x)
				}
			}
			return s
		}
		for _, r := range []struct {
			what, which string
			v           []float64
		}{
			{"above the floor", "", overFloor}, {against, "", overAgainst},
			{"above the floor", fmt.Sprintf(" in which no fleet's heap grew (page faults under %v per request in each)", steadyFaults), steadyOf(overFloor)},
			{against, " in which no fleet's heap grew", steadyOf(overAgainst)},
		} {
			if len(r.v) == 0 {
				continue
			}
			mean, se := meanSE(r.v)
			slices.Sort(r.v)
			t.Logf("over %d rounds%s: the emulator (engines) costs %s: median %.1f us per request, range %.1f..%.1f; mean %.1f, standard error %.1f (rounds %.1f)",
				len(r.v), r.which, r.what, r.v[len(r.v)/2], r.v[0], r.v[len(r.v)-1], mean, se, r.v)
		}
	}
}

// steadyFaults is the page faults per request below which a fleet's heap
// is taken not to have grown in a round. A round in which a process still
// grows its heap (the first rounds after the warm-up, often) costs it a
// fault per fresh page and the misses of memory no request has touched:
// in the soak such rounds measured up to 2.1 faults per request and were
// the dearest (the engines' 161.0 and 175.7 us above the floor at 2.1,
// against 53.6 to 55.9 us in rounds at 0.0 in the same runs), where an
// engine that has served for a while reuses its heap. Rounds whose every
// fleet stayed below it are summarised apart, as the steady state.
const steadyFaults = 0.1

// meanSE returns the mean of v and its standard error (the sample standard
// deviation over the square root of len(v); 0 for fewer than two values).
func meanSE(v []float64) (mean, se float64) {
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	if len(v) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss/float64(len(v)-1)) / math.Sqrt(float64(len(v)))
}

// soakFleet is one fleet of TestFleetCPU: engine processes hosting the
// engines (or trivial servers), and what was measured of them.
type soakFleet struct {
	name    string
	trivial bool
	bin     string // the test binary run as its engine processes: this one when empty
	procs   []*soakEngine
	urls    []string

	idle0, idle          time.Duration
	cpu0, sys0           time.Duration
	counts0              soakCounts
	done, failed, tokens atomic.Int64
	latency              atomic.Int64 // the done requests' latencies summed, in ns
}

// start runs the fleet's engine processes.
func (f *soakFleet) start(t *testing.T, engines, perProc, interval int) {
	for len(f.urls) < engines {
		p, err := startSoakEngine(f.bin, interval, min(perProc, engines-len(f.urls)), f.trivial)
		if err != nil {
			t.Fatal(err)
		}
		f.procs = append(f.procs, p)
		t.Cleanup(p.stop)
		for _, a := range p.addrs {
			f.urls = append(f.urls, "http://"+a)
		}
	}
}

// warmUp sends each engine a request (the first builds the tokenizer's
// tables), then, with conns > 0, conns requests at once, opening that many
// keep-alive connections per engine, as a router's pool would hold them in
// steady state: the load then reuses them instead of dialling a new
// connection for most requests of a short run.
func (f *soakFleet) warmUp(t *testing.T, client *http.Client, conns int) {
	post := func(u string, tokens int) {
		resp, err := client.Post(u+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":"warm up","max_tokens":%d}`, tokens)))
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, u := range f.urls {
		post(u, 2)
	}
	var wg sync.WaitGroup
	for _, u := range f.urls {
		for range conns {
			wg.Go(func() { post(u, 40) })
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// fillCache sends each engine distinct long prompts with one output token
// until their prompt tokens exceed its KV capacity (prof's blocks), the
// engines in parallel: the free blocks are then all cached, and every
// block the load allocates evicts the least recently used one. Prompt
// tokens are counted from the responses' usage. It returns the most
// prompts an engine needed. With rounds > 0 it sends each server that
// many prompts instead (a trivial server has no cache to fill, but the
// floor's heap should see the same bytes as the engines').
func (f *soakFleet) fillCache(t *testing.T, client *http.Client, prof engine.Profile, rounds int) int {
	capacity := prof.KVCapacityTokens()
	chars := min(prof.MaxModelLen-16, 64<<10) // per prompt: the built-in tokenizer gives ~0.7 tokens a character here
	var wg sync.WaitGroup
	sent := make([]int, len(f.urls)) // prompts per server
	for k, u := range f.urls {
		wg.Go(func() {
			r := 0
			defer func() { sent[k] = r }()
			for filled := 0; rounds == 0 && filled < capacity+capacity/8 || r < rounds; r++ {
				var b strings.Builder
				for i := 0; b.Len() < chars-24; i++ {
					fmt.Fprintf(&b, "f%d.%d.%d ", k, r, i)
				}
				body, err := json.Marshal(map[string]any{"prompt": b.String(), "max_tokens": 1})
				if err != nil {
					t.Error(err)
					return
				}
				resp, err := client.Post(u+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				var out struct {
					Usage struct {
						PromptTokens int `json:"prompt_tokens"`
					} `json:"usage"`
				}
				err = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || rounds == 0 && out.Usage.PromptTokens <= 0 {
					t.Errorf("fill %s: status %d, %v, usage %+v", u, resp.StatusCode, err, out.Usage)
					return
				}
				filled += out.Usage.PromptTokens
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return slices.Max(sent)
}

// cpu sums the fleet's processes' CPU time (user and system), system time
// and wake-up counters.
func (f *soakFleet) cpu(t *testing.T, client *http.Client) (cpu, sys time.Duration, counts soakCounts) {
	for _, p := range f.procs {
		u, s, c, err := p.cpu(client)
		if err != nil {
			t.Fatal(err)
		}
		cpu += u + s
		sys += s
		counts.add(c)
	}
	return cpu, sys, counts
}

// soakCounts are an engine process's wake-up counters (GET /_soak/cpu):
// the context switches of all its threads (getrusage), the engine loop's
// timed sleeps and the steps the engine computed.
type soakCounts struct {
	nvcsw, nivcsw, sleeps, steps, conns int64
	minflt                              int64 // page faults served without I/O (first touches of fresh memory)
	caught                              int64 // steps computed at once by catchUp
}

func (c *soakCounts) add(o soakCounts) {
	c.nvcsw += o.nvcsw
	c.minflt += o.minflt
	c.nivcsw += o.nivcsw
	c.sleeps += o.sleeps
	c.steps += o.steps
	c.conns += o.conns
	c.caught += o.caught
}

func (c *soakCounts) sub(o soakCounts) {
	c.nvcsw -= o.nvcsw
	c.minflt -= o.minflt
	c.nivcsw -= o.nivcsw
	c.sleeps -= o.sleeps
	c.steps -= o.steps
	c.conns -= o.conns
	c.caught -= o.caught
}

// soakEngine is one engine process of TestFleetCPU.
type soakEngine struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addrs []string // one per engine it hosts; addrs[0] answers for the process
	once  sync.Once
}

// startSoakEngine runs a test binary (bin, or this one when empty) as an
// engine process (TestSoakEngineChild) and reads the addresses it listens
// on.
func startSoakEngine(bin string, interval, engines int, trivial bool) (*soakEngine, error) {
	if bin == "" {
		bin = os.Args[0]
	}
	cmd := exec.Command(bin, "-test.run=^TestSoakEngineChild$")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envSoakTrivial+"=") })
	cmd.Env = append(cmd.Env, envSoakChild+"=1", envSoakInterval+"="+strconv.Itoa(interval), envSoakPerProc+"="+strconv.Itoa(engines))
	if trivial {
		cmd.Env = append(cmd.Env, envSoakTrivial+"=1")
	}
	if p := os.Getenv(envSoakProcs); p != "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+p)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &soakEngine{cmd: cmd, stdin: stdin}
	sc := bufio.NewScanner(stdout)
	for len(p.addrs) < engines && sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
			p.addrs = append(p.addrs, a)
		}
	}
	if len(p.addrs) < engines {
		p.stop()
		return nil, fmt.Errorf("soak engine: no address (%v)", sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return p, nil
}

// cpu asks the engine process for its own CPU time, user and system, and
// its wake-up counters.
func (p *soakEngine) cpu(c *http.Client) (user, sys time.Duration, counts soakCounts, err error) {
	resp, err := c.Get("http://" + p.addrs[0] + "/_soak/cpu")
	if err != nil {
		return 0, 0, counts, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, counts, err
	}
	var u, s int64
	if _, err := fmt.Sscan(string(b), &u, &s, &counts.nvcsw, &counts.nivcsw, &counts.sleeps, &counts.steps, &counts.conns, &counts.minflt, &counts.caught); err != nil {
		return 0, 0, counts, fmt.Errorf("soak engine cpu %q: %w", b, err)
	}
	return time.Duration(u), time.Duration(s), counts, nil
}

// startProfile starts the engine process's CPU profile (KVROUTE_SOAK_PROFILE):
// the load is profiled, not the start-up and warm-up.
func (p *soakEngine) startProfile(c *http.Client) error {
	resp, err := c.Post("http://"+p.addrs[0]+"/_soak/profile", "text/plain", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("soak engine profile: status %d", resp.StatusCode)
	}
	return nil
}

// stop closes the engine's stdin (it exits) and waits for it.
func (p *soakEngine) stop() {
	p.once.Do(func() {
		p.stdin.Close()
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	})
}

// TestSoakEngineChild is the engine process of TestFleetCPU (it runs only
// with KVROUTE_SOAK_CHILD set): KVROUTE_SOAK_PER_PROCESS Servers (default
// 1) with the 8B/H100 profile at speed 1, each behind its own net/http
// server on its own port, like `kvroute engine`, plus GET /_soak/cpu
// answering the process's CPU time in nanoseconds and its engines' summed
// counters. It prints "listening ADDR" per engine and serves until its
// stdin closes.
func TestSoakEngineChild(t *testing.T) {
	if os.Getenv(envSoakChild) == "" {
		t.Skip("engine process of TestFleetCPU")
	}
	var profOnce sync.Once
	var profFile *os.File
	startProfile := func() (err error) {
		profOnce.Do(func() {
			dir := os.Getenv(envSoakProfile)
			if dir == "" {
				err = errors.New("no " + envSoakProfile)
				return
			}
			if profFile, err = os.Create(filepath.Join(dir, fmt.Sprintf("engine-%d.prof", os.Getpid()))); err != nil {
				return
			}
			// 1 kHz rather than pprof's 100 Hz: a 10 s soak gives enough
			// samples (StartCPUProfile then warns that the rate is set).
			runtime.SetCPUProfileRate(1000)
			if err = pprof.StartCPUProfile(profFile); err != nil {
				profFile.Close()
				profFile = nil
			}
		})
		return err
	}
	defer func() {
		if profFile != nil {
			pprof.StopCPUProfile()
			profFile.Close()
		}
	}()
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	floorStep := 6500 * time.Microsecond
	if v := os.Getenv(envSoakFloorStep); v != "" {
		if floorStep, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	var servers []*Server
	var conns atomic.Int64 // connections accepted, all engines
	counters := func() (sleeps, steps, caught int64) {
		for _, s := range servers {
			sleeps += s.timerSleeps.Load()
			steps += int64(s.metrics.stats().st.Steps)
			caught += s.caughtUp.Load()
		}
		return sleeps, steps, caught
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var https []*http.Server
	for i := range max(1, envInt(envSoakPerProc, 1)) {
		cfg := Config{Model: "m", Engine: engine.Config{Profile: prof}, Speed: 1}
		setSoakInterval(&cfg, envInt(envSoakInterval, 1))
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, s)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		if i == 0 {
			mux.HandleFunc("GET /_soak/cpu", func(w http.ResponseWriter, _ *http.Request) {
				var ru syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				sleeps, steps, caught := counters()
				fmt.Fprintln(w, ru.Utime.Nano(), ru.Stime.Nano(), ru.Nvcsw, ru.Nivcsw, sleeps, steps, conns.Load(), ru.Minflt, caught)
			})
			// The parent starts the CPU profile when the load starts.
			mux.HandleFunc("POST /_soak/profile", func(w http.ResponseWriter, _ *http.Request) {
				if err := startProfile(); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			})
		}
		mux.Handle("/", s.Handler())
		if os.Getenv(envSoakTrivial) != "" {
			// The floor of any HTTP server that answers each request after a
			// delay: read the body, sleep as long as the request would take (a
			// ~6.5 ms step per output token), write a response of the same size.
			// A streamed request is answered at the same pace as the engine
			// streams it: a chunk of an engine chunk's size per token, each
			// written and flushed at a tick of a ticker shared by the server's
			// streams (floorTicker), as an engine's step delivers one token to
			// every stream at once.
			ticker := newFloorTicker(floorStep)
			wg.Go(func() { ticker.run(ctx) })
			mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
				var req struct {
					MaxTokens int  `json:"max_tokens"`
					Stream    bool `json:"stream"`
				}
				b, _ := io.ReadAll(r.Body)
				_ = json.Unmarshal(b, &req)
				if req.Stream {
					floorStream(w, r, ticker, req.MaxTokens)
					return
				}
				time.Sleep(time.Duration(req.MaxTokens) * floorStep)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(bytes.Repeat([]byte("x"), 400+5*req.MaxTokens))
			})
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ConnState: func(_ net.Conn, cs http.ConnState) {
			if cs == http.StateNew {
				conns.Add(1)
			}
		}}
		https = append(https, hs)
		wg.Add(2)
		go func() { defer wg.Done(); _ = s.Run(ctx) }()
		go func() { defer wg.Done(); _ = hs.Serve(ln) }()
		fmt.Printf("listening %s\n", ln.Addr())
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	for _, hs := range https {
		_ = hs.Shutdown(sctx)
	}
	cancel()
	for _, s := range servers {
		_ = s.Close()
	}
	wg.Wait()
	if os.Getenv(envSoakProfile) != "" {
		sleeps, steps, caught := counters()
		fmt.Fprintf(os.Stderr, "soak engines %d: %d timed sleeps, %d steps (%d caught up)\n", os.Getpid(), sleeps, steps, caught)
	}
}

// floorTicker ticks every step while any stream waits on it, waking all
// of them at once (a closed channel): the floor's form of an engine step
// that delivers a token to every running stream. It does not tick while no
// stream is open, so a fleet of non-streamed requests pays nothing for it.
type floorTicker struct {
	step  time.Duration
	start chan struct{} // a stream opened on an idle ticker
	mu    sync.Mutex
	open  int           // streams open
	tick  chan struct{} // closed at the next tick
}

func newFloorTicker(step time.Duration) *floorTicker {
	return &floorTicker{step: step, start: make(chan struct{}, 1), tick: make(chan struct{})}
}

// run ticks until ctx is done.
func (f *floorTicker) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		f.mu.Lock()
		idle := f.open == 0
		f.mu.Unlock()
		if idle {
			select {
			case <-f.start:
			case <-ctx.Done():
				return
			}
		}
		t.Reset(f.step)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		f.mu.Lock()
		close(f.tick)
		f.tick = make(chan struct{})
		f.mu.Unlock()
	}
}

// join opens a stream; leave closes it.
func (f *floorTicker) join() {
	f.mu.Lock()
	f.open++
	if f.open == 1 {
		select {
		case f.start <- struct{}{}:
		default:
		}
	}
	f.mu.Unlock()
}

func (f *floorTicker) leave() {
	f.mu.Lock()
	f.open--
	f.mu.Unlock()
}

// next waits for the next tick (false: the request ended first).
func (f *floorTicker) next(done <-chan struct{}) bool {
	f.mu.Lock()
	c := f.tick
	f.mu.Unlock()
	select {
	case <-c:
		return true
	case <-done:
		return false
	}
}

// floorStream is the floor's streamed response: an SSE chunk of about an
// engine's chat chunk's size (~230 bytes) per token, one a tick, then
// [DONE].
func floorStream(w http.ResponseWriter, r *http.Request, ticker *floorTicker, tokens int) {
	chunk := append(append([]byte("data: "), bytes.Repeat([]byte("x"), 222)...), "\n\n"...)
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	ticker.join()
	defer ticker.leave()
	for range tokens {
		if !ticker.next(r.Context().Done()) {
			return
		}
		if _, err := w.Write(chunk); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

func TestFloorTicker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := newFloorTicker(time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() { f.run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	rec := newRecorder()
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	floorStream(rec, r, f, 3)
	if n := strings.Count(rec.body.String(), "data: "); n != 4 {
		t.Errorf("%d events, want 3 chunks and [DONE]:\n%s", n, rec.body.String())
	}
	if !strings.HasSuffix(rec.body.String(), "data: [DONE]\n\n") {
		t.Errorf("stream does not end with [DONE]")
	}
	f.mu.Lock()
	open := f.open
	f.mu.Unlock()
	if open != 0 {
		t.Errorf("%d streams open after the stream ended", open)
	}
}

func TestMeanSE(t *testing.T) {
	for _, c := range []struct {
		v        []float64
		mean, se float64
	}{
		{[]float64{1, 2, 3, 4}, 2.5, math.Sqrt(5.0/3) / 2},
		{[]float64{7}, 7, 0},
		{[]float64{-3, -3}, -3, 0},
	} {
		if m, se := meanSE(c.v); math.Abs(m-c.mean) > 1e-12 || math.Abs(se-c.se) > 1e-12 {
			t.Errorf("meanSE(%v) = %v, %v; want %v, %v", c.v, m, se, c.mean, c.se)
		}
	}
}

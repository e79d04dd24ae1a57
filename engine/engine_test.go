package engine

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"
)

func mustEngine(t testing.TB, name string, mod func(*Config)) *Engine {
	t.Helper()
	p, err := LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Profile: p}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// tokens returns n token ids starting at from.
func tokens(from, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(from + i)
	}
	return s
}

func concat(a, b []uint32) []uint32 { return append(slices.Clip(a), b...) }

// driver steps an engine in virtual time, checking invariants after every
// step and mirroring the KV events into a set that must equal the cache.
type driver struct {
	t       testing.TB
	e       *Engine
	now     time.Duration
	outputs []Output
	events  []KVEvent
	mirror  map[uint64]int // copies of each hash, as a consumer of the events counts them
	steps   []StepResult
}

func newDriver(t testing.TB, e *Engine) *driver {
	return &driver{t: t, e: e, mirror: map[uint64]int{}}
}

func (d *driver) add(r *Request) {
	d.t.Helper()
	if err := d.e.Add(d.now, r); err != nil {
		d.t.Fatal(err)
	}
}

func (d *driver) step() StepResult {
	d.t.Helper()
	r := d.e.Step(d.now)
	d.now += r.Duration
	d.outputs = append(d.outputs, r.Outputs...)
	d.events = append(d.events, r.Events...)
	d.steps = append(d.steps, r)
	d.mirrorEvents(r.Events)
	return r
}

// mirrorEvents applies KV events to the mirror and checks it against the
// engine's cache: each hash has as many copies cached as BlockStored
// reported, less BlockRemoved.
func (d *driver) mirrorEvents(events []KVEvent) {
	d.t.Helper()
	for _, ev := range events {
		switch ev.Kind {
		case BlockStored:
			for _, h := range ev.BlockHashes {
				d.mirror[h]++
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				if d.mirror[h] == 0 {
					d.t.Fatalf("BlockRemoved %d: no copy stored", h)
				}
				if d.mirror[h]--; d.mirror[h] == 0 {
					delete(d.mirror, h)
				}
			}
		case AllBlocksCleared:
			clear(d.mirror)
		}
	}
	checkInvariants(d.t, d.e)
	if d.e.caching && !d.e.cfg.NoEvents {
		cached := map[uint64]int{}
		d.e.pool.cached.each(func(h uint64, _ int32) { cached[h]++ })
		if !maps.Equal(cached, d.mirror) {
			d.t.Fatalf("events describe %d hashes (%d copies), the cache holds %d (%d copies)",
				len(d.mirror), sum(d.mirror), len(cached), d.e.pool.cached.len())
		}
	}
}

func sum(m map[uint64]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func (d *driver) run() {
	d.t.Helper()
	for i := 0; d.e.HasWork(); i++ {
		if i > 1e6 {
			d.t.Fatal("engine does not finish")
		}
		d.step()
	}
}

// byID returns the outputs of one request, in order.
func (d *driver) byID(id string) []Output {
	var out []Output
	for _, o := range d.outputs {
		if o.ID == id {
			out = append(out, o)
		}
	}
	return out
}

// checkInvariants verifies the block pool against the live sequences:
// reference counts equal the references held, the free queue holds exactly
// the unreferenced blocks, and the hash map and block flags agree.
func checkInvariants(t testing.TB, e *Engine) {
	t.Helper()
	p := e.pool
	refs := make([]int32, p.size())
	for _, s := range e.seqs {
		for _, b := range s.blocks {
			refs[b]++
		}
		if s.status == statusWaiting && len(s.blocks) != 0 {
			t.Fatalf("waiting request %s holds %d blocks", s.id, len(s.blocks))
		}
		if n := len(s.blocks); n > 0 && s.last != s.blocks[n-1] {
			t.Fatalf("request %s: last block %d, want %d", s.id, s.last, s.blocks[n-1])
		}
	}
	free := 0
	for i := range refs {
		b := p.blocks[i]
		if b.ref != refs[i] {
			t.Fatalf("block %d: ref %d, but %d references are held", i, b.ref, refs[i])
		}
		if b.ref == 0 {
			free++
		}
		if b.hashed {
			found := false
			p.cached.copies(b.hash, func(id int32) { found = found || id == int32(i) })
			if !found {
				t.Fatalf("block %d: flagged cached under %d but the map does not hold it", i, b.hash)
			}
		}
	}
	if free != p.numFree {
		t.Fatalf("numFree %d, but %d blocks are unreferenced", p.numFree, free)
	}
	n := 0
	mask := len(p.free) - 1
	for k := range p.used {
		slot := (p.head + k) & mask
		id := p.free[slot]
		if id < 0 {
			continue // a hole
		}
		if p.blocks[id].ref != 0 {
			t.Fatalf("block %d in the free queue with ref %d", id, p.blocks[id].ref)
		}
		if p.blocks[id].slot != int32(slot) {
			t.Fatalf("block %d in free queue slot %d records slot %d", id, slot, p.blocks[id].slot)
		}
		n++
	}
	for id := range p.blocks {
		if b := &p.blocks[id]; b.slot >= 0 && p.free[b.slot] != int32(id) {
			t.Fatalf("block %d records free queue slot %d, which holds %d", id, b.slot, p.free[b.slot])
		}
	}
	if n != p.numFree {
		t.Fatalf("free queue has %d blocks, numFree %d", n, p.numFree)
	}
	hashed := 0
	for i := range p.size() {
		if p.blocks[i].hashed {
			hashed++
		}
	}
	if hashed != p.cached.len() {
		t.Fatalf("%d blocks flagged cached, the table holds %d", hashed, p.cached.len())
	}
	p.cached.each(func(h uint64, id int32) {
		if !p.blocks[id].hashed || p.blocks[id].hash != h {
			t.Fatalf("table %d -> block %d, which holds %d (hashed %v)", h, id, p.blocks[id].hash, p.blocks[id].hashed)
		}
	})
	checkRuns(t, e)
	held, loading, queued, abortedLoading := 0, 0, 0, 0
	for _, s := range e.loaded {
		if e.seqs[s.id] != s || s.status != statusLoaded {
			t.Fatalf("request %s (status %d) among those whose KV arrived", s.id, s.status)
		}
	}
	for _, s := range e.seqs {
		switch {
		case s.status == statusHeld:
			held++
		case s.status == statusLoading || s.status == statusLoaded || s.status == statusAbortedLoading:
			// A RemoteKV request holds blocks for its whole prompt.
			if want := (int(s.promptLen) + e.bs - 1) / e.bs; len(s.blocks) != want || s.outputs != 0 {
				t.Fatalf("request %s waiting for its KV (status %d) holds %d blocks, want %d", s.id, s.status, len(s.blocks), want)
			}
			switch {
			case s.status == statusLoading:
				loading++
			case s.status == statusAbortedLoading:
				abortedLoading++
			case !slices.Contains(e.loaded, s):
				t.Fatalf("request %s: its KV arrived, but it is not among those that wait to run", s.id)
			}
		case s.remote:
			queued++
		}
	}
	if st := e.Stats(); st.Running > e.maxSeqs || st.Held != held || st.Loading != loading || st.LoadQueued != queued ||
		st.AbortedLoading != abortedLoading {
		t.Fatalf("stats %+v: want running <= max_num_seqs %d, %d held, %d loading, %d queued for it, %d aborted while loading",
			st, e.maxSeqs, held, loading, queued, abortedLoading)
	}
}

func TestSingleRequest(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	d.add(&Request{ID: "a", Prompt: tokens(1, 100), MaxTokens: 5})
	d.run()
	out := d.byID("a")
	if len(out) != 5 {
		t.Fatalf("got %d outputs, want 5", len(out))
	}
	p := e.Profile()
	wantTTFT := p.PrefillTime(100, 0)
	for i, o := range out {
		if o.Index != i || o.First != (i == 0) || o.Finished != (i == 4) {
			t.Errorf("output %d: index %d first %v finished %v", i, o.Index, o.First, o.Finished)
		}
		if o.TTFT != wantTTFT {
			t.Errorf("output %d: TTFT %v, want the prefill step %v", i, o.TTFT, wantTTFT)
		}
	}
	last := out[4]
	if last.FinishReason != FinishLength || last.PrefillTime != wantTTFT || last.QueueTime != 0 {
		t.Errorf("last output = %+v, want finish length, prefill %v", last, wantTTFT)
	}
	if last.DecodeTime != last.Time-out[0].Time {
		t.Errorf("DecodeTime %v, want %v", last.DecodeTime, last.Time-out[0].Time)
	}
	// Decode steps: the context grows from 101 to 104 tokens.
	for i := 1; i < 5; i++ {
		want := p.StepTime(Batch{DecodeTokens: 1, DecodeContext: 100 + i, Seqs: 1, Sampled: 1})
		if out[i].ITL != want {
			t.Errorf("output %d: ITL %v, want %v", i, out[i].ITL, want)
		}
	}
	st := e.Stats()
	want := Stats{NumGPUBlocks: 65, BlockSize: 16, FreeBlocks: 64, CachedBlocks: 6, PrefixQueries: 100,
		PromptTokens: 100, GenerationTokens: 5, FinishedLength: 1, Steps: 5, BusyTime: last.Time}
	if st != want {
		t.Errorf("Stats = %+v\nwant    %+v", st, want)
	}
	// 100 prompt tokens + 4 computed outputs = 104 tokens: 6 full blocks
	// stored, in one event for the prompt.
	if len(d.events) != 1 || d.events[0].Kind != BlockStored || len(d.events[0].BlockHashes) != 6 ||
		d.events[0].ParentHash != nil || len(d.events[0].TokenIDs) != 96 || d.events[0].Medium != MediumGPU {
		t.Errorf("events = %+v, want one BlockStored of 6 blocks without parent", d.events)
	}
}

// TestPrefixCaching is the end-to-end check at the model level: a
// second request sharing a 4k-token prefix reports 4096 cached tokens and its
// TTFT drops by exactly what the cost model predicts.
func TestPrefixCaching(t *testing.T) {
	for _, hash := range []string{HashXXH3, HashSHA256, HashSHA256CBOR} {
		t.Run(hash, func(t *testing.T) {
			h, _ := NewHashFunc(hash, "")
			e := mustEngine(t, "llama-3.1-8b-h100", func(c *Config) { c.HashFunc = h })
			p := e.Profile()
			d := newDriver(t, e)
			prefix := tokens(1000, 4096)
			d.add(&Request{ID: "a", Prompt: concat(prefix, tokens(50000, 100)), MaxTokens: 3})
			d.run()
			rb := &Request{ID: "b", Prompt: concat(prefix, tokens(60000, 100)), MaxTokens: 3}
			if got := e.PrefixHit(rb); got != 4096 {
				t.Errorf("PrefixHit = %d, want 4096", got)
			}
			d.add(rb)
			d.run()
			a, b := d.byID("a")[0], d.byID("b")[0]
			if a.CachedTokens != 0 || b.CachedTokens != 4096 {
				t.Errorf("cached tokens a=%d b=%d, want 0 and 4096", a.CachedTokens, b.CachedTokens)
			}
			wantA, wantB := p.PrefillTime(4196, 0), p.PrefillTime(100, 4096)
			if a.TTFT != wantA || b.TTFT != wantB {
				t.Errorf("TTFT a=%v b=%v, want %v and %v", a.TTFT, b.TTFT, wantA, wantB)
			}
			if b.TTFT >= a.TTFT/4 {
				t.Errorf("TTFT with 4096 cached = %v, want far below %v", b.TTFT, a.TTFT)
			}
			st := e.Stats()
			if st.PrefixQueries != 2*4196 || st.PrefixHits != 4096 {
				t.Errorf("prefix queries/hits = %d/%d, want %d/4096", st.PrefixQueries, st.PrefixHits, 2*4196)
			}
			// b's BlockStored continues a's chain: its parent is a's block 255.
			var ev KVEvent
			for _, x := range d.events {
				if x.Kind == BlockStored && x.ParentHash != nil {
					ev = x
				}
			}
			if ev.ParentHash == nil || *ev.ParentHash != d.events[0].BlockHashes[255] {
				t.Errorf("b's BlockStored parent = %v, want a's block 255 %d", ev.ParentHash, d.events[0].BlockHashes[255])
			}
		})
	}
}

// TestFullPromptHit: a prompt that is entirely cached still computes its
// last token (vLLM caps the hit at prompt length - 1).
func TestFullPromptHit(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	prompt := tokens(7, 64) // exactly 4 blocks
	d.add(&Request{ID: "a", Prompt: prompt, MaxTokens: 1})
	d.run()
	d.add(&Request{ID: "b", Prompt: prompt, MaxTokens: 1})
	d.run()
	if got := d.byID("b")[0].CachedTokens; got != 48 {
		t.Errorf("cached tokens = %d, want 48 (3 of 4 blocks: one token must be computed)", got)
	}
}

// TestEvictionOrder checks the LRU order of vLLM's free queue: blocks of the
// request freed first are evicted first, and each request's blocks tail
// first.
func TestEvictionOrder(t *testing.T) {
	e := mustEngine(t, "tiny", nil) // 64 blocks of 16
	d := newDriver(t, e)
	d.add(&Request{ID: "a", Prompt: tokens(1, 320), MaxTokens: 1}) // 20 blocks
	d.run()
	var aHashes []uint64 // stored over two steps: the prompt is chunked at 256 tokens
	for _, ev := range d.events {
		aHashes = append(aHashes, ev.BlockHashes...)
	}
	if len(aHashes) != 20 {
		t.Fatalf("a stored %d blocks, want 20", len(aHashes))
	}
	d.add(&Request{ID: "b", Prompt: tokens(10000, 320), MaxTokens: 1}) // 20 more
	d.run()
	if st := e.Stats(); st.CachedBlocks != 40 || st.FreeBlocks != 64 {
		t.Fatalf("after a and b: %+v, want 40 cached, 64 free", st)
	}
	d.events = nil
	// c needs 30 blocks: 24 never-used ones, then the 6 least recently freed
	// cached blocks: a's, last block first.
	d.add(&Request{ID: "c", Prompt: tokens(20000, 480), MaxTokens: 1})
	d.run()
	var removed []uint64
	for _, ev := range d.events {
		if ev.Kind == BlockRemoved {
			removed = append(removed, ev.BlockHashes...)
		}
	}
	want := []uint64{aHashes[19], aHashes[18], aHashes[17], aHashes[16], aHashes[15], aHashes[14]}
	if !slices.Equal(removed, want) {
		t.Errorf("evicted %v, want a's last six blocks tail first %v", removed, want)
	}
	// a's first 14 blocks survive.
	d.add(&Request{ID: "a2", Prompt: tokens(1, 320), MaxTokens: 1})
	d.run()
	if got := d.byID("a2")[0].CachedTokens; got != 14*16 {
		t.Errorf("a again: cached %d tokens, want %d", got, 14*16)
	}
}

// TestPreemption runs more decode work than the cache holds: the newest
// running request is preempted, recomputed, and every request still produces
// exactly its tokens, the same ones it produces alone.
func TestPreemption(t *testing.T) {
	e := mustEngine(t, "tiny", nil) // 64 blocks
	d := newDriver(t, e)
	for i := range 4 {
		d.add(&Request{ID: fmt.Sprint("r", i), Prompt: tokens(1000*i+1, 200), MaxTokens: 400}) // 38 blocks each at the end
	}
	d.run()
	st := e.Stats()
	if st.Preemptions == 0 {
		t.Fatal("no preemptions under memory pressure")
	}
	preempted := map[string]int{}
	for i := range 4 {
		id := fmt.Sprint("r", i)
		out := d.byID(id)
		if len(out) != 400 {
			t.Fatalf("%s: %d outputs, want 400", id, len(out))
		}
		for j, o := range out {
			if o.Index != j {
				t.Fatalf("%s: output %d has index %d", id, j, o.Index)
			}
		}
		last := out[len(out)-1]
		if !last.Finished || last.FinishReason != FinishLength {
			t.Errorf("%s: last output %+v", id, last)
		}
		preempted[id] = last.Preemptions
		// Alone, the request produces the same tokens.
		solo := newDriver(t, mustEngine(t, "tiny", nil))
		solo.add(&Request{ID: id, Prompt: tokens(1000*i+1, 200), MaxTokens: 400})
		solo.run()
		for j, o := range solo.byID(id) {
			if o.Token != out[j].Token {
				t.Fatalf("%s: token %d = %d under pressure, %d alone", id, j, out[j].Token, o.Token)
			}
		}
	}
	if preempted["r0"] != 0 {
		t.Errorf("the oldest request was preempted %d times; vLLM preempts the newest first", preempted["r0"])
	}
	if preempted["r3"] == 0 {
		t.Errorf("the newest request was never preempted: %v", preempted)
	}
	if st.FreeBlocks != st.NumGPUBlocks-1 { // all but the null block
		t.Errorf("after all requests: %d of %d blocks free", st.FreeBlocks, st.NumGPUBlocks-1)
	}
}

// TestChunkedPrefill: a prompt longer than the token budget is prefilled
// over several steps, and running decodes are scheduled before it.
func TestChunkedPrefill(t *testing.T) {
	e := mustEngine(t, "tiny", nil) // budget 256
	d := newDriver(t, e)
	d.add(&Request{ID: "dec", Prompt: tokens(1, 20), MaxTokens: 10})
	d.step() // dec prefilled, first token
	d.add(&Request{ID: "long", Prompt: tokens(500, 600), MaxTokens: 2})
	r := d.step()
	if r.Batch.DecodeTokens != 1 || r.Batch.PrefillTokens != 255 {
		t.Errorf("step 2 batch = %+v, want 1 decode + 255 prefill tokens", r.Batch)
	}
	r = d.step()
	if r.Batch.DecodeTokens != 1 || r.Batch.PrefillTokens != 255 {
		t.Errorf("step 3 batch = %+v, want 1 decode + 255 prefill tokens", r.Batch)
	}
	r = d.step() // 90 left
	if r.Batch.PrefillTokens != 90 || len(d.byID("long")) != 1 {
		t.Errorf("step 4 batch = %+v, long outputs %d; want the last 90-token chunk and a first token", r.Batch, len(d.byID("long")))
	}
	d.run()
}

func TestMaxNumSeqs(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.MaxNumSeqs = 2 })
	d := newDriver(t, e)
	for i := range 3 {
		d.add(&Request{ID: fmt.Sprint(i), Prompt: tokens(100*i, 20), MaxTokens: 3})
	}
	d.step()
	if st := e.Stats(); st.Running != 2 || st.Waiting != 1 {
		t.Errorf("running %d waiting %d, want 2 and 1", st.Running, st.Waiting)
	}
	d.run()
	if got := d.byID("2")[2].QueueTime; got <= 0 {
		t.Errorf("third request queue time %v, want > 0", got)
	}
}

func TestEOS(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	d.add(&Request{ID: "eos", Prompt: tokens(1, 20), MaxTokens: 10, EOSAt: 4})
	d.add(&Request{ID: "ignore", Prompt: tokens(1, 20), MaxTokens: 10, EOSAt: 4, IgnoreEOS: true})
	d.add(&Request{ID: "never", Prompt: tokens(1, 20), MaxTokens: 10})
	d.run()
	tests := []struct {
		id     string
		n      int
		reason string
	}{{"eos", 4, FinishStop}, {"ignore", 10, FinishLength}, {"never", 10, FinishLength}}
	for _, tt := range tests {
		out := d.byID(tt.id)
		last := out[len(out)-1]
		if len(out) != tt.n || last.FinishReason != tt.reason {
			t.Errorf("%s: %d outputs, finish %q; want %d, %q", tt.id, len(out), last.FinishReason, tt.n, tt.reason)
		}
		for _, o := range out {
			isEOS := o.Token == e.Profile().Model.EOSTokenID
			if isEOS != (tt.reason == FinishStop && o.Finished) {
				t.Errorf("%s: token %d at %d (EOS=%v)", tt.id, o.Token, o.Index, isEOS)
			}
		}
	}
	if st := e.Stats(); st.FinishedStop != 1 || st.FinishedLength != 2 {
		t.Errorf("finished stop/length = %d/%d, want 1/2", st.FinishedStop, st.FinishedLength)
	}
}

func TestAddErrors(t *testing.T) {
	e := mustEngine(t, "tiny", nil) // max model len 1024
	if err := e.Add(0, &Request{ID: "x", Prompt: tokens(0, 10)}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		r    Request
		want error
	}{
		{"empty", Request{ID: "e"}, ErrEmptyPrompt},
		{"duplicate", Request{ID: "x", Prompt: tokens(0, 10)}, ErrDuplicateID},
		{"too long", Request{ID: "l", Prompt: tokens(0, 1000), MaxTokens: 100}, &LengthError{}},
		{"prompt fills context", Request{ID: "f", PromptLen: 1024, BlockHashes: []uint64{1}}, &LengthError{}},
		{"length mismatch", Request{ID: "m", Prompt: tokens(0, 10), PromptLen: 11}, nil},
		{"negative max tokens", Request{ID: "n", Prompt: tokens(0, 10), MaxTokens: -1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.Add(0, &tt.r)
			if err == nil {
				t.Fatal("Add succeeded")
			}
			var le *LengthError
			switch want := tt.want.(type) {
			case *LengthError:
				if !errors.As(err, &le) || le.MaxModelLen != 1024 {
					t.Errorf("err = %v, want a *LengthError with MaxModelLen 1024", err)
				}
			case error:
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want %v", err, want)
				}
			}
		})
	}
	if st := e.Stats(); st.Waiting != 1 {
		t.Errorf("waiting = %d, want 1 (failed Adds must not queue)", st.Waiting)
	}
}

func TestNewErrors(t *testing.T) {
	p, _ := LookupProfile("tiny")
	tests := []struct {
		name string
		cfg  Config
	}{
		{"zero profile", Config{}},
		{"negative", Config{Profile: p, MaxNumSeqs: -1}},
		{"context larger than cache", Config{Profile: p, MaxModelLen: 4096}},
		{"huge block", Config{Profile: p, BlockSize: 256}},
		{"cache beyond MaxNumGPUBlocks", Config{Profile: p, NumGPUBlocks: MaxNumGPUBlocks + 1}},
	}
	for _, tt := range tests {
		if _, err := New(tt.cfg); err == nil {
			t.Errorf("%s: New succeeded", tt.name)
		}
	}
	// A smaller cache lowers the default max model length instead of
	// failing: to the 15 blocks left of 16 by the null block.
	e, err := New(Config{Profile: p, NumGPUBlocks: 16})
	if err != nil || e.Profile().MaxModelLen != 240 {
		t.Errorf("New with 16 blocks: %v, max model len %d; want 240", err, e.Profile().MaxModelLen)
	}
}

func TestAbort(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	d.add(&Request{ID: "run", Prompt: tokens(1, 40), MaxTokens: 100})
	d.add(&Request{ID: "wait", Prompt: tokens(100, 40), MaxTokens: 100})
	d.step()
	d.step()
	e.Abort(d.now, "run")
	e.Abort(d.now, "unknown")
	d.step()
	e.Abort(d.now, "wait")
	d.run()
	for _, id := range []string{"run", "wait"} {
		out := d.byID(id)
		last := out[len(out)-1]
		if !last.Finished || last.FinishReason != FinishAbort {
			t.Errorf("%s: last output %+v, want an abort", id, last)
		}
	}
	if st := e.Stats(); st.FinishedAbort != 2 || st.FreeBlocks != 64 || st.Running != 0 {
		t.Errorf("stats %+v, want 2 aborts and every block free", st)
	}
}

// TestDisaggregated models a P/D handoff: the prefill leg holds its blocks
// until Release; the decode leg skips prefill and computes one token.
func TestDisaggregated(t *testing.T) {
	pre := mustEngine(t, "tiny", nil)
	d := newDriver(t, pre)
	prompt := tokens(1, 300)
	d.add(&Request{ID: "p", Prompt: prompt, MaxTokens: 1, HoldKV: true})
	d.run()
	if st := pre.Stats(); st.Held != 1 || st.FreeBlocks != 64-19 {
		t.Fatalf("prefill engine: %+v, want 1 held with 19 blocks", st)
	}
	if ids := pre.BlockIDs("p"); len(ids) != 19 {
		t.Errorf("BlockIDs = %v, want 19 ids", ids)
	}
	pre.Release("p")
	if st := pre.Stats(); st.Held != 0 || st.FreeBlocks != 64 || st.CachedBlocks != 18 {
		t.Errorf("after Release: %+v", st)
	}

	dec := mustEngine(t, "tiny", nil)
	d2 := newDriver(t, dec)
	d2.add(&Request{ID: "d", Prompt: prompt, MaxTokens: 3, SkipPrefill: true})
	r := d2.step()
	if r.Batch.PrefillTokens != 1 || len(r.Outputs) != 1 || !r.Outputs[0].First {
		t.Errorf("decode leg first step: batch %+v, outputs %+v; want 1 token computed and a first token", r.Batch, r.Outputs)
	}
	if got := r.Outputs[0].CachedTokens; got != 299 {
		t.Errorf("decode leg cached tokens = %d, want 299", got)
	}
	stored := 0
	for _, ev := range r.Events {
		stored += len(ev.BlockHashes)
	}
	if stored != 18 {
		t.Errorf("decode leg stored %d blocks, want the 18 transferred full blocks", stored)
	}
	d2.run()
}

func TestResetPrefixCache(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	d.add(&Request{ID: "a", Prompt: tokens(1, 100), MaxTokens: 50})
	d.step()
	if e.ResetPrefixCache() {
		t.Error("ResetPrefixCache succeeded while a request holds blocks")
	}
	d.run()
	if !e.ResetPrefixCache() {
		t.Fatal("ResetPrefixCache failed on an idle engine")
	}
	// The clear event rides on the next step, even without requests.
	if !e.HasWork() {
		t.Error("HasWork = false with an AllBlocksCleared event pending")
	}
	r := d.step()
	if len(r.Events) != 1 || r.Events[0].Kind != AllBlocksCleared {
		t.Errorf("events = %+v, want AllBlocksCleared", r.Events)
	}
	d.add(&Request{ID: "b", Prompt: tokens(1, 100), MaxTokens: 1})
	d.run()
	if got := d.byID("b")[0].CachedTokens; got != 0 {
		t.Errorf("cached tokens after reset = %d, want 0", got)
	}
}

// TestFastPath: requests given as block hashes (no tokens) share blocks
// exactly like token requests.
func TestFastPath(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	h := XXH3()
	prompt := tokens(1, 200)
	var keys []uint64
	parent := h.None()
	for i := 0; i+16 <= len(prompt); i += 16 {
		parent = h.Block(parent, prompt[i:i+16])
		keys = append(keys, parent.Key())
	}
	d.add(&Request{ID: "tok", Prompt: prompt, MaxTokens: 20})
	d.run()
	d.add(&Request{ID: "fast", PromptLen: 200, BlockHashes: keys, MaxTokens: 20})
	d.run()
	if got := d.byID("fast")[0].CachedTokens; got != 192 {
		t.Errorf("fast path cached %d tokens, want 192", got)
	}
	for _, ev := range d.events {
		if ev.Kind == BlockStored && ev.TokenIDs != nil && len(ev.TokenIDs) != 16*len(ev.BlockHashes) {
			t.Errorf("BlockStored with %d tokens for %d blocks", len(ev.TokenIDs), len(ev.BlockHashes))
		}
	}
	if st := e.Stats(); st.FreeBlocks != 64 {
		t.Errorf("%d blocks free, want 64", st.FreeBlocks)
	}
}

func TestDisablePrefixCaching(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.DisablePrefixCaching = true })
	d := newDriver(t, e)
	d.add(&Request{ID: "a", Prompt: tokens(1, 100), MaxTokens: 3})
	d.run()
	d.add(&Request{ID: "b", Prompt: tokens(1, 100), MaxTokens: 3})
	d.run()
	if got := d.byID("b")[0].CachedTokens; got != 0 || len(d.events) != 0 {
		t.Errorf("without prefix caching: %d cached tokens, %d events", got, len(d.events))
	}
	// vLLM's get_computed_blocks returns before it records a query when
	// prefix caching is off: its counters stay 0.
	if st := e.Stats(); st.PrefixQueries != 0 || st.PrefixHits != 0 {
		t.Errorf("without prefix caching: got %d prefix queries and %d hits, want 0 and 0", st.PrefixQueries, st.PrefixHits)
	}
}

// randomWorkload drives an engine with shared prefixes, random lengths,
// aborts and P/D legs; the driver checks invariants after every step.
func randomWorkload(t testing.TB, e *Engine, seed uint64, n int) *driver {
	rng := rand.New(rand.NewPCG(seed, 1))
	d := newDriver(t, e)
	prefixes := [][]uint32{tokens(1, 64), tokens(5000, 200), tokens(9000, 33)}
	live := []string{}
	held := []string{}
	for i := 0; ; i++ {
		if i >= n {
			// Held KV is leased: release it so waiting requests can run,
			// before asking whether any can (requests waiting for blocks
			// held by a request that finished since the last release
			// would not run otherwise).
			for _, id := range held {
				e.Release(id) // a no-op until the request finished
			}
			if !e.HasWork() {
				break
			}
		}
		if i < n {
			for range rng.IntN(3) {
				id := fmt.Sprint("q", i, "-", rng.IntN(1e6))
				prompt := concat(prefixes[rng.IntN(3)], tokens(rng.IntN(1e5), 1+rng.IntN(150)))
				r := &Request{ID: id, Prompt: prompt, MaxTokens: 1 + rng.IntN(120), EOSAt: rng.IntN(100)}
				switch rng.IntN(10) {
				case 0:
					r.HoldKV = true
					held = append(held, id)
				case 1:
					r.SkipPrefill = true
				case 2:
					r.Prompt = nil
					r.PromptLen = len(prompt)
					r.BlockHashes = []uint64{uint64(rng.IntN(20)) + 1, uint64(rng.IntN(20)) + 100}
				}
				r.LoRA = [...]string{"", "", "", "a", "b"}[rng.IntN(5)] // LoRA adapters
				if err := e.Add(d.now, r); err != nil {
					var le *LengthError
					if !errors.As(err, &le) {
						t.Fatal(err)
					}
					continue
				}
				live = append(live, id)
			}
			if len(live) > 0 && rng.IntN(8) == 0 {
				e.Abort(d.now, live[rng.IntN(len(live))])
			}
			if len(held) > 0 && rng.IntN(4) == 0 {
				e.Release(held[rng.IntN(len(held))]) // a no-op until it finished
			}
		}
		d.step()
		if i > 1e5 {
			t.Fatal("engine does not finish")
		}
	}
	for _, id := range held {
		e.Release(id)
	}
	return d
}

// TestRefcountProperty: under a random workload the pool stays consistent
// after every step, and once everything finished every block is free (no
// leak), free blocks being either cached or never used.
func TestRefcountProperty(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := mustEngine(t, "tiny", func(c *Config) { c.NumGPUBlocks = 40 + int(seed)*8; c.MaxModelLen = 512 })
			randomWorkload(t, e, seed, 300)
			checkInvariants(t, e)
			if st := e.Stats(); st.FreeBlocks != st.NumGPUBlocks-1 || st.Running+st.Waiting+st.Held != 0 || len(e.seqs) != 0 {
				t.Errorf("leak: %+v, %d live sequences", st, len(e.seqs))
			}
		})
	}
}

// TestDeterminism: the same inputs give the same outputs, durations and
// events.
func TestDeterminism(t *testing.T) {
	run := func() []StepResult {
		e := mustEngine(t, "tiny", func(c *Config) { c.NumGPUBlocks = 48; c.MaxModelLen = 512 })
		return randomWorkload(t, e, 42, 200).steps
	}
	a, b := run(), run()
	if len(a) != len(b) {
		t.Fatalf("%d steps vs %d", len(a), len(b))
	}
	for i := range a {
		a[i].removed, b[i].removed = nil, nil
		if !reflect.DeepEqual(a[i], b[i]) {
			t.Fatalf("step %d differs:\n%+v\n%+v", i, a[i], b[i])
		}
	}
}

// TestStepInto: reusing a StepResult gives the same results as Step.
func TestStepInto(t *testing.T) {
	mk := func() *Engine { return mustEngine(t, "tiny", nil) }
	e1, e2 := mk(), mk()
	for i := range 6 {
		r := &Request{ID: fmt.Sprint(i), Prompt: tokens(i*7, 50+10*i), MaxTokens: 30}
		r2 := *r
		e1.Add(0, r)
		e2.Add(0, &r2)
	}
	var now time.Duration
	var reused StepResult
	for e1.HasWork() {
		want := e1.Step(now)
		e2.StepInto(now, &reused)
		if want.Duration != reused.Duration || !reflect.DeepEqual(want.Outputs, reused.Outputs) ||
			len(want.Events) != len(reused.Events) {
			t.Fatalf("at %v: Step and StepInto differ", now)
		}
		now += want.Duration
	}
	if e2.HasWork() {
		t.Error("StepInto engine has work left")
	}
}

func TestConfigOverrides(t *testing.T) {
	base := mustEngine(t, "llama-3.1-8b-h100", nil).Profile()
	tests := []struct {
		name  string
		mod   func(*Config)
		check func(p Profile) string
	}{
		{"block size keeps capacity", func(c *Config) { c.BlockSize = 32 }, func(p Profile) string {
			if p.BlockSize != 32 || p.NumGPUBlocks != base.NumGPUBlocks/2 {
				return fmt.Sprintf("block size %d, %d blocks; want 32, %d", p.BlockSize, p.NumGPUBlocks, base.NumGPUBlocks/2)
			}
			return ""
		}},
		{"explicit blocks", func(c *Config) { c.NumGPUBlocks = 1000 }, func(p Profile) string {
			if p.NumGPUBlocks != 1000 || p.MaxModelLen != 15984 { // 999 usable blocks
				return fmt.Sprintf("%d blocks, max model len %d; want 1000, 15984", p.NumGPUBlocks, p.MaxModelLen)
			}
			return ""
		}},
		{"scheduler limits", func(c *Config) { c.MaxNumSeqs = 7; c.MaxNumBatchedTokens = 333 }, func(p Profile) string {
			if p.MaxNumSeqs != 7 || p.MaxNumBatchedTokens != 333 {
				return fmt.Sprintf("max seqs %d, budget %d; want 7, 333", p.MaxNumSeqs, p.MaxNumBatchedTokens)
			}
			return ""
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if msg := tt.check(mustEngine(t, "llama-3.1-8b-h100", tt.mod).Profile()); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func TestSpeed(t *testing.T) {
	durations := func(speed float64) []time.Duration {
		e := mustEngine(t, "tiny", func(c *Config) { c.Speed = speed })
		d := newDriver(t, e)
		d.add(&Request{ID: "a", Prompt: tokens(1, 300), MaxTokens: 5})
		d.run()
		var out []time.Duration
		for _, s := range d.steps {
			out = append(out, s.Duration)
		}
		return out
	}
	one, four := durations(1), durations(4)
	if len(one) != len(four) {
		t.Fatalf("%d steps at speed 1, %d at speed 4", len(one), len(four))
	}
	for i := range one {
		if d := one[i] - 4*four[i]; d < -4 || d > 4 {
			t.Errorf("step %d: %v at speed 1, %v at speed 4", i, one[i], four[i])
		}
	}
}

// TestStalledOnHeldKV: a request that cannot get blocks while held leases
// keep them makes HasWork false (no busy loop), until Release.
func TestStalledOnHeldKV(t *testing.T) {
	e := mustEngine(t, "tiny", nil) // 64 blocks, max model len 1024
	d := newDriver(t, e)
	d.add(&Request{ID: "lease", Prompt: tokens(1, 960), MaxTokens: 1, HoldKV: true}) // 60 blocks held
	d.run()
	d.add(&Request{ID: "big", Prompt: tokens(5000, 400), MaxTokens: 10}) // its first chunk needs 16 blocks, 4 free
	if !e.HasWork() {
		t.Fatal("HasWork = false right after Add")
	}
	if r := d.step(); r.Duration != 0 || len(r.Outputs) != 0 {
		t.Fatalf("step ran %+v with the cache held", r.Batch)
	}
	if e.HasWork() {
		t.Fatal("HasWork = true although nothing can run until a Release")
	}
	e.Release("lease")
	if !e.HasWork() {
		t.Fatal("HasWork = false after Release")
	}
	d.run()
	if out := d.byID("big"); len(out) != 10 {
		t.Errorf("big produced %d tokens, want 10", len(out))
	}
}

// TestDecodeRun checks DecodeRun against stepping: under random workloads
// (arrivals in bursts, EOS, held KV, cache pressure), whenever it promises
// n plain decode steps, the next n steps decode every running request once,
// admit and preempt nothing, finish nothing before the last, finish
// something in the last exactly when it says so, and last exactly d.
func TestDecodeRun(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := mustEngine(t, "tiny", func(c *Config) { c.NumGPUBlocks = 48 + int(seed)*16; c.MaxModelLen = 512 })
			rng := rand.New(rand.NewPCG(seed, 2))
			d := newDriver(t, e)
			runs, promised := 0, 0
			for i := 0; i < 400 || e.HasWork(); i++ {
				if i < 400 && rng.IntN(6) == 0 {
					for range 1 + rng.IntN(3) {
						r := &Request{ID: fmt.Sprint("r", i, "-", rng.IntN(1e6)), Prompt: tokens(rng.IntN(1e5), 1+rng.IntN(100)),
							MaxTokens: 1 + rng.IntN(80), EOSAt: rng.IntN(60), HoldKV: rng.IntN(8) == 0}
						if err := e.Add(d.now, r); err != nil {
							t.Fatal(err)
						}
					}
				}
				if rng.IntN(3) == 0 {
					for id, s := range e.seqs {
						if s.status == statusHeld {
							e.Release(id)
						}
					}
				}
				limit := 1 + rng.IntN(40)
				n, dur, fin := e.DecodeRun(limit)
				if n == 0 {
					if e.HasWork() {
						d.step()
					}
					continue
				}
				if n > limit {
					t.Fatalf("DecodeRun(%d) = %d steps", limit, n)
				}
				runs++
				promised += n
				r := len(e.running)
				var sum time.Duration
				for k := 1; k <= n; k++ {
					res := d.step()
					sum += res.Duration
					if res.Batch.Seqs != r || res.Batch.DecodeTokens != r || res.Batch.PrefillTokens != 0 || res.Preempted != 0 {
						t.Fatalf("step %d of %d: batch %+v, %d preempted; want %d plain decodes", k, n, res.Batch, res.Preempted, r)
					}
					gotFin := false
					for _, o := range res.Outputs {
						gotFin = gotFin || o.Finished
					}
					if want := k == n && fin; gotFin != want {
						t.Fatalf("step %d of %d: finished %v, want %v", k, n, gotFin, want)
					}
					if len(res.Events) > 0 && e.cfg.NoEvents {
						t.Fatalf("events with NoEvents")
					}
				}
				if sum != dur {
					t.Fatalf("DecodeRun duration %v, stepping took %v", dur, sum)
				}
			}
			if runs == 0 || promised < 100 {
				t.Errorf("DecodeRun promised %d steps in %d runs: it should find the plain decode runs", promised, runs)
			}
		})
	}
}

// TestRecycledSequences: with NoEvents the engine reuses finished
// sequences and their slices; under random workloads (aborts, held KV,
// caller-given hashes) it must produce exactly the outputs and durations of
// an engine that reports events (and so recycles nothing).
func TestRecycledSequences(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			mod := func(noEvents bool) func(*Config) {
				return func(c *Config) { c.NumGPUBlocks = 48 + int(seed)*8; c.MaxModelLen = 512; c.NoEvents = noEvents }
			}
			plain := randomWorkload(t, mustEngine(t, "tiny", mod(false)), seed, 300)
			e := mustEngine(t, "tiny", mod(true))
			recycled := randomWorkload(t, e, seed, 300)
			if len(e.spare) == 0 {
				t.Fatalf("no sequence was recycled")
			}
			if len(plain.outputs) != len(recycled.outputs) {
				t.Fatalf("%d outputs with recycling, want %d", len(recycled.outputs), len(plain.outputs))
			}
			for i := range plain.outputs {
				if got, want := recycled.outputs[i], plain.outputs[i]; got != want {
					t.Fatalf("output %d: got %+v, want %+v", i, got, want)
				}
			}
			if got, want := recycled.now, plain.now; got != want {
				t.Errorf("end time %v, want %v", got, want)
			}
		})
	}
}

// TestSequenceLayout keeps each group of a sequence's fields (see the
// type) in its own cache line, and the sequence in the 256-byte size class
// (whose objects start on a cache line): a decode step touches lines 0 and
// 1 of every running request, and line 2 once per block.
func TestSequenceLayout(t *testing.T) {
	var s sequence
	type field struct {
		name      string
		off, size uintptr
	}
	lines := [][]field{
		{{"status", unsafe.Offsetof(s.status), unsafe.Sizeof(s.status)}, {"tokenMode", unsafe.Offsetof(s.tokenMode), unsafe.Sizeof(s.tokenMode)},
			{"blocks", unsafe.Offsetof(s.blocks), unsafe.Sizeof(s.blocks)}},
		{{"seed", unsafe.Offsetof(s.seed), unsafe.Sizeof(s.seed)}, {"ttft", unsafe.Offsetof(s.ttft), unsafe.Sizeof(s.ttft)},
			{"cachedTokens", unsafe.Offsetof(s.cachedTokens), unsafe.Sizeof(s.cachedTokens)}, {"run", unsafe.Offsetof(s.run), unsafe.Sizeof(s.run)}},
		{{"hashes", unsafe.Offsetof(s.hashes), unsafe.Sizeof(s.hashes)}, {"parent", unsafe.Offsetof(s.parent), unsafe.Sizeof(s.parent)}},
		{{"tokens", unsafe.Offsetof(s.tokens), unsafe.Sizeof(s.tokens)}, {"ownHashes", unsafe.Offsetof(s.ownHashes), unsafe.Sizeof(s.ownHashes)}},
	}
	for want, fs := range lines {
		for _, f := range fs {
			if first, last := f.off/64, (f.off+f.size-1)/64; first != uintptr(want) || last != uintptr(want) {
				t.Errorf("field %s spans lines %d..%d, want line %d", f.name, first, last, want)
			}
		}
	}
	if size := unsafe.Sizeof(s); size > 256 || size <= 240 {
		t.Errorf("sequence is %d bytes, want 241..256 (the 256-byte size class)", size)
	}
}

// TestGeneratedBlockKeys checks every cached block's key against the chain
// computed here over each request's prompt and output tokens, for every
// hash function (the sha256 ones carry a 32-byte digest from block to
// block, which the 64-bit keys alone cannot give), including a request
// whose first keys are the caller's.
func TestGeneratedBlockKeys(t *testing.T) {
	for _, name := range []string{HashXXH3, HashSHA256, HashSHA256CBOR} {
		t.Run(name, func(t *testing.T) {
			h, err := NewHashFunc(name, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, noEvents := range []bool{false, true} {
				e := mustEngine(t, "tiny", func(c *Config) { c.HashFunc, c.NoEvents = h, noEvents })
				reqs := map[string]*Request{}
				outs := map[string][]uint32{}
				var now time.Duration
				for i := range 5 {
					r := &Request{ID: fmt.Sprint("g", i), Prompt: tokens(i*1000, 16*i+5), MaxTokens: 40 + 7*i, Seed: uint64(i + 1)}
					if i == 4 {
						r.BlockHashes = []uint64{7, 8} // the rest of the chain continues from the caller's keys
					}
					if err := e.Add(now, r); err != nil {
						t.Fatal(err)
					}
					reqs[r.ID] = r
				}
				var res StepResult
				for e.HasWork() {
					e.StepInto(now, &res)
					now += res.Duration
					for _, o := range res.Outputs {
						outs[o.ID] = append(outs[o.ID], o.Token)
					}
				}
				want := map[uint64]bool{}
				for id, r := range reqs {
					all := concat(r.Prompt, outs[id])
					all = all[:len(all)-1] // the last token is never computed
					parent := h.None()
					for b := 0; (b+1)*16 <= len(all); b++ {
						if b < len(r.BlockHashes) {
							want[r.BlockHashes[b]] = true
							parent = digestOf(r.BlockHashes[b])
							continue
						}
						parent = h.Block(parent, all[b*16:(b+1)*16])
						want[parent.Key()] = true
					}
				}
				got := map[uint64]bool{}
				materializeAll(e)
				e.pool.cached.each(func(k uint64, _ int32) { got[k] = true })
				if len(want) < 15 || !maps.Equal(got, want) {
					t.Errorf("NoEvents=%v: cached %d keys, want %d (the chains over prompts and outputs), equal: %v", noEvents, len(got), len(want), maps.Equal(got, want))
				}
			}
		})
	}
}

// TestSamplerMatchesStep checks that Sampler.AppendTokens gives the tokens
// Step reports, for seeded and unseeded requests, with and without EOS,
// under preemption (a cache too small for all of them).
func TestSamplerMatchesStep(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.NumGPUBlocks = 12 })
	sm := e.Sampler()
	var reqs []*Request
	got := map[string][]uint32{}
	var now time.Duration
	for i := range 12 {
		r := &Request{ID: fmt.Sprint("s", i), Prompt: tokens(i*100, 20+i), MaxTokens: 10 + 3*i}
		switch i % 4 {
		case 0:
			r.Seed = uint64(i) * 7919
		case 1:
			r.EOSAt = 5 + i
		case 2:
			r.EOSAt, r.IgnoreEOS = 3, true
		}
		if err := e.Add(now, r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	var res StepResult
	preempted := 0
	for e.HasWork() {
		e.StepInto(now, &res)
		now += res.Duration
		preempted += res.Preempted
		for _, o := range res.Outputs {
			got[o.ID] = append(got[o.ID], o.Token)
		}
	}
	if preempted == 0 {
		t.Errorf("no preemption: the test wants some")
	}
	for _, r := range reqs {
		want := sm.AppendTokens([]uint32{99}, r, len(got[r.ID]))
		if !slices.Equal(want[1:], got[r.ID]) || want[0] != 99 {
			t.Errorf("%s: Step gave %v, AppendTokens %v", r.ID, got[r.ID], want)
		}
		// AppendTokenRange, in pieces, gives the same tokens.
		var pieces []uint32
		for from := 0; from < len(got[r.ID]); from += 4 {
			pieces = sm.AppendTokenRange(pieces, r, from, min(from+4, len(got[r.ID])))
		}
		if !slices.Equal(pieces, got[r.ID]) {
			t.Errorf("%s: Step gave %v, AppendTokenRange by 4 %v", r.ID, got[r.ID], pieces)
		}
	}
}

// TestNoEventsSameKeys: without KV events the engine keeps only the prompt
// tokens after the blocks whose keys it knows (keepTokens); the keys of
// the blocks it fills later (the last partial prompt block and the
// outputs) must be those of an engine that keeps them all.
func TestNoEventsSameKeys(t *testing.T) {
	keys := func(noEvents bool) map[uint64]bool {
		e := mustEngine(t, "tiny", func(c *Config) { c.NoEvents = noEvents })
		var now time.Duration
		for i := range 6 {
			r := &Request{ID: fmt.Sprint("k", i), Prompt: tokens(i*1000, 16*i+5+i), MaxTokens: 40, Seed: uint64(i + 1)}
			if i == 5 {
				r.BlockHashes = []uint64{7, 8} // caller-given keys for the first blocks, the rest from tokens
			}
			if err := e.Add(now, r); err != nil {
				t.Fatal(err)
			}
		}
		var res StepResult
		for e.HasWork() {
			e.StepInto(now, &res)
			now += res.Duration
		}
		m := map[uint64]bool{}
		materializeAll(e)
		e.pool.cached.each(func(k uint64, _ int32) { m[k] = true })
		return m
	}
	got, want := keys(true), keys(false)
	if len(want) < 20 || !maps.Equal(got, want) {
		t.Errorf("NoEvents cached %d keys, with events %d (want the same, at least 20)", len(got), len(want))
	}
}

// TestPromptLenOnly: a request that gives only its prompt length (no
// tokens, no block keys) runs, and since nothing identifies its blocks a
// second one of the same length gets no cache hit (FuzzEngine found the
// panic this used to be).
func TestPromptLenOnly(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	for _, id := range []string{"a", "b"} {
		d.add(&Request{ID: id, PromptLen: 100, MaxTokens: 4})
		d.run()
		out := d.byID(id)
		if len(out) == 0 || !out[len(out)-1].Finished {
			t.Fatalf("%s: outputs %+v, want a finished request", id, out)
		}
		if c := out[len(out)-1].CachedTokens; c != 0 {
			t.Errorf("%s: %d cached tokens, want 0 (no block keys)", id, c)
		}
	}
}

// TestFreeQueueOrder drives the block pool's free queue (a ring with
// holes, compacted when it fills) with random touches, releases and
// allocations, and checks its order against a naive list: allocation pops
// the least recently released block.
func TestFreeQueueOrder(t *testing.T) {
	compacted := 0
	for _, n := range []int{1, 3, 16, 40} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			p := newBlockPool(n)
			rng := rand.New(rand.NewPCG(uint64(n), 1))
			var queue []int32 // the reference: free blocks, head first
			for i := range n {
				queue = append(queue, int32(i))
			}
			held := map[int32]bool{}
			for step := range 20000 {
				// Few allocations: touches' holes pile up and fill the ring.
				switch k := rng.IntN(10); {
				case k == 0 && len(queue) > 0: // allocate
					id := p.alloc()
					if id != queue[0] {
						t.Fatalf("step %d: alloc got block %d, want %d", step, id, queue[0])
					}
					queue = queue[1:]
					held[id] = true
				case k < 6 && len(queue) > 0: // a prefix hit on a free block
					i := rng.IntN(len(queue))
					if k > 1 && i == 0 && len(queue) > 1 {
						i = 1 // mostly not the head: holes pile up behind it
					}
					id := queue[i]
					p.touch(id)
					queue = append(queue[:i:i], queue[i+1:]...)
					held[id] = true
				default: // release a held block
					for id := range held {
						p.release(id)
						delete(held, id)
						queue = append(queue, id)
						break
					}
				}
				if p.numFree != len(queue) {
					t.Fatalf("step %d: numFree %d, want %d", step, p.numFree, len(queue))
				}
			}
			if p.spare != nil {
				compacted++
			}
		})
	}
	if compacted == 0 {
		t.Error("no ring was ever compacted")
	}
}

// TestSequenceSlab checks that new requests' sequences are allocated
// together (newSequence's slab), adjacent and on their own cache lines, so
// that a step reading every running request misses few pages. Between two
// Adds the test allocates another object of a sequence's size class (256
// bytes, with pointers), as a server's other work does: sequences allocated
// one by one would no longer be adjacent.
func TestSequenceSlab(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	var prev uintptr
	others := make([]*[32]*int, 0, slabSeqs)
	for i := range slabSeqs {
		others = append(others, new([32]*int))
		id := fmt.Sprint("r", i)
		if err := e.Add(0, &Request{ID: id, Prompt: tokens(i*100, 20), MaxTokens: 4}); err != nil {
			t.Fatal(err)
		}
		p := uintptr(unsafe.Pointer(e.seqs[id]))
		if p%64 != 0 {
			t.Errorf("sequence %d at %#x, not on a line of its own", i, p)
		}
		if i > 0 && p != prev+unsafe.Sizeof(sequence{}) {
			t.Errorf("sequence %d at %#x, want %#x (right after the previous one)", i, p, prev+unsafe.Sizeof(sequence{}))
		}
		prev = p
	}
	runtime.KeepAlive(others)
}

// TestBlockIDSlab checks that new sequences' block id arrays are carved one
// after the other from the engine's slab (blockIDs), with their room, while
// other objects of their size class are allocated between them (as a
// server's other work does), and that a long prompt's array is allocated
// alone.
func TestBlockIDSlab(t *testing.T) {
	e := mustEngine(t, "llama-3.1-8b-h100", func(c *Config) { c.NoEvents = true })
	var prev []int32
	var others [][]int32
	for i := range 8 {
		others = append(others, make([]int32, 0, 96))
		id := fmt.Sprint("r", i)
		if err := e.Add(0, &Request{ID: id, Prompt: tokens(i*1000, 500), MaxTokens: 1000}); err != nil {
			t.Fatal(err)
		}
		b := e.seqs[id].blocks
		if want := (500 + 1000 + 15) / 16; cap(b) != want {
			t.Errorf("request %d: room for %d block ids, want %d", i, cap(b), want)
		}
		if i > 0 {
			if p, want := unsafe.Pointer(unsafe.SliceData(b)), unsafe.Add(unsafe.Pointer(unsafe.SliceData(prev)), 4*cap(prev)); p != want {
				t.Errorf("request %d: block ids at %p, want %p (right after the previous request's)", i, p, want)
			}
		}
		prev = b
	}
	runtime.KeepAlive(others)
	long := (idSlabLen/16 + 1) * 16 // tokens of a prompt whose array is allocated alone
	left := len(e.idSlab)
	if err := e.Add(0, &Request{ID: "long", Prompt: tokens(1, long), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if len(e.idSlab) != left || cap(e.seqs["long"].blocks) != long/16+1 {
		t.Errorf("a long prompt's block ids: slab %d -> %d ids left, room %d; want it alone, with room for %d",
			left, len(e.idSlab), cap(e.seqs["long"].blocks), long/16+1)
	}
}

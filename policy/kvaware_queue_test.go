package policy

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestKVAwareHolderQueueOfHits: the queue estimate weighs an endpoint's
// in-flight prompt tokens by the uncached share of what the policy routed
// there, so a hot prefix's holder whose queue is mostly cache hits counts as
// lightly queued and keeps the burst (the fleet-wide share made it look
// saturated and sent the burst to a cold endpoint that prefilled the prefix
// again: the storm workload's pile-up).
func TestKVAwareHolderQueueOfHits(t *testing.T) {
	k, err := NewKVAware(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	one := func(id string, cached int) {
		k.Pick(epoch, &kvroute.Request{ID: id, PromptTokens: 6100}, []kvroute.Candidate{cand("holder", kvroute.Load{}, cached/32, cached)})
	}
	one("first", 0) // the miss that puts the prefix on the holder
	for i := range 8 {
		one("hit"+strconv.Itoa(i), 6000)
	}
	const inflightTok = 9 * 6100
	cands := []kvroute.Candidate{
		cand("holder", kvroute.Load{InFlight: 9, InFlightTokens: inflightTok}, 6000/32, 6000),
		cand("cold", kvroute.Load{}, 0, 0),
	}
	d := k.Pick(epoch, &kvroute.Request{ID: "next", PromptTokens: 6100}, cands)
	if d.Endpoint != "holder" {
		t.Errorf("chose %s (%s), want holder", d.Endpoint, d.Reason)
	}
	// Own share: (6100 + 8 x 100) uncached of 9 x 6100 prompt tokens.
	want := inflightTok * (6100.0 + 8*100) / (9 * 6100)
	if got := part(d.Scores[0], "queued_tokens"); math.Abs(got-want) > 1 {
		t.Errorf("holder queued_tokens = %v, want %v", got, want)
	}
	// Released requests no longer count: with nothing of its own there the
	// fleet-wide share applies again.
	for _, id := range []string{"first", "hit0", "hit1", "hit2", "hit3", "hit4", "hit5", "hit6", "hit7", "next"} {
		k.Release(epoch, &kvroute.Request{ID: id}, "holder")
	}
	if s := k.eps["holder"]; s.sumPrompt != 0 || s.sumTok != 0 {
		t.Errorf("after release sumPrompt, sumTok = %v, %v; want 0, 0", s.sumPrompt, s.sumTok)
	}
}

// TestKVAwareFirstTokenQueue: once the router reports first tokens, the
// queued prefill on an endpoint is the uncached tokens of the requests the
// policy sent there that have not produced one yet, exactly: a request
// past its first token (decoding) no longer counts, however many prompt
// tokens it had.
func TestKVAwareFirstTokenQueue(t *testing.T) {
	k, err := NewKVAware(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	pick := func(id string, cached int, load kvroute.Load) kvroute.Decision {
		return k.Pick(epoch, &kvroute.Request{ID: id, PromptTokens: 4000, BlockSize: 32, BlockHashes: make([]uint64, 125)},
			[]kvroute.Candidate{cand("e", load, cached/32, cached)})
	}
	pick("cold", 0, kvroute.Load{})    // 4000 uncached
	pick("hit", 3200, kvroute.Load{})  // 800 uncached
	pick("hit2", 3200, kvroute.Load{}) // 800 uncached
	k.FirstToken(epoch, &kvroute.Request{ID: "cold"}, "e")
	k.FirstToken(epoch, &kvroute.Request{ID: "cold"}, "e") // repeated: no effect
	k.FirstToken(epoch, &kvroute.Request{ID: "unknown"}, "e")
	// The router still holds all three in flight; two have no first token.
	// (The engine's own queue, Waiting x the mean uncached size, is a floor
	// for work other routers sent: none here.)
	load := kvroute.Load{InFlight: 3, Running: 3, InFlightTokens: 8000}
	tests := []struct {
		name    string
		release []string
		want    float64
	}{
		{"two hits queued", nil, 1600},
		{"a queued hit released", []string{"hit2"}, 800},
		{"the decoding cold request released", []string{"cold"}, 800},
		{"all released", []string{"hit"}, 0},
	}
	for i, tt := range tests {
		for _, id := range tt.release {
			k.Release(epoch, &kvroute.Request{ID: id}, "e")
		}
		d := pick("probe"+strconv.Itoa(i), 0, load)
		if got := part(d.Scores[0], "queued_tokens"); math.Abs(got-tt.want) > 0.01 {
			t.Errorf("%s: queued_tokens = %v, want %v", tt.name, got, tt.want)
		}
		k.Release(epoch, &kvroute.Request{ID: "probe" + strconv.Itoa(i)}, "e")
	}
}

// TestKVAwareQueueHeadProgress: the queue head's prefill progress since it
// started (a dispatch to an empty queue, or the last first token there) is
// credited at ProgressTokPerMs, up to the head's size, then one step.
func TestKVAwareQueueHeadProgress(t *testing.T) {
	k, err := NewKVAware(map[string]any{"progress_tok_per_ms": 10}, 1)
	if err != nil {
		t.Fatal(err)
	}
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	pick := func(ms int, id string, prompt int) kvroute.Decision {
		return k.Pick(at(ms), &kvroute.Request{ID: id, PromptTokens: prompt}, []kvroute.Candidate{cand("e", kvroute.Load{}, 0, 0)})
	}
	pick(0, "head", 3000)                                           // starts at once on the empty queue
	pick(10, "next", 20000)                                         // queued behind it
	k.FirstToken(epoch, nil, "e")                                   // nil request: ignored
	k.FirstToken(epoch, &kvroute.Request{ID: "elsewhere"}, "other") // not pending: only says the router reports first tokens
	tests := []struct {
		name  string
		ms    int
		first string // a first token at ms, before the probe
		want  float64
	}{
		{"100 ms into the head", 100, "", 23000 - 1000},
		{"progress capped at the head's size", 1000, "", 20000},
		{"the next starts at the head's first token", 1000, "head", 20000},
		{"200 ms into the next", 1200, "", 20000 - 2000},
		{"progress capped at one step", 3000, "", 20000 - 8192},
	}
	for i, tt := range tests {
		if tt.first != "" {
			k.FirstToken(at(tt.ms), &kvroute.Request{ID: tt.first}, "e")
		}
		probe := "probe" + strconv.Itoa(i)
		d := pick(tt.ms, probe, 100)
		if got := part(d.Scores[0], "queued_tokens"); math.Abs(got-tt.want) > 0.01 {
			t.Errorf("%s: queued_tokens = %v, want %v", tt.name, got, tt.want)
		}
		k.Release(at(tt.ms), &kvroute.Request{ID: probe}, "e")
	}
}

// TestKVAwareHotSpread: a hot prefix (more requests in flight than one
// endpoint's share) whose holder runs over the in-flight bound is spread to
// a new replica even though the holder's queue is not congested (its
// prompts are cache hits); with hot_spread off the holder keeps it.
func TestKVAwareHotSpread(t *testing.T) {
	for _, spread := range []bool{true, false} {
		k, err := NewKVAware(map[string]any{"hot_spread": spread}, 1)
		if err != nil {
			t.Fatal(err)
		}
		hashes := make([]uint64, 190)
		for i := range hashes {
			hashes[i] = uint64(i + 1)
		}
		req := func(id string) *kvroute.Request {
			return &kvroute.Request{ID: id, PromptTokens: 6200, BlockSize: 32, BlockHashes: hashes}
		}
		cands := func(holderInFlight int) []kvroute.Candidate {
			return []kvroute.Candidate{
				cand("holder", kvroute.Load{InFlight: holderInFlight, Running: holderInFlight}, 187, 5984),
				cand("a", kvroute.Load{InFlight: 4, Running: 4}, 0, 0),
				cand("b", kvroute.Load{InFlight: 4, Running: 4}, 0, 0),
				cand("c", kvroute.Load{InFlight: 4, Running: 4}, 0, 0),
			}
		}
		// Twelve of the prefix's requests in flight, all on the holder.
		for i := range 12 {
			if d := k.Pick(epoch, req("r"+strconv.Itoa(i)), cands(4)); d.Endpoint != "holder" {
				t.Fatalf("spread=%v: warm-up pick %d went to %s (%s)", spread, i, d.Endpoint, d.Reason)
			}
			k.FirstToken(epoch, req("r"+strconv.Itoa(i)), "holder")
		}
		// Holder at 20 in flight: mean (32+1)/4, bound max(1.25 x 8.25,
		// 8.25+4) = 12.25 < 21 < 2 x bound; share 1.25 x 32/4 = 10 < 13.
		d := k.Pick(epoch, req("next"), cands(20))
		if spread && d.Endpoint == "holder" {
			t.Errorf("hot_spread on: chose the holder over its bound (%s)", d.Reason)
		}
		if !spread && d.Endpoint != "holder" {
			t.Errorf("hot_spread off: chose %s (%s), want holder", d.Endpoint, d.Reason)
		}
		if !spread {
			continue
		}
		// No room: every endpoint without the prefix has a congested queue
		// (a burst on a cold fleet): the holder keeps the prefix.
		busy := cands(20)
		for i := 1; i < len(busy); i++ {
			busy[i].Load.Waiting = 20
		}
		d = k.Pick(epoch, req("busy"), busy)
		if d.Endpoint != "holder" {
			t.Errorf("hot_spread on, no room elsewhere: chose %s (%s), want holder", d.Endpoint, d.Reason)
		}
		if got := part(d.Scores[0], "cached_tokens"); got != 5984 {
			t.Errorf("hot_spread on, no room elsewhere: holder credited %v tokens (why %q), want 5984 (not capped)", got, d.Scores[0].Why)
		}
	}
}

// TestKVAwareDecodeStepProjected: the decode term prices the step an
// endpoint will run once the requests the router holds open there decode,
// so of two endpoints alike now (no queue, nothing cached, the same batch
// and decoding context), the one about to decode long prompts it was just
// sent (InFlightTokens) loses, although it holds fewer requests. With the
// step as the batch is now the two scored alike and the tie went to the
// one with fewer in flight: the burst pile-up that ended rag at 420 req/s
// last.
func TestKVAwareDecodeStepProjected(t *testing.T) {
	k, err := NewKVAware(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The router reports first tokens: the queue estimate then counts only
	// the policy's own queued prefill (none here), not InFlightTokens.
	k.FirstToken(epoch, &kvroute.Request{ID: "unknown"}, "long")
	now := kvroute.Load{Running: 4, DecodeTokens: 8000}
	long, short := now, now
	long.InFlight, long.InFlightTokens = 2, 100000 // two 50k-token prompts, cached, about to decode
	short.InFlight, short.InFlightTokens = 3, 3000
	cands := []kvroute.Candidate{cand("long", long, 0, 0), cand("short", short, 0, 0)}
	d := k.Pick(epoch, &kvroute.Request{ID: "r", PromptTokens: 1000}, cands)
	if d.Endpoint != "short" {
		t.Errorf("chose %s (%s), want short", d.Endpoint, d.Reason)
	}
	p := k.Params()
	for i, c := range cands {
		batch := float64(max(c.Load.InFlight, c.Load.Running) + 1)
		ctx := float64(c.Load.DecodeTokens + c.Load.InFlightTokens + 1000)
		want := p.DecodeWeight * float64(p.OutputTokens) *
			(p.StepOverheadUs + batch*p.DecodeUsPerToken + ctx/1000*p.DecodeUsPerCtxKTok) / 1000
		if got := part(d.Scores[i], "decode_ms"); math.Abs(got-want) > 0.001 {
			t.Errorf("%s: decode_ms = %v, want %v", c.Endpoint.ID, got, want)
		}
	}
}

// TestKVAwareDecodeKVCap: an endpoint whose KV is full gets no decode
// advantage (DecodeKVCap): its short step is the batch its memory holds,
// and a request sent there waits for memory first. Of two endpoints alike
// but for their decoding context and KV usage, the full one with the
// shorter contexts has the lower decode term without the cap (the tenants
// workload at 200/s, seed 5: its light tenants piled onto it until it
// preempted); with it, its decode term is raised to the other's, and its
// score by as much, while the other's does not move.
func TestKVAwareDecodeKVCap(t *testing.T) {
	full := kvroute.Load{Running: 40, DecodeTokens: 20000, KVUsage: 1}
	room := kvroute.Load{Running: 40, DecodeTokens: 60000, KVUsage: 0.6}
	cands := []kvroute.Candidate{cand("full", full, 0, 0), cand("room", room, 0, 0)}
	pick := func(capAt float64) kvroute.Decision {
		t.Helper()
		k, err := NewKVAware(map[string]any{"decode_kv_cap": capAt}, 1)
		if err != nil {
			t.Fatal(err)
		}
		k.FirstToken(epoch, &kvroute.Request{ID: "unknown"}, "full")
		return k.Pick(epoch, &kvroute.Request{ID: "r", PromptTokens: 1000}, cands)
	}
	off, on := pick(1), pick(DefaultKVAwareParams().DecodeKVCap)
	offFull, offRoom := part(off.Scores[0], "decode_ms"), part(off.Scores[1], "decode_ms")
	if !(offFull < offRoom-1) {
		t.Fatalf("decode_kv_cap 1 (off): decode_ms full %v, room %v; want full's well below", offFull, offRoom)
	}
	if got := part(on.Scores[0], "decode_ms"); got != offRoom {
		t.Errorf("capped: full's decode_ms %v, want room's %v", got, offRoom)
	}
	if got, want := on.Scores[0].Value-off.Scores[0].Value, offRoom-offFull; math.Abs(got-want) > 0.002 {
		t.Errorf("capped: full's score rose by %v, want %v (its decode term's rise)", got, want)
	}
	if on.Scores[1].Value != off.Scores[1].Value {
		t.Errorf("capped: room's score moved from %v to %v", off.Scores[1].Value, on.Scores[1].Value)
	}
	// The explanation says so, and the raise is no cap: full keeps its
	// eligibility and is not "capped".
	if part(on.Scores[0], "decode_kv_full") != 1 || part(on.Scores[1], "decode_kv_full") != -1 || part(off.Scores[0], "decode_kv_full") != -1 {
		t.Errorf("decode_kv_full parts: capped full %v, room %v, uncapped full %v; want 1 and none (-1) on the others",
			part(on.Scores[0], "decode_kv_full"), part(on.Scores[1], "decode_kv_full"), part(off.Scores[0], "decode_kv_full"))
	}
	if !on.Scores[0].Eligible || part(on.Scores[0], "capped") != -1 {
		t.Errorf("capped full: eligible %v, capped part %v; want eligible and no capped part (-1)", on.Scores[0].Eligible, part(on.Scores[0], "capped"))
	}
}

// TestKVAwareStepPhase: a busy engine's step in progress began at its last
// first token and lasts the estimate's step; a request sent there waits for
// its rest (step_wait_ms, in queue_ms), half a step once it is over. Of two
// engines alike but for that, the one whose step ends sooner wins. An idle
// engine, or one that has given no first token yet, has no wait.
func TestKVAwareStepPhase(t *testing.T) {
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	// 100 running sequences with 1M tokens of context: a step of
	// 6000 + 100 x 2 + 1000 x 45 us = 51.2 ms.
	busy := kvroute.Load{Running: 100, DecodeTokens: 1_000_000}
	const step = 51.2
	wait := func(s kvroute.Score) float64 { return max(part(s, "step_wait_ms"), 0) } // absent: none
	for _, phase := range []bool{true, false} {
		k, err := NewKVAware(map[string]any{"step_phase": phase}, 1)
		if err != nil {
			t.Fatal(err)
		}
		// One request each, their first tokens at 40 ms (a) and 0 ms (b).
		k.Pick(at(-10), &kvroute.Request{ID: "ra", PromptTokens: 100}, []kvroute.Candidate{cand("a", kvroute.Load{}, 0, 0)})
		k.Pick(at(-10), &kvroute.Request{ID: "rb", PromptTokens: 100}, []kvroute.Candidate{cand("b", kvroute.Load{}, 0, 0)})
		d := k.Pick(at(-5), &kvroute.Request{ID: "early", PromptTokens: 100}, []kvroute.Candidate{cand("a", busy, 0, 0), cand("b", busy, 0, 0)})
		if got := wait(d.Scores[0]) + wait(d.Scores[1]); got != 0 {
			t.Errorf("step_phase %v, before any first token: step_wait_ms %v, want none", phase, got)
		}
		k.Release(at(-5), &kvroute.Request{ID: "early"}, d.Endpoint)
		k.FirstToken(at(40), &kvroute.Request{ID: "ra"}, "a")
		k.FirstToken(at(0), &kvroute.Request{ID: "rb"}, "b")
		for _, tt := range []struct {
			name   string
			ms     int
			load   kvroute.Load
			wa, wb float64 // step_wait_ms of a and b
		}{
			{"b's step ends sooner", 45, busy, step - 5, step - 45},
			{"both steps over", 100, busy, step / 2, step / 2},
			{"idle engines", 45, kvroute.Load{}, 0, 0},
		} {
			cands := []kvroute.Candidate{cand("a", tt.load, 0, 0), cand("b", tt.load, 0, 0)}
			d := k.Pick(at(tt.ms), &kvroute.Request{ID: "probe", PromptTokens: 100}, cands)
			wa, wb := wait(d.Scores[0]), wait(d.Scores[1])
			if !phase {
				tt.wa, tt.wb = 0, 0
			}
			if math.Abs(wa-tt.wa) > 0.01 || math.Abs(wb-tt.wb) > 0.01 {
				t.Errorf("step_phase %v, %s: step_wait_ms %v and %v, want %v and %v", phase, tt.name, wa, wb, tt.wa, tt.wb)
			}
			if dq := part(d.Scores[0], "queue_ms") - part(d.Scores[1], "queue_ms"); math.Abs(dq-(tt.wa-tt.wb)) > 0.01 {
				t.Errorf("step_phase %v, %s: queue_ms differ by %v, want %v (the waits' difference)", phase, tt.name, dq, tt.wa-tt.wb)
			}
			if phase && tt.wa > tt.wb && d.Endpoint != "b" {
				t.Errorf("%s: chose %s (%s), want b", tt.name, d.Endpoint, d.Reason)
			}
			k.Release(at(tt.ms), &kvroute.Request{ID: "probe"}, d.Endpoint)
		}
	}
}

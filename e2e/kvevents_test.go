package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// prompt is one test prompt, sent to one engine.
type prompt struct {
	path, body string
	owner      *engineProc
	hashes     []uint64 // kvindex.HashTokens of the engine's own token ids
	tokens     int
}

// indexHolds reports the blocks each endpoint holds of hashes in the
// router's precise index.
func indexHolds(idx *kvindex.Index, hashes []uint64) map[string]int {
	out := map[string]int{}
	for _, h := range idx.Match(hashes, nil) {
		out[h.Endpoint] = h.Blocks
	}
	return out
}

// awaitEvents sends small warm-up prompts to e until the router has
// applied at least one more KV-event batch of it than before (or, with
// restart, seen a restart of its sequence). A PUB socket drops what it
// publishes before its subscriber is connected (ZeroMQ's slow joiner); the
// subscriber catches up from the replay socket on the next batch it sees.
func awaitEvents(t *testing.T, r *routerProc, e *engineProc, restart bool) {
	t.Helper()
	labels := map[string]string{"model": model, "endpoint": e.id}
	name := "kvroute_endpoint_kv_event_batches_total"
	if restart {
		name = "kvroute_endpoint_kv_event_restarts_total"
	}
	before, _ := r.metric(t, name, labels)
	i := 0
	eventually(t, 10*time.Second, "KV events of "+e.id+" flowing", func() (bool, string) {
		i++
		warmUp(t, e, i)
		time.Sleep(50 * time.Millisecond) // pace: each lost batch moves the new sequence on
		v, _ := r.metric(t, name, labels)
		return v > before, fmt.Sprintf("%s{endpoint=%s} = %v", name, e.id, v)
	})
}

// warmUp sends e a distinct prompt of a few KV blocks: one event batch.
func warmUp(t *testing.T, e *engineProc, i int) {
	t.Helper()
	post(t, e.url(), "/v1/completions", completionBody(fmt.Sprintf("warm-up %d of %s: %s", i, e.id, text(uint64(1000+i), 30)), 1))
}

// TestKVEventsBuildPreciseIndex: two engines publish KV events, one in
// vLLM's array encoding over a socket it binds, one in the map encoding
// connecting to the router; prompts sent straight to them end up in the
// router's precise index under the engine that computed them, keyed by the
// router's own hash of the engine's token ids, and each engine confirms
// with the cached_tokens of a repeat.
func TestKVEventsBuildPreciseIndex(t *testing.T) {
	a := startEngine(t, "a", engineOpts{encoding: "array"})
	b := startEngine(t, "b", engineOpts{encoding: "map", connect: true})
	r := startRouter(t, modelConfig("round_robin", true, a, b))
	idx := r.p.PreciseIndex(model)
	if idx == nil {
		t.Fatal("no precise index")
	}

	var prompts []*prompt
	for i := range 6 {
		owner := []*engineProc{a, b}[i%2]
		p := &prompt{owner: owner}
		if i%3 == 2 {
			p.path, p.body = "/v1/completions", completionBody(text(uint64(i), 150+40*i), 1)
		} else {
			p.path, p.body = "/v1/chat/completions", chatBody(text(uint64(100+i), 120+50*i), fmt.Sprintf("question %d", i), 1, false)
		}
		ids := tokenize(t, owner, p.body)
		p.tokens = len(ids)
		p.hashes = kvindex.HashTokens(ids, blockSize, nil)
		if len(p.hashes) < 4 {
			t.Fatalf("prompt %d: only %d blocks", i, len(p.hashes))
		}
		prompts = append(prompts, p)
	}
	awaitEvents(t, r, a, false)
	awaitEvents(t, r, b, false)
	for _, p := range prompts {
		post(t, p.owner.url(), p.path, p.body)
	}
	for i, p := range prompts {
		eventually(t, 5*time.Second, fmt.Sprintf("prompt %d indexed on %s", i, p.owner.id), func() (bool, string) {
			got := indexHolds(idx, p.hashes)
			want := map[string]int{p.owner.id: len(p.hashes)}
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("index holds %v, want %v", got, want)
		})
	}
	// The engines agree: a repeat is served from the blocks the index lists
	// (all but the last token, as vLLM computes at least one).
	for i, p := range prompts {
		res := post(t, p.owner.url(), p.path, p.body)
		want := min(len(p.hashes), (p.tokens-1)/blockSize) * blockSize
		if got := res.usage.CachedTokens(); got != want {
			t.Errorf("prompt %d on %s: cached_tokens %d, want %d (index: %d blocks of %d tokens)", i, p.owner.id, got, want,
				len(p.hashes), p.tokens)
		}
	}
	if v, _ := r.metric(t, "kvroute_precise_index_entries", map[string]string{"model": model}); v <= 0 {
		t.Errorf("kvroute_precise_index_entries: got %v, want > 0", v)
	}
}

// TestEngineRestartDropsEntries: an engine that restarts (empty cache,
// sequence numbers from 0) loses its entries in the precise index once its
// new life publishes, and what it computes afterwards is indexed again.
func TestEngineRestartDropsEntries(t *testing.T) {
	a := startEngine(t, "a", engineOpts{encoding: "array"})
	b := startEngine(t, "b", engineOpts{encoding: "map", connect: true})
	r := startRouter(t, modelConfig("round_robin", true, a, b))
	idx := r.p.PreciseIndex(model)

	mk := func(seed uint64) *prompt {
		body := chatBody(text(seed, 200), "restart", 1, false)
		return &prompt{path: "/v1/chat/completions", body: body, hashes: kvindex.HashTokens(tokenize(t, a, body), blockSize, nil)}
	}
	before, after, onB := mk(1), mk(2), mk(3)
	awaitEvents(t, r, a, false)
	awaitEvents(t, r, b, false)
	// The subscriber recognises a restart by the sequence going back: give
	// the first life a history longer than the batches the second one
	// publishes before it has reconnected (dropped by its PUB socket).
	for i := range 40 {
		warmUp(t, a, 100+i)
	}
	post(t, a.url(), before.path, before.body)
	post(t, b.url(), onB.path, onB.body)
	eventually(t, 5*time.Second, "first life indexed", func() (bool, string) {
		ga, gb := indexHolds(idx, before.hashes), indexHolds(idx, onB.hashes)
		return ga["a"] == len(before.hashes) && gb["b"] == len(onB.hashes), fmt.Sprintf("a holds %v, b holds %v", ga, gb)
	})

	a.restart()
	awaitEvents(t, r, a, true)
	post(t, a.url(), after.path, after.body)
	eventually(t, 10*time.Second, "restart honoured", func() (bool, string) {
		gBefore, gAfter := indexHolds(idx, before.hashes), indexHolds(idx, after.hashes)
		return gBefore["a"] == 0 && gAfter["a"] == len(after.hashes),
			fmt.Sprintf("old prompt on a: %d blocks (want 0); new prompt on a: %d (want %d)", gBefore["a"], gAfter["a"], len(after.hashes))
	})
	if got := indexHolds(idx, onB.hashes)["b"]; got != len(onB.hashes) {
		t.Errorf("b's entries after a's restart: %d blocks, want %d", got, len(onB.hashes))
	}
	if v, _ := r.metric(t, "kvroute_endpoint_kv_event_restarts_total", map[string]string{"model": model, "endpoint": "a"}); v < 1 {
		t.Errorf("kvroute_endpoint_kv_event_restarts_total{endpoint=a}: got %v, want >= 1", v)
	}
}

// TestKVEventsSaltedPrompts: prompts with vLLM's cache_salt, in either
// event encoding, land in the precise index under the keys the router
// gives a request with the same salt (kvindex.HashTokensSalted: the
// engines report each salted first block's extra_keys, which the index
// folds into its key), and under none of an unsalted request's or another
// salt's.
func TestKVEventsSaltedPrompts(t *testing.T) {
	a := startEngine(t, "a", engineOpts{encoding: "array"})
	b := startEngine(t, "b", engineOpts{encoding: "map", connect: true})
	r := startRouter(t, modelConfig("round_robin", true, a, b))
	idx := r.p.PreciseIndex(model)
	awaitEvents(t, r, a, false)
	awaitEvents(t, r, b, false)
	for i, tc := range []struct {
		owner *engineProc
		salt  string
	}{{a, "t1"}, {b, "t1"}, {a, "a salt long enough for msgpack's str8 form"}, {b, "a salt long enough for msgpack's str8 form"}} {
		plain := completionBody(text(uint64(500+i), 200), 1)
		ids := tokenize(t, tc.owner, plain)
		salted := strings.TrimSuffix(plain, "}") + fmt.Sprintf(`,"cache_salt":%q}`, tc.salt)
		post(t, tc.owner.url(), "/v1/completions", salted)
		want := kvindex.HashTokensSalted(ids, tc.salt, blockSize, nil)
		eventually(t, 5*time.Second, fmt.Sprintf("salted prompt %d indexed on %s", i, tc.owner.id), func() (bool, string) {
			got := indexHolds(idx, want)
			return got[tc.owner.id] == len(want), fmt.Sprintf("index holds %v of %d salted blocks", got, len(want))
		})
		if got := indexHolds(idx, kvindex.HashTokens(ids, blockSize, nil)); len(got) != 0 {
			t.Errorf("prompt %d: the unsalted request's keys match %v", i, got)
		}
		if got := indexHolds(idx, kvindex.HashTokensSalted(ids, "other", blockSize, nil)); len(got) != 0 {
			t.Errorf("prompt %d: another salt's keys match %v", i, got)
		}
	}
}

package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// TestKVFailureRestartWithoutTraffic: an engine restarts (empty cache) and
// gets no request for a while, so it publishes no KV event. The router must
// drop its old entries once its subscriber has reconnected, without waiting
// for the new engine's first batch: until then every request with a prefix
// the old engine held would be sent to the restarted one for a cache hit it
// no longer has. The new engine's blocks are then indexed as usual.
func TestKVFailureRestartWithoutTraffic(t *testing.T) {
	a := startEngine(t, "a", engineOpts{encoding: "array"})
	b := startEngine(t, "b", engineOpts{encoding: "map"})
	r := startRouter(t, modelConfig("round_robin", true, a, b))
	idx := r.p.PreciseIndex(model)
	if idx == nil {
		t.Fatal("no precise index")
	}
	mk := func(seed uint64) *prompt {
		body := chatBody(text(seed, 200), "restart without traffic", 1, false)
		return &prompt{path: "/v1/chat/completions", body: body, hashes: kvindex.HashTokens(tokenize(t, a, body), blockSize, nil)}
	}
	before, onB, after := mk(11), mk(12), mk(13)
	awaitEvents(t, r, a, false)
	awaitEvents(t, r, b, false)
	post(t, a.url(), before.path, before.body)
	post(t, b.url(), onB.path, onB.body)
	eventually(t, 5*time.Second, "first life indexed", func() (bool, string) {
		ga, gb := indexHolds(idx, before.hashes), indexHolds(idx, onB.hashes)
		return ga["a"] == len(before.hashes) && gb["b"] == len(onB.hashes), fmt.Sprintf("a holds %v, b holds %v", ga, gb)
	})

	a.restart()
	eventually(t, 10*time.Second, "the restarted engine's old entries dropped without a request", func() (bool, string) {
		g := indexHolds(idx, before.hashes)
		return g["a"] == 0, fmt.Sprintf("old prompt on a: %d blocks (want 0)", g["a"])
	})
	if got := indexHolds(idx, onB.hashes)["b"]; got != len(onB.hashes) {
		t.Errorf("b's entries after a's restart: %d blocks, want %d", got, len(onB.hashes))
	}

	post(t, a.url(), after.path, after.body)
	eventually(t, 10*time.Second, "the new life indexed", func() (bool, string) {
		g := indexHolds(idx, after.hashes)
		return g["a"] == len(after.hashes), fmt.Sprintf("new prompt on a: %d blocks (want %d)", g["a"], len(after.hashes))
	})
}

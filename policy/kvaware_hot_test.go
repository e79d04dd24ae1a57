package policy

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestKVAwareHotSettled: a hot prefix that has been in flight for
// HotSettle, whose holder runs a few requests above the mean (under the
// in-flight bound, so HotSpread alone leaves it alone) while an endpoint
// without the prefix is idle, grows a new replica there. Without the
// settled bound (hot_slack above the bound), before HotSettle, or when the
// endpoints without the prefix have prefill queued, the holder keeps it.
// This is the shared-system-prompt workload's stuck replica sets: each
// prompt on 3 of 8 endpoints, holders at 72 in flight, others at 45.
func TestKVAwareHotSettled(t *testing.T) {
	hashes := make([]uint64, 190)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	req := func(id string) *kvroute.Request {
		return &kvroute.Request{ID: id, PromptTokens: 6200, BlockSize: 32, BlockHashes: hashes}
	}
	// The holder at 60 in flight, three endpoints without the prefix at 50:
	// mean (210+1)/4 = 52.75, in-flight bound max(1.25 x 52.75, 52.75+4) =
	// 65.9 > 61 (HotSpread alone does not cap), settled bound 52.75+2 < 61;
	// share 1.25 x 210/4 = 65.6 < 71 requests of the prefix in flight.
	cands := func(waiting int) []kvroute.Candidate {
		c := []kvroute.Candidate{cand("holder", kvroute.Load{InFlight: 60, Running: 60}, 187, 5984)}
		for _, id := range []string{"a", "b", "c"} {
			c = append(c, cand(id, kvroute.Load{InFlight: 50, Running: 50, Waiting: waiting}, 0, 0))
		}
		return c
	}
	tests := []struct {
		name     string
		params   map[string]any
		after    time.Duration // since the prefix's first request
		waiting  int           // engine queue of the endpoints without the prefix
		replica  bool          // want a new replica (not the holder)
		wantWhy  string        // the holder's Why
		wantCred float64       // the holder's credited tokens
	}{
		{"settled, idle endpoint: new replica", nil, 6 * time.Second, 0, true, "capped: in-flight above bound", 0},
		{"not settled yet", nil, 4 * time.Second, 0, false, "", 5984},
		{"no idle endpoint", nil, 6 * time.Second, 1, false, "", 5984},
		{"without the settled bound", map[string]any{"hot_slack": 100}, 6 * time.Second, 0, false, "", 5984},
		{"hot_settle 0", map[string]any{"hot_settle": "0s"}, time.Millisecond, 0, true, "capped: in-flight above bound", 0},
	}
	for _, tt := range tests {
		k, err := NewKVAware(tt.params, 1)
		if err != nil {
			t.Fatal(err)
		}
		// 70 of the prefix's requests in flight on the holder, their
		// prefill done (first tokens), dispatched over the first second.
		warm := []kvroute.Candidate{cand("holder", kvroute.Load{}, 187, 5984)}
		for i := range 70 {
			at := epoch.Add(time.Duration(i) * 10 * time.Millisecond)
			r := req("r" + strconv.Itoa(i))
			if d := k.Pick(at, r, warm); d.Endpoint != "holder" {
				t.Fatalf("%s: warm-up pick %d went to %s (%s)", tt.name, i, d.Endpoint, d.Reason)
			}
			k.FirstToken(at, r, "holder")
		}
		d := k.Pick(epoch.Add(tt.after), req("probe"), cands(tt.waiting))
		if got := d.Endpoint != "holder"; got != tt.replica {
			t.Errorf("%s: chose %s (%s), want new replica %v", tt.name, d.Endpoint, d.Reason, tt.replica)
		}
		if got := d.Scores[0].Why; got != tt.wantWhy {
			t.Errorf("%s: holder's why = %q, want %q", tt.name, got, tt.wantWhy)
		}
		if got := part(d.Scores[0], "cached_tokens"); got != tt.wantCred {
			t.Errorf("%s: holder credited %v tokens, want %v", tt.name, got, tt.wantCred)
		}
	}
}

// TestKVAwareHotSettleBreak: the settling clock restarts when the prefix
// has no request in flight, so a prefix that comes back is not settled
// at once.
func TestKVAwareHotSettleBreak(t *testing.T) {
	k, err := NewKVAware(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	hashes := []uint64{7, 8, 9}
	r := &kvroute.Request{ID: "x", PromptTokens: 96, BlockSize: 32, BlockHashes: hashes}
	holder := []kvroute.Candidate{cand("h", kvroute.Load{}, 3, 96)}
	k.Pick(epoch, r, holder)
	if got := k.prefixInflight[9]; got.n != 1 || !got.since.Equal(epoch) {
		t.Fatalf("after one dispatch: demand %+v, want 1 since %v", got, epoch)
	}
	k.Release(epoch.Add(time.Second), r, "h")
	if got, ok := k.prefixInflight[9]; ok {
		t.Fatalf("after release: demand %+v still tracked", got)
	}
	later := epoch.Add(10 * time.Second)
	k.Pick(later, &kvroute.Request{ID: "y", PromptTokens: 96, BlockSize: 32, BlockHashes: hashes}, holder)
	k.Pick(later.Add(time.Second), &kvroute.Request{ID: "z", PromptTokens: 96, BlockSize: 32, BlockHashes: hashes}, holder)
	if got := k.prefixInflight[9]; got.n != 2 || !got.since.Equal(later) {
		t.Errorf("after the prefix came back: demand %+v, want 2 since %v", got, later)
	}
}

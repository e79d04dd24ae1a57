package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestKVAwareSpareFull: a request whose only hit is a small shared prefix
// (1k of 8k tokens) on a holder whose full cache thrashes (Evicts, with a
// horizon under ThrashHorizon) does not follow it there while endpoints
// with room idle: the holder is credited only what they cache
// (thrashing) and loses the tie among equals. With the prefix on the
// endpoints with room too, the holder keeps its credit but still loses
// ties to them. A full cache that keeps blocks longer than the horizon,
// every cache full, a hit of a quarter or more, the holder's room, or
// spare_full off leave the hit its credit, and it wins.
func TestKVAwareSpareFull(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	const others = 7
	tests := []struct {
		name         string
		params       map[string]any
		holderBlocks int // cached on the holder
		othersBlocks int // cached on the others
		holderEvicts bool
		horizon      time.Duration // the holder's
		othersEvict  bool
		full         bool // want the holder marked thrashing
		credit       int  // want the holder credited
		holderChosen bool // want it chosen every time (else never)
	}{
		{"small hit on a thrashing cache, room elsewhere", nil, 31, 0, true, 50 * time.Millisecond, false, true, 0, false},
		{"the others hold the prefix too", nil, 31, 31, true, 50 * time.Millisecond, false, true, 992, false},
		{"a full cache that keeps blocks 10s", nil, 31, 0, true, 10 * time.Second, false, false, 992, true},
		{"thrash_horizon 20s", map[string]any{"thrash_horizon": "20s"}, 31, 0, true, 10 * time.Second, false, true, 0, false},
		{"every cache full", nil, 31, 0, true, 50 * time.Millisecond, true, false, 992, true},
		{"the holder has room", nil, 31, 0, false, 0, false, false, 992, true},
		{"a quarter cached", nil, 64, 0, true, 50 * time.Millisecond, false, false, 2048, true},
		{"spare_full off", map[string]any{"spare_full": false}, 31, 0, true, 50 * time.Millisecond, false, false, 992, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := NewKVAware(tt.params, 1)
			if err != nil {
				t.Fatal(err)
			}
			holderPicks := 0
			const n = 200
			for i := range n {
				req := &kvroute.Request{ID: fmt.Sprint("r", i), PromptTokens: 8192, BlockSize: 32, BlockHashes: hashes}
				holder := cand("holder", kvroute.Load{}, tt.holderBlocks, tt.holderBlocks*32)
				holder.Evicts, holder.Horizon = tt.holderEvicts, tt.horizon
				cands := []kvroute.Candidate{holder}
				for j := range others {
					c := cand(fmt.Sprint("e", j), kvroute.Load{}, tt.othersBlocks, tt.othersBlocks*32)
					c.Evicts = tt.othersEvict
					cands = append(cands, c)
				}
				d := k.Pick(t0.Add(time.Duration(i)*time.Second), req, cands)
				if d.Index == 0 {
					holderPicks++
				}
				s := d.Scores[0]
				if full := part(s, "thrashing") == 1; full != tt.full || part(s, "cached_tokens") != float64(tt.credit) {
					t.Fatalf("holder's score %+v: want thrashing %v, %d tokens credited", s, tt.full, tt.credit)
				}
				if tt.full && s.Why == "" {
					t.Errorf("holder's score: no Why for thrashing")
				}
				k.Release(t0, req, d.Endpoint)
			}
			if want := map[bool]int{true: n, false: 0}[tt.holderChosen]; holderPicks != want {
				t.Errorf("holder chosen %d times of %d, want %d", holderPicks, n, want)
			}
		})
	}
}

// TestKVAwareTieRoom: of two tied candidates for a request neither caches a
// quarter of, the tie goes to the one whose cache the request's blocks push
// nothing out of, or, both full, to the one whose least recent block is
// older (Horizon), even with more requests in flight; with a quarter
// cached on both, or no cache full, the in-flight count decides as before.
func TestKVAwareTieRoom(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	type side struct {
		evicts   bool
		horizon  time.Duration
		inflight int
	}
	tests := []struct {
		name   string
		blocks int // cached on both
		a, b   side
		want   int    // the candidate chosen every time: 0 (a) or 1 (b)
		reason string // its reason's head
	}{
		{"both full, b keeps blocks longer", 0, side{true, 5 * time.Second, 0}, side{true, time.Minute, 1}, 1, "miss, tie broken by cache room"},
		{"both full, a keeps blocks longer", 0, side{true, time.Minute, 1}, side{true, 5 * time.Second, 0}, 0, "miss, tie broken by cache room"},
		{"a full, b has room", 0, side{true, time.Minute, 0}, side{false, 0, 1}, 1, "miss, tie broken by cache room"},
		{"a small hit on both, b keeps blocks longer", 31, side{true, 5 * time.Second, 0}, side{true, time.Minute, 1}, 1, "affinity, tie broken by cache room"},
		{"a quarter cached on both: fewer in flight", 64, side{true, 5 * time.Second, 0}, side{true, time.Minute, 1}, 0, "affinity, tie broken by load"},
		{"neither full: fewer in flight", 0, side{false, 0, 1}, side{false, 0, 0}, 1, "miss, least loaded of two tied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := NewKVAware(map[string]any{"spare_full": false}, 1)
			if err != nil {
				t.Fatal(err)
			}
			const n = 50
			for i := range n {
				req := &kvroute.Request{ID: fmt.Sprint("r", i), PromptTokens: 8192, BlockSize: 32, BlockHashes: hashes}
				var cands []kvroute.Candidate
				for j, s := range []side{tt.a, tt.b} {
					c := cand(fmt.Sprint("e", j), kvroute.Load{InFlight: s.inflight}, tt.blocks, tt.blocks*32)
					c.Evicts, c.Horizon = s.evicts, s.horizon
					cands = append(cands, c)
				}
				d := k.Pick(t0.Add(time.Duration(i)*time.Second), req, cands)
				if d.Index != tt.want {
					t.Fatalf("decision %d: chose %q (%s), want e%d; scores %+v", i, d.Endpoint, d.Reason, tt.want, d.Scores)
				}
				if !strings.HasPrefix(d.Reason, tt.reason+":") {
					t.Fatalf("decision %d: reason %q, want %q", i, d.Reason, tt.reason)
				}
				k.Release(t0, req, d.Endpoint)
			}
		})
	}
}

package policy

import (
	"fmt"
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

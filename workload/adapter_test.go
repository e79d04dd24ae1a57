package workload

import (
	"slices"
	"testing"
)

// TestBlockHashesAdapter: the same prompt for two adapters, or for an
// adapter and the base model, has no block hash in common, in every prompt
// form (segments, tokens, text, and AssignHashIDs' partial last block); for
// the same adapter the hashes are equal. The oracle sees no hit across
// adapters.
func TestBlockHashesAdapter(t *testing.T) {
	segs := []Segment{{Key: 7, Len: 100}, {Key: 8, Len: 37}}
	forms := map[string]Request{
		"segments": {PromptLen: 137, Segments: segs},
		"tokens":   {PromptLen: 137, Tokens: AppendSegmentTokens(AppendSegmentTokens(nil, segs[0]), segs[1])},
		"text":     {PromptLen: 137, Text: (&Request{PromptLen: 137, Segments: segs}).PromptText()},
	}
	for name, r := range forms {
		t.Run(name, func(t *testing.T) {
			seen := map[uint64]string{}
			for _, adapter := range []string{"", "a", "b"} {
				r := r
				r.Adapter = adapter
				hs := r.BlockHashes(16, nil)
				if len(hs) == 0 {
					t.Fatal("no blocks")
				}
				if again := r.BlockHashes(16, nil); !slices.Equal(hs, again) {
					t.Errorf("adapter %q: hashes differ between calls", adapter)
				}
				for _, h := range hs {
					if other, ok := seen[h]; ok {
						t.Fatalf("adapter %q shares block %x with adapter %q", adapter, h, other)
					}
					seen[h] = adapter
				}
			}
		})
	}
	// A prompt shorter than one trace block is one partial block, hashed
	// from the chain's root.
	reqs := []Request{
		{PromptLen: 100, Segments: segs[:1]},
		{PromptLen: 100, Segments: segs[:1], Adapter: "a"},
		{PromptLen: 100, Segments: segs[:1], Adapter: "a"},
	}
	AssignHashIDs(reqs)
	if reqs[0].HashIDs[0] == reqs[1].HashIDs[0] || reqs[1].HashIDs[0] != reqs[2].HashIDs[0] {
		t.Errorf("hash ids %v, %v, %v: want the adapter's apart from the base model's, and equal for one adapter",
			reqs[0].HashIDs, reqs[1].HashIDs, reqs[2].HashIDs)
	}
	o := NewOracle(16)
	for _, adapter := range []string{"", "a", "b", "a"} {
		o.Observe(&Request{PromptLen: 137, Segments: segs, Adapter: adapter}, nil)
	}
	if got, want := o.CachedTokens(), int64(128); got != want {
		t.Errorf("oracle cached %d tokens, want %d (the second request of adapter a only)", got, want)
	}
}

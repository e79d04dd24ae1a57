package signals

import (
	"context"
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/kvindex"
)

// loraEvent is a BlockStored event as vLLM's msgspec encoder writes it
// for blocks of a LoRA adapter's request, in the array (array_like) or
// map form, its fields in vLLM's order: block_hashes, parent_block_hash,
// token_ids, block_size, lora_id, medium, lora_name, extra_keys (left out
// when extra is nil: an older vLLM, or a trailing default omitted).
func loraEvent(mapForm bool, hashes []uint64, parent any, tokens []uint32, lora string, extra []any) any {
	names := []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	vals := []any{hashes, parent, tokens, 16, 7, "GPU", lora}
	if extra != nil {
		names, vals = append(names, "extra_keys"), append(vals, extra)
	}
	if !mapForm {
		return append([]any{"BlockStored"}, vals...)
	}
	m := map[string]any{"type": "BlockStored"}
	for i, n := range names {
		m[n] = vals[i]
	}
	return m
}

// TestSubscriberLoRAKeys: blocks an engine stored for a LoRA adapter's
// request, as vLLM publishes them (msgpack frames, array and map events;
// with extra_keys holding (lora_name[, cache_salt]) per block, the newer
// form, or lora_name alone, the older), get in the precise index the keys
// kvindex.HashTokensKeyed gives the same request: every block matches,
// across two events (the second continuing the first by its parent).
// The base model's request, another adapter's, and (with a salt) the
// adapter's unsalted request match none of them.
func TestSubscriberLoRAKeys(t *testing.T) {
	const bs = 16
	tokens := make([]uint32, 4*bs)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	for _, tc := range []struct {
		name  string
		salt  string
		extra bool // extra_keys sent (else lora_name alone)
	}{
		{"extra_keys", "", true},
		{"extra_keys salted", "tenant-a", true},
		{"lora_name only", "", false},
	} {
		for _, mapForm := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/map=%v", tc.name, mapForm), func(t *testing.T) {
				const lora = "sql-lora"
				entry := func(i int) any {
					if i == 0 && tc.salt != "" {
						return []any{lora, tc.salt}
					}
					return []any{lora}
				}
				var first, second []any
				if tc.extra {
					first, second = []any{entry(0), entry(1)}, []any{entry(2), entry(3)}
				}
				batch := []any{1.789e9, []any{
					loraEvent(mapForm, []uint64{11, 12}, nil, tokens[:2*bs], lora, first),
					loraEvent(mapForm, []uint64{13, 14}, uint64(12), tokens[2*bs:], lora, second),
				}, 0}
				payload, err := msgpack.Marshal(batch)
				if err != nil {
					t.Fatal(err)
				}
				idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: bs})
				s, err := NewSubscriber(SubscriberConfig{Endpoint: "e", Address: "tcp://127.0.0.1:1", Sink: idx})
				if err != nil {
					t.Fatal(err)
				}
				s.handle(context.Background(), 0, payload)
				if st := s.Status(); st.DecodeErrors != 0 || st.Events != 2 {
					t.Fatalf("status %+v, want 2 events decoded", st)
				}
				match := func(lora, salt string) int {
					hits := idx.Match(kvindex.HashTokensKeyed(tokens, lora, salt, bs, nil), nil)
					if len(hits) == 0 {
						return 0
					}
					return hits[0].Blocks
				}
				if got := match(lora, tc.salt); got != 4 {
					t.Errorf("the adapter's request matches %d blocks, want 4", got)
				}
				if got := match("", tc.salt); got != 0 {
					t.Errorf("the base model's request matches %d blocks, want 0", got)
				}
				if got := match("chat-lora", tc.salt); got != 0 {
					t.Errorf("another adapter's request matches %d blocks, want 0", got)
				}
				if tc.salt != "" {
					if got := match(lora, ""); got != 0 {
						t.Errorf("the adapter's unsalted request matches %d blocks, want 0", got)
					}
				}
			})
		}
	}
}

package signals

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// b concatenates hex pieces (spaces ignored) into bytes.
func b(t testing.TB, pieces ...string) []byte {
	t.Helper()
	var out []byte
	for _, p := range pieces {
		x, err := hex.DecodeString(strings.ReplaceAll(p, " ", ""))
		if err != nil {
			t.Fatalf("bad hex %q: %v", p, err)
		}
		out = append(out, x...)
	}
	return out
}

// s is a msgpack fixstr.
func s(str string) string {
	return hex.EncodeToString(append([]byte{0xa0 | byte(len(str))}, str...))
}

// handBuilt are msgpack payloads written byte by byte from the msgpack spec
// and protocols.md section 2, with the batches they must decode to.
func handBuilt(t testing.TB) []struct {
	name    string
	payload []byte
	want    EventBatch
} {
	sha := "7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf" // sha256 test vector b0
	return []struct {
		name    string
		payload []byte
		want    EventBatch
	}{
		{
			// vLLM 0.9.0: [ts, events], positional events without medium.
			name: "array-v0.9.0",
			payload: b(t,
				"92", "cb 3ff8000000000000", // [1.5,
				"93",                                                                   // [ 3 events
				"96", s("BlockStored"), "92 01 02", "c0", "94 01 02 03 04", "02", "c0", // [tag, [1,2], nil, [1,2,3,4], 2, nil]
				"92", s("BlockRemoved"), "91 01", // [tag, [1]]
				"91", "da 0010", "416c6c426c6f636b73436c6561726564", // ["AllBlocksCleared"] as str16
			),
			want: EventBatch{TS: 1.5, Events: []KVEvent{
				{Kind: EventBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},
				{Kind: EventBlockRemoved, BlockHashes: []uint64{1}},
				{Kind: EventAllBlocksCleared},
			}},
		},
		{
			// vLLM 0.26: map events in a positional batch with dp rank, a
			// uint64 hash >= 2^63, an unknown future key.
			name: "map-v0.26",
			payload: b(t,
				"93", "cb 41daa8dbe0359fe7", // [1789095808.8378847,
				"91", "8d", // [{13 entries
				s("type"), s("BlockStored"),
				s("block_hashes"), "91 cf dab89baa7b5857c0",
				s("parent_block_hash"), "05",
				s("token_ids"), "92 07 cd 0100", // [7, 256]
				s("block_size"), "02",
				s("lora_id"), "c0",
				s("medium"), s("GPU"),
				s("lora_name"), "c0",
				s("extra_keys"), "91 c0",
				s("group_idx"), "00",
				s("kv_cache_spec_kind"), s("full_attention"),
				"ac", hex.EncodeToString([]byte("future_field")), "92 01 02",
				s("kv_cache_spec_sliding_window"), "c0",
				"00", // dp rank 0]
			),
			want: EventBatch{TS: 1789095808.8378847, HasDPRank: true, Events: []KVEvent{
				{Kind: EventBlockStored, BlockHashes: []uint64{15760518052499183552}, Parent: 5, HasParent: true,
					TokenIDs: []uint32{7, 256}, BlockSize: 2, Medium: "GPU", ExtraKeys: []uint64{0}, SpecKind: "full_attention"},
			}},
		},
		{
			// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 32-byte digests; CPU
			// medium; a LoRA; an extra key; two unknown trailing fields; a
			// negative (Python hash) parent.
			name: "array-bytes-hashes",
			payload: b(t,
				"93", "cb 3ff8000000000000", "92",
				"9e", s("BlockStored"), // 13 fields after the tag
				"91 c4 20", sha, // [digest]
				"d3 fffffffffffffffe", // parent -2
				"91 2a",               // [42]
				"01",                  // block_size 1
				"03",                  // lora_id 3
				s("CPU"),
				s("sql"),
				"91 92 a1 78 01", // extra_keys [["x", 1]]
				"01",             // group_idx 1
				s("sliding_window"),
				"cd 1000", // 4096
				"c0", "a3 6e6577",
				"93", s("BlockRemoved"), "91 c4 20", sha, s("CPU"),
				"07", // dp rank 7]
			),
			want: EventBatch{TS: 1.5, DPRank: 7, HasDPRank: true, Events: []KVEvent{
				{Kind: EventBlockStored, BlockHashes: []uint64{1403909460543360175}, Parent: 0xfffffffffffffffe, HasParent: true,
					TokenIDs: []uint32{42}, BlockSize: 1, LoRAID: 3, HasLoRAID: true, Medium: "CPU", LoRAName: "sql",
					ExtraKeys: []uint64{xxh3.Hash(b(t, "92 a1 78 01"))}, GroupIdx: 1, SpecKind: "sliding_window", SlidingWindow: 4096},
				{Kind: EventBlockRemoved, BlockHashes: []uint64{1403909460543360175}, Medium: "CPU"},
			}},
		},
		{
			// A possible future form: the batch itself as a map; an unknown
			// event type is kept as EventUnknown.
			name: "map-batch",
			payload: b(t,
				"83", s("ts"), "cb 3ff8000000000000",
				s("events"), "91", "82", s("type"), s("Hibernate"), s("x"), "01",
				"b2", hex.EncodeToString([]byte("data_parallel_rank")), "c0",
			),
			want: EventBatch{TS: 1.5, Events: []KVEvent{{Kind: EventUnknown}}},
		},
	}
}

func normalize(b EventBatch) EventBatch {
	for i := range b.Events {
		ev := &b.Events[i]
		if len(ev.BlockHashes) == 0 {
			ev.BlockHashes = nil
		}
		if len(ev.TokenIDs) == 0 {
			ev.TokenIDs = nil
		}
	}
	if len(b.Events) == 0 {
		b.Events = nil
	}
	return b
}

func TestDecodeHandBuilt(t *testing.T) {
	dec := NewEventDecoder()
	var got EventBatch
	for _, tt := range handBuilt(t) {
		t.Run(tt.name, func(t *testing.T) {
			// Decode twice into the same batch to exercise buffer reuse.
			for round := 0; round < 2; round++ {
				if err := dec.Decode(tt.payload, &got); err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if g := normalize(got); !reflect.DeepEqual(g, normalize(tt.want)) {
					t.Fatalf("round %d:\n got %+v\nwant %+v", round, g, tt.want)
				}
			}
		})
	}
}

// fixtures are the batches behind testdata/*.msgpack.
func fixtures() []struct {
	file string
	enc  EventEncoding
	b    EventBatch
} {
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	// sha256 test vectors from protocols.md section 3, as int64.
	h := []uint64{1403909460543360175, 1643945449041937783, 17267691262617277681}
	stored := KVEvent{Kind: EventBlockStored, BlockHashes: h, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}
	cont := KVEvent{Kind: EventBlockStored, BlockHashes: []uint64{99}, Parent: h[2], HasParent: true, TokenIDs: toks[:16],
		BlockSize: 16, Medium: "GPU", ExtraKeys: []uint64{0}, SpecKind: "full_attention"}
	removed := KVEvent{Kind: EventBlockRemoved, BlockHashes: h[1:], Medium: "GPU"}
	offload := KVEvent{Kind: EventBlockStored, BlockHashes: h[:1], TokenIDs: toks[:16], BlockSize: 16, Medium: "CPU", GroupIdx: 1}
	batch := EventBatch{TS: 1789095808.8378847, HasDPRank: true, Events: []KVEvent{stored, cont, removed, offload, {Kind: EventAllBlocksCleared}}}
	return []struct {
		file string
		enc  EventEncoding
		b    EventBatch
	}{
		{"kvevents_array.msgpack", EventEncoding{}, batch},
		{"kvevents_map.msgpack", EventEncoding{MapEvents: true}, batch},
		{"kvevents_array_bytes.msgpack", EventEncoding{BytesHashes: true}, batch},
		{"kvevents_map_batch.msgpack", EventEncoding{MapEvents: true, MapBatch: true}, batch},
	}
}

// TestEventFixtures checks the committed payloads: the encoder reproduces
// them byte for byte (go test -update rewrites them) and they decode to the
// batches they were built from.
func TestEventFixtures(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.file, func(t *testing.T) {
			enc, err := EncodeEventBatch(nil, &f.b, f.enc)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", f.file)
			if *update {
				if err := os.WriteFile(path, enc, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(file, enc) {
				t.Fatalf("encoder output differs from %s:\n got %x\nwant %x", path, enc, file)
			}
			got, err := DecodeEventBatch(file)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(got), normalize(f.b)) {
				t.Fatalf("decoded\n got %+v\nwant %+v", got, f.b)
			}
		})
	}
}

// TestEncodeMatchesHandBuilt checks the encoder against the hand-built
// bytes where the layouts coincide.
func TestEncodeMatchesHandBuilt(t *testing.T) {
	b0 := EventBatch{TS: 1.5, Events: []KVEvent{
		{Kind: EventBlockRemoved, BlockHashes: []uint64{1}},
		{Kind: EventAllBlocksCleared},
	}}
	got, err := EncodeEventBatch(nil, &b0, EventEncoding{})
	if err != nil {
		t.Fatal(err)
	}
	want := b(t, "92 cb 3ff8000000000000 92", "93", s("BlockRemoved"), "91 01 c0", "91", s("AllBlocksCleared"))
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	// Map events with dp rank, uint64 hash.
	b1 := EventBatch{TS: 1.5, HasDPRank: true, Events: []KVEvent{{Kind: EventBlockRemoved, BlockHashes: []uint64{15760518052499183552}, Medium: "GPU"}}}
	got, err = EncodeEventBatch(nil, &b1, EventEncoding{MapEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	want = b(t, "93 cb 3ff8000000000000 91", "83", s("type"), s("BlockRemoved"), s("block_hashes"), "91 cf dab89baa7b5857c0", s("medium"), s("GPU"), "00")
	if !bytes.Equal(got, want) {
		t.Fatalf("map events:\n got %x\nwant %x", got, want)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty", nil, "EOF"},
		{"not a batch", b(t, "05"), "want an array or a map"},
		{"short batch", b(t, "91 cb 3ff8000000000000"), "at least 2"},
		{"huge array", b(t, "92 cb 3ff8000000000000 dd ffffffff"), "elements in"},
		{"bad token", b(t, "92 cb 3ff8000000000000 91 94", s("BlockStored"), "91 01 c0 91 a1 78"), "token id"},
		{"negative token", b(t, "92 cb 3ff8000000000000 91 94", s("BlockStored"), "91 01 c0 91 ff"), "out of range"},
		{"nil hash", b(t, "92 cb 3ff8000000000000 91 92", s("BlockRemoved"), "91 c0"), "nil block hash"},
		{"trailing", b(t, "92 cb 3ff8000000000000 90 00"), "trailing"},
		{"truncated", b(t, "92 cb 3ff8000000000000 91 92", s("BlockRemoved"), "92 01"), "elements in"},
		{"truncated float", b(t, "92 cb 3ff8"), "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeEventBatch(tt.payload)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrEventFormat) {
				t.Fatalf("err = %v, want ErrEventFormat containing %q", err, tt.want)
			}
		})
	}
}

func FuzzDecodeEventBatch(f *testing.F) {
	for _, h := range handBuilt(f) {
		f.Add(h.payload)
	}
	for _, fx := range fixtures() {
		p, err := EncodeEventBatch(nil, &fx.b, fx.enc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	dec := NewEventDecoder()
	var batch EventBatch
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := dec.Decode(payload, &batch); err != nil {
			return
		}
		// Whatever decodes re-encodes and decodes to the same events
		// (extra keys excepted: only their hashes survive).
		for i := range batch.Events {
			batch.Events[i].ExtraKeys = nil
			if batch.Events[i].Kind == EventUnknown {
				return
			}
		}
		p, err := EncodeEventBatch(nil, &batch, EventEncoding{MapEvents: true})
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeEventBatch(p)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		for i := range again.Events {
			again.Events[i].ExtraKeys = nil
		}
		if !reflect.DeepEqual(normalize(again), normalize(batch)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again, batch)
		}
	})
}

func BenchmarkDecodeEventBatch(b *testing.B) {
	// One step's worth: 8 BlockStored of 16 blocks of 16 tokens.
	toks := make([]uint32, 256)
	for i := range toks {
		toks[i] = uint32(100000 + i)
	}
	hs := make([]uint64, 16)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	var batch EventBatch
	for i := 0; i < 8; i++ {
		batch.Events = append(batch.Events, KVEvent{Kind: EventBlockStored, BlockHashes: hs, TokenIDs: toks, BlockSize: 16, Medium: "GPU", Parent: 1, HasParent: true})
	}
	for _, enc := range []EventEncoding{{}, {MapEvents: true}} {
		name := "array"
		if enc.MapEvents {
			name = "map"
		}
		b.Run(name, func(b *testing.B) {
			p, err := EncodeEventBatch(nil, &batch, enc)
			if err != nil {
				b.Fatal(err)
			}
			dec := NewEventDecoder()
			var out EventBatch
			b.ReportAllocs()
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if err := dec.Decode(p, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*8*16)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

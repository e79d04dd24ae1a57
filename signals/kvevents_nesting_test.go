package signals

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestDecodeDeepNesting: values the decoder skips (a batch's trailing
// elements, unknown event fields, extra_keys entries) may nest arrays and
// maps millions deep in a payload of a few megabytes. Skipping them must
// not recurse once per level: that overflowed the goroutine stack, a fatal
// error that took the whole router down on one malformed (or hostile)
// batch.
func TestDecodeDeepNesting(t *testing.T) {
	const depth = 10_000_000
	nested := func(open byte) []byte { // open^depth nil
		return append(bytes.Repeat([]byte{open}, depth), 0xc0)
	}
	ts := []byte{0xcb, 0, 0, 0, 0, 0, 0, 0, 0}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name    string
		payload []byte
	}{
		// [ts, [], 0, [[[...]]]]: a fourth batch element.
		{"batch element", cat([]byte{0x94}, ts, []byte{0x90, 0x00}, nested(0x91))},
		// [ts, [["BlockRemoved", [], "GPU", 0, [[[...]]]]]]: a fifth event field.
		{"event field", cat([]byte{0x92}, ts, []byte{0x91, 0x95, 0xac}, []byte("BlockRemoved"),
			[]byte{0x90, 0xa3}, []byte("GPU"), []byte{0x00}, nested(0x91))},
		// {"ts": ts, "x": {"": {"": ...}}}: an unknown batch key, nested maps.
		{"map key", cat([]byte{0x82, 0xa2}, []byte("ts"), ts, []byte{0xa1, 'x'},
			bytes.Repeat([]byte{0x81, 0xa0}, depth/2), []byte{0xc0})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := DecodeEventBatch(tc.payload)
			if err != nil {
				t.Fatalf("err = %v, want nil (a skipped value)", err)
			}
			if len(b.Events) > 1 {
				t.Fatalf("events %+v", b.Events)
			}
			// Cut short, the same payload is an error, not a crash.
			if _, err := DecodeEventBatch(tc.payload[:len(tc.payload)-1]); err == nil {
				t.Fatal("truncated payload: err = nil")
			}
		})
	}
}

// FuzzValueLen checks valueLen against msgpack's own Skip on shallow values:
// both accept the same values and agree on their length.
func FuzzValueLen(f *testing.F) {
	for _, v := range []any{nil, true, 1, -1, 1 << 40, 1.5, float32(2.5), "str", []byte{1, 2}, []any{1, "a", []any{nil}},
		map[string]any{"a": 1, "b": []any{2}}, msgpack.RawMessage{0xd4, 1, 2}, msgpack.RawMessage{0xc7, 2, 5, 1, 2}} {
		p, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > 1<<16 { // msgpack's Skip recurses: keep it shallow
			return
		}
		got, gotErr := valueLen(p)
		r := bytes.NewReader(p)
		wantErr := msgpack.NewDecoder(r).Skip()
		want := len(p) - r.Len()
		if (gotErr == nil) != (wantErr == nil) || (gotErr == nil && got != want) {
			t.Fatalf("valueLen(%x) = %d, %v; msgpack Skip: %d, %v", p, got, gotErr, want, wantErr)
		}
	})
}

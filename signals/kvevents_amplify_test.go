package signals

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestDecodeEventAmplification: a decoded event (a KVEvent, 184 bytes)
// must not cost many times the bytes it took in the payload. Every event an
// engine publishes names its type ("BlockStored" is the shortest name: 13
// bytes at the least), but one-byte events ({} or [""]: an unknown type)
// decoded into a KVEvent each: a 64 MiB frame (the default MaxFrameSize)
// of them made the subscriber allocate some 12 GiB (more with the slice's
// growth), enough to take the router down.
func TestDecodeEventAmplification(t *testing.T) {
	const n = 1 << 16
	for _, tt := range []struct {
		name  string
		event []byte
	}{
		{"empty maps", []byte{0x80}},                                // {}
		{"empty tags", []byte{0x91, 0xa0}},                          // [""]
		{"short tags", []byte{0x91, 0xa1, 'X'}},                     // ["X"]
		{"empty arrays", []byte{0x90}},                              // []: an error (no tag), after n events
		{"nil tags", []byte{0x81, 0xa0, 0xc0}},                      // {"": nil}
		{"type only", []byte{0x81, 0xa4, 't', 'y', 'p', 'e', 0xa0}}, // {"type": ""}
	} {
		t.Run(tt.name, func(t *testing.T) {
			var p bytes.Buffer
			p.Write([]byte{0x92, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}) // [1.5,
			p.Write([]byte{0xdd, 0, 1, 0, 0})                         // [n events
			p.Write(bytes.Repeat(tt.event, n))
			var b EventBatch
			err := NewEventDecoder().Decode(p.Bytes(), &b)
			kept := cap(b.Events) * int(unsafe.Sizeof(KVEvent{}))
			if kept > 16*p.Len() {
				t.Errorf("%d bytes of payload decoded into %d events (%d bytes of KVEvents; err %v)", p.Len(), len(b.Events), kept, err)
			}
		})
	}
}

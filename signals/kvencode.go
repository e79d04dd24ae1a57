package signals

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"
)

// EventEncoding selects how EncodeEventBatch lays a batch out, following
// vLLM's history (protocols.md section 2).
type EventEncoding struct {
	// MapEvents encodes each event as a map with a "type" key (vLLM 0.26+);
	// false encodes positional arrays with the tag first (vLLM 0.9 to 0.25).
	MapEvents bool
	// MapBatch encodes the outer batch as a map {ts, events,
	// data_parallel_rank} instead of the positional [ts, events, dp_rank].
	MapBatch bool
	// BytesHashes sends block hashes as 32-byte digests whose last 8 bytes
	// are the hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) instead of ints.
	BytesHashes bool
}

// EncodeEventBatch appends the msgpack payload of b to dst the way vLLM's
// msgspec encoder lays it out (omit_defaults: trailing optional fields with
// default values are left out). Extra keys cannot be recovered from their
// decoded hashes: a non-zero entry is encoded as the 1-tuple [entry]. It
// lets the emulator and tests publish what the Subscriber reads.
func EncodeEventBatch(dst []byte, b *EventBatch, enc EventEncoding) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(buf)
	w := &eventWriter{e: e, enc: enc}
	if enc.MapBatch {
		n := 2
		if b.HasDPRank {
			n = 3
		}
		w.mapLen(n)
		w.str("ts")
		w.err1(e.EncodeFloat64(b.TS))
		w.str("events")
	} else {
		n := 2
		if b.HasDPRank {
			n = 3
		}
		w.arrayLen(n)
		w.err1(e.EncodeFloat64(b.TS))
	}
	w.arrayLen(len(b.Events))
	for i := range b.Events {
		w.event(&b.Events[i])
	}
	if b.HasDPRank {
		if enc.MapBatch {
			w.str("data_parallel_rank")
		}
		w.err1(e.EncodeInt(int64(b.DPRank)))
	}
	if w.err != nil {
		return dst, fmt.Errorf("encode kv event batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

type eventWriter struct {
	e   *msgpack.Encoder
	enc EventEncoding
	err error
}

func (w *eventWriter) err1(err error) {
	if w.err == nil {
		w.err = err
	}
}
func (w *eventWriter) str(s string)   { w.err1(w.e.EncodeString(s)) }
func (w *eventWriter) arrayLen(n int) { w.err1(w.e.EncodeArrayLen(n)) }
func (w *eventWriter) mapLen(n int)   { w.err1(w.e.EncodeMapLen(n)) }
func (w *eventWriter) nilv()          { w.err1(w.e.EncodeNil()) }

func (w *eventWriter) hash(h uint64) {
	if !w.enc.BytesHashes {
		w.err1(w.e.EncodeUint(h))
		return
	}
	var d [32]byte
	// A digest-like filler; only the last 8 bytes carry the hash.
	binary.BigEndian.PutUint64(d[0:], xxh3.HashString("d0")^h)
	binary.BigEndian.PutUint64(d[8:], xxh3.HashString("d1")^h)
	binary.BigEndian.PutUint64(d[16:], xxh3.HashString("d2")^h)
	binary.BigEndian.PutUint64(d[24:], h)
	w.err1(w.e.EncodeBytes(d[:]))
}

func (w *eventWriter) optString(s string) {
	if s == "" {
		w.nilv()
	} else {
		w.str(s)
	}
}

// event writes one event.
func (w *eventWriter) event(ev *KVEvent) {
	var names []int
	var tag string
	switch ev.Kind {
	case EventBlockStored:
		tag, names = "BlockStored", storedFields
	case EventBlockRemoved:
		tag, names = "BlockRemoved", removedFields
	case EventAllBlocksCleared:
		tag = "AllBlocksCleared"
	default:
		w.err1(fmt.Errorf("cannot encode event kind %d", ev.Kind))
		return
	}
	// Required fields are always sent; optional ones (default None) up to
	// the last one set in positional form, only those set in map form.
	required, optional := 0, []bool(nil)
	switch ev.Kind {
	case EventBlockStored:
		required = 7 // block_hashes .. lora_name
		optional = []bool{ev.ExtraKeys != nil, ev.GroupIdx != 0 || ev.SpecKind != "", ev.SpecKind != "", ev.SlidingWindow != 0}
	case EventBlockRemoved:
		required = 2
		optional = []bool{ev.GroupIdx != 0}
	}
	send := make([]bool, 0, len(names))
	for i := range names {
		send = append(send, i < required || optional[i-required])
	}
	if !w.enc.MapEvents {
		last := required
		for i := required; i < len(names); i++ {
			if send[i] {
				last = i + 1
			}
		}
		w.arrayLen(1 + last)
		w.str(tag)
		for i := 0; i < last; i++ {
			w.field(ev, names[i])
		}
		return
	}
	n := 1
	for _, s := range send {
		if s {
			n++
		}
	}
	w.mapLen(n)
	w.str("type")
	w.str(tag)
	for i, id := range names {
		if send[i] {
			w.str(fieldNames[id])
			w.field(ev, id)
		}
	}
}

func (w *eventWriter) field(ev *KVEvent, id int) {
	e := w.e
	switch id {
	case fBlockHashes:
		w.arrayLen(len(ev.BlockHashes))
		for _, h := range ev.BlockHashes {
			w.hash(h)
		}
	case fParent:
		if ev.HasParent {
			w.hash(ev.Parent)
		} else {
			w.nilv()
		}
	case fTokenIDs:
		w.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			w.err1(e.EncodeUint(uint64(t)))
		}
	case fBlockSize:
		w.err1(e.EncodeInt(int64(ev.BlockSize)))
	case fLoRAID:
		if ev.HasLoRAID {
			w.err1(e.EncodeInt(ev.LoRAID))
		} else {
			w.nilv()
		}
	case fMedium:
		w.optString(ev.Medium)
	case fLoRAName:
		w.optString(ev.LoRAName)
	case fExtraKeys:
		if ev.ExtraKeys == nil {
			w.nilv()
			return
		}
		w.arrayLen(len(ev.ExtraKeys))
		for _, k := range ev.ExtraKeys {
			if k == 0 {
				w.nilv()
			} else {
				w.arrayLen(1)
				w.err1(e.EncodeUint(k))
			}
		}
	case fGroupIdx:
		w.err1(e.EncodeInt(int64(ev.GroupIdx)))
	case fSpecKind:
		w.optString(ev.SpecKind)
	case fSlidingWindow:
		if ev.SlidingWindow == 0 {
			w.nilv()
		} else {
			w.err1(e.EncodeInt(int64(ev.SlidingWindow)))
		}
	}
}

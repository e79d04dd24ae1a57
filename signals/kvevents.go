package signals

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
	"github.com/zeebo/xxh3"
)

// EventKind is the type of a vLLM KV-cache event.
type EventKind uint8

// Event kinds, named as vLLM tags them.
const (
	EventUnknown EventKind = iota // a tag this decoder does not know; skipped
	EventBlockStored
	EventBlockRemoved
	EventAllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case EventBlockStored:
		return "BlockStored"
	case EventBlockRemoved:
		return "BlockRemoved"
	case EventAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// KVEvent is one decoded KV-cache event (vllm/distributed/kv_events.py).
// Engine block hashes are reduced to 64 bits: integers as sent (vLLM sends
// the low 64 bits of the sha256 digest), byte digests of 8, 16 or 32 bytes
// by their last 8 bytes read big-endian (the same value the integer form
// would carry), shorter byte strings by their big-endian value, other byte
// strings by XXH3.
type KVEvent struct {
	Kind        EventKind
	BlockHashes []uint64
	// Parent is the engine hash of the block before BlockHashes[0];
	// HasParent is false for the first block of a sequence.
	Parent    uint64
	HasParent bool
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is the deprecated integer adapter id (HasLoRAID false = None).
	LoRAID    int64
	HasLoRAID bool
	// Medium is "GPU", "CPU", ... ("" = not sent).
	Medium   string
	LoRAName string
	// ExtraKeys holds one entry per block when the engine sent extra_keys:
	// 0 for None, else a non-zero hash of the entry's msgpack bytes.
	ExtraKeys []uint64
	// GroupIdx is the KV cache group (0 when not sent).
	GroupIdx      int
	SpecKind      string
	SlidingWindow int
}

// EventBatch is one published batch (one engine step).
type EventBatch struct {
	TS     float64 // engine wall clock, seconds since the epoch
	Events []KVEvent
	// DPRank is the data-parallel rank; HasDPRank is false when not sent.
	DPRank    int
	HasDPRank bool
}

// EventDecoder decodes vLLM KV-event batch payloads in both encodings:
// positional arrays (vLLM 0.9 to 0.25, SGLang) and map-encoded events (vLLM
// 0.26+), with the outer batch as an array or a map. Trailing fields may be
// missing or extra. An EventDecoder reuses its buffers and those of the
// batch it fills; it is not safe for concurrent use.
type EventDecoder struct {
	r       bytes.Reader
	d       *msgpack.Decoder
	buf     []byte
	payload []byte // being decoded; r reads it
}

// NewEventDecoder returns a decoder.
func NewEventDecoder() *EventDecoder {
	dec := &EventDecoder{}
	dec.d = msgpack.NewDecoder(&dec.r)
	return dec
}

// DecodeEventBatch decodes one payload with a fresh decoder.
func DecodeEventBatch(payload []byte) (EventBatch, error) {
	var b EventBatch
	err := NewEventDecoder().Decode(payload, &b)
	return b, err
}

// ErrEventFormat wraps every decoding error.
var ErrEventFormat = errors.New("kv event batch")

// Decode decodes payload into b, reusing b's slices.
func (dec *EventDecoder) Decode(payload []byte, b *EventBatch) (err error) {
	dec.payload = payload
	dec.r.Reset(payload)
	dec.d.Reset(&dec.r)
	events := b.Events[:0]
	*b = EventBatch{}
	b.Events = events
	if err := dec.batch(b); err != nil {
		return fmt.Errorf("%w: %w", ErrEventFormat, err)
	}
	if dec.r.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrEventFormat, dec.r.Len())
	}
	return nil
}

func (dec *EventDecoder) peek() (byte, error) { return dec.d.PeekCode() }

// arrayLen decodes an array header; nil is -1. Lengths beyond the bytes left
// are rejected before anything is allocated.
func (dec *EventDecoder) arrayLen() (int, error) {
	n, err := dec.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > dec.r.Len() {
		return 0, fmt.Errorf("array of %d elements in %d bytes", n, dec.r.Len())
	}
	return n, nil
}

func (dec *EventDecoder) mapLen() (int, error) {
	n, err := dec.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if 2*n > dec.r.Len() {
		return 0, fmt.Errorf("map of %d entries in %d bytes", n, dec.r.Len())
	}
	return n, nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isStr(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBin(c byte) bool {
	return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) ||
		(c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

// valueLen returns the length in bytes of the msgpack value starting at p.
// It walks nested arrays and maps with a counter, not recursion: a payload
// of millions of nested one-element arrays (msgpack's own Skip and
// DecodeRaw recurse once per level) would otherwise overflow the goroutine
// stack, a fatal error that no recover catches, and take the router down.
func valueLen(p []byte) (int, error) {
	off, pending := 0, 1 // pending: values still to skip
	for pending > 0 {
		if off >= len(p) {
			return 0, io.ErrUnexpectedEOF
		}
		pending--
		c := p[off]
		// head: bytes of the header, including c; n: length field (bytes
		// of a string, bin or ext body, or elements of a container).
		head, n, items := 1, uint64(0), uint64(0)
		switch {
		case c <= 0x7f || c >= 0xe0 || c == msgpcode.Nil || c == msgpcode.False || c == msgpcode.True:
		case msgpcode.IsFixedMap(c):
			items = 2 * uint64(c&0x0f)
		case msgpcode.IsFixedArray(c):
			items = uint64(c & 0x0f)
		case msgpcode.IsFixedString(c):
			n = uint64(c & 0x1f)
		default:
			var lenBytes int
			switch c {
			case msgpcode.Uint8, msgpcode.Int8:
				head = 2
			case msgpcode.Uint16, msgpcode.Int16, msgpcode.FixExt1:
				head = 3
			case msgpcode.FixExt2:
				head = 4
			case msgpcode.Float, msgpcode.Uint32, msgpcode.Int32:
				head = 5
			case msgpcode.FixExt4:
				head = 6
			case msgpcode.Double, msgpcode.Uint64, msgpcode.Int64:
				head = 9
			case msgpcode.FixExt8:
				head = 10
			case msgpcode.FixExt16:
				head = 18
			case msgpcode.Bin8, msgpcode.Str8:
				lenBytes = 1
			case msgpcode.Bin16, msgpcode.Str16, msgpcode.Array16, msgpcode.Map16:
				lenBytes = 2
			case msgpcode.Bin32, msgpcode.Str32, msgpcode.Array32, msgpcode.Map32:
				lenBytes = 4
			case msgpcode.Ext8:
				lenBytes, head = 1, 2 // the code and the type byte
			case msgpcode.Ext16:
				lenBytes, head = 2, 2
			case msgpcode.Ext32:
				lenBytes, head = 4, 2
			default:
				return 0, fmt.Errorf("invalid code %#x", c)
			}
			if lenBytes > 0 {
				if off+1+lenBytes > len(p) {
					return 0, io.ErrUnexpectedEOF
				}
				for _, b := range p[off+1 : off+1+lenBytes] {
					n = n<<8 | uint64(b)
				}
				head += lenBytes
				switch c {
				case msgpcode.Array16, msgpcode.Array32:
					items, n = n, 0
				case msgpcode.Map16, msgpcode.Map32:
					items, n = 2*n, 0
				}
			}
		}
		off += head
		if off > len(p) {
			return 0, io.ErrUnexpectedEOF
		}
		// Every element takes at least a byte: longer lengths are lies,
		// rejected before they can overflow anything.
		left := uint64(len(p) - off)
		if n > left || items > left || uint64(pending)+items > left {
			return 0, io.ErrUnexpectedEOF
		}
		off += int(n)
		pending += int(items)
	}
	return off, nil
}

// skip skips the next value.
func (dec *EventDecoder) skip() error {
	_, err := dec.raw()
	return err
}

// raw returns the bytes of the next value (a subslice of the payload) and
// moves past it.
func (dec *EventDecoder) raw() ([]byte, error) {
	pos := len(dec.payload) - dec.r.Len()
	n, err := valueLen(dec.payload[pos:])
	if err != nil {
		return nil, err
	}
	if _, err := dec.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return dec.payload[pos : pos+n], nil
}

// str reads a string (or bin) into the scratch buffer; valid until the next
// call.
func (dec *EventDecoder) str() ([]byte, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, err
	}
	if !isStr(c) && !isBin(c) {
		return nil, fmt.Errorf("want a string, got code %#x", c)
	}
	n, err := dec.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n > dec.r.Len() {
		return nil, fmt.Errorf("string of %d bytes in %d", n, dec.r.Len())
	}
	if cap(dec.buf) < n {
		dec.buf = make([]byte, n)
	}
	dec.buf = dec.buf[:n]
	if _, err := dec.r.Read(dec.buf); err != nil && n > 0 {
		return nil, err
	}
	return dec.buf, nil
}

// Common strings are returned without allocating.
var knownStrings = []string{"GPU", "CPU", "DISK", "full_attention", "sliding_window", "mamba"}

func (dec *EventDecoder) optString() (string, error) {
	c, err := dec.peek()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", dec.d.DecodeNil()
	}
	b, err := dec.str()
	if err != nil {
		return "", err
	}
	for _, s := range knownStrings {
		if string(b) == s {
			return s, nil
		}
	}
	return string(b), nil
}

func (dec *EventDecoder) optInt() (int64, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, dec.d.DecodeNil()
	}
	if !isInt(c) {
		return 0, false, fmt.Errorf("want an integer, got code %#x", c)
	}
	v, err := dec.d.DecodeInt64()
	return v, true, err
}

func (dec *EventDecoder) smallInt() (int, error) {
	v, _, err := dec.optInt()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("integer %d out of range", v)
	}
	return int(v), nil
}

// hash reads an ExternalBlockHash (int or bytes); ok is false for nil.
func (dec *EventDecoder) hash() (h uint64, ok bool, err error) {
	c, err := dec.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, false, dec.d.DecodeNil()
	case isInt(c):
		h, err = dec.d.DecodeUint64()
		return h, true, err
	case isBin(c) || isStr(c):
		b, err := dec.str()
		if err != nil {
			return 0, false, err
		}
		return bytesHash(b), true, nil
	}
	return 0, false, fmt.Errorf("want a block hash, got code %#x", c)
}

// bytesHash reduces a byte block hash to 64 bits: the last 8 bytes read
// big-endian for digests of 8, 16 or 32 bytes (sha256, sha256_cbor: 32;
// xxhash: 16; vLLM's int form keeps the low 64 bits of
// int.from_bytes(digest, "big")), XXH3 for other lengths of 8 bytes or more,
// the big-endian value of shorter ones.
func bytesHash(b []byte) uint64 {
	if len(b) >= 8 {
		if len(b) == 32 || len(b) == 16 || len(b) == 8 {
			return binary.BigEndian.Uint64(b[len(b)-8:])
		}
		return xxh3.Hash(b)
	}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

func (dec *EventDecoder) hashes(dst []uint64) ([]uint64, error) {
	n, err := dec.arrayLen()
	if err != nil {
		return dst, err
	}
	for i := 0; i < n; i++ {
		h, ok, err := dec.hash()
		if err != nil {
			return dst, err
		}
		if !ok {
			return dst, errors.New("nil block hash")
		}
		dst = append(dst, h)
	}
	return dst, nil
}

func (dec *EventDecoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := dec.arrayLen()
	if err != nil {
		return dst, err
	}
	// Fast path: read the integers straight from the payload (token arrays
	// are most of a batch's bytes); anything unusual goes the slow way.
	pos := len(dec.payload) - dec.r.Len()
	p := dec.payload[pos:]
	i, off := 0, 0
	for ; i < n && off < len(p); i++ {
		v, w := fastUint(p[off:])
		if w == 0 || v > math.MaxUint32 {
			break
		}
		dst = append(dst, uint32(v))
		off += w
	}
	if off > 0 {
		if _, err := dec.r.Seek(int64(off), io.SeekCurrent); err != nil {
			return dst, err
		}
	}
	for ; i < n; i++ {
		c, err := dec.peek()
		if err != nil {
			return dst, err
		}
		if !isInt(c) {
			return dst, fmt.Errorf("token id: want an integer, got code %#x", c)
		}
		v, err := dec.d.DecodeInt64()
		if err != nil {
			return dst, err
		}
		if v < 0 || v > math.MaxUint32 {
			return dst, fmt.Errorf("token id %d out of range", v)
		}
		dst = append(dst, uint32(v))
	}
	return dst, nil
}

// fastUint decodes a non-negative msgpack integer at the start of p and
// returns it with its width in bytes; width 0 means "not a non-negative
// integer that fits in p".
func fastUint(p []byte) (uint64, int) {
	c := p[0]
	switch {
	case c <= 0x7f:
		return uint64(c), 1
	case c == msgpcode.Uint8 && len(p) >= 2:
		return uint64(p[1]), 2
	case c == msgpcode.Uint16 && len(p) >= 3:
		return uint64(binary.BigEndian.Uint16(p[1:])), 3
	case c == msgpcode.Uint32 && len(p) >= 5:
		return uint64(binary.BigEndian.Uint32(p[1:])), 5
	case c == msgpcode.Uint64 && len(p) >= 9:
		return binary.BigEndian.Uint64(p[1:]), 9
	case c == msgpcode.Int8 && len(p) >= 2 && int8(p[1]) >= 0:
		return uint64(p[1]), 2
	case c == msgpcode.Int16 && len(p) >= 3 && int16(binary.BigEndian.Uint16(p[1:])) >= 0:
		return uint64(binary.BigEndian.Uint16(p[1:])), 3
	case c == msgpcode.Int32 && len(p) >= 5 && int32(binary.BigEndian.Uint32(p[1:])) >= 0:
		return uint64(binary.BigEndian.Uint32(p[1:])), 5
	}
	return 0, 0
}

func (dec *EventDecoder) extraKeys(dst []uint64) ([]uint64, bool, error) {
	c, err := dec.peek()
	if err != nil {
		return dst, false, err
	}
	if c == msgpcode.Nil {
		return dst, false, dec.d.DecodeNil()
	}
	n, err := dec.arrayLen()
	if err != nil {
		return dst, false, err
	}
	for i := 0; i < n; i++ {
		c, err := dec.peek()
		if err != nil {
			return dst, false, err
		}
		if c == msgpcode.Nil {
			if err := dec.d.DecodeNil(); err != nil {
				return dst, false, err
			}
			dst = append(dst, 0)
			continue
		}
		raw, err := dec.raw()
		if err != nil {
			return dst, false, err
		}
		h := xxh3.Hash(raw)
		if h == 0 {
			h = 1
		}
		dst = append(dst, h)
	}
	return dst, true, nil
}

func (dec *EventDecoder) batch(b *EventBatch) error {
	c, err := dec.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := dec.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("batch array of %d elements, want at least 2", n)
		}
		if b.TS, err = dec.d.DecodeFloat64(); err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		if err := dec.events(b); err != nil {
			return err
		}
		if n >= 3 {
			v, ok, err := dec.optInt()
			if err != nil {
				return fmt.Errorf("data_parallel_rank: %w", err)
			}
			b.DPRank, b.HasDPRank = int(v), ok
		}
		for i := 3; i < n; i++ {
			if err := dec.skip(); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := dec.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := dec.str()
			if err != nil {
				return err
			}
			switch string(k) {
			case "ts":
				if b.TS, err = dec.d.DecodeFloat64(); err != nil {
					return fmt.Errorf("ts: %w", err)
				}
			case "events":
				if err := dec.events(b); err != nil {
					return err
				}
			case "data_parallel_rank":
				v, ok, err := dec.optInt()
				if err != nil {
					return fmt.Errorf("data_parallel_rank: %w", err)
				}
				b.DPRank, b.HasDPRank = int(v), ok
			default:
				if err := dec.skip(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return fmt.Errorf("batch: want an array or a map, got code %#x", c)
}

// minEventBytes is the least an event takes in a payload: every event an
// engine publishes is an array or a map that names its type, "BlockStored"
// the shortest (["BlockStored"]: 13 bytes). A decoded event (a KVEvent) takes
// some 180 bytes, so an events array of more elements than the bytes left
// allow at that rate is rejected before anything is allocated for it: a
// payload of one-byte events ({}: an unknown type) made the decoder
// allocate about 180 times its size.
const minEventBytes = 13

func (dec *EventDecoder) events(b *EventBatch) error {
	n, err := dec.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if n > dec.r.Len()/minEventBytes {
		return fmt.Errorf("events: %d events in %d bytes", n, dec.r.Len())
	}
	for i := 0; i < n; i++ {
		var ev *KVEvent
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
			ev = &b.Events[len(b.Events)-1]
			*ev = KVEvent{BlockHashes: ev.BlockHashes[:0], TokenIDs: ev.TokenIDs[:0], ExtraKeys: ev.ExtraKeys[:0]}
		} else {
			b.Events = append(b.Events, KVEvent{})
			ev = &b.Events[len(b.Events)-1]
		}
		if err := dec.event(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

func kindOf(tag []byte) EventKind {
	switch string(tag) {
	case "BlockStored":
		return EventBlockStored
	case "BlockRemoved":
		return EventBlockRemoved
	case "AllBlocksCleared":
		return EventAllBlocksCleared
	}
	return EventUnknown
}

// Event fields.
const (
	fUnknown = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
)

var fieldNames = [...]string{"", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
	"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}

// Positional field order after the tag (protocols.md section 2).
var (
	storedFields  = []int{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}
	removedFields = []int{fBlockHashes, fMedium, fGroupIdx}
)

func fieldID(name []byte) int {
	switch string(name) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	}
	return fUnknown
}

func (dec *EventDecoder) event(ev *KVEvent) error {
	c, err := dec.peek()
	if err != nil {
		return err
	}
	hadExtra := false
	switch {
	case isArray(c):
		n, err := dec.arrayLen()
		if err != nil {
			return err
		}
		if n < 1 {
			return errors.New("empty event array")
		}
		tag, err := dec.str()
		if err != nil {
			return fmt.Errorf("tag: %w", err)
		}
		ev.Kind = kindOf(tag)
		var fields []int
		switch ev.Kind {
		case EventBlockStored:
			fields = storedFields
		case EventBlockRemoved:
			fields = removedFields
		}
		for i := 1; i < n; i++ {
			if i-1 >= len(fields) {
				if err := dec.skip(); err != nil {
					return err
				}
				continue
			}
			if err := dec.field(ev, fields[i-1], &hadExtra); err != nil {
				return fmt.Errorf("%s: %w", fieldNames[fields[i-1]], err)
			}
		}
	case isMap(c):
		n, err := dec.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := dec.str()
			if err != nil {
				return err
			}
			if string(k) == "type" {
				tag, err := dec.str()
				if err != nil {
					return fmt.Errorf("type: %w", err)
				}
				ev.Kind = kindOf(tag)
				continue
			}
			id := fieldID(k)
			if err := dec.field(ev, id, &hadExtra); err != nil {
				return fmt.Errorf("%s: %w", fieldNames[id], err)
			}
		}
	default:
		return fmt.Errorf("want an array or a map, got code %#x", c)
	}
	if !hadExtra {
		ev.ExtraKeys = nil
	}
	// The token ids need not be block_size per block hash: a hybrid
	// model's sliding-window or Mamba group leaves its null blocks out of
	// block_hashes but not out of token_ids (vLLM's
	// BlockPool.cache_full_blocks), and a BlockStored without token ids is
	// legal too (the OffloadingConnector reports the blocks it copies to
	// the CPU tier by hash alone). The decoder takes the event as sent;
	// the Sink checks the events it is given (those of the group the
	// Subscriber follows), and a bad one is a store error, not a batch
	// that cannot be decoded (which would clear the endpoint's entries).
	return nil
}

func (dec *EventDecoder) field(ev *KVEvent, id int, hadExtra *bool) error {
	var err error
	switch id {
	case fBlockHashes:
		ev.BlockHashes, err = dec.hashes(ev.BlockHashes)
	case fParent:
		ev.Parent, ev.HasParent, err = dec.hash()
	case fTokenIDs:
		ev.TokenIDs, err = dec.tokens(ev.TokenIDs)
	case fBlockSize:
		ev.BlockSize, err = dec.smallInt()
	case fLoRAID:
		ev.LoRAID, ev.HasLoRAID, err = dec.optInt()
	case fMedium:
		ev.Medium, err = dec.optString()
	case fLoRAName:
		ev.LoRAName, err = dec.optString()
	case fExtraKeys:
		ev.ExtraKeys, *hadExtra, err = dec.extraKeys(ev.ExtraKeys)
	case fGroupIdx:
		ev.GroupIdx, err = dec.smallInt()
	case fSpecKind:
		ev.SpecKind, err = dec.optString()
	case fSlidingWindow:
		ev.SlidingWindow, err = dec.smallInt()
	default:
		err = dec.skip()
	}
	return err
}

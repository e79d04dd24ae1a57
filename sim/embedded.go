package sim

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/kvroute/kvroute/workload"
)

// DefaultTraceName names the embedded default workload in reports.
const DefaultTraceName = "mooncake-conversation (embedded)"

// conversationTrace is the Mooncake FAST'25 conversation trace (12,031
// requests, Apache-2.0, see data/README.md) in a compact form: gzip over
// varints, with hash ids delta-coded within each request. DefaultTraceJSONL
// turns it back into the byte-identical JSONL file.
//
//go:embed data/conversation_trace.bin.gz
var conversationTrace []byte

// DefaultTraceJSONL returns the embedded default trace as the original
// Mooncake JSONL bytes.
func DefaultTraceJSONL() ([]byte, error) {
	return decodeCompactTrace(conversationTrace)
}

// DefaultWorkload returns the embedded default trace as a workload, so that
// `kvroute sim` runs with no files.
func DefaultWorkload() (*workload.Workload, error) {
	jsonl, err := DefaultTraceJSONL()
	if err != nil {
		return nil, err
	}
	w, err := workload.ReadTrace(bytes.NewReader(jsonl), workload.ReadOptions{})
	if err != nil {
		return nil, fmt.Errorf("sim: default trace: %w", err)
	}
	w.Name = DefaultTraceName
	return w, nil
}

// compactMagic starts a compact trace (after gunzip).
const compactMagic = "KVRTRC1\n"

// traceRecord is one line of a Mooncake trace.
type traceRecord struct {
	Timestamp    uint64   `json:"timestamp"`
	InputLength  uint64   `json:"input_length"`
	OutputLength uint64   `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// encodeCompactTrace converts a Mooncake JSONL trace (integer millisecond
// timestamps, non-decreasing) to the compact form. Lines must be exactly in
// the canonical layout that appendTraceLine writes, so that decoding
// reproduces the input byte for byte; anything else is an error.
func encodeCompactTrace(jsonl []byte) ([]byte, error) {
	var raw bytes.Buffer
	raw.WriteString(compactMagic)
	var tmp [binary.MaxVarintLen64]byte
	uv := func(x uint64) { raw.Write(tmp[:binary.PutUvarint(tmp[:], x)]) }
	sv := func(x int64) { raw.Write(tmp[:binary.PutVarint(tmp[:], x)]) }
	sc := bufio.NewScanner(bytes.NewReader(jsonl))
	sc.Buffer(nil, 64<<20)
	var prevTS uint64
	var line []byte
	for n := 1; sc.Scan(); n++ {
		var r traceRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("encode trace: line %d: %w", n, err)
		}
		if line = appendTraceLine(line[:0], &r); !bytes.Equal(line[:len(line)-1], sc.Bytes()) {
			return nil, fmt.Errorf("encode trace: line %d is not in canonical Mooncake layout", n)
		}
		if r.Timestamp < prevTS {
			return nil, fmt.Errorf("encode trace: line %d: timestamp goes backwards", n)
		}
		uv(r.Timestamp - prevTS)
		prevTS = r.Timestamp
		uv(r.InputLength)
		uv(r.OutputLength)
		uv(uint64(len(r.HashIDs)))
		prev := int64(-1)
		for _, h := range r.HashIDs {
			sv(int64(h) - prev - 1)
			prev = int64(h)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("encode trace: %w", err)
	}
	if len(jsonl) > 0 && jsonl[len(jsonl)-1] != '\n' {
		return nil, errors.New("encode trace: the last line has no newline")
	}
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// maxCompactTrace bounds the decoded size of a compact trace.
const maxCompactTrace = 256 << 20

// decodeCompactTrace reverses encodeCompactTrace.
func decodeCompactTrace(data []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("decode trace: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxCompactTrace+1))
	if err != nil {
		return nil, fmt.Errorf("decode trace: %w", err)
	}
	if len(raw) > maxCompactTrace {
		return nil, errors.New("decode trace: too large")
	}
	if !bytes.HasPrefix(raw, []byte(compactMagic)) {
		return nil, errors.New("decode trace: bad magic")
	}
	rd := bytes.NewReader(raw[len(compactMagic):])
	out := make([]byte, 0, len(raw)*8)
	var ts uint64
	var r traceRecord
	for rd.Len() > 0 {
		var d [4]uint64
		for i := range d {
			if d[i], err = binary.ReadUvarint(rd); err != nil {
				return nil, fmt.Errorf("decode trace: %w", err)
			}
		}
		ts += d[0]
		n := d[3]
		if n > uint64(rd.Len()) { // every id takes at least one byte
			return nil, errors.New("decode trace: hash id count past the end")
		}
		r = traceRecord{Timestamp: ts, InputLength: d[1], OutputLength: d[2], HashIDs: r.HashIDs[:0]}
		prev := int64(-1)
		for range n {
			x, err := binary.ReadVarint(rd)
			if err != nil {
				return nil, fmt.Errorf("decode trace: %w", err)
			}
			prev += x + 1
			if prev < 0 {
				return nil, errors.New("decode trace: negative hash id")
			}
			r.HashIDs = append(r.HashIDs, uint64(prev))
		}
		out = appendTraceLine(out, &r)
		if len(out) > maxCompactTrace {
			return nil, errors.New("decode trace: too large")
		}
	}
	return out, nil
}

// appendTraceLine writes r in the layout of the Mooncake release files.
func appendTraceLine(b []byte, r *traceRecord) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendUint(b, r.Timestamp, 10)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendUint(b, r.InputLength, 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendUint(b, r.OutputLength, 10)
	b = append(b, `, "hash_ids": [`...)
	for i, h := range r.HashIDs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, h, 10)
	}
	return append(b, "]}\n"...)
}

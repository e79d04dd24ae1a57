package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/zeebo/xxh3"
)

// ReadOptions configures trace reading. The zero value reads Mooncake traces.
type ReadOptions struct {
	// BlockSize is the number of tokens per hash id; default 512 (Mooncake).
	// Qwen-Bailian traces use 16.
	BlockSize int
	// TimeUnit is the unit of "timestamp"; default time.Millisecond.
	TimeUnit time.Duration
	// MaxLineBytes caps one JSON line, its line ending not counted; default
	// 64 MiB.
	MaxLineBytes int
}

func (o ReadOptions) withDefaults() ReadOptions {
	if o.BlockSize <= 0 {
		o.BlockSize = TraceBlockSize
	}
	if o.TimeUnit <= 0 {
		o.TimeUnit = time.Millisecond
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = 64 << 20
	}
	return o
}

// traceLine is one JSONL record: the Mooncake keys plus kvroute's optional
// ones (omitted when empty, so a plain trace stays plain).
type traceLine struct {
	Timestamp json.Number `json:"timestamp"`
	// The lengths are pointers so that a missing key (another trace
	// format's line) is told from a 0.
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`

	ID        string      `json:"id,omitempty"`
	ArrivalNS *int64      `json:"arrival_ns,omitempty"`
	Session   string      `json:"session,omitempty"`
	Tenant    string      `json:"tenant,omitempty"`
	Adapter   string      `json:"adapter,omitempty"`
	Segments  [][2]uint64 `json:"segments,omitempty"`
	Tokens    []uint32    `json:"tokens,omitempty"`
	Text      string      `json:"text,omitempty"`
}

// defaultID is the ID a request gets from its position when the trace does
// not name it.
func defaultID(i int) string { return fmt.Sprintf("r%06d", i) }

// ReadTraceFile reads a JSONL trace file with default options.
func ReadTraceFile(path string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: read trace: %w", err)
	}
	defer f.Close()
	w, err := ReadTrace(f, ReadOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	w.Name = path
	return w, nil
}

// ReadTrace reads a JSONL trace (Mooncake format, optionally with kvroute's
// extra fields) from r. Blank lines are skipped; any bad line is an error
// naming its line number. Requests are returned sorted by arrival (stably).
func ReadTrace(r io.Reader, opts ReadOptions) (*Workload, error) {
	opts = opts.withDefaults()
	sc := bufio.NewScanner(r)
	// The scanner's buffer holds a line and its line ending ("\r\n"); the
	// cap itself is checked on the line. The buffer starts no larger than
	// that: the scanner returns any line its buffer holds, whatever its
	// limit.
	limit := opts.MaxLineBytes
	if limit <= math.MaxInt-2 {
		limit += 2
	}
	sc.Buffer(make([]byte, 0, min(1<<16, limit)), limit)
	w := &Workload{Name: "trace"}
	lineNo := 0
	for sc.Scan() {
		lineNo++
		if len(sc.Bytes()) > opts.MaxLineBytes {
			return nil, fmt.Errorf("workload: trace line %d: longer than %d bytes", lineNo, opts.MaxLineBytes)
		}
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		req, err := ParseTraceLine(line, len(w.Requests), opts)
		if err != nil {
			return nil, fmt.Errorf("workload: trace line %d: %w", lineNo, err)
		}
		w.Requests = append(w.Requests, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("workload: trace line %d: longer than %d bytes", lineNo+1, opts.MaxLineBytes)
		}
		return nil, fmt.Errorf("workload: read trace: %w", err)
	}
	sortByArrival(w.Requests)
	return w, nil
}

// ParseTraceLine parses one JSONL record; index is the request's position,
// used for its default ID.
func ParseTraceLine(line []byte, index int, opts ReadOptions) (Request, error) {
	opts = opts.withDefaults()
	var tl traceLine
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&tl); err != nil {
		return Request{}, fmt.Errorf("bad json: %w", err)
	}
	if dec.More() {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	// A line of another format (or JSON null) decoded into zeros: an empty
	// prompt that every engine refused, or "output_length 0".
	switch {
	case tl.InputLength == nil:
		return Request{}, errors.New("missing input_length")
	case tl.OutputLength == nil:
		return Request{}, errors.New("missing output_length")
	}
	r := Request{
		ID:        tl.ID,
		Session:   tl.Session,
		Tenant:    tl.Tenant,
		Adapter:   tl.Adapter,
		PromptLen: *tl.InputLength,
		OutputLen: *tl.OutputLength,
		HashIDs:   tl.HashIDs,
		Tokens:    tl.Tokens,
		Text:      tl.Text,
	}
	if r.ID == "" {
		r.ID = defaultID(index)
	}
	if len(r.Tokens) == 0 {
		// "tokens": [] is no tokens, as "segments": [] and "text": "" are
		// no segments and no text (and as WriteTrace writes it: not at
		// all): the line is in the Mooncake form, checked as such.
		r.Tokens = nil
	}
	if r.PromptLen < 0 || r.OutputLen < 0 {
		return Request{}, fmt.Errorf("negative length (input_length %d, output_length %d)", r.PromptLen, r.OutputLen)
	}
	if r.PromptLen == 0 {
		// vLLM-compatible servers and the engine model refuse an empty
		// prompt: the request could only fail (and a plan with it had no
		// fleet that meets the SLO).
		return Request{}, errors.New("input_length 0: a request has at least one prompt token")
	}
	if r.OutputLen == 0 {
		// Every request generates at least its first token; max_tokens 0
		// would mean "up to the model's length" to the engine model and to
		// vLLM-compatible servers.
		return Request{}, errors.New("output_length 0: a request generates at least one token")
	}
	if r.PromptLen > MaxLen || r.OutputLen > MaxLen {
		return Request{}, fmt.Errorf("length too large (input_length %d, output_length %d; at most %d tokens)", r.PromptLen, r.OutputLen, MaxLen)
	}
	switch {
	case tl.ArrivalNS != nil:
		if *tl.ArrivalNS < 0 {
			return Request{}, fmt.Errorf("negative arrival_ns %d", *tl.ArrivalNS)
		}
		r.Arrival = time.Duration(*tl.ArrivalNS)
	case tl.Timestamp != "":
		ts, err := strconv.ParseFloat(string(tl.Timestamp), 64)
		if err != nil || ts < 0 || math.IsNaN(ts) || ts*float64(opts.TimeUnit) > float64(math.MaxInt64/2) {
			return Request{}, fmt.Errorf("bad timestamp %q", tl.Timestamp)
		}
		r.Arrival = time.Duration(math.Round(ts * float64(opts.TimeUnit)))
	default:
		return Request{}, errors.New("missing timestamp")
	}
	if len(tl.Segments) > 0 {
		r.Segments = make([]Segment, len(tl.Segments))
		for i, s := range tl.Segments {
			if s[1] == 0 || s[1] > MaxLen {
				return Request{}, fmt.Errorf("segment %d has bad length %d", i, s[1])
			}
			r.Segments[i] = Segment{Key: s[0], Len: int(s[1])}
		}
	}
	if r.Tokens != nil && len(r.Tokens) != r.PromptLen {
		return Request{}, fmt.Errorf("tokens has %d ids but input_length is %d", len(r.Tokens), r.PromptLen)
	}
	if r.Segments == nil && r.Tokens == nil && r.Text == "" {
		// The Mooncake form: hash ids are the prompt.
		if tl.HashIDs == nil {
			return Request{}, errors.New("missing hash_ids (or segments, tokens or text)")
		}
		if want := (r.PromptLen + opts.BlockSize - 1) / opts.BlockSize; len(r.HashIDs) != want {
			return Request{}, fmt.Errorf("input_length %d needs %d hash_ids of %d tokens, got %d",
				r.PromptLen, want, opts.BlockSize, len(r.HashIDs))
		}
		r.Segments = segmentsFromHashIDs(r.HashIDs, r.PromptLen, opts.BlockSize)
	}
	if err := r.Validate(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// segmentsFromHashIDs turns trace block ids into segments: block i is the
// segment keyed by its hash id, blockSize long except the last, which holds
// the remainder of the prompt.
func segmentsFromHashIDs(ids []uint64, promptLen, blockSize int) []Segment {
	if len(ids) == 0 {
		return nil
	}
	segs := make([]Segment, len(ids))
	for i, id := range ids {
		n := blockSize
		if rest := promptLen - i*blockSize; rest < n {
			n = rest
		}
		segs[i] = Segment{Key: id, Len: n}
	}
	return segs
}

// WriteTrace writes requests as Mooncake-compatible JSONL: timestamp (ms),
// input_length, output_length and hash_ids (512-token blocks), plus the
// optional fields id, arrival_ns (when the arrival is not a whole
// millisecond), session, tenant, adapter (a LoRA adapter's name),
// segments (when they are not implied by hash_ids), tokens and text. A request without HashIDs gets ids computed
// from its prompt (see AssignHashIDs) in the file, so the output is always a
// valid Mooncake trace. ReadTrace of the output gives back requests equal to
// the input when every request has HashIDs.
func WriteTrace(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	var missing []Request
	for i := range reqs {
		if reqs[i].HashIDs == nil && reqs[i].PromptLen > 0 {
			missing = append(missing[:0], reqs...)
			AssignHashIDs(missing)
			break
		}
	}
	for i := range reqs {
		r := &reqs[i]
		if missing != nil {
			r = &missing[i]
		}
		if err := r.Validate(); err != nil {
			return err
		}
		tl := traceLine{
			Timestamp:    json.Number(strconv.FormatInt(r.Arrival.Milliseconds(), 10)),
			InputLength:  &r.PromptLen,
			OutputLength: &r.OutputLen,
			HashIDs:      r.HashIDs,
			Session:      r.Session,
			Tenant:       r.Tenant,
			Adapter:      r.Adapter,
			Tokens:       r.Tokens,
			Text:         r.Text,
		}
		if tl.HashIDs == nil {
			tl.HashIDs = []uint64{}
		}
		if r.ID != defaultID(i) {
			tl.ID = r.ID
		}
		if r.Arrival%time.Millisecond != 0 {
			ns := int64(r.Arrival)
			tl.ArrivalNS = &ns
		}
		implied := r.Tokens == nil && r.Text == "" &&
			segmentsEqual(r.Segments, segmentsFromHashIDs(r.HashIDs, r.PromptLen, TraceBlockSize))
		if !implied && len(r.Segments) > 0 {
			tl.Segments = make([][2]uint64, len(r.Segments))
			for j, s := range r.Segments {
				tl.Segments[j] = [2]uint64{s.Key, uint64(s.Len)}
			}
		}
		b, err := json.Marshal(&tl)
		if err != nil {
			return fmt.Errorf("workload: write trace: %w", err)
		}
		b = append(b, '\n')
		if _, err := bw.Write(b); err != nil {
			return fmt.Errorf("workload: write trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("workload: write trace: %w", err)
	}
	return nil
}

// WriteTraceFile writes reqs to path (see WriteTrace).
func WriteTraceFile(path string, reqs []Request) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("workload: write trace: %w", err)
	}
	if err := WriteTrace(f, reqs); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("workload: write trace: %w", err)
	}
	return nil
}

func segmentsEqual(a, b []Segment) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// AssignHashIDs sets HashIDs on every request from its prompt, the way
// Mooncake traces are built: the prompt's 512-token blocks are hashed in a
// chain (the last, partial block included) and the hashes are renumbered
// 0, 1, 2, ... in order of first appearance across reqs.
func AssignHashIDs(reqs []Request) {
	ids := map[uint64]uint64{}
	var buf []uint64
	for i := range reqs {
		r := &reqs[i]
		buf = r.BlockHashes(TraceBlockSize, buf[:0])
		if rem := r.PromptLen % TraceBlockSize; rem != 0 {
			buf = append(buf, partialBlockHash(r, buf, rem))
		}
		r.HashIDs = make([]uint64, len(buf))
		for j, h := range buf {
			id, ok := ids[h]
			if !ok {
				id = uint64(len(ids))
				ids[h] = id
			}
			r.HashIDs[j] = id
		}
	}
}

// partialBlockHash hashes the trailing rem tokens of r, chained to its last
// full block hash (full[len(full)-1]).
func partialBlockHash(r *Request, full []uint64, rem int) uint64 {
	parent := r.root()
	if len(full) > 0 {
		parent = full[len(full)-1]
	}
	start := r.PromptLen - rem
	switch {
	case r.Tokens != nil:
		h := splitmix64(parent ^ 0x7061727469616c) // "partial"
		for _, t := range r.Tokens[start:] {
			h = splitmix64(h ^ uint64(t))
		}
		return h
	case len(r.Segments) > 0:
		si, off := seekSegments(r.Segments, start)
		h, _, _, _ := hashRange(chainSeed(parent), r.Segments, si, off, rem)
		return splitmix64(h ^ 0x7061727469616c)
	}
	t := r.Text
	if s := start * 4; s < len(t) {
		t = t[s:]
	} else {
		t = ""
	}
	return splitmix64(parent ^ xxh3.HashString(t) ^ 0x7061727469616c)
}

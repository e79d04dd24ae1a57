package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Done is the data of the event that ends an OpenAI-style stream.
const Done = "[DONE]"

// ContentTypeEventStream is the media type of a server-sent event stream.
const ContentTypeEventStream = "text/event-stream"

// IsPlainEventStream reports whether a response with header h is a
// server-sent event stream that a proxy can read and end in band: its
// media type is ContentTypeEventStream (parameters and case aside) and it
// is not content-encoded. An engine, or a hop before the router, may send
// a stream gzipped to a client that accepts gzip, and a proxy that passes
// bodies on as they are cannot write events inside that encoding: such a
// stream is an opaque body, aborted when it breaks.
func IsPlainEventStream(h http.Header) bool {
	if ce := h.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return false
	}
	ct, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(ct), ContentTypeEventStream)
}

// SSEWriter writes server-sent events in the form vLLM emits them:
// "data: <payload>\n\n". Events are buffered by Data and sent with Flush, so a
// caller that has several events at once (several tokens of one engine step)
// pays for one write and one flush. An SSEWriter is not safe for concurrent
// use.
type SSEWriter struct {
	w   io.Writer
	f   http.Flusher // nil when w cannot flush
	buf []byte
	err error
}

// NewSSEWriter returns a writer on w. If w is an http.ResponseWriter (or
// anything with a Flush method) Flush also flushes it to the client.
func NewSSEWriter(w io.Writer) *SSEWriter {
	f, _ := w.(http.Flusher)
	return &SSEWriter{w: w, f: f, buf: make([]byte, 0, 1024)}
}

// SetHeaders sets the response headers of an event stream as vLLM does:
// its StreamingResponse(media_type="text/event-stream") sends the media
// type, with the charset Starlette adds, and no caching or
// proxy-buffering headers.
func SetHeaders(h http.Header) {
	h.Set("Content-Type", ContentTypeEventStream+"; charset=utf-8")
}

// Data buffers one event whose data is payload. A payload holding line
// breaks (LF, CRLF or a bare CR, which readers all end a line at) is split
// into several data lines as the SSE format requires; a reader joins them
// with LF.
func (w *SSEWriter) Data(payload []byte) {
	w.buf = appendLines(w.buf, "data: ", payload)
	w.buf = append(w.buf, '\n')
}

// appendLines appends text as lines, each prefix and one line of text, at
// every line break of text (LF, CRLF or CR).
func appendLines(dst []byte, prefix string, text []byte) []byte {
	for {
		i := bytes.IndexAny(text, "\r\n")
		dst = append(dst, prefix...)
		if i < 0 {
			dst = append(dst, text...)
			return append(dst, '\n')
		}
		dst = append(dst, text[:i]...)
		dst = append(dst, '\n')
		if text[i] == '\r' && i+1 < len(text) && text[i+1] == '\n' {
			i++
		}
		text = text[i+1:]
	}
}

// AppendData appends an event to the internal buffer through fn, which
// receives the buffer and returns it extended by one JSON payload (no
// newlines). It avoids a copy: w.AppendData(func(b []byte) []byte {
// return AppendChatContentChunk(b, h, text, "", nil) }).
func (w *SSEWriter) AppendData(fn func(dst []byte) []byte) {
	w.buf = append(w.buf, "data: "...)
	w.buf = fn(w.buf)
	w.buf = append(w.buf, '\n', '\n')
}

// Done buffers the terminating "data: [DONE]" event.
func (w *SSEWriter) Done() { w.buf = append(w.buf, "data: [DONE]\n\n"...) }

// Comment buffers an SSE comment (": text", a comment line for each line
// of text), which clients ignore; useful as a keep-alive.
func (w *SSEWriter) Comment(text string) {
	w.buf = appendLines(w.buf, ": ", []byte(text))
	w.buf = append(w.buf, '\n')
}

// Buffered returns the number of bytes waiting for Flush.
func (w *SSEWriter) Buffered() int { return len(w.buf) }

// Flush writes the buffered events in one Write and flushes the underlying
// writer. After a write error every later Flush returns that error.
func (w *SSEWriter) Flush() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) > 0 {
		_, err := w.w.Write(w.buf)
		w.buf = w.buf[:0]
		if err != nil {
			w.err = fmt.Errorf("sse write: %w", err)
			return w.err
		}
	}
	if w.f != nil {
		w.f.Flush()
	}
	return nil
}

// Event is one server-sent event. Data and the strings are valid until the
// next call to SSEReader.Next.
type Event struct {
	// Type is the "event:" field; empty means "message". An event with an
	// "error:" line has type "error" (see SSEReader).
	Type string
	// ID is the last "id:" field seen in the stream (it persists across
	// events, as the SSE specification says).
	ID string
	// Data is the event's data lines joined with "\n".
	Data []byte
	// Retry is the last valid "retry:" field (0 = none).
	Retry time.Duration
}

// IsDone reports whether the event is the "[DONE]" terminator.
func (e *Event) IsDone() bool { return string(bytes.TrimSpace(e.Data)) == Done }

// ErrEventTooLarge is returned when a line or an event exceeds the reader's
// limit.
var ErrEventTooLarge = errors.New("sse: event too large")

// DefaultMaxEventBytes is the default limit on one event's size.
const DefaultMaxEventBytes = 16 << 20

// SSEReader reads server-sent events tolerantly: lines may end in LF, CRLF
// or CR; "data:" with or without the space; comments, unknown fields and a
// leading byte-order mark are skipped; an event that is not followed by a
// blank line at the end of the stream is still delivered. An "error:" line
// (llama.cpp's mid-stream error before 2025-09) is read as a data line of
// an event of type "error". It does not
// interpret the data (see Event.IsDone). An SSEReader is not safe for
// concurrent use.
type SSEReader struct {
	r io.Reader
	// MaxEventBytes limits one line and one event's data; 0 means
	// DefaultMaxEventBytes.
	MaxEventBytes int

	buf        []byte // read buffer; buf[start:end] is unread
	start, end int
	err        error // sticky error from r
	skipLF     bool  // the last line ended in CR: a following LF belongs to it
	line       []byte
	started    bool  // a line was read (BOM check done)
	fatal      error // ErrEventTooLarge: the reader is unusable

	data    []byte
	hasData bool
	evType  []byte
	id      string
	retry   time.Duration
}

// NewSSEReader returns a reader of events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: r, buf: make([]byte, 4096)}
}

func (r *SSEReader) max() int {
	if r.MaxEventBytes > 0 {
		return r.MaxEventBytes
	}
	return DefaultMaxEventBytes
}

// readLine returns the next line without its terminator, or the reader's
// error (io.EOF at a clean end) when no line is left. A last line without a
// terminator is returned as a line.
func (r *SSEReader) readLine() ([]byte, error) {
	r.line = r.line[:0]
	partial := false
	for {
		if r.skipLF && r.start < r.end {
			if r.buf[r.start] == '\n' {
				r.start++
			}
			r.skipLF = false
		}
		chunk := r.buf[r.start:r.end]
		if i := bytes.IndexAny(chunk, "\r\n"); i >= 0 {
			if chunk[i] == '\r' {
				r.skipLF = true
			}
			r.start += i + 1
			if !partial {
				return chunk[:i], nil
			}
			r.line = append(r.line, chunk[:i]...)
			if len(r.line) > r.max() {
				return nil, ErrEventTooLarge
			}
			return r.line, nil
		}
		if len(chunk) > 0 {
			r.line = append(r.line, chunk...)
			partial = true
			if len(r.line) > r.max() {
				return nil, ErrEventTooLarge
			}
		}
		r.start, r.end = 0, 0
		if r.err != nil {
			if partial {
				return r.line, nil
			}
			return nil, r.err
		}
		n, err := r.r.Read(r.buf)
		r.end = n
		if err != nil {
			r.err = err
		}
	}
}

// Next returns the next event. At the end of the stream it returns io.EOF,
// or the underlying reader's error when the stream broke.
func (r *SSEReader) Next() (Event, error) {
	r.data = r.data[:0]
	r.hasData = false
	r.evType = r.evType[:0]
	if r.fatal != nil {
		return Event{}, r.fatal
	}
	for {
		line, err := r.readLine()
		if !r.started && err == nil {
			r.started = true
			line = TrimBOM(line)
		}
		if err != nil {
			if err == ErrEventTooLarge {
				r.fatal = err
				return Event{}, err
			}
			if r.hasData {
				return r.event(), nil
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if r.hasData {
				return r.event(), nil
			}
			r.evType = r.evType[:0]
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data", "error":
			if field[0] == 'e' {
				// llama.cpp's server before PR 16109 (2025-09) sent a
				// mid-stream error as an "error:" field, which the SSE
				// format does not know: an error event, not nothing.
				r.evType = append(r.evType[:0], "error"...)
			}
			if r.hasData {
				r.data = append(r.data, '\n')
			}
			r.data = append(r.data, value...)
			r.hasData = true
			if len(r.data) > r.max() {
				r.fatal = ErrEventTooLarge
				return Event{}, ErrEventTooLarge
			}
		case "event":
			r.evType = append(r.evType[:0], value...)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.id = string(value)
			}
		case "retry":
			if ms, err := strconv.ParseUint(string(value), 10, 63); err == nil {
				r.retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
}

func (r *SSEReader) event() Event {
	return Event{Type: string(r.evType), ID: r.id, Data: r.data, Retry: r.retry}
}

// EventHead keeps the first bytes of an event stream passed on, to tell
// whether it opened with an error event (StartsWithError). The zero value
// is ready to use.
type EventHead struct {
	b [32]byte
	n int
}

// Add records p, the next bytes of the stream, as long as the head is not
// full.
func (h *EventHead) Add(p []byte) {
	if h.n < len(h.b) {
		h.n += copy(h.b[h.n:], p)
	}
}

// StartsWithError reports whether the stream opened with an event whose
// data is a JSON object whose first member is "error": an error event as
// vLLM writes one (data: {"error":{...}}) and SGLang (data: {"error":
// {...}}, Python's json.dumps). SGLang answers so, in a 200, a streamed
// request that its tokenizer manager refuses after the response started
// (a LoRA adapter it does not serve): the stream is that event and
// [DONE], and no token was generated.
func (h *EventHead) StartsWithError() bool {
	p, ok := bytes.CutPrefix(h.b[:h.n], []byte("data:"))
	if !ok {
		return false
	}
	p, ok = bytes.CutPrefix(bytes.TrimLeft(p, " \t"), []byte("{"))
	if !ok {
		return false
	}
	p, ok = bytes.CutPrefix(bytes.TrimLeft(p, " \t"), []byte(`"error"`))
	return ok && bytes.HasPrefix(bytes.TrimLeft(p, " \t"), []byte(":"))
}

// EventTail keeps the last bytes of an event stream passed on, to tell
// whether it stopped between events or mid-event, and whether its final
// data: [DONE] event was sent. Events may end with any of the line endings
// the SSE format allows (LF, CRLF, CR). The zero value is ready to use.
type EventTail [24]byte

// Add records p, the next bytes of the stream.
func (t *EventTail) Add(p []byte) {
	if len(p) >= len(t) {
		copy(t[:], p[len(p)-len(t):])
		return
	}
	k := copy(t[:], t[len(p):])
	copy(t[k:], p)
}

// AtBoundary reports whether the bytes added so far end an event (a blank
// line).
func (t *EventTail) AtBoundary() bool {
	_, ok := eventEnd(t[:])
	return ok
}

// SawDone reports whether the bytes added so far end with the final
// data: [DONE] event.
func (t *EventTail) SawDone() bool {
	const line = "data: " + Done
	b, ok := eventEnd(t[:])
	return ok && len(b) >= len(line) && string(b[len(b)-len(line):]) == line
}

// cutEOL removes one line ending (CRLF, LF or CR) from the end of b.
func cutEOL(b []byte) ([]byte, bool) {
	switch {
	case len(b) >= 2 && b[len(b)-2] == '\r' && b[len(b)-1] == '\n':
		return b[:len(b)-2], true
	case len(b) >= 1 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r'):
		return b[:len(b)-1], true
	}
	return b, false
}

// eventEnd reports whether b ends with a blank line (an event's end) and
// returns b without it.
func eventEnd(b []byte) ([]byte, bool) {
	b, ok := cutEOL(b)
	if !ok {
		return b, false
	}
	return cutEOL(b)
}

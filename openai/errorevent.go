package openai

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// EndsWithErrorEvent reports whether the event stream whose last bytes are
// tail (a UsageTail's) ended with an error event: its last event, apart
// from a final data: [DONE], has data that is a JSON object with an
// "error" member, as vLLM, SGLang and llama.cpp's servers end a stream
// that failed after its 200 (data: {"error": {"message": ..., "type":
// ..., "code": 500}} then data: [DONE]). status is the error's "code"
// when it is an HTTP status (an integer from 100 to 599), else 0: vLLM
// writes 500 for a request its engine failed (GenerationError,
// InternalServerError) and 400 for a request it refused; OpenAI's own
// codes are strings.
//
// An event cut off by the start of tail is read only when its first kept
// line starts a field (data:, event: or a comment); an error event longer
// than tail is not seen.
func EndsWithErrorEvent(tail []byte) (status int, ok bool) {
	ev := lastEvent(tail)
	var data []byte
	lines := 0
	for len(ev) > 0 {
		var line []byte
		line, ev = cutLine(ev)
		v, isData := bytes.CutPrefix(line, []byte("data:"))
		if !isData {
			continue // a comment or another field
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		switch lines++; lines {
		case 1:
			data = v // one line, the usual event: no copy
		case 2:
			data = append(append(append([]byte(nil), data...), '\n'), v...)
		default:
			data = append(append(data, '\n'), v...)
		}
	}
	// Nothing but an error event has this member: a chunk's text
	// containing "error" is inside a string, with its quotes escaped.
	if !bytes.Contains(data, []byte(`"error"`)) {
		return 0, false
	}
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &body) != nil || len(body.Error) == 0 || string(body.Error) == "null" {
		return 0, false
	}
	var e struct {
		Code json.RawMessage `json:"code"`
	}
	if json.Unmarshal(body.Error, &e) != nil {
		return 0, true // "error": "text"
	}
	if c, err := strconv.Atoi(string(e.Code)); err == nil && c >= 100 && c <= 599 {
		return c, true
	}
	return 0, true
}

// lastEvent returns the lines of the last event in b, a stream's last
// bytes, leaving out a final data: [DONE] event and the blank lines that
// end events. It is empty when b holds no event whose start it can tell.
func lastEvent(b []byte) []byte {
	b = bytes.TrimRight(b, "\r\n")
	if start := lineStart(b); isDoneLine(b[start:]) && (start == 0 || blankBefore(b[:start])) {
		b = bytes.TrimRight(b[:start], "\r\n")
	}
	// Walk back line by line to the blank line before the event.
	end := len(b)
	for i := end; ; {
		start := lineStart(b[:i])
		if start == 0 {
			// The event may have started before b did: keep it only
			// when b starts with a field line (b starts a line).
			if bytes.HasPrefix(b, []byte("data:")) || bytes.HasPrefix(b, []byte("event:")) || bytes.HasPrefix(b, []byte(":")) {
				return b[:end]
			}
			return nil
		}
		if blankBefore(b[:start]) {
			return b[start:end]
		}
		i = start - 1 // past the line ending before this line
		if b[i] == '\n' && i > 0 && b[i-1] == '\r' {
			i--
		}
	}
}

// lineStart returns the index at which the last line of b starts.
func lineStart(b []byte) int {
	return bytes.LastIndexAny(b, "\r\n") + 1
}

// blankBefore reports whether b, the bytes before a line, end with a
// blank line: two line endings in a row (LF LF, CRLF CRLF, CR CR, ...).
func blankBefore(b []byte) bool {
	b, ok := cutEOL(b)
	if !ok {
		return false
	}
	if len(b) == 0 {
		return true
	}
	_, ok = cutEOL(b)
	return ok
}

// isDoneLine reports whether line is data: [DONE].
func isDoneLine(line []byte) bool {
	v, ok := bytes.CutPrefix(line, []byte("data:"))
	return ok && string(bytes.TrimPrefix(v, []byte(" "))) == Done
}

// cutLine returns b's first line and the rest after its line ending.
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.IndexAny(b, "\r\n")
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if b[i] == '\r' && len(rest) > 0 && rest[0] == '\n' {
		rest = rest[1:]
	}
	return line, rest
}

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
// ..., "code": 500}} then data: [DONE]), or is an "error:" event, as
// llama.cpp's server before PR 16109 sent one (SSEReader), whose data is
// the error object. status is the error's "code" when it is an HTTP
// status (an integer from 100 to 599), else 0: vLLM writes 500 for a
// request its engine failed (GenerationError, InternalServerError) and
// 400 for a request it refused; OpenAI's own codes are strings.
//
// The tail's first line may be cut: SSEReader takes it for a field it
// does not know, or a comment, and an event cut off by the tail's start
// is never the last one of a stream that ends with an error event, short
// as those are (one longer than the tail is not seen). A tail without
// the word "error" is told at once, without parsing.
func EndsWithErrorEvent(tail []byte) (status int, ok bool) {
	if !bytes.Contains(tail, []byte("error")) {
		return 0, false
	}
	r := NewSSEReader(bytes.NewReader(tail))
	var last []byte
	lastType := ""
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		if string(ev.Data) != Done {
			last, lastType = append(last[:0], ev.Data...), ev.Type
		}
	}
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	errObj := json.RawMessage(nil)
	switch {
	case json.Unmarshal(last, &body) == nil && len(body.Error) > 0 && string(body.Error) != "null":
		errObj = body.Error
	case lastType == "error":
		errObj = last
	default:
		return 0, false
	}
	var e struct {
		Code json.RawMessage `json:"code"`
	}
	if json.Unmarshal(errObj, &e) != nil {
		return 0, true // "error": "text"
	}
	if c, err := strconv.Atoi(string(e.Code)); err == nil && c >= 100 && c <= 599 {
		return c, true
	}
	return 0, true
}

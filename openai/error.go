package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute"
)

// ErrorResponse is the OpenAI-style error body:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
type ErrorResponse struct {
	Error ErrorObject `json:"error"`
}

// ErrorObject is the inside of an ErrorResponse. Param is null when the
// error names no field. Code is the machine-readable code string when the
// error has one, otherwise the HTTP status as a number (as vLLM sends it).
type ErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

// AsError returns err as a *kvroute.Error: err itself (or the one it wraps)
// when it is one, otherwise a 500 internal error carrying err's message.
// A nil err gives nil.
func AsError(err error) *kvroute.Error {
	if err == nil {
		return nil
	}
	var e *kvroute.Error
	if errors.As(err, &e) {
		return e
	}
	return &kvroute.Error{Status: http.StatusInternalServerError, Type: kvroute.TypeInternal,
		Code: "internal_error", Message: err.Error()}
}

// NewErrorResponse builds the body for err (see AsError).
func NewErrorResponse(err error) ErrorResponse {
	e := AsError(err)
	if e == nil {
		e = AsError(errors.New("unknown error"))
	}
	status := e.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	typ := e.Type
	if typ == "" {
		typ = kvroute.TypeInternal
	}
	obj := ErrorObject{Message: e.Error(), Type: typ, Code: status}
	if e.Code != "" {
		obj.Code = e.Code
	}
	if e.Param != "" {
		p := e.Param
		obj.Param = &p
	}
	return ErrorResponse{Error: obj}
}

// AppendError appends err's OpenAI-style JSON body (without a newline) to
// dst. It is also the payload of the error event that ends a failed stream.
func AppendError(dst []byte, err error) []byte {
	b, merr := json.Marshal(NewErrorResponse(err))
	if merr != nil { // cannot happen: every field is a string, a number or null
		return append(dst, `{"error":{"message":"internal error","type":"internal_error","param":null,"code":500}}`...)
	}
	return append(dst, b...)
}

// WriteError writes err as an OpenAI-style error response: the status from
// the *kvroute.Error it is or wraps (500 otherwise) and the JSON body. It is
// the one place HTTP-facing errors become responses. Headers already set on
// w (Retry-After, X-Request-Id) are kept.
func WriteError(w http.ResponseWriter, err error) {
	e := AsError(err)
	status := http.StatusInternalServerError
	if e != nil && e.Status != 0 {
		status = e.Status
	}
	body := AppendError(make([]byte, 0, 256), err)
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Del("Content-Encoding")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// AppendErrorEvent appends the server-sent events that end a stream that
// failed after its first byte, in the form vLLM uses: the error body as a
// data event, then "data: [DONE]".
func AppendErrorEvent(dst []byte, err error) []byte {
	dst = append(dst, "data: "...)
	dst = AppendError(dst, err)
	return append(dst, "\n\ndata: "+Done+"\n\n"...)
}

package kvroute

import (
	"errors"
	"fmt"
	"net/http"
)

// Error is an error with an HTTP status and an OpenAI error type; the proxy
// turns it into {"error":{"message","type","param","code"}} in one place.
type Error struct {
	Status  int    // HTTP status code
	Type    string // OpenAI error type, e.g. invalid_request_error
	Param   string // the offending request field, if any
	Code    string // machine-readable code, e.g. model_not_found
	Message string
	Err     error // wrapped cause, if any
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %v", e.Message, e.Err)
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with the given status, type and formatted message.
func Errorf(status int, typ, code, param, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// Common error types used in OpenAI-style bodies.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeOverloaded     = "overloaded_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeUpstream       = "upstream_error"
	TypeInternal       = "internal_error"
	TypeRateLimit      = "rate_limit_error"
)

// StatusOf returns the HTTP status carried by err, or 500.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) && e.Status != 0 {
		return e.Status
	}
	return http.StatusInternalServerError
}

// EndpointFailure reports whether an engine's response status (or the
// code of the error event that ended its stream) is the endpoint's
// failure, for passive health and retries: 5xx except 501 Not
// Implemented and 505, which say the request, not the endpoint, is at
// fault.
func EndpointFailure(status int) bool {
	return status >= 500 && status != http.StatusNotImplemented && status != http.StatusHTTPVersionNotSupported
}

// HeaderErrorSource is set to ErrorSourceUpstream on an error response
// (status 400 and up) that an engine sent and the router passes through
// unchanged, such as an engine's 404 for a model it does not serve under
// the name asked for; the router's own error responses do not have it.
const HeaderErrorSource = "X-Kvroute-Error-Source"

// ErrorSourceUpstream is the HeaderErrorSource value of an engine's error.
const ErrorSourceUpstream = "upstream"

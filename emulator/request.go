package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"

	"github.com/kvroute/kvroute/tokenizer"
)

// apiRequest is the part of an OpenAI-compatible completions or chat
// request the emulator honours. Other fields (temperature, top_p, ...) are
// accepted and ignored, as they do not change the engine's timing.
type apiRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []apiMessage    `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stop                json.RawMessage `json:"stop"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	N                   *int            `json:"n"`
	Seed                *int64          `json:"seed"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	KVTransferParams    *kvTransfer     `json:"kv_transfer_params"`
	BootstrapHost       string          `json:"bootstrap_host"`
	BootstrapPort       json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom       json.RawMessage `json:"bootstrap_room"`

	stops        []string // parsed Stop
	promptText   string   // completions: text prompt
	promptIDs    []uint32 // completions: token-id prompt
	chatMessages []tokenizer.Message
	room         *uint64 // parsed BootstrapRoom
	port         int     // parsed BootstrapPort
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// kvTransfer is NixlConnector's kv_transfer_params.
type kvTransfer struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteBlockIDs  any    `json:"remote_block_ids"`
	RemoteNumTokens int    `json:"remote_num_tokens"`
}

// apiError is an error answered with vLLM's error body.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// errorType is the "type" vLLM puts in its error bodies for a status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "BadRequestError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	return "InternalServerError"
}

// vllmError is an error with vLLM's status, type and message; written by
// openai.WriteError it becomes vLLM's body
// {"error":{"message":...,"type":"BadRequestError","param":null,"code":400}}.
func vllmError(status int, msg string) *kvroute.Error {
	return &kvroute.Error{Status: status, Type: errorType(status), Message: msg}
}

// appendErrorBody appends vLLM's error body (the payload of a mid-stream
// error event too).
func appendErrorBody(dst []byte, status int, msg string) []byte {
	return openai.AppendError(dst, vllmError(status, msg))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	openai.WriteError(w, vllmError(status, msg))
}

// parseRequest decodes and validates a request body the way vLLM's pydantic
// models and serving layer do (for the fields the emulator honours). A body
// of the common shape takes the fast path (scanRequest); the rest, errors
// included, goes through encoding/json (decodeRequest).
func parseRequest(body []byte, chat bool) (*apiRequest, *apiError) {
	r, ok := scanRequest(body, chat)
	if !ok {
		var aerr *apiError
		if r, aerr = decodeRequest(body, chat); aerr != nil {
			return nil, aerr
		}
	}
	if aerr := r.checkOptions(); aerr != nil {
		return nil, aerr
	}
	if !ok {
		if aerr := r.decodeExtra(); aerr != nil {
			return nil, aerr
		}
	}
	return r, nil
}

// checkOptions validates n, max_tokens (max_completion_tokens takes its
// place when given) and stream_options.
func (r *apiRequest) checkOptions() *apiError {
	if r.N != nil && *r.N != 1 {
		return badRequest("n=%d is not supported: this engine generates one choice per request (n must be 1)", *r.N)
	}
	if r.MaxCompletionTokens != nil {
		r.MaxTokens = r.MaxCompletionTokens
	}
	if r.MaxTokens != nil && *r.MaxTokens < 1 {
		return badRequest("max_tokens must be at least 1, got %d.", *r.MaxTokens)
	}
	if r.StreamOptions != nil && !r.Stream {
		return badRequest("Stream options can only be defined when `stream=True`.")
	}
	return nil
}

// decodeRequest decodes a body with encoding/json: the messages or the
// prompt (their errors come first, as vLLM's validation reports them).
func decodeRequest(body []byte, chat bool) (*apiRequest, *apiError) {
	var r apiRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, badRequest("JSON decode error: %v", err)
	}
	if chat {
		if r.Messages == nil {
			return nil, badRequest("1 validation error for ChatCompletionRequest\nmessages\n  Field required")
		}
		r.chatMessages = make([]tokenizer.Message, 0, len(r.Messages))
		for i, m := range r.Messages {
			if m.Role == "" {
				return nil, badRequest("1 validation error for ChatCompletionRequest\nmessages.%d.role\n  Field required", i)
			}
			text, err := messageText(m.Content)
			if err != nil {
				return nil, badRequest("1 validation error for ChatCompletionRequest\nmessages.%d.content\n  %v", i, err)
			}
			r.chatMessages = append(r.chatMessages, tokenizer.Message{Role: m.Role, Content: text})
		}
	} else {
		if len(r.Prompt) == 0 || string(r.Prompt) == "null" {
			return nil, badRequest("1 validation error for CompletionRequest\nprompt\n  Field required")
		}
		if err := r.parsePrompt(); err != nil {
			return nil, err
		}
	}
	return &r, nil
}

// decodeExtra decodes the raw fields decodeRequest kept: stop and the
// SGLang bootstrap fields (after checkOptions, as vLLM validates them).
func (r *apiRequest) decodeExtra() *apiError {
	if len(r.Stop) > 0 && string(r.Stop) != "null" {
		var one string
		if err := json.Unmarshal(r.Stop, &one); err == nil {
			r.stops = []string{one}
		} else if err := json.Unmarshal(r.Stop, &r.stops); err != nil {
			return badRequest("1 validation error\nstop\n  Input should be a valid string or a list of strings")
		}
	}
	if len(r.BootstrapRoom) > 0 && string(r.BootstrapRoom) != "null" {
		var room uint64
		if err := json.Unmarshal(r.BootstrapRoom, &room); err != nil {
			return badRequest("bootstrap_room must be one non-negative integer (batched requests are not supported)")
		}
		r.room = &room
	}
	if len(r.BootstrapPort) > 0 && string(r.BootstrapPort) != "null" {
		if err := json.Unmarshal(r.BootstrapPort, &r.port); err != nil || r.port < 0 || r.port > 65535 {
			return badRequest("bootstrap_port must be a port number")
		}
	}
	return nil
}

// messageText returns a message's text: a string, null, or a list of
// content parts whose "text" parts are concatenated.
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("Input should be a valid string or a list of content parts")
	}
	var b []byte
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q is not supported (text only)", p.Type)
		}
		b = append(b, p.Text...)
	}
	return string(b), nil
}

// parsePrompt accepts a string, a list of one string, a list of token ids,
// or a list of one list of token ids.
func (r *apiRequest) parsePrompt() *apiError {
	var s string
	if err := json.Unmarshal(r.Prompt, &s); err == nil {
		r.promptText = s
		return nil
	}
	var ss []string
	if err := json.Unmarshal(r.Prompt, &ss); err == nil {
		if len(ss) != 1 {
			return badRequest("batched prompts are not supported: give one prompt (got %d)", len(ss))
		}
		r.promptText = ss[0]
		return nil
	}
	var ids []uint32
	if err := json.Unmarshal(r.Prompt, &ids); err == nil {
		r.promptIDs = ids
		return nil
	}
	var idss [][]uint32
	if err := json.Unmarshal(r.Prompt, &idss); err == nil {
		if len(idss) != 1 {
			return badRequest("batched prompts are not supported: give one prompt (got %d)", len(idss))
		}
		r.promptIDs = idss[0]
		return nil
	}
	return badRequest("1 validation error for CompletionRequest\nprompt\n  Input should be a string, a list of strings, a list of token ids or a list of lists of token ids")
}

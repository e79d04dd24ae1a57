package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/pyjson"
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
	MaxTokens           *wholeInt       `json:"max_tokens"`
	MaxCompletionTokens *wholeInt       `json:"max_completion_tokens"`
	Stop                json.RawMessage `json:"stop"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	IncludeStopStr      bool            `json:"include_stop_str_in_output"` // keep a matched stop string in the text
	MinTokens           wholeInt        `json:"min_tokens"`                 // no EOS, and no stop string, in the first MinTokens tokens
	Stream              bool            `json:"stream"`
	promptEmpty         bool            // completions: the prompt is the empty string (the bools share a word)
	autoTools           bool            // chat: tool_choice is "auto", given or implied by tools (checkTools)
	N                   *wholeInt       `json:"n"`
	Seed                *wholeInt       `json:"seed"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	KVTransferParams    *kvTransfer     `json:"kv_transfer_params"`
	BootstrapHost       string          `json:"bootstrap_host"`
	BootstrapPort       json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom       json.RawMessage `json:"bootstrap_room"`
	// LoRAPath is SGLang's per-request adapter (its name): read with the
	// SGLang P/D protocol only (Server.resolveSGLangAdapter).
	LoRAPath json.RawMessage `json:"lora_path"`
	// LoRA is llama.cpp's per-request adapter scales ([{"id": N, "scale":
	// S}]): read with the llama.cpp flavour only, kept raw
	// (Server.resolveLlamaAdapter); absent: empty, null: "null".
	LoRA      json.RawMessage `json:"lora"`
	Suffix    json.RawMessage `json:"suffix"`     // completions: vLLM rejects any but null (hasSuffix)
	CacheSalt json.RawMessage `json:"cache_salt"` // the prefix cache's salt (checkOptions: cacheSalt)
	RequestID json.RawMessage `json:"request_id"` // vLLM's request id when no X-Request-Id (checkOptions: requestID)
	// The chat template's and the tokenizer's options (vLLM's chat and
	// tokenize requests; chatOptions). AddSpecialTokens is the
	// completions' too (default true there, false for chat).
	AddGenerationPrompt  *bool                      `json:"add_generation_prompt"`
	ContinueFinalMessage bool                       `json:"continue_final_message"`
	AddSpecialTokens     *bool                      `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]json.RawMessage `json:"chat_template_kwargs"`
	Tools                json.RawMessage            `json:"tools"`
	Documents            json.RawMessage            `json:"documents"`        // the template's documents (RAG templates)
	ReasoningEffort      json.RawMessage            `json:"reasoning_effort"` // template variables (tokenizer.ReasoningEffortVars)
	ChatTemplate         json.RawMessage            `json:"chat_template"`    // a template of the client's own: vLLM's 400 (tokenizer.ErrRequestChatTemplate)
	// opts are the options vLLM checks that only bodies the fast path
	// leaves to encoding/json have (reqOptions); nil without any.
	opts *reqOptions

	stops        []string // parsed Stop
	cacheSalt    string   // parsed CacheSalt: engine.Request.CacheSalt
	requestID    string   // parsed RequestID ("" when absent)
	promptText   string   // completions: text prompt
	promptIDs    []uint32 // completions: token-id prompt
	chatMessages []tokenizer.Message
	// messagesJSON is the messages' JSON, for a HuggingFace chat template
	// (tokenizer.ChatTemplate.RenderJSON: the keys vLLM gives a template
	// besides role and content, such as an assistant's tool_calls).
	messagesJSON []byte
	partErr      *contentErr // chat: the first content part vLLM refuses (contentError)
	room         *uint64     // parsed BootstrapRoom
	loraPath     string      // parsed LoRAPath ("" when absent or null)
	port         int         // parsed BootstrapPort
}

// reqOptions are request fields the engine model does not act on but
// vLLM checks or answers (options.go); decodeRequest reads them, in a
// pass of their own, so that the fast path's requests carry none.
type reqOptions struct {
	ToolChoice json.RawMessage `json:"tool_choice"`
	// ReturnTokenIDs is vLLM's return_token_ids: the response carries the
	// prompt's and the generated tokens' ids (prompt_token_ids,
	// token_ids) instead of null.
	ReturnTokenIDs *bool `json:"return_token_ids"`
	// Logprobs is chat's bool or the completions' count; TopLogprobs
	// chat's count (checkLogprobs). The emulator computes none: a request
	// that asks for them passing vLLM's checks is refused (logprobsError).
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs json.RawMessage `json:"top_logprobs"`

	// logprobs is the sample logprobs vLLM's sampling parameters get (chat:
	// top_logprobs when logprobs is true; completions: logprobs), nil for
	// none; wantLogprobs whether the response would carry logprobs.
	logprobs     *int
	wantLogprobs bool
}

// optionKeys are reqOptions' JSON keys.
var optionKeys = []string{"tool_choice", "return_token_ids", "logprobs", "top_logprobs"}

// decodeOptions reads a body's reqOptions into r.opts (nil when it has
// none).
func (r *apiRequest) decodeOptions(body []byte) *apiError {
	var o reqOptions
	if err := json.Unmarshal(exactKeys(body, optionKeys...), &o); err != nil {
		return invalidBody("body", "JSON decode error: %v", err)
	}
	if len(o.ToolChoice) > 0 || o.ReturnTokenIDs != nil || len(o.Logprobs) > 0 || len(o.TopLogprobs) > 0 {
		r.opts = &o
	}
	return nil
}

// returnTokenIDs reports whether the request set return_token_ids.
func (r *apiRequest) returnTokenIDs() bool {
	return r.opts != nil && r.opts.ReturnTokenIDs != nil && *r.opts.ReturnTokenIDs
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// UnmarshalJSON decodes a message with its keys matched exactly
// (exactKeys).
func (m *apiMessage) UnmarshalJSON(b []byte) error {
	type plain apiMessage
	return json.Unmarshal(exactKeys(b, "role", "content"), (*plain)(m))
}

// foldedKey reports whether the JSON object obj may have a key that names
// one of keys only up to case: it walks obj's keys with the fast path's
// scanner (its values skipped), and reports true as well when obj is
// beyond that scanner (exactKeys then decodes it to know).
func foldedKey(obj []byte, keys []string) bool {
	s := scanner{b: obj}
	s.ws()
	if !s.eat('{') {
		return true
	}
	s.ws()
	if s.eat('}') {
		return false
	}
	for {
		k, ok := s.str()
		if !ok {
			return true
		}
		if bytes.ContainsFunc(k, func(r rune) bool { return r != unicode.ToLower(r) || r == 'ſ' }) {
			for _, key := range keys {
				if strings.EqualFold(string(k), key) && string(k) != key {
					return true
				}
			}
		}
		s.ws()
		if !s.eat(':') {
			return true
		}
		s.ws()
		if !s.skip(0) {
			return true
		}
		s.ws()
		if s.eat(',') {
			s.ws()
			continue
		}
		return !s.eat('}')
	}
}

// requestKeys are the JSON keys of apiRequest's fields.
var requestKeys = sync.OnceValue(func() []string {
	var keys []string
	t := reflect.TypeFor[apiRequest]()
	for i := range t.NumField() {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	return keys
})

// exactKeys returns obj, a JSON object, without the keys that name one of
// keys only up to case, and obj itself when it has none: pydantic (vLLM's
// request models, and the router's parser) matches keys exactly, so such
// a key is an unknown one, ignored, where encoding/json would take it for
// the field (the last of the two in the body winning). Only bodies the
// fast path (scanRequest, exact keys) leaves to encoding/json come here.
func exactKeys(obj []byte, keys ...string) []byte {
	if !foldedKey(obj, keys) {
		return obj
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(obj, &m) != nil {
		return obj // encoding/json reports the error
	}
	folded := false
	for k := range m {
		for _, key := range keys {
			if k != key && strings.EqualFold(k, key) {
				delete(m, k)
				folded = true
				break
			}
		}
	}
	if !folded {
		return obj
	}
	b, err := json.Marshal(m)
	if err != nil {
		return obj
	}
	return b
}

// streamOptions is stream_options as vLLM's StreamOptions has it:
// include_usage defaults to true (only an explicit false or null turns the
// usage chunk off), continuous_usage_stats to false.
type streamOptions struct {
	IncludeUsage         bool
	ContinuousUsageStats bool
	// set is whether the object has any key: vLLM's validator rejects
	// stream_options without stream=true only when the raw object is not
	// empty ({} passes).
	set bool
}

// UnmarshalJSON decodes stream_options with vLLM's defaults (the
// encoding/json path; scanRequest's streamOptions is the fast one).
func (so *streamOptions) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*so = streamOptions{IncludeUsage: true, set: len(m) > 0}
	for k, v := range m {
		var dst *bool
		switch k {
		case "include_usage":
			dst = &so.IncludeUsage
		case "continuous_usage_stats":
			dst = &so.ContinuousUsageStats
		default:
			continue
		}
		var on *bool // null is None: false
		if err := json.Unmarshal(v, &on); err != nil {
			return fmt.Errorf("stream_options.%s: %w", k, err)
		}
		*dst = on != nil && *on
	}
	return nil
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
	// param is the request field the error is about (vLLM's
	// VLLMValidationError parameter); "" writes null.
	param string
	// typ overrides the type errorType gives the status: vLLM answers
	// errors found while FastAPI validates the body (pydantic, its model
	// validators) with the HTTP phrase "Bad Request" instead of
	// "BadRequestError".
	typ string
	// sglang writes the error in SGLang's flat shape (writeSGLang).
	sglang bool
	// llama writes the error in llama.cpp's shape (llamaError: code,
	// message and type, typ its type).
	llama bool
	// inStream: SGLang raises the error inside a streamed response's
	// generator (its tokenizer manager's), after the response started: a
	// streamed request gets it as the stream's error event in a 200
	// (writeSGLangStreamError).
	inStream bool
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// invalidBody is a 400 for a body vLLM rejects while validating it into
// its request model: type "Bad Request" and the offending field in param.
func invalidBody(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...), param: param, typ: typeValidation}
}

// errNoPrompt is vLLM's CompletionRequest validator's error for a prompt
// that is missing, null or "".
func errNoPrompt() *apiError {
	return invalidBody("prompt", "Value error, Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)")
}

// hasSuffix reports whether a completions request gives a suffix, which
// vLLM does not support (its serving layer's 400, after the model check).
func (r *apiRequest) hasSuffix() bool {
	return len(r.Suffix) > 0 && string(r.Suffix) != "null"
}

// errNoModel is vLLM's error for a request naming another model.
func errNoModel(model string) *apiError {
	return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", model), param: "model"}
}

// tooFewTokens is vLLM's error for a max_tokens below 1 (its sampling
// parameters' check).
func tooFewTokens(n int) *apiError {
	return validationError("max_tokens", n, "max_tokens must be at least 1, got %d.", n)
}

// checkMinTokens is vLLM's check of min_tokens against the request's final
// max_tokens (its sampling parameters').
func checkMinTokens(minTokens, maxTokens int) *apiError {
	if minTokens < 0 {
		return badRequest("min_tokens must be greater than or equal to 0, got %d.", minTokens)
	}
	if minTokens > maxTokens {
		return badRequest("min_tokens must be less than or equal to max_tokens=%d, got %d.", maxTokens, minTokens)
	}
	return nil
}

// validationError is vLLM's VLLMValidationError raised while serving a
// request: a 400 BadRequestError whose message ends with the parameter and
// the rejected value, and whose param names the parameter.
func validationError(param string, value int, format string, args ...any) *apiError {
	msg := fmt.Sprintf(format, args...) + " (parameter=" + param + ", value=" + strconv.Itoa(value) + ")"
	return &apiError{status: http.StatusBadRequest, msg: msg, param: param}
}

// typeValidation is the type of vLLM's RequestValidationError answers
// (HTTPStatus.BAD_REQUEST.phrase).
const typeValidation = "Bad Request"

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

// kvError is e as the error openai.WriteError writes.
func (e *apiError) kvError() *kvroute.Error {
	ke := vllmError(e.status, e.msg)
	ke.Param = e.param
	if e.typ != "" {
		ke.Type = e.typ
	}
	return ke
}

// appendErrorBody appends vLLM's error body (the payload of a mid-stream
// error event too).
func appendErrorBody(dst []byte, status int, msg string) []byte {
	return openai.AppendError(dst, vllmError(status, msg))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	openai.WriteError(w, vllmError(status, msg))
}

// writeAPIError writes e with its param and type.
func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.sglang {
		writeSGLang(w, e)
		return
	}
	if e.llama {
		llamaError(w, e.status, e.msg, e.typ)
		return
	}
	openai.WriteError(w, e.kvError())
}

// writeSGLang writes e as SGLang's OpenAI-compatible server answers an
// error (OpenAIServingBase.create_error_response): its ErrorResponse
// dumped at the top level, not under "error" as vLLM's, with type
// "BadRequestError" for a 400 (e.typ otherwise) and the status as code.
func writeSGLang(w http.ResponseWriter, e *apiError) {
	typ := e.typ
	if typ == "" {
		typ = "BadRequestError"
	}
	var param any
	if e.param != "" {
		param = e.param
	}
	body, _ := json.Marshal(struct {
		Object  string `json:"object"`
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    int    `json:"code"`
	}{"error", e.msg, typ, param, e.status})
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	_, _ = w.Write(body)
}

// writeSGLangStreamError writes e, an SGLang error raised inside a
// streamed response (apiError.inStream), as SGLang's serving code sends it:
// the StreamingResponse has started (200, text/event-stream), its
// generator catches the ValueError (serving_chat.py's
// _generate_chat_stream, serving_completions.py's generate_stream_resp)
// and yields create_streaming_error_response's event, Python's
// json.dumps of {"error": <its ErrorResponse>} (", " and ": " between
// items, non-ASCII escaped), then "data: [DONE]".
func writeSGLangStreamError(w http.ResponseWriter, e *apiError) {
	typ := e.typ
	if typ == "" {
		typ = "BadRequestError"
	}
	b := append(make([]byte, 0, 128+len(e.msg)), `data: {"error": {"object": "error", "message": `...)
	b = pyjson.AppendString(b, e.msg, true)
	b = append(b, `, "type": `...)
	b = pyjson.AppendString(b, typ, true)
	b = append(b, `, "param": `...)
	if e.param != "" {
		b = pyjson.AppendString(b, e.param, true)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `, "code": `...)
	b = strconv.AppendInt(b, int64(e.status), 10)
	b = append(b, "}}\n\ndata: [DONE]\n\n"...)
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	_ = http.NewResponseController(w).Flush()
}

// parseRequest decodes and validates a request body the way vLLM's pydantic
// models and serving layer do (for the fields the emulator honours). A body
// of the common shape takes the fast path (scanRequest); the rest, errors
// included, goes through encoding/json (decodeRequest). Chat messages'
// contents may alias body (scanRequest's): body must not change while
// they are used.
func parseRequest(body []byte, chat bool) (*apiRequest, *apiError) {
	r, scanned, aerr := parseBody(body, chat)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := r.checkOptions(chat); aerr != nil {
		return nil, aerr
	}
	if !scanned {
		if aerr := r.decodeExtra(); aerr != nil {
			return nil, aerr
		}
	}
	return r, nil
}

// parseBody decodes the prompt or the messages of a body and the fields
// the fast path reads (scanned reports that it took the body), without
// the generation options' checks: what POST /tokenize needs.
func parseBody(body []byte, chat bool) (r *apiRequest, scanned bool, aerr *apiError) {
	body = openai.TrimBOM(body) // as vLLM's server reads it
	if r, ok := scanRequest(body, chat); ok {
		return r, true, nil
	}
	r, aerr = decodeRequest(body, chat)
	return r, false, aerr
}

// completionDefaultMaxTokens is max_tokens of a /v1/completions request
// that gives none or null (vLLM's CompletionRequest default, the OpenAI
// Completions API's too).
const completionDefaultMaxTokens = 16

// checkOptions validates stream_options, logprobs and tools, and picks max_tokens (on
// chat, max_completion_tokens takes its place when given; vLLM's
// CompletionRequest has no such field and ignores it; its max_tokens
// defaults to 16). checkLength checks max_tokens, after the model, as
// vLLM's sampling parameters do.
func (r *apiRequest) checkOptions(chat bool) *apiError {
	if r.StreamOptions != nil && r.StreamOptions.set && !r.Stream {
		return invalidBody("stream_options", "Value error, Stream options can only be defined when `stream=True`.")
	}
	if aerr := r.checkLogprobs(chat); aerr != nil {
		return aerr
	}
	if chat {
		if aerr := r.checkTools(); aerr != nil {
			return aerr
		}
	}
	if len(r.CacheSalt) > 0 && string(r.CacheSalt) != "null" {
		// vLLM's check_cache_salt_support (a model validator).
		if json.Unmarshal(r.CacheSalt, &r.cacheSalt) != nil || r.cacheSalt == "" {
			return invalidBody("body", "Value error, Parameter 'cache_salt' must be a non-empty string if provided.")
		}
	}
	if len(r.RequestID) > 0 {
		// vLLM's request models have request_id: str (default a random
		// uuid): null or another type is a validation error.
		if json.Unmarshal(r.RequestID, &r.requestID) != nil || string(r.RequestID) == "null" {
			model := "CompletionRequest"
			if chat {
				model = "ChatCompletionRequest"
			}
			return invalidBody("body.request_id", "1 validation error for %s\nrequest_id\n  Input should be a valid string", model)
		}
	}
	if !chat {
		r.MaxCompletionTokens = nil
	}
	if r.MaxCompletionTokens != nil {
		r.MaxTokens = r.MaxCompletionTokens
	}
	return nil
}

// checkN is vLLM's sampling parameters' check of n (the first of them):
// n below 1 is its error; n above 1, which vLLM serves with n choices, is
// refused, as the emulator generates one choice per request. Null is 1.
func (r *apiRequest) checkN() *apiError {
	if r.N == nil || *r.N == 1 {
		return nil
	}
	if *r.N < 1 {
		return badRequest("n must be at least 1, got %d.", *r.N)
	}
	return badRequest("n=%d is not supported by this emulated engine: it generates one choice per request (n must be 1)", *r.N)
}

// wholeInt is an integer field of a request (max_tokens,
// max_completion_tokens, n, seed, min_tokens) as vLLM's (lax) pydantic
// models read it: a JSON integer, or a number in float form whose value
// is whole (1024.0, 1e3, as Python's json.dumps writes a computed value).
type wholeInt int

// UnmarshalJSON reads an integer, or a whole number in float form.
func (w *wholeInt) UnmarshalJSON(b []byte) error {
	if n, err := strconv.ParseInt(string(b), 10, strconv.IntSize); err == nil {
		*w = wholeInt(n)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("Input should be a valid integer, got %s", b)
	}
	if f != math.Trunc(f) {
		return fmt.Errorf("Input should be a valid integer, got a number with a fractional part (%s)", b)
	}
	if f < math.MinInt || f >= math.MaxInt {
		return fmt.Errorf("Input should be a valid integer, got %s, out of range", b)
	}
	*w = wholeInt(f)
	return nil
}

// decodeRequest decodes a body with encoding/json: the messages or the
// prompt (their errors come first, as vLLM's validation reports them).
func decodeRequest(body []byte, chat bool) (*apiRequest, *apiError) {
	var r apiRequest
	if err := json.Unmarshal(exactKeys(body, requestKeys()...), &r); err != nil {
		return nil, invalidBody("body", "JSON decode error: %v", err)
	}
	if aerr := r.decodeOptions(body); aerr != nil {
		return nil, aerr
	}
	if chat {
		if r.Messages == nil {
			return nil, invalidBody("body.messages", "1 validation error for ChatCompletionRequest\nmessages\n  Field required")
		}
		r.chatMessages = make([]tokenizer.Message, 0, len(r.Messages))
		for i, m := range r.Messages {
			if m.Role == "" {
				return nil, invalidBody(fmt.Sprintf("body.messages.%d.role", i), "1 validation error for ChatCompletionRequest\nmessages.%d.role\n  Field required", i)
			}
			text, perr, err := messageText(m.Content)
			if err != nil {
				return nil, invalidBody(fmt.Sprintf("body.messages.%d.content", i), "1 validation error for ChatCompletionRequest\nmessages.%d.content\n  %v", i, err)
			}
			if r.partErr == nil {
				r.partErr = perr
			}
			r.chatMessages = append(r.chatMessages, tokenizer.Message{Role: m.Role, Content: text})
		}
		var raw struct {
			Messages json.RawMessage `json:"messages"`
		}
		if json.Unmarshal(exactKeys(body, "messages"), &raw) == nil {
			r.messagesJSON = raw.Messages
		}
		// vLLM's check_generation_prompt, on the request as sent (an
		// add_generation_prompt left to its default true passes here).
		if r.ContinueFinalMessage && r.AddGenerationPrompt != nil && *r.AddGenerationPrompt {
			return nil, invalidBody("body", "Value error, Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
	} else {
		if len(r.Prompt) == 0 || string(r.Prompt) == "null" {
			return nil, errNoPrompt()
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
			return invalidBody("body.stop", "1 validation error\nstop\n  Input should be a valid string or a list of strings")
		}
	}
	if len(r.BootstrapRoom) > 0 && string(r.BootstrapRoom) != "null" {
		var room uint64
		if err := json.Unmarshal(r.BootstrapRoom, &room); err != nil {
			return badRequest("bootstrap_room must be one non-negative integer (batched requests are not supported)")
		}
		r.room = &room
	}
	if len(r.LoRAPath) > 0 && string(r.LoRAPath) != "null" {
		if err := json.Unmarshal(r.LoRAPath, &r.loraPath); err != nil {
			return badRequest("lora_path must be one adapter name (batched requests are not supported)")
		}
	}
	if len(r.BootstrapPort) > 0 && string(r.BootstrapPort) != "null" {
		if err := json.Unmarshal(r.BootstrapPort, &r.port); err != nil || r.port < 0 || r.port > 65535 {
			return badRequest("bootstrap_port must be a port number")
		}
	}
	return nil
}

// messageText returns a message's text: a string, null, or a list of
// content parts joined with newlines, as vLLM renders them for a chat
// template that takes string content (chat_utils.py,
// _parse_chat_message_content_parts): a part that is a plain string, and
// the parts vLLM reads as text ("text", "input_text" and "output_text" by
// their "text", "refusal" and "thinking" by the member of that name), give
// their text; one whose text is empty, null or absent is dropped, as vLLM
// drops it. A part vLLM refuses only when it renders the messages (an
// image on this text-only model, a type it does not know) is refused in
// partErr, reported after the model check as vLLM reports it (contentError);
// err is a content of the wrong shape, which vLLM's request model refuses.
func messageText(raw json.RawMessage) (text string, partErr *contentErr, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, fmt.Errorf("Input should be a valid string or a list of content parts")
	}
	var b []byte
	written := false
	for _, raw := range parts {
		var t string
		if json.Unmarshal(raw, &t) != nil {
			var p map[string]json.RawMessage // keys matched exactly, as pydantic does
			if err := json.Unmarshal(raw, &p); err != nil {
				return "", nil, fmt.Errorf("Input should be a valid string or a content part object")
			}
			var perr *contentErr
			if t, perr, err = partText(p); err != nil {
				return "", nil, err
			}
			if perr != nil {
				if partErr == nil {
					partErr = perr // vLLM stops at the first
				}
				continue
			}
		}
		if t == "" {
			continue // vLLM keeps only the parts that parse to a true value (chat_utils.py: `if parse_res:`)
		}
		if written {
			b = append(b, '\n') // vLLM joins text parts with "\n" (chat_utils.py)
		}
		b = append(b, t...)
		written = true
	}
	return string(b), partErr, nil
}

// mediaParts are the content part types (and, in a part without a type,
// the members) vLLM reads as images, audio or video, which a text-only
// model refuses (chat_utils.py's MM_PARSER_MAP).
var mediaParts = []string{"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds", "video_url"}

// supportedParts is vLLM's list of content part types in its error for
// another one (MM_PARSER_MAP's keys, sorted).
const supportedParts = "audio_embeds, audio_url, image_embeds, image_pil, image_url, input_audio, input_image, input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, video_url"

// partText returns the text of a content part object p as vLLM reads it
// (messageText), or the error vLLM gives for it when it renders the
// messages.
func partText(p map[string]json.RawMessage) (string, *contentErr, error) {
	var typ string
	rawType, hasType := p["type"]
	if hasType && string(rawType) != "null" {
		if json.Unmarshal(rawType, &typ) != nil {
			return "", &contentErr{msg: "Invalid 'type' field in multimodal part."}, nil
		}
	} else {
		for _, k := range mediaParts { // vLLM finds the kind of a part without a type by its members
			if _, ok := p[k]; ok {
				return "", &contentErr{media: true}, nil
			}
		}
		return "", &contentErr{msg: "Missing 'type' field in multimodal part."}, nil
	}
	key := ""
	switch typ {
	case "text", "input_text", "output_text":
		key = "text"
	case "refusal", "thinking":
		key = typ
	case "tool_reference": // the name of a deferred tool, as text to a template that takes strings
		key = "name"
	case "prompt_embeds":
		return "", &contentErr{msg: "You must set `--enable-prompt-embeds` to input `prompt_embeds`"}, nil
	default:
		if slices.Contains(mediaParts, typ) {
			return "", &contentErr{media: true}, nil
		}
		return "", &contentErr{msg: fmt.Sprintf("Unsupported chat content part type: %s. Supported types: %s. (parameter=type, value=%s)", pyRepr(typ), supportedParts, typ), param: "type"}, nil
	}
	var t *string // absent or null: no text, dropped
	if v, ok := p[key]; ok {
		if err := json.Unmarshal(v, &t); err != nil {
			return "", nil, fmt.Errorf("content part %q: %s should be a valid string", typ, key)
		}
	}
	if t == nil {
		return "", nil, nil
	}
	return *t, nil, nil
}

// pyRepr is Python's repr of a string, for the common case: single
// quotes, unless the string has one and no double quote.
func pyRepr(s string) string {
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}

// contentErr is a content part vLLM refuses when it renders a chat
// request's messages, after it has checked the model: a part of a type it
// does not know (param "type"), or an image, audio or video part, which a
// text-only model refuses with "<model> is not a multimodal model".
type contentErr struct {
	msg   string
	param string
	media bool
}

// contentError is the 400 vLLM answers for a request whose content parts
// it refuses (apiRequest.partErr), or nil.
func (s *Server) contentError(r *apiRequest) *apiError {
	e := r.partErr
	if e == nil {
		return nil
	}
	if e.media {
		return badRequest("%s is not a multimodal model", s.cfg.Model)
	}
	return &apiError{status: http.StatusBadRequest, msg: e.msg, param: e.param}
}

// parsePrompt accepts a string, a list of one string, a list of token ids,
// or a list of one list of token ids.
func (r *apiRequest) parsePrompt() *apiError {
	var s string
	if err := json.Unmarshal(r.Prompt, &s); err == nil {
		r.promptText, r.promptEmpty = s, s == ""
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
	return invalidBody("body.prompt", "1 validation error for CompletionRequest\nprompt\n  Input should be a string, a list of strings, a list of token ids or a list of lists of token ids")
}

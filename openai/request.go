package openai

import (
	"bytes"
	"encoding/binary"
	"math"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// Kind is the API a request body is addressed to.
type Kind uint8

const (
	// KindCompletion is POST /v1/completions: the prompt is in "prompt".
	KindCompletion Kind = iota
	// KindChat is POST /v1/chat/completions: the prompt is in "messages".
	KindChat
)

func (k Kind) String() string {
	if k == KindChat {
		return "chat"
	}
	return "completion"
}

// RequestInfo is what routing needs from a request body. Everything else in
// the body is skipped (but still checked to be well-formed JSON) and the body
// itself is forwarded untouched.
type RequestInfo struct {
	// Model is the "model" field. ParseRequest fails when it is missing.
	Model string
	// Prompt is the canonical prompt text routing hashes (see ParseRequest).
	Prompt string
	// TokenIDs holds the prompt when a completion request sends token ids
	// (one sequence; for a batch, the sequences concatenated).
	TokenIDs []uint32
	// Stream is the "stream" field (false when absent or null).
	Stream bool
	// MaxTokens is, for chat, "max_completion_tokens" when present, else
	// "max_tokens"; for completions "max_tokens" (the Completions API, and
	// vLLM's CompletionRequest, have no max_completion_tokens: it is
	// skipped like any unknown field). 0 when absent or null. A number
	// with a whole value counts whatever its form (1024.0, 1e3).
	MaxTokens int
	// User is the "user" field ("" when absent or null).
	User string
	// Messages is the number of chat messages (0 for completions).
	Messages int
	// CacheSalt is the "cache_salt" field when it is a string (vLLM's
	// prefix-cache salt; "" when absent, null or of another type, which
	// the engine refuses).
	CacheSalt string
	// SessionValue is the value of the top-level field named by
	// Options.SessionField: a string's value, or the JSON text of a number,
	// boolean, object or array; "" when absent or null.
	SessionValue string
	// LoRAPath is the LoRA adapter "lora_path" names, SGLang's field
	// (see AdapterRead): a string's value; for a list (a batch's, one name
	// per item) the name every item gives; "" when absent, null, an empty
	// string or a list of none. A list whose items name different adapters
	// (or some an adapter and some none), or a value of another type, is a
	// 400: the router routes a request for one adapter.
	LoRAPath string

	// mediaBytes is how much of Prompt is the JSON of content parts that
	// are not text, and mediaParts how many they are.
	mediaBytes, mediaParts int
}

// PromptTokens estimates the prompt's length in tokens: exact for token-id
// prompts, about four characters per token for text, and for each chat
// content part that is not text (an image, audio) nonTextPartTokens,
// whatever the size of its JSON (a data URL's base64 is not prompt text).
func (ri *RequestInfo) PromptTokens() int {
	if ri.TokenIDs != nil {
		return len(ri.TokenIDs)
	}
	return (len(ri.Prompt)-ri.mediaBytes+3)/4 + ri.mediaParts*nonTextPartTokens
}

// nonTextPartTokens is what PromptTokens counts for a content part that is
// not text (an image, audio, a video): engines turn one into a number of
// placeholder tokens that depends on the model and the media (576 for
// LLaVA-1.5, 1,369 for a 1024x1024 image with Qwen2.5-VL, 765 for
// OpenAI's own high-detail 1024x1024), not on the length of its JSON.
const nonTextPartTokens = 1024

// maxDepth bounds the nesting of skipped values, as encoding/json does.
const maxDepth = 10000

// utf8BOM is the UTF-8 byte-order mark, which a body may start with.
const utf8BOM = "\xef\xbb\xbf"

// TrimBOM returns body without its leading UTF-8 byte-order mark, if it has
// one: the engines' servers read such a body (Python's json.loads skips the
// mark in bytes), and so do ParseRequest and whatever decodes a body after
// it with encoding/json, which does not.
func TrimBOM(body []byte) []byte { return bytes.TrimPrefix(body, []byte(utf8BOM)) }

// ParseRequest scans a completion or chat-completion request body once,
// without building a document tree, and returns the fields routing needs.
// Every value is checked to be well-formed JSON, so a body ParseRequest
// accepts is one encoding/json accepts, but for one leading UTF-8
// byte-order mark, which it skips as vLLM and SGLang do (Python's
// json.loads skips it in bytes; the body is forwarded with it); object keys
// match case-sensitively and the last of duplicate keys wins.
//
// The canonical prompt is, for completions, the prompt string itself; for a
// batch of strings each one framed as a netstring ("<len>:<text>,"); for
// token ids the decimal ids each followed by a space. For chat it is the
// messages in kvroute's canonical chat form (kvroute.AppendChatMessage),
// with an assistant message's "tool_calls" after its content and the
// request's "tools" before the first message, each as its raw JSON (chat
// templates render them into the prompt): no two different conversations
// share a canonical text, a conversation's text is a prefix of its
// continuation's, and two conversations whose messages share a long
// prefix share it in their canonical texts. Content given as parts
// joins the parts with "\n" (as vLLM joins text parts): plain strings and
// the parts vLLM reads as text ("text", "input_text" and "output_text" by
// their "text", "refusal" and "thinking" by the member of that name) as
// their text ("tool_reference" its "name"), or not at all when it is
// empty, null or absent (vLLM drops those), and other parts (images,
// audio) as their raw JSON.
//
// Errors are *kvroute.Error values with status 400, an OpenAI error type
// and the offending field in Param.
func ParseRequest(kind Kind, body []byte) (RequestInfo, error) {
	ri, _, err := ParseRequestInto(kind, body, Options{})
	return ri, err
}

// Options are ParseRequestInto's optional inputs.
type Options struct {
	// Prompt is storage for the canonical prompt (grown when too small), so
	// that a server can recycle one buffer per request instead of
	// allocating a prompt-sized one.
	Prompt []byte
	// SessionField names a top-level body field whose value is reported as
	// RequestInfo.SessionValue (a session or document affinity key); ""
	// for none.
	SessionField string
}

// ParseRequestInto is ParseRequest with options. With opts.Prompt the
// returned RequestInfo.Prompt aliases that storage: it must not be written
// again while the RequestInfo is in use. The storage used (opts.Prompt's,
// or a larger one) is returned for the next request.
func ParseRequestInto(kind Kind, body []byte, opts Options) (RequestInfo, []byte, error) {
	p := parser{s: scanner{b: body}, kind: kind, prompt: opts.Prompt[:0], sessionField: opts.SessionField}
	ri, err := p.parse()
	return ri, p.prompt[:0], err
}

type parser struct {
	s            scanner
	kind         Kind
	sessionField string
	ri           RequestInfo
	prompt       []byte // canonical prompt being built
	role         []byte // scratch for a message's role
	hdr          []byte // scratch for a message's frame
	seen         struct{ model, prompt, messages bool }
	tools        []byte // the raw JSON of a chat request's "tools" (nil: none)
	maxTok       struct {
		tokens, completion    int
		hasTokens, hasComplet bool
	}
	media struct{ bytes, parts int } // the non-text parts of the message being read
}

func (p *parser) parse() (RequestInfo, error) {
	s := &p.s
	s.i = len(s.b) - len(TrimBOM(s.b)) // as Python's json.loads reads bytes: the engines accept it
	s.ws()
	if s.i >= len(s.b) {
		return RequestInfo{}, invalid("", "empty_body", "request body is empty; want a JSON object")
	}
	if s.b[s.i] != '{' {
		if err := s.skip(0); err != nil {
			return RequestInfo{}, err
		}
		return RequestInfo{}, invalid("", "invalid_body", "request body must be a JSON object")
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
	} else {
		for {
			key, err := s.member()
			if err != nil {
				return RequestInfo{}, err
			}
			if err := p.field(key); err != nil {
				return RequestInfo{}, err
			}
			more, err := s.more('}')
			if err != nil {
				return RequestInfo{}, err
			}
			if !more {
				break
			}
		}
	}
	s.ws()
	if s.i < len(s.b) {
		return RequestInfo{}, s.errorf("invalid character %q after top-level value", s.b[s.i])
	}
	if p.ri.Model == "" {
		return RequestInfo{}, invalid("model", "missing_model", "the \"model\" field is required")
	}
	switch p.kind {
	case KindCompletion:
		if !p.seen.prompt {
			return RequestInfo{}, invalid("prompt", "missing_prompt", "the \"prompt\" field is required")
		}
	case KindChat:
		if !p.seen.messages {
			return RequestInfo{}, invalid("messages", "missing_messages", "the \"messages\" field is required")
		}
	}
	if p.kind == KindChat && p.tools != nil {
		p.prompt = kvroute.PrependChatTools(p.prompt, p.tools)
	}
	if len(p.prompt) > 0 {
		// p.prompt is never written again: share it rather than copy it.
		p.ri.Prompt = unsafe.String(unsafe.SliceData(p.prompt), len(p.prompt))
	}
	if p.maxTok.hasComplet {
		p.ri.MaxTokens = p.maxTok.completion
	} else if p.maxTok.hasTokens {
		p.ri.MaxTokens = p.maxTok.tokens
	}
	return p.ri, nil
}

// field handles one top-level member; the scanner is at its value.
func (p *parser) field(key []byte) error {
	if p.sessionField == "" || string(key) != p.sessionField {
		return p.known(key)
	}
	start := p.s.i
	if err := p.known(key); err != nil {
		return err
	}
	switch raw := p.s.b[start:p.s.i]; {
	case string(raw) == "null":
		p.ri.SessionValue = ""
	case raw[0] == '"':
		p.ri.SessionValue = string(unescape(nil, raw[1:len(raw)-1]))
	default:
		p.ri.SessionValue = string(raw)
	}
	return nil
}

// known handles the members routing reads and skips the others.
func (p *parser) known(key []byte) error {
	s := &p.s
	switch string(key) {
	case "model":
		v, err := p.stringOrNull("model")
		if err != nil {
			return err
		}
		p.ri.Model = v
	case "stream":
		switch {
		case s.lit("true"):
			p.ri.Stream = true
		case s.lit("false"), s.lit("null"):
			p.ri.Stream = false
		default:
			return p.wrongType("stream", "a boolean")
		}
	case "max_tokens", "max_completion_tokens":
		name := string(key)
		if name == "max_completion_tokens" && p.kind != KindChat {
			return s.skip(0)
		}
		if s.lit("null") {
			if name == "max_tokens" {
				p.maxTok.hasTokens = false
			} else {
				p.maxTok.hasComplet = false
			}
			return nil
		}
		n, err := p.integer(name)
		if err != nil {
			return err
		}
		if name == "max_tokens" {
			p.maxTok.tokens, p.maxTok.hasTokens = n, true
		} else {
			p.maxTok.completion, p.maxTok.hasComplet = n, true
		}
	case "user":
		v, err := p.stringOrNull("user")
		if err != nil {
			return err
		}
		p.ri.User = v
	case "cache_salt":
		if s.peek() != '"' {
			p.ri.CacheSalt = "" // the last key wins
			return s.skip(0)    // not a salt: the engine answers it (vLLM's 400)
		}
		v, err := p.stringOrNull("cache_salt")
		if err != nil {
			return err
		}
		p.ri.CacheSalt = v
	case "lora_path":
		v, err := p.loraPath()
		if err != nil {
			return err
		}
		p.ri.LoRAPath = v
	case "prompt":
		if p.kind != KindCompletion {
			return s.skip(0)
		}
		return p.completionPrompt()
	case "messages":
		if p.kind != KindChat {
			return s.skip(0)
		}
		return p.messages()
	case "tools":
		if p.kind != KindChat {
			return s.skip(0)
		}
		start := s.i
		if err := s.skip(0); err != nil {
			return err
		}
		p.tools = listValue(s.b[start:s.i])
	default:
		return s.skip(0)
	}
	return nil
}

// loraPath reads "lora_path" (see RequestInfo.LoRAPath): a string, null,
// or a list of them that all name one adapter.
func (p *parser) loraPath() (string, error) {
	const param = "lora_path"
	s := &p.s
	if s.peek() != '[' {
		if c := s.peek(); c != '"' && c != 'n' {
			return "", p.wrongType(param, "a string, null or a list of strings")
		}
		return p.stringOrNull(param)
	}
	s.i++
	s.ws()
	if s.peek() == ']' {
		s.i++
		return "", nil
	}
	var name string
	for i := 0; ; i++ {
		s.ws()
		if c := s.peek(); c != '"' && c != 'n' {
			return "", p.wrongType(param, "a string, null or a list of strings")
		}
		v, err := p.stringOrNull(param)
		if err != nil {
			return "", err
		}
		switch {
		case i == 0:
			name = v
		case v != name:
			return "", invalid(param, "mixed_adapters", "%q names more than one LoRA adapter for the items of a batch "+
				"(%s and %s): the router routes a request to engines serving its one adapter; send one request per adapter",
				param, adapterOrBase(name), adapterOrBase(v))
		}
		more, err := s.more(']')
		if err != nil {
			return "", err
		}
		if !more {
			return name, nil
		}
	}
}

// adapterOrBase names a LoRA adapter in an error message; "" is the base
// model.
func adapterOrBase(name string) string {
	if name == "" {
		return "the base model (null)"
	}
	return strconv.Quote(name)
}

// stringOrNull reads the string member param: its value, or "" for null.
func (p *parser) stringOrNull(param string) (string, error) {
	s := &p.s
	if s.lit("null") {
		return "", nil
	}
	if s.peek() != '"' {
		return "", p.wrongType(param, "a string")
	}
	raw, esc, err := s.str()
	if err != nil {
		return "", err
	}
	if !esc && utf8.Valid(raw) {
		return string(raw), nil
	}
	return string(unescape(nil, raw)), nil
}

// integer reads a non-negative JSON integer: a number whose value is whole,
// written with a fraction or an exponent or not (1024.0 and 1e3 are
// integers to vLLM's request models, and Python's json.dumps writes a
// computed float so).
func (p *parser) integer(param string) (int, error) {
	s := &p.s
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, p.wrongType(param, "an integer")
	}
	start := s.i
	isInt, err := s.number()
	if err != nil {
		return 0, err
	}
	if !isInt {
		f, err := strconv.ParseFloat(string(s.b[start:s.i]), 64)
		switch {
		case err == nil && f != math.Trunc(f):
			return 0, invalid(param, "invalid_type", "%q must be an integer, got %s", param, s.b[start:s.i])
		case err != nil || f < 0 || f >= 1<<63:
			return 0, invalid(param, "invalid_value", "%q must be a non-negative integer that fits in 64 bits, got %s", param, s.b[start:s.i])
		}
		return int(f), nil
	}
	n, err := strconv.Atoi(string(s.b[start:s.i]))
	if err != nil || n < 0 {
		return 0, invalid(param, "invalid_value", "%q must be a non-negative integer that fits in 64 bits, got %s", param, s.b[start:s.i])
	}
	return n, nil
}

func (p *parser) wrongType(param, want string) error {
	s := &p.s
	start := s.i
	if err := s.skip(0); err != nil {
		return err
	}
	return invalid(param, "invalid_type", "%q must be %s, got %s", param, want, describeJSON(s.b[start:s.i]))
}

// completionPrompt reads "prompt": a string, an array of strings, an array
// of token ids or an array of arrays of token ids.
func (p *parser) completionPrompt() error {
	s := &p.s
	p.seen.prompt = true
	p.prompt = p.prompt[:0]
	p.ri.TokenIDs = nil
	switch s.peek() {
	case '"':
		var err error
		if p.prompt, err = s.strAppend(p.prompt); err != nil {
			return err
		}
		return nil
	case '[':
	default:
		return p.wrongType("prompt", "a string, an array of strings or an array of token ids")
	}
	s.i++
	s.ws()
	if s.peek() == ']' {
		s.i++
		return invalid("prompt", "empty_prompt", "\"prompt\" must not be an empty array")
	}
	var elem byte // the kind of the first element: '"', '0' or '['
	var strs [][]byte
	for n := 0; ; n++ {
		s.ws()
		c := s.peek()
		kind := c
		if c == '-' || (c >= '0' && c <= '9') {
			kind = '0'
		}
		if n == 0 {
			elem = kind
		}
		if kind != elem || (kind != '"' && kind != '0' && kind != '[') {
			return p.wrongType("prompt", "an array of strings, of token ids or of arrays of token ids")
		}
		switch kind {
		case '"':
			str, err := s.strAppend(nil)
			if err != nil {
				return err
			}
			strs = append(strs, str)
		case '0':
			if err := p.tokenID(); err != nil {
				return err
			}
		case '[':
			s.i++
			s.ws()
			if s.peek() == ']' {
				s.i++
			} else {
				for {
					s.ws()
					if err := p.tokenID(); err != nil {
						return err
					}
					more, err := s.more(']')
					if err != nil {
						return err
					}
					if !more {
						break
					}
				}
			}
		}
		more, err := s.more(']')
		if err != nil {
			return err
		}
		if !more {
			break
		}
	}
	switch {
	case elem == '"' && len(strs) == 1:
		p.prompt = append(p.prompt, strs[0]...)
	case elem == '"':
		for _, t := range strs {
			p.prompt = appendNetstring(p.prompt, t)
		}
	default:
		if p.ri.TokenIDs == nil {
			p.ri.TokenIDs = []uint32{}
		}
		for _, id := range p.ri.TokenIDs {
			p.prompt = strconv.AppendUint(p.prompt, uint64(id), 10)
			p.prompt = append(p.prompt, ' ')
		}
	}
	return nil
}

func (p *parser) tokenID() error {
	s := &p.s
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return p.wrongType("prompt", "an array of token ids")
	}
	start := s.i
	isInt, err := s.number()
	if err != nil {
		return err
	}
	n, perr := strconv.ParseUint(string(s.b[start:s.i]), 10, 32)
	if !isInt || perr != nil {
		return invalid("prompt", "invalid_value", "token ids in \"prompt\" must be integers in [0, 2^32), got %s", s.b[start:s.i])
	}
	p.ri.TokenIDs = append(p.ri.TokenIDs, uint32(n))
	return nil
}

// messages reads "messages": a non-empty array of message objects.
func (p *parser) messages() error {
	s := &p.s
	p.seen.messages = true
	if cap(p.prompt) < len(s.b)-s.i {
		// The canonical text is never longer than the JSON it comes from.
		p.prompt = make([]byte, 0, len(s.b)-s.i)
	}
	p.prompt = p.prompt[:0]
	p.ri.Messages = 0
	p.ri.mediaBytes, p.ri.mediaParts = 0, 0
	if s.peek() != '[' {
		return p.wrongType("messages", "an array of messages")
	}
	s.i++
	s.ws()
	if s.peek() == ']' {
		s.i++
		return invalid("messages", "empty_messages", "\"messages\" must not be empty")
	}
	for {
		s.ws()
		if err := p.message(p.ri.Messages); err != nil {
			return err
		}
		p.ri.Messages++
		more, err := s.more(']')
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
}

func (p *parser) message(idx int) error {
	s := &p.s
	if s.peek() != '{' {
		return p.wrongType(msgParam(idx, ""), "an object")
	}
	s.i++
	// The content is decoded in place at the end of the canonical prompt
	// and framed once the message is read (its role may come after it).
	start := len(p.prompt)
	role := p.role[:0]
	hasRole := false
	var toolCalls []byte // the raw JSON of the message's "tool_calls"
	defer func() { p.role = role }()
	p.media.bytes, p.media.parts = 0, 0
	s.ws()
	if s.peek() == '}' {
		s.i++
	} else {
		for {
			key, err := s.member()
			if err != nil {
				return err
			}
			switch string(key) {
			case "role":
				if s.peek() != '"' {
					return p.wrongType(msgParam(idx, ".role"), "a string")
				}
				if role, err = s.strAppend(role[:0]); err != nil {
					return err
				}
				hasRole = true
			case "content":
				if p.prompt, err = p.msgContent(idx, p.prompt[:start]); err != nil {
					return err
				}
			case "tool_calls":
				from := s.i
				if err := s.skip(0); err != nil {
					return err
				}
				toolCalls = listValue(s.b[from:s.i])
			default:
				if err := s.skip(0); err != nil {
					return err
				}
			}
			more, err := s.more('}')
			if err != nil {
				return err
			}
			if !more {
				break
			}
		}
	}
	if !hasRole {
		return invalid(msgParam(idx, ".role"), "missing_role", "%s has no \"role\"", msgParam(idx, ""))
	}
	// Frame in kvroute's canonical chat form: the role header before the
	// content already in place, NUL bytes in the content escaped (rare: a
	// second pass only when there is one), then the terminator.
	n := len(p.prompt) - start
	hdr := kvroute.AppendChatRole(p.hdr[:0], role)
	p.hdr = hdr
	p.prompt = slices.Grow(p.prompt, len(hdr)+len(kvroute.ChatTerminator))[:len(p.prompt)+len(hdr)]
	copy(p.prompt[start+len(hdr):], p.prompt[start:start+n])
	copy(p.prompt[start:], hdr)
	if content := p.prompt[start+len(hdr):]; bytes.IndexByte(content, 0) >= 0 {
		esc := kvroute.AppendChatContent(nil, content)
		p.prompt = append(p.prompt[:start+len(hdr)], esc...)
	}
	if toolCalls != nil {
		p.prompt = kvroute.AppendChatToolCalls(p.prompt, toolCalls)
	}
	p.prompt = append(p.prompt, kvroute.ChatTerminator...)
	p.ri.mediaBytes += p.media.bytes
	p.ri.mediaParts += p.media.parts
	return nil
}

// listValue returns raw, a JSON value, unless it is null or an empty
// array (no tools, no tool calls: rendered as none), then nil.
func listValue(raw []byte) []byte {
	if string(raw) == "null" || raw[0] == '[' && len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0 {
		return nil
	}
	return raw
}

// msgParam names a message field in errors (built only when needed).
func msgParam(idx int, field string) string {
	return "messages[" + strconv.Itoa(idx) + "]" + field
}

// msgContent reads message idx's content: null, a string or an array of
// parts, and appends it to dst. It counts the parts that are not text in
// p.media.
func (p *parser) msgContent(idx int, dst []byte) ([]byte, error) {
	s := &p.s
	p.media.bytes, p.media.parts = 0, 0
	switch c := s.peek(); {
	case s.lit("null"):
		return dst, nil
	case c == '"':
		return s.strAppend(dst)
	case c != '[':
		return nil, p.wrongType(msgParam(idx, ".content"), "a string, an array of parts or null")
	}
	s.i++
	s.ws()
	if s.peek() == ']' {
		s.i++
		return dst, nil
	}
	written := 0 // parts written to dst
	for n := 0; ; n++ {
		s.ws()
		start := s.i
		text, kind, err := p.part(idx, n)
		if err != nil {
			return nil, err
		}
		if kind != partNone && written > 0 {
			dst = append(dst, '\n')
		}
		switch kind {
		case partText:
			dst = append(dst, text...)
			written++
		case partOther:
			dst = append(dst, s.b[start:s.i]...)
			p.media.bytes += s.i - start
			p.media.parts++
			written++
		}
		more, err := s.more(']')
		if err != nil {
			return nil, err
		}
		if !more {
			return dst, nil
		}
	}
}

// What a content part is to the canonical prompt.
const (
	partNone  = iota // nothing: a text part without text, which vLLM drops
	partText         // its text
	partOther        // not text (an image, audio): its JSON
)

// textKey names the member that holds the text of a part of type typ that
// vLLM reads as text (chat_utils.py's MM_PARSER_MAP: "text", the Responses
// API's "input_text" and "output_text", "refusal" and "thinking", and
// "tool_reference", a deferred tool, by its "name"), or "" for a part that
// is not text.
func textKey(typ []byte) string {
	switch string(typ) {
	case "text", "input_text", "output_text":
		return "text"
	case "refusal":
		return "refusal"
	case "thinking":
		return "thinking"
	case "tool_reference":
		return "name"
	}
	return ""
}

// partValue is a content part's member that may hold its text: its
// string value and whether it is a string (false when it is absent or
// null), or whether it is of another type.
type partValue struct {
	str           []byte
	isStr, isElse bool
}

// part reads one content part. A plain string (a text part to vLLM) and
// a part vLLM reads as text (textKey) are partText with their text when it
// is a non-empty string, and partNone when it is empty, null or absent
// (vLLM drops such a part); any other part is partOther.
func (p *parser) part(idx, n int) (text []byte, kind int, err error) {
	s := &p.s
	switch s.peek() {
	case '"':
		if text, err = s.strAppend(nil); err != nil {
			return nil, 0, err
		}
		if len(text) == 0 {
			return nil, partNone, nil
		}
		return text, partText, nil
	case '{':
	default:
		return nil, 0, p.wrongType(msgParam(idx, ".content["+strconv.Itoa(n)+"]"), "an object or a string")
	}
	s.i++
	var typ []byte
	var vals [4]partValue // "text", "refusal", "thinking", "name"
	s.ws()
	if s.peek() == '}' {
		s.i++
		return nil, partOther, nil
	}
	for {
		key, err := s.member()
		if err != nil {
			return nil, 0, err
		}
		// The last of duplicate keys wins: a "type" that is not a string
		// undoes one before it, and so does a text member of any value.
		k, slot := string(key), -1
		switch k {
		case "text":
			slot = 0
		case "refusal":
			slot = 1
		case "thinking":
			slot = 2
		case "name":
			slot = 3
		}
		switch {
		case k == "type" && s.peek() == '"':
			if typ, err = s.strAppend(typ[:0]); err != nil {
				return nil, 0, err
			}
		case slot >= 0 && s.peek() == '"':
			v := &vals[slot]
			if v.str, err = s.strAppend(v.str[:0]); err != nil {
				return nil, 0, err
			}
			v.isStr, v.isElse = true, false
		case slot >= 0 && s.lit("null"):
			vals[slot].isStr, vals[slot].isElse = false, false
		default:
			if k == "type" {
				typ = typ[:0]
			} else if slot >= 0 {
				vals[slot].isStr, vals[slot].isElse = false, true
			}
			if err := s.skip(0); err != nil {
				return nil, 0, err
			}
		}
		more, err := s.more('}')
		if err != nil {
			return nil, 0, err
		}
		if !more {
			break
		}
	}
	var v *partValue
	switch textKey(typ) {
	case "":
		return nil, partOther, nil
	case "text":
		v = &vals[0]
	case "refusal":
		v = &vals[1]
	case "thinking":
		v = &vals[2]
	default:
		v = &vals[3]
	}
	switch {
	case v.isElse:
		return nil, partOther, nil
	case !v.isStr || len(v.str) == 0:
		return nil, partNone, nil
	}
	return v.str, partText, nil
}

func appendNetstring(dst, s []byte) []byte {
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, ':')
	dst = append(dst, s...)
	return append(dst, ',')
}

// scanner walks JSON text. Its methods leave i after what they consumed.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return s.syntax("looking for "+strconv.QuoteRune(rune(c)), s.peek())
	}
	s.i++
	return nil
}

// lit consumes the literal word if it is next.
func (s *scanner) lit(word string) bool {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// member reads an object member's key and the ':' after it, with the
// white space around them, and leaves s at the member's value.
func (s *scanner) member() ([]byte, error) {
	s.ws()
	key, err := s.key()
	if err != nil {
		return nil, err
	}
	s.ws()
	if err := s.expect(':'); err != nil {
		return nil, err
	}
	s.ws()
	return key, nil
}

// key reads an object key and returns its unescaped value.
func (s *scanner) key() ([]byte, error) {
	if s.peek() != '"' {
		return nil, s.syntax("looking for beginning of object key string", s.peek())
	}
	raw, esc, err := s.str()
	if err != nil {
		return nil, err
	}
	if esc || !utf8.Valid(raw) {
		return unescape(nil, raw), nil
	}
	return raw, nil
}

// strSlow is str one run between escapes at a time (bytes.IndexByte for
// the next quote and backslash, a control-character check per run): str
// leaves it the strings it finds wrong, so that the error is reported the
// way it always was.
func (s *scanner) strSlow() (raw []byte, esc bool, err error) {
	s.i++ // opening quote
	start, i, quote := s.i, s.i, -1
	for {
		if quote < i { // find the next quote not yet known to be escaped
			q := bytes.IndexByte(s.b[i:], '"')
			if q < 0 {
				s.i = len(s.b)
				return nil, false, s.errorf("unexpected end of JSON input in string")
			}
			quote = i + q
		}
		seg := s.b[i:quote]
		bs := bytes.IndexByte(seg, '\\')
		if bs >= 0 {
			seg = seg[:bs]
		}
		if j := indexControl(seg); j >= 0 {
			s.i = i + j
			return nil, false, s.errorf("invalid control character %q in string literal", seg[j])
		}
		if bs < 0 {
			s.i = quote + 1
			return s.b[start:quote], esc, nil
		}
		esc = true
		i += bs // at the backslash; the quote is after it, so i+1 exists
		switch s.b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if i+6 > len(s.b) {
				s.i = i
				return nil, false, s.errorf("unexpected end of JSON input in \\u escape")
			}
			for _, h := range s.b[i+2 : i+6] {
				if hexVal(h) < 0 {
					s.i = i
					return nil, false, s.errorf("invalid character %q in \\u hexadecimal character escape", h)
				}
			}
			i += 6
		default:
			s.i = i
			return nil, false, s.errorf("invalid character %q in string escape code", s.b[i+1])
		}
	}
}

// strAppend reads a string at s.i (which is '"'), checking it, and appends
// its value to dst, the way encoding/json decodes it: invalid UTF-8 and lone
// surrogates become U+FFFD.
func (s *scanner) strAppend(dst []byte) ([]byte, error) {
	if cap(dst)-len(dst) >= len(s.b)-s.i { // room for anything left: one pass
		if out, ok := s.strAppendFast(dst); ok {
			return out, nil
		}
	}
	raw, esc, err := s.str()
	if err != nil {
		return nil, err
	}
	dst = slices.Grow(dst, len(raw))
	if !esc {
		return appendUTF8(dst, raw), nil
	}
	return unescape(dst, raw), nil
}

// appendUTF8 appends b, replacing invalid UTF-8 by U+FFFD.
func appendUTF8(dst, b []byte) []byte {
	if utf8.Valid(b) {
		return append(dst, b...)
	}
	for j := 0; j < len(b); {
		r, size := utf8.DecodeRune(b[j:])
		if r == utf8.RuneError && size == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, b[j:j+size]...)
		}
		j += size
	}
	return dst
}

// number reads a JSON number and reports whether it is an integer.
func (s *scanner) number() (isInt bool, err error) {
	isInt = true
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	default:
		return false, s.syntax("in numeric literal", c)
	}
	if s.peek() == '.' {
		isInt = false
		s.i++
		if c := s.peek(); c < '0' || c > '9' {
			return false, s.syntax("after decimal point in numeric literal", c)
		}
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		isInt = false
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if c := s.peek(); c < '0' || c > '9' {
			return false, s.syntax("in exponent of numeric literal", c)
		}
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	}
	return isInt, nil
}

// skip checks and steps over one value.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return s.errorf("exceeded max depth")
	}
	switch c := s.peek(); {
	case c == '"':
		_, _, err := s.str()
		return err
	case c == '{':
		s.i++
		s.ws()
		if s.peek() == '}' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if s.peek() != '"' {
				return s.syntax("looking for beginning of object key string", s.peek())
			}
			if _, _, err := s.str(); err != nil {
				return err
			}
			s.ws()
			if err := s.expect(':'); err != nil {
				return err
			}
			s.ws()
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			more, err := s.more('}')
			if err != nil {
				return err
			}
			if !more {
				return nil
			}
		}
	case c == '[':
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			more, err := s.more(']')
			if err != nil {
				return err
			}
			if !more {
				return nil
			}
		}
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	case s.lit("true"), s.lit("false"), s.lit("null"):
		return nil
	default:
		return s.syntax("looking for beginning of value", c)
	}
}

// more reads the separator after an element of an object (close '}') or
// an array (close ']'): true after a ',' (another element follows), false
// at the closing bracket.
func (s *scanner) more(close byte) (bool, error) {
	s.ws()
	c := s.peek()
	s.i++
	switch c {
	case ',':
		return true, nil
	case close:
		return false, nil
	}
	if close == '}' {
		return false, s.syntax("after object value", c)
	}
	return false, s.syntax("after array element", c)
}

func (s *scanner) syntax(where string, c byte) error {
	if s.i >= len(s.b) && c == 0 {
		return s.errorf("unexpected end of JSON input")
	}
	return s.errorf("invalid character %q %s", c, where)
}

func (s *scanner) errorf(format string, args ...any) error {
	e := invalid("", "invalid_json", format, args...)
	e.Message = "invalid JSON in request body at byte " + strconv.Itoa(min(s.i, len(s.b))) + ": " + e.Message
	return e
}

func invalid(param, code, format string, args ...any) *kvroute.Error {
	return kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, code, param, format, args...)
}

// describeJSON names a JSON value's type for error messages.
func describeJSON(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch c := v[0]; {
	case c == '"':
		return "a string"
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	default:
		return "a number"
	}
}

// indexControl returns the index of the first byte below 0x20 in b, or -1.
// It tests eight bytes at a time: a word has such a byte when subtracting
// 0x20 from each byte borrows into a byte whose top bit was clear.
func indexControl(b []byte) int {
	const lo, hi = 0x2020202020202020, 0x8080808080808080
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		if (w-lo)&^w&hi != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return i
		}
	}
	return -1
}

func hexVal(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

func getu4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r = r<<4 | hexVal(c)
	}
	return r
}

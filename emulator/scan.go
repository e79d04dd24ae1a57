package emulator

import (
	"bytes"
	"encoding/binary"
	"math"
	"unicode/utf8"

	"github.com/kvroute/kvroute/tokenizer"
)

// scanRequest is parseRequest's fast path: one pass over a request body of
// the common shape, without reflection and without encoding/json's
// separate validation pass. It fills what the encoding/json path
// (decodeRequest) fills, before checkOptions, and reports false whenever the
// body is anything else: then decodeRequest decides, so every error and
// every unusual input (escapes other than the simple ones, \u escapes,
// invalid UTF-8, nulls, duplicate or non-lowercase keys, numbers that are
// not plain integers, content parts, P/D fields, the chat template's and
// tokenizer's options (add_generation_prompt, ...), the options vLLM
// checks or answers that the engine model does not act on (logprobs,
// top_logprobs, tool_choice, return_token_ids), nesting deeper than
// maxScanDepth) is handled exactly as before. FuzzParseRequest checks that
// whenever it succeeds it agrees with decodeRequest.
//
// Accepted: a top-level object whose known keys are model (string),
// prompt (a string, a list of one string, or a list of token ids; completions
// only, a chat request skips it as decodeRequest keeps it raw), messages
// (chat only: objects with string role and content), max_tokens,
// max_completion_tokens, min_tokens, n, seed (integers), ignore_eos,
// include_stop_str_in_output, stream (booleans),
// stop (a string or a list of strings) and stream_options (an object of
// booleans); any other lowercase key is skipped (its value validated).
//
// The messages' contents alias body (a chat request's system prompt is
// kilobytes, needed only until it is encoded): the caller must not change
// body while it uses them. Every other string is a copy.
func scanRequest(body []byte, chat bool) (*apiRequest, bool) {
	s := scanner{b: body}
	r := new(apiRequest)
	var seen uint32
	s.ws()
	if !s.eat('{') {
		return nil, false
	}
	s.ws()
	if !s.eat('}') {
		for {
			key, ok := s.key()
			if !ok {
				return nil, false
			}
			s.ws()
			if !s.eat(':') {
				return nil, false
			}
			s.ws()
			bit, ok := scanField(&s, r, key, chat)
			if !ok {
				return nil, false
			}
			if seen&bit != 0 {
				return nil, false // a repeated key: the last one wins in encoding/json
			}
			seen |= bit
			s.ws()
			if s.eat(',') {
				s.ws()
				continue
			}
			if s.eat('}') {
				break
			}
			return nil, false
		}
	}
	s.ws()
	if s.i != len(s.b) {
		return nil, false
	}
	if chat && r.chatMessages == nil {
		return nil, false // no messages: decodeRequest gives the error
	}
	if !chat && seen&fieldPrompt == 0 {
		return nil, false
	}
	return r, true
}

// Bits of the known fields scanRequest has seen (a repeat is left to
// decodeRequest).
const (
	fieldModel uint32 = 1 << iota
	fieldPrompt
	fieldMessages
	fieldMaxTokens
	fieldMaxCompletionTokens
	fieldN
	fieldSeed
	fieldIgnoreEOS
	fieldIncludeStopStr
	fieldStream
	fieldStop
	fieldMinTokens
	fieldStreamOptions
	fieldOther = 0 // unknown keys may repeat (encoding/json ignores them)
)

// maxScanDepth bounds the nesting of skipped values (encoding/json allows
// 10,000 levels; deeper bodies go to decodeRequest).
const maxScanDepth = 64

// scanField reads the value of key into r. It returns the field's bit.
func scanField(s *scanner, r *apiRequest, key []byte, chat bool) (uint32, bool) {
	switch string(key) {
	case "model":
		v, ok := s.str()
		r.Model = string(v)
		return fieldModel, ok
	case "prompt":
		if chat {
			return fieldPrompt, s.skip(0) // kept raw and unused
		}
		return fieldPrompt, s.prompt(r)
	case "messages":
		if !chat {
			return 0, false
		}
		start := s.i
		ok := s.messages(r)
		r.messagesJSON = s.b[start:s.i] // aliases the body, as the contents do
		return fieldMessages, ok
	case "max_tokens":
		v, ok := s.intPtr(math.MinInt, math.MaxInt)
		r.MaxTokens = (*wholeInt)(v)
		return fieldMaxTokens, ok
	case "max_completion_tokens":
		v, ok := s.intPtr(math.MinInt, math.MaxInt)
		r.MaxCompletionTokens = (*wholeInt)(v)
		return fieldMaxCompletionTokens, ok
	case "n":
		v, ok := s.intPtr(math.MinInt, math.MaxInt)
		r.N = (*wholeInt)(v)
		return fieldN, ok
	case "seed":
		v, ok := s.integer(math.MinInt, math.MaxInt)
		seed := wholeInt(v)
		r.Seed = &seed
		return fieldSeed, ok
	case "ignore_eos":
		v, ok := s.boolean()
		r.IgnoreEOS = v
		return fieldIgnoreEOS, ok
	case "include_stop_str_in_output":
		v, ok := s.boolean()
		r.IncludeStopStr = v
		return fieldIncludeStopStr, ok
	case "stream":
		v, ok := s.boolean()
		r.Stream = v
		return fieldStream, ok
	case "stop":
		return fieldStop, s.stop(r)
	case "min_tokens":
		v, ok := s.integer(math.MinInt, math.MaxInt)
		r.MinTokens = wholeInt(v)
		return fieldMinTokens, ok
	case "stream_options":
		return fieldStreamOptions, s.streamOptions(r)
	case "kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room", "lora_path", "lora":
		return 0, false // P/D fields, SGLang's and llama.cpp's adapters: decodeRequest
	case "cache_salt", "request_id", "logprobs", "top_logprobs", "tool_choice", "return_token_ids":
		return 0, false // decodeRequest
	case "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template_kwargs", "chat_template", "tools", "documents", "reasoning_effort":
		return 0, false // template and tokenizer options: decodeRequest
	case "suffix":
		if !chat {
			return 0, false // decodeRequest keeps it (hasSuffix)
		}
	}
	return fieldOther, s.skip(0)
}

// scanner reads JSON from b at i. Every method reports false for anything
// outside the fast path's subset, valid JSON or not.
type scanner struct {
	b []byte
	i int
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

// eat consumes c if it is next.
func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// key reads an object key: only lowercase ASCII letters, digits and '_'
// (encoding/json matches keys case-insensitively, with Unicode folding:
// anything else is left to it).
func (s *scanner) key() ([]byte, bool) {
	if !s.eat('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
			s.i++
		default:
			return nil, false
		}
	}
	return nil, false
}

// str reads a string value. Without escapes the result aliases the body;
// the simple escapes (\" \\ \/ \b \f \n \r \t) are decoded into a copy; \u
// escapes and invalid UTF-8 (which encoding/json replaces) are not taken.
func (s *scanner) str() ([]byte, bool) {
	if !s.eat('"') {
		return nil, false
	}
	start := s.i
	end := bytes.IndexByte(s.b[start:], '"')
	if end < 0 {
		return nil, false
	}
	v := s.b[start : start+end]
	if k := bytes.IndexByte(v, '\\'); k >= 0 {
		s.i = start + k
		return s.strEscaped(start)
	}
	if !plainString(v) {
		return nil, false
	}
	s.i = start + end + 1
	return v, true
}

// plainString reports whether v, a string's bytes without quotes or
// backslashes, has no control character and is valid UTF-8: what
// encoding/json decodes to the same bytes. Eight bytes at a time (a chat
// request's system prompt is kilobytes): a byte below 0x20 borrows into
// its own high bit in x - 0x20 (a borrow into the next byte only follows
// one), and the high bits of all words say whether there is non-ASCII
// text, which utf8.Valid then checks.
func plainString(v []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	var or uint64
	i := 0
	for ; i+8 <= len(v); i += 8 {
		x := binary.LittleEndian.Uint64(v[i:])
		if (x-0x20*ones)&^x&highs != 0 {
			return false
		}
		or |= x
	}
	for _, c := range v[i:] {
		if c < 0x20 {
			return false
		}
		or |= uint64(c)
	}
	return or&highs == 0 || utf8.Valid(v)
}

// strEscaped finishes str from the first backslash (at s.i) of a string
// that started at start.
func (s *scanner) strEscaped(start int) ([]byte, bool) {
	for _, c := range s.b[start:s.i] {
		if c < 0x20 {
			return nil, false // encoding/json rejects raw control characters
		}
	}
	v := make([]byte, 0, s.i-start+64)
	v = append(v, s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return v, utf8.Valid(v)
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, false
			}
			var d byte
			switch s.b[s.i+1] {
			case '"':
				d = '"'
			case '\\':
				d = '\\'
			case '/':
				d = '/'
			case 'b':
				d = '\b'
			case 'f':
				d = '\f'
			case 'n':
				d = '\n'
			case 'r':
				d = '\r'
			case 't':
				d = '\t'
			default:
				return nil, false // \u and invalid escapes
			}
			v = append(v, d)
			s.i += 2
			continue
		case c < 0x20:
			return nil, false
		}
		v = append(v, c)
		s.i++
	}
	return nil, false
}

// integer reads a plain integer (no fraction or exponent, at most 18
// digits) within [lo, hi].
func (s *scanner) integer(lo, hi int64) (int64, bool) {
	neg := s.eat('-')
	start := s.i
	var v int64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		v = v*10 + int64(s.b[s.i]-'0')
		s.i++
	}
	n := s.i - start
	if n == 0 || n > 18 || n > 1 && s.b[start] == '0' {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if neg {
		v = -v
	}
	return v, v >= lo && v <= hi
}

func (s *scanner) intPtr(lo, hi int64) (*int, bool) {
	v, ok := s.integer(lo, hi)
	n := int(v)
	return &n, ok
}

func (s *scanner) boolean() (bool, bool) {
	switch {
	case s.lit("true"):
		return true, true
	case s.lit("false"):
		return false, true
	}
	return false, false
}

// lit consumes the literal word if it is next.
func (s *scanner) lit(word string) bool {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// prompt reads a completions prompt: a string, a list of one string, or a
// non-empty list of token ids (decodeRequest's parsePrompt handles the
// rest and the errors).
func (s *scanner) prompt(r *apiRequest) bool {
	if s.i < len(s.b) && s.b[s.i] == '"' {
		v, ok := s.str()
		r.promptText, r.promptEmpty = string(v), len(v) == 0
		return ok
	}
	if !s.eat('[') {
		return false
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '"' {
		v, ok := s.str()
		s.ws()
		r.promptText = string(v)
		return ok && s.eat(']')
	}
	ids := make([]uint32, 0, 64)
	ok := s.list(false, func() bool {
		if s.i < len(s.b) && s.b[s.i] == '-' {
			return false // even -0 is not a uint32 to encoding/json
		}
		v, ok := s.integer(0, math.MaxUint32)
		ids = append(ids, uint32(v))
		return ok
	})
	r.promptIDs = ids
	return ok
}

// list reads the rest of an array whose '[' was read: elem reads each
// element (from its first byte). An empty array is accepted when empty is.
func (s *scanner) list(empty bool, elem func() bool) bool {
	s.ws()
	if s.eat(']') {
		return empty
	}
	for {
		if !elem() {
			return false
		}
		s.ws()
		if s.eat(']') {
			return true
		}
		if !s.eat(',') {
			return false
		}
		s.ws()
	}
}

// messages reads chat messages whose role and content are strings.
func (s *scanner) messages(r *apiRequest) bool {
	if !s.eat('[') {
		return false
	}
	msgs := make([]tokenizer.Message, 0, 4)
	ok := s.list(true, func() bool {
		m, ok := s.message()
		msgs = append(msgs, m)
		return ok
	})
	r.chatMessages = msgs
	return ok
}

func (s *scanner) message() (tokenizer.Message, bool) {
	var m tokenizer.Message
	if !s.eat('{') {
		return m, false
	}
	var role, content bool
	s.ws()
	if s.eat('}') {
		return m, false // no role: decodeRequest gives the error
	}
	for {
		key, ok := s.key()
		if !ok {
			return m, false
		}
		s.ws()
		if !s.eat(':') {
			return m, false
		}
		s.ws()
		switch string(key) {
		case "role":
			var v []byte
			v, ok = s.str()
			if role || len(v) == 0 {
				return m, false // repeated, or empty (an error)
			}
			m.Role, role = roleString(v), true
		case "content":
			var v []byte
			v, ok = s.str()
			if content {
				return m, false
			}
			m.Content, content = bytesString(v), true // aliases the body (see scanRequest)
		default:
			ok = s.skip(0)
		}
		if !ok {
			return m, false
		}
		s.ws()
		if s.eat(',') {
			s.ws()
			continue
		}
		if s.eat('}') {
			return m, role
		}
		return m, false
	}
}

// roleString is string(v), without an allocation for the common roles.
func roleString(v []byte) string {
	switch string(v) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	}
	return string(v)
}

// stop reads a stop string or a list of them.
func (s *scanner) stop(r *apiRequest) bool {
	if s.i < len(s.b) && s.b[s.i] == '"' {
		v, ok := s.str()
		r.stops = []string{string(v)}
		return ok
	}
	if !s.eat('[') {
		return false
	}
	stops := []string{}
	ok := s.list(true, func() bool {
		v, ok := s.str()
		stops = append(stops, string(v))
		return ok
	})
	r.stops = stops
	return ok
}

// streamOptions reads stream_options: an object of its two booleans
// (include_usage true unless given).
func (s *scanner) streamOptions(r *apiRequest) bool {
	if !s.eat('{') {
		return false
	}
	so := &streamOptions{IncludeUsage: true} // vLLM's default
	r.StreamOptions = so
	var seen uint8
	s.ws()
	if s.eat('}') {
		return true
	}
	for {
		key, ok := s.key()
		if !ok {
			return false
		}
		so.set = true
		s.ws()
		if !s.eat(':') {
			return false
		}
		s.ws()
		switch string(key) {
		case "include_usage":
			if seen&1 != 0 {
				return false
			}
			seen |= 1
			so.IncludeUsage, ok = s.boolean()
		case "continuous_usage_stats":
			if seen&2 != 0 {
				return false
			}
			seen |= 2
			so.ContinuousUsageStats, ok = s.boolean()
		default:
			ok = s.skip(0)
		}
		if !ok {
			return false
		}
		s.ws()
		if s.eat(',') {
			s.ws()
			continue
		}
		return s.eat('}')
	}
}

// skip validates and skips any JSON value (as encoding/json's checkValid
// accepts it), at most maxScanDepth levels deep.
func (s *scanner) skip(depth int) bool {
	if depth > maxScanDepth || s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		return s.skipString()
	case c == '{':
		s.i++
		s.ws()
		if s.eat('}') {
			return true
		}
		for {
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != '"' || !s.skipString() {
				return false
			}
			s.ws()
			if !s.eat(':') {
				return false
			}
			s.ws()
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			return s.eat('}')
		}
	case c == '[':
		s.i++
		return s.list(true, func() bool { return s.skip(depth + 1) })
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.skipNumber()
	}
	return false
}

// skipString skips a string with any valid escapes (its value is unused, so
// \u escapes and invalid UTF-8 do not matter).
func (s *scanner) skipString() bool {
	s.i++ // the opening quote
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				s.i += 6
			default:
				return false
			}
			continue
		case c < 0x20:
			return false
		}
		s.i++
	}
	return false
}

// skipNumber skips a number in JSON's grammar.
func (s *scanner) skipNumber() bool {
	s.eat('-')
	digits := func() int {
		start := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		return s.i - start
	}
	start := s.i
	n := digits()
	if n == 0 || n > 1 && s.b[start] == '0' {
		return false
	}
	if s.eat('.') && digits() == 0 {
		return false
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

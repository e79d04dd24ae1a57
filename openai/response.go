package openai

import (
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"unicode/utf8"
)

// Object names vLLM puts in the "object" field.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectTextCompletion      = "text_completion"
)

// Finish reasons as vLLM reports them.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
)

// Usage is the token accounting of a response, in vLLM's field order.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails reports how many prompt tokens were served from the
// engine's prefix cache (vLLM: --enable-prompt-tokens-details).
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CachedTokens returns u.PromptTokensDetails.CachedTokens, or -1 when the
// engine did not report it.
func (u *Usage) CachedTokens() int {
	if u == nil || u.PromptTokensDetails == nil {
		return -1
	}
	return u.PromptTokensDetails.CachedTokens
}

// The types below are vLLM's response models (vllm/entrypoints/openai/
// completion/protocol.py and chat_completion/protocol.py) in their field
// order. A whole response is their model_dump(): every field, null ones
// too (service_tier, system_fingerprint, token_ids, ... are null unless the
// request asked for them).

// ChatMessage is the assistant message of a non-streaming chat response
// (vLLM's ChatMessage; its reasoning was reasoning_content before v0.16).
type ChatMessage struct {
	Role         string  `json:"role"`
	Content      string  `json:"content"`
	Refusal      *string `json:"refusal"`
	Annotations  any     `json:"annotations"`
	Audio        any     `json:"audio"`
	FunctionCall any     `json:"function_call"`
	ToolCalls    []any   `json:"tool_calls"`
	Reasoning    *string `json:"reasoning"`
}

// ChatChoice is one choice of a non-streaming chat response.
type ChatChoice struct {
	Index        int         `json:"index"`
	Message      ChatMessage `json:"message"`
	Logprobs     any         `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
	// StopReason is null, the matched stop string, or a stop token id.
	StopReason any `json:"stop_reason"`
	// TokenIDs are the generated token ids with return_token_ids, else null.
	TokenIDs []uint32 `json:"token_ids"`
}

// ChatCompletion is a non-streaming /v1/chat/completions response.
type ChatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []ChatChoice `json:"choices"`
	ServiceTier       *string      `json:"service_tier"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Usage             *Usage       `json:"usage"`
	PromptLogprobs    any          `json:"prompt_logprobs"`
	// PromptTokenIDs are the prompt's token ids with return_token_ids,
	// else null.
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	// KVTransferParams is the P/D handoff (NixlConnector): null unless the
	// request asked for a remote decode.
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// CompletionChoice is one choice of a non-streaming /v1/completions
// response.
type CompletionChoice struct {
	Index          int      `json:"index"`
	Text           string   `json:"text"`
	Logprobs       any      `json:"logprobs"`
	FinishReason   *string  `json:"finish_reason"`
	StopReason     any      `json:"stop_reason"`
	TokenIDs       []uint32 `json:"token_ids"`
	PromptLogprobs any      `json:"prompt_logprobs"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
}

// Completion is a non-streaming /v1/completions response.
type Completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []CompletionChoice `json:"choices"`
	ServiceTier       *string            `json:"service_tier"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Usage             *Usage             `json:"usage"`
	// KVTransferParams is the P/D handoff; null unless asked for.
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// CompletionChunkChoice is one choice of a streaming /v1/completions
// chunk (vLLM's CompletionResponseStreamChoice).
type CompletionChunkChoice struct {
	Index          int      `json:"index"`
	Text           string   `json:"text"`
	Logprobs       any      `json:"logprobs"`
	FinishReason   *string  `json:"finish_reason"`
	StopReason     any      `json:"stop_reason"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	TokenIDs       []uint32 `json:"token_ids"`
}

// CompletionChunk is one streaming /v1/completions event, which vLLM dumps
// whole (exclude_unset=False): usage is null but in the usage chunk
// (Choices empty) and with stream_options.continuous_usage_stats.
type CompletionChunk struct {
	ID      string                  `json:"id"`
	Object  string                  `json:"object"`
	Created int64                   `json:"created"`
	Model   string                  `json:"model"`
	Choices []CompletionChunkChoice `json:"choices"`
	Usage   *Usage                  `json:"usage"`
}

// ChatDelta is the incremental message of a streaming chat chunk.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChunkChoice is one choice of a streaming chat chunk. vLLM dumps chat
// chunks with exclude_unset=True: a field appears when its serving code
// passed it, null or not.
type ChatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        ChatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	// StopReason appears only in a choice's final chunk: "null", a quoted
	// stop string or a token id.
	StopReason json.RawMessage `json:"stop_reason,omitempty"`
	// TokenIDs appears in every chunk after the first: "null" unless the
	// request set return_token_ids.
	TokenIDs json.RawMessage `json:"token_ids,omitempty"`
}

// ChatChunk is one streaming /v1/chat/completions event. The usage chunk
// has empty Choices and a non-nil Usage.
type ChatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
	// PromptTokenIDs appears in the first chunk only: "null" unless the
	// request set return_token_ids.
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
}

// NewChatID returns a chat completion id as vLLM makes it: "chatcmpl-" and
// 32 hex digits.
func NewChatID() string { return newID("chatcmpl-") }

// NewCompletionID returns a completion id: "cmpl-" and 32 hex digits.
func NewCompletionID() string { return newID("cmpl-") }

func newID(prefix string) string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	var buf [48]byte // the id is built on the stack: one allocation, the string's
	dst := append(buf[:0], prefix...)
	dst = hex.AppendEncode(dst, b[:])
	return string(dst)
}

// ChunkHeader holds the fields every streaming chunk of one response
// repeats. The Append functions below write vLLM's exact chunk JSON without
// reflection; they are the emulator's hot path and produce the same JSON as
// encoding/json on ChatChunk and CompletionChunk (a test checks). They
// keep the JSON of the header's fields in it, made at the first chunk and
// made again when a field changed: a ChunkHeader (and its copies, which
// share it) is not safe for concurrent use.
type ChunkHeader struct {
	ID      string
	Model   string
	Created int64

	pre *headerJSON // made at the first chunk
}

// headerJSON is what ChunkHeader.append writes for object and the fields
// id, model and created.
type headerJSON struct {
	b                 []byte
	id, model, object string
	created           int64
}

// append appends the chunk's start: its id, object, created and model.
func (h *ChunkHeader) append(dst []byte, object string) []byte {
	p := h.pre
	if p == nil {
		p = new(headerJSON)
		h.pre = p
	} else if object == p.object && h.ID == p.id && h.Model == p.model && h.Created == p.created {
		return append(dst, p.b...)
	}
	p.b = h.appendFields(p.b[:0], object)
	p.id, p.model, p.object, p.created = h.ID, h.Model, object, h.Created
	return append(dst, p.b...)
}

func (h *ChunkHeader) appendFields(dst []byte, object string) []byte {
	dst = append(dst, `{"id":`...)
	dst = AppendJSONString(dst, h.ID)
	dst = append(dst, `,"object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, h.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = AppendJSONString(dst, h.Model)
	return dst
}

// ChunkUsage is the usage a chunk carries with
// stream_options.continuous_usage_stats: the prompt's tokens and those
// generated so far. A nil *ChunkUsage writes none.
type ChunkUsage struct {
	PromptTokens, CompletionTokens int
}

// appendChatUsage appends a chat chunk's running usage, as vLLM dumps it
// (exclude_unset: no prompt_tokens_details).
func appendChatUsage(dst []byte, u *ChunkUsage) []byte {
	if u == nil {
		return dst
	}
	dst = append(dst, `,"usage":`...)
	return AppendUsage(dst, u.PromptTokens, u.CompletionTokens, -1)
}

// AppendTokenIDs appends ids as a JSON array, or null when ids is nil
// (vLLM's token_ids and prompt_token_ids without return_token_ids).
func AppendTokenIDs(dst []byte, ids []uint32) []byte {
	if ids == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return append(dst, ']')
}

// AppendChatRoleChunk appends the first chunk of a chat stream: role with
// empty content, and the top-level prompt_token_ids (vLLM passes it in the
// first chunk: the prompt's ids with return_token_ids, else null;
// promptIDs nil writes null).
func AppendChatRoleChunk(dst []byte, h *ChunkHeader, role string, promptIDs []uint32, u *ChunkUsage) []byte {
	dst = h.append(dst, ObjectChatCompletionChunk)
	dst = append(dst, `,"choices":[{"index":0,"delta":{"role":`...)
	dst = AppendJSONString(dst, role)
	dst = append(dst, `,"content":""},"logprobs":null,"finish_reason":null}]`...)
	dst = appendChatUsage(dst, u)
	dst = append(dst, `,"prompt_token_ids":`...)
	dst = AppendTokenIDs(dst, promptIDs)
	return append(dst, '}')
}

// AppendChatContentChunk appends a content chunk. When finishReason is not
// empty it is the final chunk of the choice and carries finish_reason and
// stop_reason (stopReason is written verbatim as JSON: "null", a quoted
// string or a token id; empty means null). Every content chunk has
// token_ids in its choice, as vLLM passes it: the ids of the chunk's
// tokens with return_token_ids, else null (ids nil).
func AppendChatContentChunk(dst []byte, h *ChunkHeader, content, finishReason string, stopReason []byte, ids []uint32, u *ChunkUsage) []byte {
	dst = h.append(dst, ObjectChatCompletionChunk)
	dst = append(dst, `,"choices":[{"index":0,"delta":{"content":`...)
	dst = AppendJSONString(dst, content)
	dst = append(dst, `},"logprobs":null,"finish_reason":`...)
	if finishReason == "" {
		dst = append(dst, `null`...)
	} else {
		dst = AppendJSONString(dst, finishReason)
		dst = append(dst, `,"stop_reason":`...)
		dst = appendRaw(dst, stopReason)
	}
	dst = append(dst, `,"token_ids":`...)
	dst = AppendTokenIDs(dst, ids)
	dst = append(dst, `}]`...)
	dst = appendChatUsage(dst, u)
	return append(dst, '}')
}

// AppendCompletionChunk appends a streaming /v1/completions chunk; an empty
// finishReason writes null. vLLM dumps these chunks whole: the choice's
// prompt_token_ids and token_ids are null (promptIDs, ids nil) unless the
// request set return_token_ids (then the prompt's ids in the first chunk,
// null after, and each chunk's tokens' ids), and so is usage without
// continuous usage stats (with them, its prompt_tokens_details is null).
func AppendCompletionChunk(dst []byte, h *ChunkHeader, text, finishReason string, stopReason []byte, promptIDs, ids []uint32, u *ChunkUsage) []byte {
	dst = h.append(dst, ObjectTextCompletion)
	dst = append(dst, `,"choices":[{"index":0,"text":`...)
	dst = AppendJSONString(dst, text)
	dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	if finishReason == "" {
		dst = append(dst, `null`...)
	} else {
		dst = AppendJSONString(dst, finishReason)
	}
	dst = append(dst, `,"stop_reason":`...)
	dst = appendRaw(dst, stopReason)
	dst = append(dst, `,"prompt_token_ids":`...)
	dst = AppendTokenIDs(dst, promptIDs)
	dst = append(dst, `,"token_ids":`...)
	dst = AppendTokenIDs(dst, ids)
	dst = append(dst, `}],"usage":`...)
	if u == nil {
		return append(dst, `null}`...)
	}
	dst = AppendUsage(dst, u.PromptTokens, u.CompletionTokens, -1)
	dst = append(dst[:len(dst)-1], `,"prompt_tokens_details":null}}`...)
	return dst
}

// AppendUsageChunk appends the stream_options.include_usage chunk:
// "choices":[] and the usage object. object is ObjectChatCompletionChunk or
// ObjectTextCompletion. cachedTokens < 0 omits prompt_tokens_details.
func AppendUsageChunk(dst []byte, h *ChunkHeader, object string, promptTokens, completionTokens, cachedTokens int) []byte {
	dst = h.append(dst, object)
	dst = append(dst, `,"choices":[],"usage":`...)
	dst = AppendUsage(dst, promptTokens, completionTokens, cachedTokens)
	return append(dst, '}')
}

// AppendUsage appends a usage object in vLLM's field order. cachedTokens < 0
// omits prompt_tokens_details.
func AppendUsage(dst []byte, promptTokens, completionTokens, cachedTokens int) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens+completionTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completionTokens), 10)
	if cachedTokens >= 0 {
		dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
		dst = strconv.AppendInt(dst, int64(cachedTokens), 10)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// StopReasonJSON returns the JSON form of a stop reason: null when
// stop == "" and isToken is false, the quoted string, or the token id.
func StopReasonJSON(dst []byte, stop string, tokenID uint32, isToken bool) []byte {
	switch {
	case isToken:
		return strconv.AppendUint(dst, uint64(tokenID), 10)
	case stop == "":
		return append(dst, "null"...)
	}
	return AppendJSONString(dst, stop)
}

func appendRaw(dst, raw []byte) []byte {
	if len(raw) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, raw...)
}

const hexDigits = "0123456789abcdef"

// jsonPlainByte says which ASCII bytes AppendJSONString copies as they
// are: all but control characters, " \ and the HTML-unsafe < > &.
var jsonPlainByte = func() (t [utf8.RuneSelf]bool) {
	for b := range t {
		t[b] = b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return t
}()

// plain8 reports whether the eight bytes of x need no escaping: each is
// ASCII, at least 0x20, and none of " \\ < > & (SWAR: a byte of v is zero,
// or below 0x20, where the subtraction borrows into its high bit; a borrow
// from a flagged byte may flag the next, which only sends the bytes to the
// per-byte loop).
func plain8(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, bs, lt, gt, amp := x^('"'*ones), x^('\\'*ones), x^('<'*ones), x^('>'*ones), x^('&'*ones)
	bad := x | (x - 0x20*ones) | (q-ones)&^q | (bs-ones)&^bs | (lt-ones)&^lt | (gt-ones)&^gt | (amp-ones)&^amp
	return bad&highs == 0
}

// load8 returns s[i:i+8] as a little-endian uint64 (one load).
func load8(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// AppendJSONString appends s as a JSON string, escaped exactly as
// encoding/json does (HTML-safe: <, > and & as \u003c etc.; invalid UTF-8 as
// \ufffd; U+2028 and U+2029 escaped).
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start, slow := 0, 0 // the bytes before slow are looked at one by one
	for i := 0; i < len(s); {
		if i >= slow {
			// Eight plain bytes at a time (generated text is mostly
			// plain); eight with something to escape, one by one.
			if i+8 <= len(s) {
				if plain8(load8(s, i)) {
					i += 8
					continue
				}
			} else if len(s) >= 8 && plain8(load8(s, len(s)-8)) {
				break // the last bytes, looked at again with the ones before them
			}
			slow = i + 8
		}
		if b := s[i]; b < utf8.RuneSelf {
			if jsonPlainByte[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

package openai

import (
	"bytes"
	"sync/atomic"
)

// The usage an engine reports at the end of an answer (prompt_tokens,
// prompt_tokens_details.cached_tokens), read from the answer's last bytes
// on their way to the client: a non-streaming response ends with its usage
// object; a stream asked with stream_options.include_usage ends with a
// usage chunk before [DONE]. The router feeds its prefix cache counters
// and learning policies with it, on aggregated pools (package proxy) and
// for requests a P/D pool runs whole on one node (package disagg).

// UsageTailSize is how many of an answer's last bytes a UsageTail keeps.
// vLLM's final usage chunk is about 300 bytes, the usage object of a
// non-streaming response under 200, and at most a short "data: [DONE]"
// follows.
const UsageTailSize = 2048

// UsageTail keeps the last UsageTailSize bytes of an answer passed on, for
// ParseUsage. The zero value is ready to use; a UsageTail is not safe for
// concurrent use.
type UsageTail struct {
	n   int
	buf [UsageTailSize]byte
}

// Reset empties t.
func (t *UsageTail) Reset() { t.n = 0 }

// Add records p, the next bytes of the answer.
func (t *UsageTail) Add(p []byte) {
	switch {
	case len(p) >= UsageTailSize:
		t.n = copy(t.buf[:], p[len(p)-UsageTailSize:])
	case t.n+len(p) <= UsageTailSize:
		t.n += copy(t.buf[t.n:], p)
	default:
		keep := UsageTailSize - len(p)
		copy(t.buf[:keep], t.buf[t.n-keep:t.n])
		copy(t.buf[keep:], p)
		t.n = UsageTailSize
	}
}

// Bytes returns the bytes kept, valid until the next Add or Reset.
func (t *UsageTail) Bytes() []byte { return t.buf[:t.n] }

var (
	usageKey  = []byte(`"usage":`)
	promptKey = []byte(`"prompt_tokens":`)
	cachedKey = []byte(`"cached_tokens":`)
)

// ParseUsage finds the last usage object in an answer's tail and returns
// its prompt_tokens and prompt_tokens_details.cached_tokens; cached is -1
// when the engine did not report it. ok is false when the tail holds no
// complete usage object (none sent, "usage":null, or cut off by the tail).
// Generated text cannot fake a usage key: JSON escapes its quotes.
func ParseUsage(tail []byte) (prompt, cached int, ok bool) {
	i := bytes.LastIndex(tail, usageKey)
	if i < 0 {
		return 0, -1, false
	}
	obj := tail[i+len(usageKey):]
	obj = bytes.TrimLeft(obj, " \t\r\n")
	if len(obj) == 0 || obj[0] != '{' {
		return 0, -1, false
	}
	depth, end := 0, -1
	for j, c := range obj {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth == 0 {
			end = j
			break
		}
	}
	if end < 0 {
		return 0, -1, false
	}
	obj = obj[:end+1]
	prompt, ok = intAfter(obj, promptKey)
	if !ok {
		return 0, -1, false
	}
	if cached, ok = intAfter(obj, cachedKey); !ok {
		cached = -1
	}
	return prompt, cached, true
}

// intAfter parses the non-negative integer after the first key in b.
func intAfter(b, key []byte) (int, bool) {
	i := bytes.Index(b, key)
	if i < 0 {
		return 0, false
	}
	b = bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	n, digits := 0, 0
	for _, c := range b {
		if c < '0' || c > '9' || digits == 18 {
			break
		}
		n = n*10 + int(c-'0')
		digits++
	}
	return n, digits > 0
}

// CachedTokens reads the cached tokens one engine reports
// (ParseUsage's cached, Usage.CachedTokens) as that engine means them.
// vLLM with --enable-prompt-tokens-details leaves prompt_tokens_details
// out of an answer that had no prompt token cached (serving_chat.py and
// serving_completion.py: "if self.enable_prompt_tokens_details and
// num_cached_tokens"), so once the engine has reported a count, an answer
// without one cached nothing; before, the count is unknown. Counting only
// the answers with the field leaves every miss out of a hit rate's
// denominator. The zero value knows nothing yet; it is safe for
// concurrent use.
type CachedTokens struct{ reported atomic.Bool }

// Of returns an answer's cached tokens: cached when reported (>= 0), else
// 0 once the engine has reported a count, else -1 (unknown).
func (c *CachedTokens) Of(cached int) int {
	switch {
	case cached >= 0:
		if !c.reported.Load() {
			c.reported.Store(true)
		}
		return cached
	case c.reported.Load():
		return 0
	}
	return -1
}

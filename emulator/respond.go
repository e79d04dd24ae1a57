package emulator

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"unsafe"

	"github.com/kvroute/kvroute/openai"
)

// bufPool recycles the byte buffers of a response (generated text,
// response body), so a busy fleet does not allocate and clear tens of
// kilobytes per request; bodyPool those of request bodies, which are
// smaller: mixed in one pool, a small buffer handed out for a response
// would grow (a fresh allocation) and the small one be dropped, again and
// again. Buffers that grew past maxPooled are dropped rather than kept.
var (
	bufPool  = sync.Pool{New: func() any { return new([]byte) }}
	bodyPool = sync.Pool{New: func() any { return new([]byte) }}
)

const maxPooled = 1 << 20

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if b == nil || cap(*b) > maxPooled {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

func getBody() *[]byte { return bodyPool.Get().(*[]byte) }

func putBody(b *[]byte) {
	if b == nil || cap(*b) > maxPooled {
		return
	}
	*b = (*b)[:0]
	bodyPool.Put(b)
}

// readBody reads r's body (at most limit bytes, enforced by
// http.MaxBytesReader) into *buf, sized from Content-Length when known.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, buf *[]byte) ([]byte, error) {
	b := (*buf)[:0]
	if n := r.ContentLength; n > 0 && n <= limit && int64(cap(b)) < n+1 {
		b = make([]byte, 0, n+1) // +1: room for the read that sees EOF
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*buf = b
			return b, nil
		}
		if err != nil {
			*buf = b
			return nil, err
		}
	}
}

// bytesString views b as a string without copying; b must not change while
// the string is in use.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// appendWhole appends the non-streaming response body of j: the JSON
// encoding/json gives openai.Completion or openai.ChatCompletion, written
// without reflection (a test compares the two): vLLM's model_dump() of its
// CompletionResponse or ChatCompletionResponse, null fields included. A
// P/D prefill leg's kv_transfer_params, a map, goes through encoding/json.
func (s *Server) appendWhole(dst []byte, j *job, kv map[string]any) []byte {
	object := openai.ObjectTextCompletion
	if j.chat {
		object = openai.ObjectChatCompletion
	}
	dst = append(dst, `{"id":`...)
	dst = openai.AppendJSONString(dst, j.respID)
	dst = append(dst, `,"object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, j.hdr.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = openai.AppendJSONString(dst, j.hdr.Model) // the adapter's name for an adapter's request
	if j.chat {
		dst = append(dst, `,"choices":[{"index":0,"message":{"role":`...)
		dst = openai.AppendJSONString(dst, j.responseRole())
		dst = append(dst, `,"content":`...)
		dst = s.appendText(dst, j)
		dst = append(dst, `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning":null},"logprobs":null,"finish_reason":`...)
	} else {
		dst = append(dst, `,"choices":[{"index":0,"text":`...)
		dst = s.appendText(dst, j)
		dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	}
	dst = openai.AppendJSONString(dst, j.finish)
	dst = append(dst, `,"stop_reason":`...)
	dst = openai.StopReasonJSON(dst, j.stopReason, 0, false)
	if j.returnIDs {
		return s.appendWholeIDs(dst, j, kv)
	}
	if j.chat {
		dst = append(dst, `,"token_ids":null}],"service_tier":null,"system_fingerprint":null,"usage":`...)
	} else {
		dst = append(dst, `,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null}],"service_tier":null,"system_fingerprint":null,"usage":`...)
	}
	dst = openai.AppendUsage(dst, len(j.prompt), j.generated, j.prog.cachedTokens)
	if j.chat {
		dst = append(dst, `,"prompt_logprobs":null,"prompt_token_ids":null`...)
	}
	return appendKVParams(dst, kv)
}

// appendWholeIDs is appendWhole's end for a request with
// return_token_ids: the choice's token_ids (the generated tokens, EOS
// included, up to a stop string's match) and the prompt's ids, the
// choice's prompt_token_ids (completions) or the response's (chat).
func (s *Server) appendWholeIDs(dst []byte, j *job, kv map[string]any) []byte {
	ids := s.sampler.AppendTokenRange(make([]uint32, 0, j.generated), j.ereq, 0, j.generated)
	dst = append(dst, `,"token_ids":`...)
	dst = openai.AppendTokenIDs(dst, ids)
	if !j.chat {
		dst = append(dst, `,"prompt_logprobs":null,"prompt_token_ids":`...)
		dst = openai.AppendTokenIDs(dst, j.prompt)
	}
	dst = append(dst, `}],"service_tier":null,"system_fingerprint":null,"usage":`...)
	dst = openai.AppendUsage(dst, len(j.prompt), j.generated, j.prog.cachedTokens)
	if j.chat {
		dst = append(dst, `,"prompt_logprobs":null,"prompt_token_ids":`...)
		dst = openai.AppendTokenIDs(dst, j.prompt)
	}
	return appendKVParams(dst, kv)
}

// appendKVParams ends a whole response with its kv_transfer_params.
func appendKVParams(dst []byte, kv map[string]any) []byte {
	dst = append(dst, `,"kv_transfer_params":`...)
	if kv == nil {
		dst = append(dst, "null"...)
	} else {
		b, err := json.Marshal(kv)
		if err != nil {
			b = []byte("null")
		}
		dst = append(dst, b...)
	}
	return append(dst, '}')
}

// appendText appends the text of a whole response j as a JSON string: a
// direct job's tokens rendered straight into it (plain words need no
// escaping), else j.text escaped.
func (s *Server) appendText(dst []byte, j *job) []byte {
	if !j.direct {
		return openai.AppendJSONString(dst, bytesString(j.text))
	}
	dst = append(dst, '"')
	dst, _ = renderTokens(s.cfg.Tokenizer, dst, j.prog.toks, nil)
	return append(dst, '"')
}

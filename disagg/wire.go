package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// ReservedFields are the request fields that steer a P/D handoff or name an
// endpoint. Only the router sets them; a client request carrying any of
// them at the top level is rejected (400), so no request can make the
// router, or an engine behind it, pull KV from an arbitrary host.
var ReservedFields = []string{
	"kv_transfer_params",                                 // vLLM NixlConnector (remote_host, remote_port, ...)
	"bootstrap_host", "bootstrap_port", "bootstrap_room", // SGLang
	"routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank", // SGLang DP attention (data_parallel_rank: its older name, still read)
	"remote_prefiller", "remote_decoder", "remote_kv_source", // llm-d offloading connector
}

// EndpointHeaders are request headers that name endpoints in other P/D
// routers (llm-d's sidecar protocol). They are never forwarded.
var EndpointHeaders = []string{
	"X-Prefiller-Host-Port", "X-Encoder-Hosts-Ports", "X-Kv-Cache-Source-Host-Port",
	"X-Data-Parallel-Host-Port", "X-Data-Parallel-Rank",
}

// ForwardHeaders are the only client headers the handoff passes to the
// engines (besides Content-Type and X-Request-Id, which it sets). The
// forwarding headers (X-Forwarded-For, -Host, -Proto) are passed as the
// request to Serve has them: its caller sets them (the proxy sets them
// from the client's address, and drops an untrusted client's own).
var ForwardHeaders = []string{"Authorization", "Accept", "Traceparent", "Tracestate", "User-Agent",
	"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// ErrMissingKVParams is the error of a prefill reply without
// kv_transfer_params: the prefill engine did not hold the KV for a remote
// decode (no KV connector, or a connector error). The handoff counts and
// logs it and never lets the decode engine recompute silently.
var ErrMissingKVParams = errors.New("disagg: prefill reply has no kv_transfer_params")

// decodeObject parses a JSON object's top level (openai.DecodeObject, the
// one body rewriter the proxy's paths share).
func decodeObject(body []byte) (map[string]json.RawMessage, error) { return openai.DecodeObject(body) }

// CheckClientRequest rejects a client request that tries to steer the
// handoff: a reserved body field (ReservedFields) or an endpoint-naming
// header (EndpointHeaders). The error is a 400 *kvroute.Error naming the
// field or header.
func CheckClientRequest(body []byte, h http.Header) error {
	for _, name := range EndpointHeaders {
		if h.Get(name) != "" {
			return &kvroute.Error{Status: http.StatusBadRequest, Type: kvroute.TypeInvalidRequest, Code: "reserved_header",
				Message: fmt.Sprintf("header %s names an endpoint and is not accepted: the router chooses the prefill and decode engines", name)}
		}
	}
	m, err := decodeObject(body)
	if err != nil {
		return &kvroute.Error{Status: http.StatusBadRequest, Type: kvroute.TypeInvalidRequest, Code: "invalid_body", Message: err.Error()}
	}
	for k := range m {
		if isReserved(k) {
			return &kvroute.Error{Status: http.StatusBadRequest, Type: kvroute.TypeInvalidRequest, Code: "reserved_field", Param: k,
				Message: fmt.Sprintf("field %q is reserved for the router's prefill/decode handoff", k)}
		}
	}
	return nil
}

// isReserved matches reserved names case-insensitively (some JSON parsers
// fold case), so no spelling slips through.
func isReserved(k string) bool {
	for _, r := range ReservedFields {
		if strings.EqualFold(k, r) {
			return true
		}
	}
	return false
}

// nixlPrefillParams is what the proxy asks the prefill engine for
// (toy_proxy_server.py).
var nixlPrefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

var one = json.RawMessage(`1`)

// NixlPrefillBody rewrites a client body into vLLM NixlConnector's prefill
// request: max_tokens=1 (and max_completion_tokens=1 when present),
// stream=false, stream_options and min_tokens/min_completion_tokens
// removed, and kv_transfer_params asking for a remote decode.
func NixlPrefillBody(body []byte) ([]byte, error) {
	m, err := decodeObject(body)
	if err != nil {
		return nil, fmt.Errorf("disagg: nixl prefill body: %w", err)
	}
	m["max_tokens"] = one
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = one
	}
	m["stream"] = json.RawMessage(`false`)
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	m["kv_transfer_params"] = nixlPrefillParams
	return encodeObject(m)
}

// NixlDecodeBody returns the client's body with the prefill engine's
// kv_transfer_params, copied verbatim.
func NixlDecodeBody(body []byte, params json.RawMessage) ([]byte, error) {
	m, err := decodeObject(body)
	if err != nil {
		return nil, fmt.Errorf("disagg: nixl decode body: %w", err)
	}
	m["kv_transfer_params"] = params
	return encodeObject(m)
}

// KVTransferParams extracts kv_transfer_params from a prefill engine's
// (non-streaming) reply. A missing, null or non-object value is
// ErrMissingKVParams.
func KVTransferParams(reply []byte) (json.RawMessage, error) {
	var r struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return nil, fmt.Errorf("disagg: prefill reply: %w", err)
	}
	kv := bytes.TrimSpace(r.KV)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, ErrMissingKVParams
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(kv, &probe); err != nil || len(probe) == 0 {
		return nil, ErrMissingKVParams
	}
	return kv, nil
}

// stoppedEarly reports whether a prefill reply (one without
// kv_transfer_params) is a request its one token ended: every choice
// finished "stop" (EOS or a stop token, which vLLM's check_stop tests
// before the length cap of max_tokens=1). vLLM's KV connectors hand the KV
// over only for a request finished by its length cap
// (FINISHED_LENGTH_CAPPED in NixlConnector.request_finished); for any
// other they free the blocks and the reply has no kv_transfer_params.
func stoppedEarly(reply []byte) bool {
	var r struct {
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(reply, &r) != nil || len(r.Choices) == 0 {
		return false
	}
	for _, c := range r.Choices {
		if c.FinishReason == nil || *c.FinishReason != "stop" {
			return false
		}
	}
	return true
}

// SGLangBody adds SGLang's bootstrap fields to a client body: the prefill
// engine's host and bootstrap port and the room that pairs the two legs. A
// batched request gets lists of equal length, one entry per item, as
// SGLang's router sends them (rooms room, room+1, ...: distinct within the
// batch). The batch size is "n" when above 1, else the number of prompts
// ("prompt" or "text" holding an array of strings or of token-id arrays,
// even of one); a single prompt of token ids is not a batch.
func SGLangBody(body []byte, host string, port int, room uint64) ([]byte, error) {
	return sglangBody(body, host, port, room, 1)
}

// sglangBody is SGLangBody with the rooms of a batch's items stride apart
// (room, room+stride, ...): a prefill engine's data-parallel rank count,
// so that every item's room names the rank (see rankRoom).
func sglangBody(body []byte, host string, port int, room, stride uint64) ([]byte, error) {
	m, err := decodeObject(body)
	if err != nil {
		return nil, fmt.Errorf("disagg: sglang body: %w", err)
	}
	h, _ := json.Marshal(host)
	n, batched := sglangBatch(m)
	if n > MaxSGLangBatch {
		return nil, fmt.Errorf("disagg: sglang body: a batch of %d items is above the limit of %d", n, MaxSGLangBatch)
	}
	if !batched {
		m["bootstrap_host"] = h
		m["bootstrap_port"] = json.RawMessage(strconv.Itoa(port))
		m["bootstrap_room"] = json.RawMessage(strconv.FormatUint(room&(1<<63-1), 10))
		return encodeObject(m)
	}
	hosts, ports, rooms := []byte{'['}, []byte{'['}, []byte{'['}
	for i := range n {
		if i > 0 {
			hosts, ports, rooms = append(hosts, ','), append(ports, ','), append(rooms, ',')
		}
		hosts = append(hosts, h...)
		ports = strconv.AppendInt(ports, int64(port), 10)
		rooms = strconv.AppendUint(rooms, (room+uint64(i)*stride)&(1<<63-1), 10)
	}
	m["bootstrap_host"] = append(hosts, ']')
	m["bootstrap_port"] = append(ports, ']')
	m["bootstrap_room"] = append(rooms, ']')
	return encodeObject(m)
}

// sglangAdapter names adapter, the LoRA adapter the request was routed
// for (kvroute.Request.Adapter) of base model base, in an SGLang leg's
// body as SGLang reads one: lora_path (a batch's items all take a single
// name), the client's own replaced, and a "model" with a colon that SGLang
// would read as "<base>:<adapter>" replaced by base (openai.NameAdapter).
// An SGLang engine does not read "model" naming an adapter alone, vLLM's
// form: it would run the base model on an engine picked for the adapter,
// under the adapter's block keys.
func sglangAdapter(body []byte, base, adapter string) ([]byte, error) {
	b, err := openai.NameAdapter(body, openai.AdapterSGLang, base, adapter)
	if err != nil {
		return nil, fmt.Errorf("disagg: sglang body: %w", err)
	}
	return b, nil
}

// MaxSGLangBatch bounds the items of one request on an SGLang P/D pool
// (each gets its own bootstrap room): a larger "n" or prompt list is
// refused rather than expanded.
const MaxSGLangBatch = 1 << 16

// sglangBatch is the number of items SGLang serves a request as and
// whether it is a batch (see SGLangBody): a list of one prompt is a batch
// of one.
func sglangBatch(m map[string]json.RawMessage) (int, bool) {
	var n int
	if json.Unmarshal(m["n"], &n) == nil && n > 1 {
		return n, true
	}
	for _, key := range []string{"prompt", "text"} {
		var items []json.RawMessage
		if json.Unmarshal(m[key], &items) != nil || len(items) == 0 {
			continue
		}
		if first := bytes.TrimSpace(items[0]); len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			return len(items), true
		}
		return 1, false // one prompt of token ids
	}
	return 1, false
}

// encodeObject writes m as JSON (openai.EncodeObject).
func encodeObject(m map[string]json.RawMessage) ([]byte, error) { return openai.EncodeObject(m) }

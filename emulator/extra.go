package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/openai"
)

// handleResetPrefixCache is vLLM's POST /reset_prefix_cache: it forgets
// every cached block (an AllBlocksCleared KV event follows). Like vLLM it
// fails while blocks are in use; the emulator answers that with 409.
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	done := make(chan bool, 1)
	if err := s.post(command{kind: cmdReset, done: done}); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	select {
	case ok := <-done:
		if !ok {
			writeError(w, http.StatusConflict, "prefix cache not reset: blocks are in use by running requests")
			return
		}
		w.WriteHeader(http.StatusOK)
	case <-s.done:
		writeError(w, http.StatusServiceUnavailable, ErrStopped.Error())
	case <-r.Context().Done():
	}
}

// handleTokenize is vLLM's POST /tokenize: {"prompt": ...} or
// {"messages": [...]} (rendered with the chat template and the generation
// prompt, as the chat endpoint does) -> {"count", "max_model_len",
// "tokens"}. As in vLLM the model is checked, and the generation options
// of a request body (max_tokens, n, stream_options, stop) are extra keys
// its tokenize request models ignore.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(body, &probe)
	chat := len(probe.Messages) > 0
	req, _, aerr := parseBody(body, chat)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if _, aerr := s.resolveModel(req.Model); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	var toks []uint32
	switch {
	case chat:
		aerr := s.contentError(req)
		var opts *chatOpts
		if aerr == nil {
			opts, aerr = req.chatOptions(s.cfg.ExcludeToolsWhenToolChoiceNone)
		}
		if aerr == nil {
			toks, aerr = s.encodeMessages(req, opts)
		}
		if aerr != nil {
			writeAPIError(w, aerr)
			return
		}
	case req.promptIDs != nil:
		toks = req.promptIDs
	default:
		toks = s.encodePrompt(req.promptText, req)
	}
	if toks == nil {
		toks = []uint32{}
	}
	out, _ := json.Marshal(struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}{len(toks), s.prof.MaxModelLen, toks, nil})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// detokenizeRequest is vLLM's DetokenizeRequest.
type detokenizeRequest struct {
	model  string
	tokens []uint32
}

// parseDetokenize decodes a POST /detokenize body as vLLM's
// DetokenizeRequest validates it: model a string or null, tokens a list of
// integers from 0 to 2^63-1 (ids past 2^32-1, which no vocabulary has, are
// dropped: a tokenizer skips an id it does not know); other keys ignored.
func parseDetokenize(body []byte) (*detokenizeRequest, *apiError) {
	const model = "DetokenizeRequest"
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(openai.TrimBOM(body), &raw); err != nil {
		return nil, invalidBody("body", "JSON decode error: %v", err)
	}
	if raw == nil {
		return nil, invalidBody("body", "1 validation error for %s\n  Input should be a valid dictionary or object to extract fields from", model)
	}
	var r detokenizeRequest
	if m, ok := raw["model"]; ok && string(m) != "null" {
		if json.Unmarshal(m, &r.model) != nil {
			return nil, invalidBody("body.model", "1 validation error for %s\nmodel\n  Input should be a valid string", model)
		}
	}
	t, ok := raw["tokens"]
	if !ok {
		return nil, invalidBody("body.tokens", "1 validation error for %s\ntokens\n  Field required", model)
	}
	var items []json.RawMessage
	if json.Unmarshal(t, &items) != nil || items == nil {
		return nil, invalidBody("body.tokens", "1 validation error for %s\ntokens\n  Input should be a valid list", model)
	}
	r.tokens = make([]uint32, 0, len(items))
	for i, it := range items {
		var w wholeInt
		if w.UnmarshalJSON(it) != nil {
			return nil, invalidBody(fmt.Sprintf("body.tokens.%d", i), "1 validation error for %s\ntokens.%d\n  Input should be a valid integer", model, i)
		}
		if w < 0 {
			return nil, invalidBody(fmt.Sprintf("body.tokens.%d", i), "1 validation error for %s\ntokens.%d\n  Input should be greater than or equal to 0", model, i)
		}
		if int64(w) <= math.MaxUint32 {
			r.tokens = append(r.tokens, uint32(w))
		}
	}
	return &r, nil
}

// handleDetokenize is vLLM's POST /detokenize: {"tokens": [ids]} ->
// {"prompt": text}, the ids decoded by the tokenizer with their special
// tokens (vLLM's tokenizer.decode); ids it does not know are skipped, as
// a HuggingFace tokenizer skips them. As in vLLM the model is checked.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}
	req, aerr := parseDetokenize(body)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if _, aerr := s.resolveModel(req.model); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	out := []byte(`{"prompt":`)
	out = openai.AppendJSONString(out, s.cfg.Tokenizer.Decode(req.tokens))
	out = append(out, '}')
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// Version is what GET /version reports, as vLLM reports its own: a PEP 440
// version, which clients parse (packaging.version) to gate features. Its
// release is the oldest vLLM whose response shapes the emulator emits
// (0.16: the chat message's reasoning, no longer reasoning_content), so a
// client expects nothing newer of it; its local label says it is the
// emulator.
const Version = "0.16.0+kvroute.emulator"

func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"version":"`+Version+`"}`)
}

// Headers of vLLM's in-band load report (ORCA, vLLM PR #24905).
const (
	headerLoadFormat  = "Endpoint-Load-Metrics-Format"
	headerLoadMetrics = "Endpoint-Load-Metrics"
)

// setLoadHeader adds the endpoint-load-metrics response header when the
// request asked for it with endpoint-load-metrics-format: TEXT or JSON
// (non-streaming responses only, as in vLLM).
func (s *Server) setLoadHeader(w http.ResponseWriter, r *http.Request) {
	format := strings.ToUpper(strings.TrimSpace(r.Header.Get(headerLoadFormat)))
	if format != "TEXT" && format != "JSON" {
		return
	}
	st := s.metrics.stats().st
	named := []struct {
		name string
		v    float64
	}{
		{"kv_cache_usage_perc", st.KVUsage},
		{"num_requests_waiting", float64(st.Waiting)}, // vLLM reads vllm:num_requests_waiting
		{"num_requests_running", float64(st.Running)},
	}
	var b []byte
	if format == "TEXT" {
		b = append(b, "TEXT "...)
		for i, m := range named {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, "named_metrics."...)
			b = append(b, m.name...)
			b = append(b, '=')
			b = appendPyFloat(b, m.v)
		}
	} else {
		b = append(b, `JSON {"named_metrics": {`...)
		for i, m := range named {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '"')
			b = append(b, m.name...)
			b = append(b, `": `...)
			b = appendPyFloat(b, m.v)
		}
		b = append(b, "}}"...)
	}
	w.Header().Set(headerLoadMetrics, string(b))
}

// appendPyFloat formats v as Python's repr of a float does for ordinary
// values: 2.0, 0.31.
func appendPyFloat(dst []byte, v float64) []byte {
	n := len(dst)
	dst = strconv.AppendFloat(dst, v, 'g', -1, 64)
	if !strings.ContainsAny(string(dst[n:]), ".eEn") {
		dst = append(dst, ".0"...)
	}
	return dst
}

package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/tokenizer"
)

// This file holds vLLM's checks of the request options the emulator does
// not act on but a client sees refused or accepted: logprobs and
// top_logprobs (their request models' check_logprobs, then the sampling
// parameters' limit, --max-logprobs) and tools and tool_choice (the chat
// request's check_tool_usage, then the serving layer's refusal of "auto"
// without --enable-auto-tool-choice).

// valueError is the 400 vLLM answers for a VLLMValidationError raised by a
// request model's validator: pydantic's "Value error, " and the error's
// text, which names the parameter and, when given, the value.
func valueError(param, value, format string, args ...any) *apiError {
	msg := "Value error, " + fmt.Sprintf(format, args...) + " (parameter=" + param
	if value != "" {
		msg += ", value=" + value
	}
	return invalidBody(param, "%s)", msg)
}

// isNull reports whether a raw field is absent or null.
func isNull(raw json.RawMessage) bool { return !hasJSON(raw) }

// pyStr is Python's str() of a JSON value (repr inside containers).
func pyStr(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	var b strings.Builder
	pyReprTo(&b, v)
	return b.String()
}

func pyReprTo(b *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if v {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case json.Number:
		b.WriteString(v.String())
	case string:
		b.WriteString(pyRepr(v))
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			pyReprTo(b, e)
		}
		b.WriteByte(']')
	case map[string]any:
		// Python keeps the body's key order; encoding/json does not, so
		// keys are sorted (equal for the one-key objects of the errors).
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(k))
			b.WriteString(": ")
			pyReprTo(b, v[k])
		}
		b.WriteByte('}')
	}
}

// pyNumber is a JSON value Python's isinstance(v, (int, float)) accepts (a
// bool too) as a float64.
func pyNumber(v any) (float64, bool) {
	switch v := v.(type) {
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	case json.Number:
		f, err := v.Float64()
		return f, err == nil
	}
	return 0, false
}

// requestModel is the name of vLLM's request model, for its validation
// errors.
func requestModel(chat bool) string {
	if chat {
		return "ChatCompletionRequest"
	}
	return "CompletionRequest"
}

// checkLogprobs is vLLM's check_logprobs for the count field (chat's
// top_logprobs, the completions' logprobs), then the fields' types; it
// sets r.logprobs and o.wantLogprobs.
func (r *apiRequest) checkLogprobs(chat bool) *apiError {
	o := r.opts
	if o == nil {
		return nil
	}
	field, raw := "logprobs", o.Logprobs
	if chat {
		field, raw = "top_logprobs", o.TopLogprobs
	}
	var count *float64
	if !isNull(raw) {
		v, ok := tokenizer.PyValue(raw)
		if !ok {
			return invalidBody("body."+field, "1 validation error for %s\n%s\n  Input should be a valid integer", requestModel(chat), field)
		}
		n, ok := pyNumber(v)
		if !ok {
			return valueError(field, pyStr(v), "`%s` must be an integer.", field)
		}
		if n < 0 && n != -1 {
			return valueError(field, pyStr(v), "`%s` must be a positive value or -1.", field)
		}
		count = &n
	}
	if chat {
		want := false
		if !isNull(o.Logprobs) {
			v, _ := tokenizer.PyValue(o.Logprobs)
			want = tokenizer.PyTrue(v)
		}
		if count != nil && (*count == -1 || *count > 0) && !want {
			return valueError("top_logprobs", "", "when using `top_logprobs`, `logprobs` must be set to true.")
		}
		if !isNull(o.Logprobs) && string(o.Logprobs) != "true" && string(o.Logprobs) != "false" {
			return invalidBody("body.logprobs", "1 validation error for ChatCompletionRequest\nlogprobs\n  Input should be a valid boolean")
		}
		o.wantLogprobs = want
	} else {
		o.wantLogprobs = count != nil
	}
	if count != nil {
		var w wholeInt
		if err := w.UnmarshalJSON(raw); err != nil || string(raw) == "true" || string(raw) == "false" {
			return invalidBody("body."+field, "1 validation error for %s\n%s\n  Input should be a valid integer", requestModel(chat), field)
		}
		if o.wantLogprobs {
			n := int(w)
			o.logprobs = &n
		}
	}
	return nil
}

// defaultMaxLogprobs is vLLM's --max-logprobs default.
const defaultMaxLogprobs = 20

// logprobsError is the 400 for a request that asks for logprobs: vLLM's
// when it asks for more sample logprobs than --max-logprobs allows (-1:
// the vocabulary), else the emulator's own, as it computes no token
// probabilities and would rather refuse than make some up. Nil for a
// request without logprobs.
func (s *Server) logprobsError(r *apiRequest) *apiError {
	o := r.opts
	if o == nil || !o.wantLogprobs {
		return nil
	}
	if o.logprobs != nil && *o.logprobs != 0 {
		vocab := s.prof.Model.Vocab
		n, limit := *o.logprobs, s.cfg.MaxLogprobs
		if n == -1 {
			n = vocab
		}
		if limit == -1 {
			limit = vocab
		}
		if n > limit {
			return validationError("logprobs", n, "Requested sample logprobs of %d, which is greater than max allowed: %d", n, limit)
		}
	}
	return &apiError{status: http.StatusBadRequest, msg: "logprobs are not supported by this emulated engine (kvroute engine computes no token probabilities)", param: "logprobs"}
}

// toolUsage is the correct form vLLM's errors about tool_choice quote.
const toolUsage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`"

// checkTools is vLLM's check_tool_usage of a chat request; it sets
// r.autoTools when tool_choice is "auto", given or implied by tools.
func (r *apiRequest) checkTools() *apiError {
	var tools any
	if !isNull(r.Tools) {
		v, ok := tokenizer.PyValue(r.Tools)
		if !ok {
			return invalidBody("body.tools", "1 validation error for ChatCompletionRequest\ntools\n  Input should be a valid list")
		}
		tools = v
	}
	if l, ok := tools.([]any); ok && len(l) == 0 {
		return valueError("tools", "", "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.")
	}
	var rawChoice json.RawMessage
	if r.opts != nil {
		rawChoice = r.opts.ToolChoice
	}
	var choice any
	switch {
	case len(rawChoice) == 0:
		if tokenizer.PyTrue(tools) {
			choice = "auto"
		}
	default:
		v, ok := tokenizer.PyValue(rawChoice)
		if !ok {
			return invalidBody("body.tool_choice", "1 validation error for ChatCompletionRequest\ntool_choice\n  Input should be 'none', 'auto' or 'required'")
		}
		choice = v
	}
	if choice == nil || choice == "none" {
		return nil
	}
	if tools == nil {
		return valueError("tool_choice", "", "When using `tool_choice`, `tools` must be set.")
	}
	obj, isObj := choice.(map[string]any)
	if choice != "auto" && choice != "required" && !isObj {
		return valueError("tool_choice", "", "Invalid value for `tool_choice`: %s! Only named tools, \"none\", \"auto\" or \"required\" are supported.", pyStr(choice))
	}
	if isObj {
		fn, ok := obj["function"].(map[string]any)
		if !ok {
			return valueError("tool_choice.function", "", "Invalid value for `function`: `%s` in `tool_choice`! %s", pyStr(obj["function"]), toolUsage)
		}
		name, ok := fn["name"]
		if !ok {
			return valueError("tool_choice.function.name", "", "Expected field `name` in `function` in `tool_choice`! %s", toolUsage)
		}
		if s, ok := name.(string); !ok || s == "" {
			return valueError("tool_choice.function.name", "", "Invalid `name` in `function`: `%s` in `tool_choice`! %s", pyStr(name), toolUsage)
		}
		found := false
		if l, ok := tools.([]any); ok {
			for _, t := range l {
				if t, ok := t.(map[string]any); ok {
					if f, ok := t["function"].(map[string]any); ok && f["name"] == name {
						found = true
						break
					}
				}
			}
		}
		if !found {
			return valueError("tool_choice", "", "The tool specified in `tool_choice` does not match any of the specified `tools`")
		}
	}
	r.autoTools = choice == "auto"
	return nil
}

// errAutoTools is vLLM's serving layer's refusal of tool_choice "auto"
// on a server started without --enable-auto-tool-choice.
func errAutoTools() *apiError {
	return badRequest(`"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`)
}

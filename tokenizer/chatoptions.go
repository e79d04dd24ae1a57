package tokenizer

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
)

// ContinueFinal cuts a chat rendered without the generation prompt after
// its final message's content, as transformers' apply_chat_template does
// for continue_final_message (vLLM's request option of that name): the
// model then continues that message instead of starting a new one. The cut
// is after the last occurrence of final, its surrounding whitespace
// trimmed, keeping its trailing whitespace when the template kept it. ok
// is false when the trimmed content does not appear in text (a template
// that rewrites the message; transformers and vLLM refuse the request).
func ContinueFinal(text, final string) (cut string, ok bool) {
	trimmed := strings.TrimSpace(final)
	at := strings.LastIndex(text, trimmed)
	if at < 0 {
		return "", false
	}
	end := min(at+len(strings.TrimLeftFunc(final, unicode.IsSpace)), len(text))
	if text[at:end] == final {
		return text[:end], true // the template kept the message's trailing whitespace
	}
	return text[:at+len(trimmed)], true
}

// PyTrue is Python's truth value of a JSON value decoded with numbers as
// json.Number (as a request's chat_template_kwargs reach a chat template
// in vLLM): false for null, false, zero, "" and empty arrays and objects.
// A number too large for a float64 is true (Python reads it as inf).
func PyTrue(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case json.Number:
		f, err := v.Float64()
		return err != nil || f != 0
	case float64:
		return v != 0
	case string:
		return v != ""
	case []any:
		return len(v) > 0
	case map[string]any:
		return len(v) > 0
	}
	return true
}

// PyValue decodes a raw JSON value as Python's json.loads gives it to a
// template, numbers as json.Number (their text); ok is false for one that
// is not JSON.
func PyValue(raw json.RawMessage) (v any, ok bool) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return nil, false
	}
	return v, true
}

// ReasoningEffortVars sets the template variables a chat request's
// reasoning_effort (effort, raw JSON; absent or null: none) gives its chat
// template in vLLM (ChatCompletionRequest.build_chat_params, since vLLM
// PR 43401, May 2026) in vars: reasoning_effort, over the same key of the
// request's chat_template_kwargs (kwargs), and enable_thinking, false for
// "none" and true otherwise, unless the kwargs set it. Qwen3's template
// then writes an empty <think> block after the generation prompt for
// "none"; Gemma 4's starts thinking for the others.
func ReasoningEffortVars(vars map[string]json.RawMessage, effort json.RawMessage, kwargs map[string]json.RawMessage) {
	var level *string
	if json.Unmarshal(effort, &level) != nil || level == nil {
		return // absent, null (vLLM leaves the kwargs' own), or not a string (vLLM's 400)
	}
	vars["reasoning_effort"] = effort
	if _, ok := kwargs["enable_thinking"]; !ok {
		vars["enable_thinking"] = json.RawMessage(strconv.FormatBool(*level != "none"))
	}
}

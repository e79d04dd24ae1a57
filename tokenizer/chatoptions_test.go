package tokenizer

import (
	"encoding/json"
	"testing"
)

// TestPyTrue: Python's truth of JSON values (PyValue), as the emulator
// reads a request's tools and logprobs as vLLM's checks do.
func TestPyTrue(t *testing.T) {
	for raw, want := range map[string]bool{
		`true`: true, `false`: false, `null`: false, `0`: false, `0.0`: false, `-0`: false, `2`: true,
		`1e400`: true, // inf in Python
		`""`:    false, `"no"`: true, `[]`: false, `[0]`: true, `{}`: false, `{"a":1}`: true,
		`not json`: false,
	} {
		v, ok := PyValue(json.RawMessage(raw))
		if got := ok && PyTrue(v); got != want {
			t.Errorf("PyTrue(PyValue(%s)) = %v, want %v", raw, got, want)
		}
	}
}

// TestContinueFinal: the rendered chat is cut after the final message's
// last occurrence, keeping the trailing whitespace the template kept.
func TestContinueFinal(t *testing.T) {
	for _, tc := range []struct {
		text, final, want string
		ok                bool
	}{
		{"<u>In an L</u><a>In an L: </a>", "In an L: ", "<u>In an L</u><a>In an L: ", true}, // kept
		{"<u>x</u><a>In an L:</a>", "In an L: ", "<u>x</u><a>In an L:", true},               // trimmed by the template
		{"<a>  In an L</a>", "  In an L", "<a>  In an L", true},                             // leading whitespace stays before
		{"<a>something else</a>", "In an L", "", false},                                     // rewritten by the template
		{"<u>hi</u><a></a>", "", "<u>hi</u><a></a>", true},                                  // empty: cut at the end
	} {
		got, ok := ContinueFinal(tc.text, tc.final)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ContinueFinal(%q, %q) = %q, %v; want %q, %v", tc.text, tc.final, got, ok, tc.want, tc.ok)
		}
	}
}

// TestReasoningEffortVars: a request's reasoning_effort gives the template
// reasoning_effort and, unless the kwargs set it, enable_thinking (false
// for "none"), as vLLM's build_chat_params does; null, absent or not a
// string sets nothing (a null leaves the kwargs' own).
func TestReasoningEffortVars(t *testing.T) {
	for _, tc := range []struct {
		effort, kwargs, want string
	}{
		{`"none"`, `{}`, `{"enable_thinking":false,"reasoning_effort":"none"}`},
		{`"high"`, `{}`, `{"enable_thinking":true,"reasoning_effort":"high"}`},
		{`"low"`, `{"enable_thinking":false}`, `{"reasoning_effort":"low"}`},
		{`null`, `{"reasoning_effort":"low"}`, `{}`},
		{``, `{}`, `{}`},
		{`3`, `{}`, `{}`},
	} {
		var kwargs map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.kwargs), &kwargs); err != nil {
			t.Fatal(err)
		}
		vars := map[string]json.RawMessage{}
		ReasoningEffortVars(vars, json.RawMessage(tc.effort), kwargs)
		if got, _ := json.Marshal(vars); string(got) != tc.want {
			t.Errorf("ReasoningEffortVars(%s, %s) = %s, want %s", tc.effort, tc.kwargs, got, tc.want)
		}
	}
}

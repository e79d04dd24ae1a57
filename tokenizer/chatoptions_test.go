package tokenizer

import (
	"encoding/json"
	"testing"
)

// TestPyTruthy: Python's truth of JSON values, as chat_template_kwargs'
// add_generation_prompt and continue_final_message are read.
func TestPyTruthy(t *testing.T) {
	for raw, want := range map[string]bool{
		`true`: true, `false`: false, `null`: false, `0`: false, `0.0`: false, `-0`: false, `2`: true,
		`1e400`: true, // inf in Python
		`""`:    false, `"no"`: true, `[]`: false, `[0]`: true, `{}`: false, `{"a":1}`: true,
		`not json`: false,
	} {
		if got := PyTruthy(json.RawMessage(raw)); got != want {
			t.Errorf("PyTruthy(%s) = %v, want %v", raw, got, want)
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

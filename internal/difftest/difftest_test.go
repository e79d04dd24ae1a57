package difftest

import "testing"

func TestFirstLine(t *testing.T) {
	for _, tc := range []struct{ got, want, diff string }{
		{"a\nb\n", "a\nb\n", ""},
		{"a\nb\n", "a\nc\n", "line 2:\n got b\nwant c"},
		{"a\n", "a\nb", "line 2:\n got \nwant b"},
		{"x", "", "line 1:\n got x\nwant "},
	} {
		if got := FirstLine([]byte(tc.got), []byte(tc.want)); got != tc.diff {
			t.Errorf("FirstLine(%q, %q) = %q, want %q", tc.got, tc.want, got, tc.diff)
		}
	}
}

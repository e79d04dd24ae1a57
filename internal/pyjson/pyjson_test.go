package pyjson

import (
	"encoding/json"
	"testing"
)

// TestAppendString: the strings Python 3.11's json.dumps writes, with
// ensure_ascii (its default; SGLang's streamed errors) and without it
// (transformers' tojson filter).
func TestAppendString(t *testing.T) {
	for _, tc := range []struct{ in, ascii, utf string }{
		{"plain <&> text", `"plain <&> text"`, `"plain <&> text"`},
		{"quote \" back \\ slash", `"quote \" back \\ slash"`, `"quote \" back \\ slash"`},
		{"nl\ncr\rtab\tbs\bff\f", `"nl\ncr\rtab\tbs\bff\f"`, `"nl\ncr\rtab\tbs\bff\f"`},
		{"\x00\x1f\x7f", `"\u0000\u001f\u007f"`, "\"\\u0000\\u001f\x7f\""},
		{"café €", `"caf\u00e9 \u20ac"`, `"café €"`},
		{"😀", `"\ud83d\ude00"`, `"😀"`},
		{"\u2028 \ufeff", `"\u2028 \ufeff"`, "\"\u2028 \ufeff\""},
		{"bad \xff byte", `"bad \ufffd byte"`, "\"bad \ufffd byte\""}, // Python's decoding with errors="replace"
		{"odict_keys(['a-lora'])", `"odict_keys(['a-lora'])"`, `"odict_keys(['a-lora'])"`},
	} {
		if got := string(AppendString(nil, tc.in, true)); got != tc.ascii {
			t.Errorf("%q, ensure_ascii: got %s, want %s", tc.in, got, tc.ascii)
		}
		if got := string(AppendString(nil, tc.in, false)); got != tc.utf {
			t.Errorf("%q: got %s, want %s", tc.in, got, tc.utf)
		}
	}
}

// FuzzAppendString: whatever the string, both forms are JSON strings that
// decode to it (invalid UTF-8 replaced by U+FFFD), appended after what dst
// held, and the ensure_ascii form is printable ASCII.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\x00\x7f\u2028😀", "bad \xff\xfe", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Each invalid byte is its own U+FFFD, as Go's range and Python's
		// errors="replace" give it.
		want := string([]rune(s))
		for _, ascii := range []bool{true, false} {
			out := AppendString([]byte("x"), s, ascii)
			if out[0] != 'x' {
				t.Fatalf("dst's bytes overwritten: %q", out)
			}
			var got string
			if err := json.Unmarshal(out[1:], &got); err != nil {
				t.Fatalf("%q (ascii %v): %s is not a JSON string: %v", s, ascii, out[1:], err)
			}
			if got != want {
				t.Fatalf("%q (ascii %v): %s decodes to %q, want %q", s, ascii, out[1:], got, want)
			}
			if ascii {
				for _, c := range out[1:] {
					if c < ' ' || c > '~' {
						t.Fatalf("%q: ensure_ascii wrote byte %#x in %s", s, c, out[1:])
					}
				}
			}
		}
	})
}

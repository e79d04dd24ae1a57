package openai

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// unescapeRef is the unescape before it read eight bytes at a time (the
// reference for TestStrFast). It appends the value of a checked string's raw contents to dst, the
// way encoding/json decodes it: invalid UTF-8 and lone surrogates become
// U+FFFD.
func unescapeRef(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		run := raw[i:] // copy the run up to the next backslash in bulk
		if bs := bytes.IndexByte(run, '\\'); bs >= 0 {
			run = run[:bs]
		}
		if len(run) > 0 {
			dst = appendUTF8(dst, run)
			i += len(run)
			continue
		}
		switch c := raw[i+1]; c {
		case '"', '\\', '/':
			dst = append(dst, c)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := getu4(raw[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, getu4(raw[i+2:])); r2 != utf8.RuneError {
						dst = utf8.AppendRune(dst, r2)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		}
		i += 2
	}
	return dst
}

// strFrags are the pieces of randomJSONString: ASCII, every escape (valid,
// bad and cut short), control characters, UTF-8 (valid, invalid and cut
// short).
var strFrags = []string{
	"a", "The quick brown fox ", "0123456789abcdef", " ", "\"",
	`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00e9`, `\u0041`, `\ud83d\ude00`, `\ud800`, `\udc00x`, `\ud800\u0041`,
	`\ud800\u12`, `\ud800\uZZZZ`, `\x`, `\u12G4`, `\u12`, `\`, "\x00", "\x1f", "\t", "\n",
	"é", "日本語", "😀", "\xff", "\xe6\x97", "\xc3", "\x80", "\uFFFD", "~\x7f",
}

// randomJSONString returns a body holding a random string of strFrags at a
// random alignment, with a closing quote 7 times in 8, and the index of its
// opening quote.
func randomJSONString(r *rand.Rand) (body []byte, at int) {
	var b strings.Builder
	b.WriteString(strings.Repeat(" ", r.IntN(9))) // alignment
	b.WriteByte('"')
	for k := r.IntN(12); k > 0; k-- {
		b.WriteString(strFrags[r.IntN(len(strFrags))])
	}
	if r.IntN(8) != 0 {
		b.WriteByte('"')
	}
	b.WriteString(strings.Repeat("x", r.IntN(3)))
	body = []byte(b.String())
	return body, bytes.IndexByte(body, '"')
}

// TestStrFast checks str and unescape, which read eight bytes at a time,
// against strSlow and unescapeRef on random strings of ASCII, every escape
// (valid, bad and cut short), control characters, UTF-8 (valid, invalid
// and cut short), with and without a closing quote, at every alignment.
func TestStrFast(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for n := 0; n < 50000; n++ {
		body, at := randomJSONString(r)
		fast, slow := scanner{b: body, i: at}, scanner{b: body, i: at}
		raw, esc, err := fast.str()
		wantRaw, wantEsc, wantErr := slow.strSlow()
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(raw, wantRaw) || esc != wantEsc || fast.i != slow.i {
			t.Fatalf("str(%q) = %q, %v, %v, i=%d; strSlow = %q, %v, %v, i=%d", body, raw, esc, err, fast.i, wantRaw, wantEsc, wantErr, slow.i)
		}
		if err != nil {
			continue
		}
		prefix := []byte("prefix")
		if got, want := unescape(prefix, raw), unescapeRef(bytes.Clone(prefix), raw); !bytes.Equal(got, want) {
			t.Fatalf("unescape(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestStrAppendOnePass checks strAppend's one pass (taken when dst has room
// for the rest of the body) against its two passes (str, then unescape or
// appendUTF8) on the strings of TestStrFast: the same value, error and
// position.
func TestStrAppendOnePass(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	onePass := 0
	for n := 0; n < 50000; n++ {
		body, at := randomJSONString(r)
		big := append(make([]byte, 0, 2*len(body)+16), "prefix"...) // room: one pass
		small := []byte("prefix")                                   // no room: two passes
		one, two := scanner{b: body, i: at}, scanner{b: body, i: at}
		got, err := one.strAppend(big)
		want, wantErr := two.strAppend(small)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(got, want) || one.i != two.i {
			t.Fatalf("strAppend(%q): one pass %q, %v, i=%d; two passes %q, %v, i=%d", body, got, err, one.i, want, wantErr, two.i)
		}
		if _, ok := (&scanner{b: body, i: at}).strAppendFast(big[:6]); ok {
			onePass++
		}
	}
	if onePass < 10000 {
		t.Fatalf("the one pass took %d strings: the test did not exercise it", onePass)
	}
}

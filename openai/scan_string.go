package openai

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// A JSON string's bytes are read eight at a time (SWAR: one 64-bit word,
// each byte a lane) until one needs a look: a quote, a backslash, a
// control character or, when copying, a non-ASCII byte.
const (
	swarOnes  = 0x0101010101010101
	swarHighs = 0x8080808080808080
)

// strStop returns w's lanes that end a run for str (a quote, a backslash
// or a byte below 0x20) as their high bits. Lanes above the lowest one
// may be marked falsely (a borrow carries into them), so only the lowest
// mark counts.
func strStop(w uint64) uint64 {
	q := w ^ (swarOnes * '"')
	b := w ^ (swarOnes * '\\')
	return ((q-swarOnes)&^q | (b-swarOnes)&^b | (w-swarOnes*0x20)&^w) & swarHighs
}

// copyStop returns w's lanes that end a run for unescape (a backslash or a
// non-ASCII byte), as strStop does.
func copyStop(w uint64) uint64 {
	b := w ^ (swarOnes * '\\')
	return ((b-swarOnes)&^b | w) & swarHighs
}

// anyStop returns w's lanes that end a run for strAppendFast: a quote, a
// backslash, a control character or a non-ASCII byte, as strStop does.
func anyStop(w uint64) uint64 {
	q := w ^ (swarOnes * '"')
	b := w ^ (swarOnes * '\\')
	return ((q-swarOnes)&^q | (b-swarOnes)&^b | (w-swarOnes*0x20)&^w | w) & swarHighs
}

// nextAnyStop returns the index of the first byte of b at or after i that
// is a quote, a backslash, a control character or not ASCII, or len(b).
func nextAnyStop(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := anyStop(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
			return i
		}
	}
	return i
}

// strAppendFast is strAppend in one pass: it checks the string at s.i and
// appends its value to dst as it goes. It gives up at anything wrong (a
// control character, a bad escape, no closing quote), leaving s.i where it
// was and returning ok false; strAppend then reads the string with str,
// which reports the error.
func (s *scanner) strAppendFast(dst []byte) (out []byte, ok bool) {
	b := s.b
	n0 := len(dst)
	i := s.i + 1
	run := i // start of the bytes not yet appended
	for {
		i = nextAnyStop(b, i)
		if i >= len(b) {
			return dst[:n0], false
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return append(dst, b[run:i]...), true
		case c >= 0x80:
			r, size := utf8.DecodeRune(b[i:]) // a quote or backslash ends no rune
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, b[run:i]...)
				dst = utf8.AppendRune(dst, utf8.RuneError)
				run = i + 1
			}
			i += size
			continue
		case c < 0x20:
			return dst[:n0], false
		}
		// A backslash.
		dst = append(dst, b[run:i]...)
		if dst, i, ok = appendEscape(dst, b, i); !ok {
			return dst[:n0], false
		}
		run = i
	}
}

// appendEscape appends the value of the escape at b[i] (a backslash) to dst
// as encoding/json decodes it (a lone surrogate becomes U+FFFD) and returns
// the index after it; ok is false for a malformed escape.
func appendEscape(dst, b []byte, i int) (_ []byte, next int, ok bool) {
	if i+1 >= len(b) {
		return dst, i, false
	}
	switch e := b[i+1]; e {
	case '"', '\\', '/':
		return append(dst, e), i + 2, true
	case 'b':
		return append(dst, '\b'), i + 2, true
	case 'f':
		return append(dst, '\f'), i + 2, true
	case 'n':
		return append(dst, '\n'), i + 2, true
	case 'r':
		return append(dst, '\r'), i + 2, true
	case 't':
		return append(dst, '\t'), i + 2, true
	case 'u':
		if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
			return dst, i, false
		}
		r := getu4(b[i+2:])
		i += 6
		if utf16.IsSurrogate(r) {
			if i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
				if !isHex4(b[i+2 : i+6]) {
					return dst, i, false
				}
				if r2 := utf16.DecodeRune(r, getu4(b[i+2:])); r2 != utf8.RuneError {
					return utf8.AppendRune(dst, r2), i + 6, true
				}
			}
			r = utf8.RuneError
		}
		return utf8.AppendRune(dst, r), i, true
	}
	return dst, i, false
}

// nextStrStop returns the index of the first byte of b at or after i that
// is a quote, a backslash or a control character, or len(b).
func nextStrStop(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := strStop(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

// nextCopyStop returns the index of the first byte of b at or after i
// that is a backslash or not ASCII, or len(b).
func nextCopyStop(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := copyStop(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '\\' || c >= 0x80 {
			return i
		}
	}
	return i
}

// str reads a string at s.i (which is '"') and returns its raw contents and
// whether they hold escapes. It finds the next quote, backslash or control
// character eight bytes at a time; a string it finds wrong (a control
// character, a bad escape, no closing quote) it leaves to strSlow, which
// reports the error.
func (s *scanner) str() (raw []byte, esc bool, err error) {
	b := s.b
	start := s.i + 1
	for i := start; ; {
		i = nextStrStop(b, i)
		if i >= len(b) || b[i] < 0x20 {
			return s.strSlow()
		}
		if b[i] == '"' {
			s.i = i + 1
			return b[start:i], esc, nil
		}
		// A backslash.
		if i+1 >= len(b) {
			return s.strSlow()
		}
		switch b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
				return s.strSlow()
			}
			i += 6
		default:
			return s.strSlow()
		}
		esc = true
	}
}

func isHex4(b []byte) bool {
	return hexVal(b[0]) >= 0 && hexVal(b[1]) >= 0 && hexVal(b[2]) >= 0 && hexVal(b[3]) >= 0
}

// unescape appends the value of a checked string's raw contents to dst, the
// way encoding/json decodes it: invalid UTF-8 and lone surrogates become
// U+FFFD. Runs of ASCII and valid UTF-8 are found eight bytes at a time and
// copied whole.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		// The run up to the next backslash, with invalid UTF-8 replaced.
		j := i
		for {
			j = nextCopyStop(raw, j)
			if j >= len(raw) || raw[j] == '\\' {
				break
			}
			r, size := utf8.DecodeRune(raw[j:]) // a backslash ends no rune
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, raw[i:j]...)
				dst = utf8.AppendRune(dst, utf8.RuneError)
				j++
				i = j
				continue
			}
			j += size
		}
		dst = append(dst, raw[i:j]...)
		if i = j; i >= len(raw) {
			break
		}
		var ok bool
		if dst, i, ok = appendEscape(dst, raw, i); !ok {
			return append(dst, raw[i:]...) // str checked raw: not reached
		}
	}
	return dst
}

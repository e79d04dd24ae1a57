// Package pyjson writes JSON as Python's json.dumps does, for the wire
// formats and templates whose bytes come from Python: SGLang's error
// events, and transformers' tojson filter in chat templates.
package pyjson

import (
	"unicode/utf16"
	"unicode/utf8"
)

// AppendString appends s as a JSON string as Python's json.dumps writes
// it: '"', '\\' and the control characters escaped (\n, \r, \t, \b, \f,
// the others as \u00XX), and with ascii (ensure_ascii) DEL and every
// non-ASCII character as \uXXXX (a UTF-16 surrogate pair above U+FFFF). Invalid
// UTF-8 is written as U+FFFD.
func AppendString(dst []byte, s string, ascii bool) []byte {
	const hex = "0123456789abcdef"
	u4 := func(dst []byte, r rune) []byte {
		return append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
	}
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\b':
				dst = append(dst, '\\', 'b')
			case c == '\f':
				dst = append(dst, '\\', 'f')
			case c < 0x20:
				dst = u4(dst, rune(c))
			case c == 0x7f && ascii:
				dst = u4(dst, rune(c))
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case ascii && r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			dst = u4(u4(dst, r1), r2)
		case ascii:
			dst = u4(dst, r)
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, '"')
}

package tokenizer

import (
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// jinja2 writes what a template prints, {{ x }}, and each operand of ~
// with Python's str(): a float as its repr ("2.0", "1e+20"), None as
// "None", a list or a dict as its repr ("[1, 'a', None]", {'k': 2.0}),
// each string in it in Python's quotes and escapes (["it's"] is
// "[\"it's\"]"). The Go engine writes a float by %g ("2", "1e+20"), None
// as "", and a list's or dict's strings in single quotes as they are,
// its floats by %g and its None as "None". A message's content that is
// null (an assistant's tool call) and a tool call's arguments, decoded
// from JSON (numbers that are floats, an object a template prints
// whole), are where a chat template meets them.
//
// pyCompares rewrites (with the comparisons, for the same parse) each
// {{ }} whose value may be printed otherwise, {{ x }}, as
// {{ (x)|kvroute_string }}, the string filter pyString, and each ~ of an
// operand that may be, a ~ b ~ c, as ((a)|kvroute_cat((b), (c))), pyCat:
// not a {{ }} or an operand that the parser knows to be a string, an
// integer or a boolean, which both engines write alike (a string
// literal, a + of one, a comparison, a test, the length filter, a filter
// that makes a string; see exprKind), so that most of a template's
// prints cost nothing more.

// catName is the name of the filter pyCompares rewrites a ~ into.
const catName = "kvroute_cat"

// pyCatVars is pyCat, by name.
var pyCatVars = map[string]jinja.Value{catName: jinja.NewCallable(catName, pyCat)}

// pyCat is jinja2's a ~ b ~ ...: the operands' str() (pyStr) joined.
func pyCat(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	n := 0
	for _, a := range args {
		if a.IsString() {
			n += len(a.AsString())
		} else {
			n += 8
		}
	}
	b := make([]byte, 0, n)
	for _, a := range args {
		b = appendPyStr(b, a)
	}
	return jinja.NewString(string(b)), nil
}

// pyStr is Python's str(v) of a template value, as jinja2 prints it: a
// string as it is, an undefined value as "", a callable as "" (Python
// writes its address), a namespace as jinja2's Namespace.__repr__,
// anything else as its repr (pyRepr).
func pyStr(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return string(appendPyStr(nil, v))
}

// appendPyStr appends pyStr(v) to dst.
func appendPyStr(dst []byte, v jinja.Value) []byte {
	switch {
	case v.IsString():
		return append(dst, v.AsString()...)
	case v.IsUndefined(), v.IsCallable():
		return dst
	}
	return appendPyRepr(dst, v, 0)
}

// maxReprDepth bounds the nesting appendPyRepr writes: deeper lists and
// dicts are written "[...]" and "{...}", as Python writes one that holds
// itself (which only the Go engine's append makes: jinja2's sandbox
// refuses it).
const maxReprDepth = maxJSONDepth

// appendPyRepr appends Python's repr(v) to dst: None, True and False,
// an integer in decimal, a float as Python writes it ("2.0", "1e+20",
// "inf", "nan"), a string in quotes (appendPyQuoted), a list and a dict
// as Python writes them ("[1, 'a']", "{'k': None}"), a namespace as
// jinja2's Namespace.__repr__ ("<Namespace {'x': 1}>"), an undefined
// value as jinja2's Undefined.__repr__ ("Undefined") and a callable as
// the Go engine writes it.
func appendPyRepr(dst []byte, v jinja.Value, depth int) []byte {
	switch {
	case v.IsNone():
		return append(dst, "None"...)
	case v.IsBool():
		if v.AsBool() {
			return append(dst, "True"...)
		}
		return append(dst, "False"...)
	case v.IsInt():
		return strconv.AppendInt(dst, v.AsInt(), 10)
	case v.IsFloat():
		switch f := v.AsFloat(); {
		case math.IsNaN(f):
			return append(dst, "nan"...)
		case math.IsInf(f, 1):
			return append(dst, "inf"...)
		case math.IsInf(f, -1):
			return append(dst, "-inf"...)
		default:
			return appendPyFloat(dst, f)
		}
	case v.IsString():
		return appendPyQuoted(dst, v.AsString())
	case v.IsList():
		if depth >= maxReprDepth {
			return append(dst, "[...]"...)
		}
		dst = append(dst, '[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyRepr(dst, it, depth+1)
		}
		return append(dst, ']')
	case v.IsDict():
		ns := isNamespace(v)
		if ns {
			dst = append(dst, "<Namespace "...)
		}
		if depth >= maxReprDepth {
			dst = append(dst, "{...}"...)
		} else {
			d := v.AsDict()
			dst = append(dst, '{')
			for i, k := range d.Keys {
				if i > 0 {
					dst = append(dst, ", "...)
				}
				dst = appendPyQuoted(dst, k)
				dst = append(dst, ": "...)
				dst = appendPyRepr(dst, d.Data[k], depth+1)
			}
			dst = append(dst, '}')
		}
		if ns {
			dst = append(dst, '>')
		}
		return dst
	case v.IsUndefined():
		return append(dst, "Undefined"...)
	}
	return append(dst, v.String()...)
}

// appendPyQuoted appends Python's repr(s) to dst: s in single quotes, or
// in double quotes when it has a single quote and no double quote; the
// quote, a backslash, tab, newline and carriage return escaped with a
// backslash, the other ASCII control characters and DEL as \xhh, and
// the characters Python does not take as printable (str.isprintable:
// separators but the ASCII space, control, format, private use and
// unassigned code points; Go's unicode.IsPrint, of Unicode 15.0, which
// Python 3.12 has) as \xhh, \uhhhh or \Uhhhhhhhh.
func appendPyQuoted(dst []byte, s string) []byte {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	const hex = "0123456789abcdef"
	dst = append(dst, quote)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch {
			case c == quote || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\t':
				dst = append(dst, `\t`...)
			case c == '\n':
				dst = append(dst, `\n`...)
			case c == '\r':
				dst = append(dst, `\r`...)
			case c < ' ' || c == 0x7f:
				dst = append(dst, '\\', 'x', hex[c>>4], hex[c&15])
			default:
				dst = append(dst, c)
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:]) // an invalid byte as U+FFFD
		i += size
		switch {
		case unicode.IsPrint(r):
			dst = utf8.AppendRune(dst, r)
		case r < 0x100:
			dst = append(dst, '\\', 'x', hex[r>>4], hex[r&15])
		case r < 0x10000:
			dst = append(dst, '\\', 'u', hex[r>>12], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		default:
			dst = append(dst, '\\', 'U')
			for sh := 28; sh >= 0; sh -= 4 {
				dst = append(dst, hex[r>>sh&15])
			}
		}
	}
	return append(dst, quote)
}

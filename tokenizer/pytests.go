package tokenizer

import (
	"errors"
	"math"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// jinja2's tests ("x is string") are Python functions of Python values; the
// Go engine's (a fixed switch, which a template cannot extend) differ from
// them on values a chat template sees:
//
//   - upper and lower are str(x).isupper() and islower(): true only with a
//     cased character ("123" is neither; the Go engine: both), with
//     Python's Unicode properties ("ß" is lower only; "ǅ", titlecase,
//     neither), of any value's str() (the Go engine: false for anything
//     but a string);
//   - number is true of a boolean (a Python int), sequence of a string and
//     a dict (they have len() and []), iterable, sequence and callable of
//     an undefined value (jinja2's Undefined iterates as empty, has a
//     length of 0, and its [] and () raise only when called);
//   - eq, ne, gt, ge, lt, le and in compare as Python's ==, <, ... and in
//     (as the operators do, pycompare.go):
//     1 == 1.0 == True, a list or dict equal item by item (1 in [1.0]),
//     strings by code point and lists item by item in order, other kinds
//     unordered (a TypeError, as is `1 in "a"`); the Go engine compares
//     kinds strictly and orders through float conversions ("10" < "9" is
//     false for it, true in Python);
//   - odd, even and divisibleby are x % n == 1 or 0 with Python's % (a
//     float or a boolean too, -3 is odd; a string or None is a TypeError);
//     the Go engine has no divisibleby;
//   - a test's one argument may follow its name without parentheses
//     ("x is divisibleby 3", "x is sameas none"), which the Go engine
//     does not parse, and a test binds to the operand before it as a
//     filter does ("a ~ b is string" tests b; the Go engine tests a ~ b).
//
// pyTests rewrites such a test in the template's source into a filter of
// the same operand, which render passes as a template variable, as
// pyFilters does for filters: "x is not eq 3" becomes
// "x|kvroute_isnot_eq(3)", so the precedence is jinja2's too.
//
// A namespace() is neither a mapping nor iterable (namespace.go).
//
// Left as they are: sameas beyond what equality decides (None, booleans,
// small integers and strings are taken as identical when equal, lists
// and dicts only when they are the same value, other numbers never: in
// CPython their identity is an accident of its caches), `"%d" % 2` (a
// string with a format is a TypeError here too), the escaped, filter and
// test tests, and tests called with keyword arguments (errors here).

// pyTestPrefix and pyTestNotPrefix start the names of the filters pyTests
// rewrites a test and a negated test ("is not") into.
const (
	pyTestPrefix    = "kvroute_is_"
	pyTestNotPrefix = "kvroute_isnot_"
)

// pyTestFunc is a jinja2 test of v with its arguments.
type pyTestFunc func(v jinja.Value, args []jinja.Value) (bool, error)

// pyTestFuncs are the tests pyTests rewrites, by jinja2's names.
var pyTestFuncs = map[string]pyTestFunc{
	"defined":     kindTest(func(v jinja.Value) bool { return !v.IsUndefined() }),
	"undefined":   kindTest(func(v jinja.Value) bool { return v.IsUndefined() }),
	"none":        kindTest(func(v jinja.Value) bool { return v.IsNone() }),
	"boolean":     kindTest(func(v jinja.Value) bool { return v.IsBool() }),
	"true":        kindTest(func(v jinja.Value) bool { return v.IsBool() && v.AsBool() }),
	"false":       kindTest(func(v jinja.Value) bool { return v.IsBool() && !v.AsBool() }),
	"integer":     kindTest(func(v jinja.Value) bool { return v.IsInt() }),
	"float":       kindTest(func(v jinja.Value) bool { return v.IsFloat() }),
	"number":      kindTest(func(v jinja.Value) bool { return v.IsInt() || v.IsFloat() || v.IsBool() }),
	"string":      kindTest(func(v jinja.Value) bool { return v.IsString() }),
	"mapping":     kindTest(func(v jinja.Value) bool { return v.IsDict() && !isNamespace(v) }),
	"iterable":    kindTest(iterable),
	"sequence":    kindTest(iterable),
	"callable":    kindTest(func(v jinja.Value) bool { return v.IsCallable() || v.IsUndefined() }),
	"upper":       kindTest(func(v jinja.Value) bool { return pyIsCase(pyStr(v), true) }),
	"lower":       kindTest(func(v jinja.Value) bool { return pyIsCase(pyStr(v), false) }),
	"odd":         modTest(false, 1),
	"even":        modTest(false, 0),
	"divisibleby": modTest(true, 0),
	"eq":          eqTest(false),
	"equalto":     eqTest(false),
	"ne":          eqTest(true),
	"gt":          orderTest(func(c int) bool { return c > 0 }),
	"greaterthan": orderTest(func(c int) bool { return c > 0 }),
	"ge":          orderTest(func(c int) bool { return c >= 0 }),
	"lt":          orderTest(func(c int) bool { return c < 0 }),
	"lessthan":    orderTest(func(c int) bool { return c < 0 }),
	"le":          orderTest(func(c int) bool { return c <= 0 }),
	"in": func(v jinja.Value, args []jinja.Value) (bool, error) {
		if len(args) != 1 {
			return false, errors.New("test in: takes one argument")
		}
		return pyIn(v, args[0])
	},
	"sameas": func(v jinja.Value, args []jinja.Value) (bool, error) {
		if len(args) != 1 {
			return false, errors.New("test sameas: takes one argument")
		}
		return pySameAs(v, args[0]), nil
	},
}

// pyTestVars are the filters of pyTestFuncs, by the names pyTests gives
// them: the test, and its negation.
var pyTestVars = func() map[string]jinja.Value {
	m := make(map[string]jinja.Value, 2*len(pyTestFuncs))
	for name, f := range pyTestFuncs {
		for _, neg := range []bool{false, true} {
			full := pyTestPrefix + name
			if neg {
				full = pyTestNotPrefix + name
			}
			m[full] = jinja.NewCallable(full, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
				if len(kwargs) > 0 {
					return jinja.Undefined(), errors.New("test " + name + ": keyword arguments are not supported")
				}
				if len(args) == 0 {
					return jinja.Undefined(), errors.New("test " + name + ": no value")
				}
				ok, err := f(args[0], args[1:])
				if err != nil {
					return jinja.Undefined(), err
				}
				return jinja.NewBool(ok != neg), nil
			})
		}
	}
	return m
}()

// kindTest is a test of its value alone, taking no argument.
func kindTest(f func(jinja.Value) bool) pyTestFunc {
	return func(v jinja.Value, args []jinja.Value) (bool, error) {
		if len(args) > 0 {
			return false, errors.New("test takes no argument")
		}
		return f(v), nil
	}
}

// pyIsCase is Python's s.isupper() (upper) or s.islower(): a cased
// character of that case and none of the other or in title case.
func pyIsCase(s string, upper bool) bool {
	cased := false
	for _, r := range s {
		isUpper := unicode.In(r, unicode.Lu, unicode.Other_Uppercase)
		isLower := unicode.In(r, unicode.Ll, unicode.Other_Lowercase)
		if unicode.Is(unicode.Lt, r) || upper && isLower || !upper && isUpper {
			return false
		}
		cased = cased || upper && isUpper || !upper && isLower
	}
	return cased
}

// pyNum is a Python int, float or bool as a number: its kind (isInt for
// an int or a bool) and value.
type pyNum struct {
	isInt bool
	i     int64
	f     float64
}

// asPyNum returns v as a number, or false when it is not one.
func asPyNum(v jinja.Value) (pyNum, bool) {
	switch {
	case v.IsInt():
		return pyNum{isInt: true, i: v.AsInt()}, true
	case v.IsBool():
		if v.AsBool() {
			return pyNum{isInt: true, i: 1}, true
		}
		return pyNum{isInt: true}, true
	case v.IsFloat():
		return pyNum{f: v.AsFloat()}, true
	}
	return pyNum{}, false
}

// cmpNum compares a and b exactly, as Python does an int with a float;
// ordered is false when either is NaN.
func cmpNum(a, b pyNum) (c int, ordered bool) {
	switch {
	case a.isInt && b.isInt:
		return cmpInt(a.i, b.i), true
	case a.isInt:
		c, ordered = cmpIntFloat(a.i, b.f)
		return c, ordered
	case b.isInt:
		c, ordered = cmpIntFloat(b.i, a.f)
		return -c, ordered
	case math.IsNaN(a.f) || math.IsNaN(b.f):
		return 0, false
	case a.f < b.f:
		return -1, true
	case a.f > b.f:
		return 1, true
	}
	return 0, true
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cmpIntFloat compares the integer i with f exactly.
func cmpIntFloat(i int64, f float64) (int, bool) {
	switch {
	case math.IsNaN(f):
		return 0, false
	case f >= 1<<63:
		return -1, true
	case f < -(1 << 63):
		return 1, true
	}
	t := math.Trunc(f)
	if c := cmpInt(i, int64(t)); c != 0 {
		return c, true
	}
	switch frac := f - t; {
	case frac > 0:
		return -1, true
	case frac < 0:
		return 1, true
	}
	return 0, true
}

// pyEqual is Python's a == b for template values: numbers by value
// whatever their kind, lists and dicts item by item, an undefined value
// equal to another only.
func pyEqual(a, b jinja.Value) bool {
	if an, ok := asPyNum(a); ok {
		bn, ok := asPyNum(b)
		if !ok {
			return false
		}
		c, ordered := cmpNum(an, bn)
		return ordered && c == 0
	}
	switch {
	case a.IsString():
		return b.IsString() && a.AsString() == b.AsString()
	case a.IsNone():
		return b.IsNone()
	case a.IsUndefined():
		return b.IsUndefined()
	case a.IsList():
		if !b.IsList() {
			return false
		}
		x, y := a.AsList().Items, b.AsList().Items
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !pyEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case isNamespace(a) || isNamespace(b):
		return a.IsDict() && b.IsDict() && a.AsDict() == b.AsDict() // the same object
	case a.IsDict():
		if !b.IsDict() {
			return false
		}
		x, y := a.AsDict(), b.AsDict()
		if len(x.Keys) != len(y.Keys) {
			return false
		}
		for _, k := range x.Keys {
			w, ok := y.Data[k]
			if !ok || !pyEqual(x.Data[k], w) {
				return false
			}
		}
		return true
	}
	return false // callables: equal when the same object, which values do not tell
}

// pyTypeName is the name of v's Python type, for error messages.
func pyTypeName(v jinja.Value) string {
	switch {
	case v.IsString():
		return "str"
	case v.IsInt():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsBool():
		return "bool"
	case v.IsNone():
		return "NoneType"
	case v.IsList():
		return "list"
	case isNamespace(v):
		return "Namespace"
	case v.IsDict():
		return "dict"
	case v.IsUndefined():
		return "Undefined"
	}
	return "function"
}

// pyCompare orders a and b as Python's < and > do: numbers by value,
// strings by code point, lists by their first unequal items, then by
// length; ordered is false when that comparison is with a NaN. Any other
// pair is Python's TypeError, and an undefined value jinja2's
// UndefinedError.
func pyCompare(a, b jinja.Value) (c int, ordered bool, err error) {
	if a.IsUndefined() || b.IsUndefined() {
		return 0, false, errors.New("test: comparison with an undefined value")
	}
	an, aok := asPyNum(a)
	bn, bok := asPyNum(b)
	switch {
	case aok && bok:
		c, ordered = cmpNum(an, bn)
		return c, ordered, nil
	case a.IsString() && b.IsString():
		return strings.Compare(a.AsString(), b.AsString()), true, nil // UTF-8 orders as code points
	case a.IsList() && b.IsList():
		x, y := a.AsList().Items, b.AsList().Items
		for i := 0; i < len(x) && i < len(y); i++ {
			if !pyEqual(x[i], y[i]) {
				return pyCompare(x[i], y[i])
			}
		}
		return cmpInt(int64(len(x)), int64(len(y))), true, nil
	}
	return 0, false, errors.New("test: comparison not supported between instances of '" + pyTypeName(a) + "' and '" + pyTypeName(b) + "'")
}

// eqTest is jinja2's eq (ne with not): Python's == (!=).
func eqTest(not bool) pyTestFunc {
	return func(v jinja.Value, args []jinja.Value) (bool, error) {
		if len(args) != 1 {
			return false, errors.New("test eq: takes one argument")
		}
		return pyEqual(v, args[0]) != not, nil
	}
}

// orderTest is one of jinja2's gt, ge, lt and le: op of pyCompare's
// result, false for an unordered pair.
func orderTest(op func(int) bool) pyTestFunc {
	return func(v jinja.Value, args []jinja.Value) (bool, error) {
		if len(args) != 1 {
			return false, errors.New("test: takes one argument")
		}
		c, ordered, err := pyCompare(v, args[0])
		return ordered && op(c), err
	}
}

// modTest is jinja2's odd (v % 2 == 1), even (v % 2 == 0) or, with arg,
// divisibleby (v % arg == 0), with Python's %: the remainder of an
// integer division takes the sign of the divisor (-3 is odd), a float's
// too, and a modulo by zero is an error.
func modTest(arg bool, want int64) pyTestFunc {
	return func(v jinja.Value, args []jinja.Value) (bool, error) {
		d := jinja.NewInt(2)
		switch {
		case arg && len(args) != 1:
			return false, errors.New("test divisibleby: takes one argument")
		case arg:
			d = args[0]
		case len(args) > 0:
			return false, errors.New("test: takes no argument")
		}
		a, aok := asPyNum(v)
		b, bok := asPyNum(d)
		if !aok || !bok {
			return false, errors.New("test: unsupported operand type(s) for %: '" + pyTypeName(v) + "' and '" + pyTypeName(d) + "'")
		}
		if a.isInt && b.isInt {
			if b.i == 0 {
				return false, errors.New("test: integer modulo by zero")
			}
			r := a.i % b.i
			if r != 0 && (r < 0) != (b.i < 0) {
				r += b.i
			}
			return r == want, nil
		}
		x, y := a.f, b.f
		if a.isInt {
			x = float64(a.i)
		}
		if b.isInt {
			y = float64(b.i)
		}
		if y == 0 {
			return false, errors.New("test: float modulo")
		}
		r := math.Mod(x, y)
		if r != 0 && (r < 0) != (y < 0) {
			r += y
		}
		return r == float64(want), nil
	}
}

// pyIn is Python's v in container: an item of a list equal to v, a key of
// a dict, a substring of a string (v must be a string), nothing in an
// undefined value (which iterates as empty); anything else (a namespace
// too) is Python's TypeError.
func pyIn(v, container jinja.Value) (bool, error) {
	switch {
	case container.IsList():
		for _, it := range container.AsList().Items {
			if pyEqual(it, v) {
				return true, nil
			}
		}
		return false, nil
	case isNamespace(container):
	case container.IsDict():
		if v.IsList() || v.IsDict() && !isNamespace(v) {
			return false, errors.New("test in: unhashable type: '" + pyTypeName(v) + "'")
		}
		return v.IsString() && container.AsDict().Has(v.AsString()), nil
	case container.IsString():
		if !v.IsString() {
			return false, errors.New("test in: 'in <string>' requires string as left operand, not " + pyTypeName(v))
		}
		return strings.Contains(container.AsString(), v.AsString()), nil
	case container.IsUndefined():
		return false, nil
	}
	return false, errors.New("test in: argument of type '" + pyTypeName(container) + "' is not iterable")
}

// pySameAs is Python's a is b as far as values tell it (see the list of
// what is left as it is above).
func pySameAs(a, b jinja.Value) bool {
	switch {
	case a.IsNone(), a.IsBool(), a.IsString():
		return a.Equals(b)
	case a.IsInt():
		return b.IsInt() && a.AsInt() == b.AsInt() && -5 <= a.AsInt() && a.AsInt() <= 256 // CPython's small ints
	case a.IsList():
		return b.IsList() && a.AsList() == b.AsList()
	case a.IsDict():
		return b.IsDict() && a.AsDict() == b.AsDict()
	}
	return false
}

// pyTests returns src with each test of pyTestFuncs ("x is string", "x is
// not eq 3", "x is divisibleby(3)"; in an expression or statement tag,
// outside string literals) rewritten as a filter of its operand:
// "|kvroute_is_string", "|kvroute_isnot_eq(3)". A test whose name it does
// not know, or whose argument it cannot tell, is left as it is, and so
// are templates with {% raw %}.
func pyTests(src string) string {
	if !strings.Contains(src, "is") || rawTagRE.MatchString(src) {
		return src
	}
	return rewriteTags(src, rewriteTests)
}

// rewriteTests rewrites the tests of one tag's text s (see pyTests); ok
// is false when it has none.
func rewriteTests(s string) (out string, ok bool) {
	var b strings.Builder
	i := 0 // s[:i] is written
	for j := 0; j < len(s); j++ {
		c := s[j]
		if c == '\'' || c == '"' {
			j = skipQuoted(s, j)
			continue
		}
		if !isIdentByte(c) {
			continue
		}
		if '0' <= c && c <= '9' { // a number, which a name may follow ("1is")
			j = numberEnd(s, j) - 1
			continue
		}
		e := j
		for e < len(s) && isIdentByte(s[e]) {
			e++
		}
		word := s[j:e]
		start := j
		j = e - 1
		if word != "is" || !operandBefore(s, start) {
			continue
		}
		name, neg, end, args := parseTest(s, e)
		if _, known := pyTestFuncs[name]; !known {
			continue
		}
		if u := unaryOperand(s, start); u >= 0 {
			// jinja2 tests -x, where the Go engine would filter x
			b.WriteString(s[i:u])
			b.WriteString("(")
			b.WriteString(strings.TrimRight(s[u:start], " \t\r\n"))
			b.WriteString(")")
		} else {
			b.WriteString(s[i:start])
		}
		if neg {
			b.WriteString("|" + pyTestNotPrefix + name)
		} else {
			b.WriteString("|" + pyTestPrefix + name)
		}
		b.WriteString(args)
		i = end
		j = end - 1
	}
	if i == 0 {
		return s, false
	}
	b.WriteString(s[i:])
	return b.String(), true
}

// unaryOperand returns where a unary minus or plus starts when the
// operand ending before s[end] (a postfix chain or a number) has one, or
// -1: jinja2 applies a test, as a filter, to the negated operand, where
// the Go engine's filter binds tighter than the sign.
func unaryOperand(s string, end int) int {
	start := operandStart(s, end)
	if start == end { // not a chain: a number?
		k := spaceStart(s, end)
		start = k
		for start > 0 && (isIdentByte(s[start-1]) || s[start-1] == '.') {
			start--
		}
		if start == k || s[start] < '0' || s[start] > '9' {
			return -1
		}
	}
	k := spaceStart(s, start)
	if k <= 1 || s[k-1] != '-' && s[k-1] != '+' {
		return -1 // s[0] is a tag's whitespace control marker ("{{-")
	}
	sign := k - 1
	k = spaceStart(s, sign)
	if k > 0 && (isIdentByte(s[k-1]) && !jinjaKeyword(s, k) || strings.IndexByte(")]}'\"", s[k-1]) >= 0) {
		return -1 // a binary minus or plus
	}
	return sign
}

// operandBefore reports whether the word at s[at] follows an operand
// (ends one: a name that is not a keyword, a number, a string literal or
// a bracket), so that it is the test operator "is", not a name or an
// attribute (".is").
func operandBefore(s string, at int) bool {
	k := spaceStart(s, at)
	if k == 0 || k == 1 && (s[0] == '-' || s[0] == '+') { // a whitespace control marker
		return false
	}
	switch c := s[k-1]; {
	case c == ')' || c == ']' || c == '}' || c == '\'' || c == '"':
		return true
	case c == '.':
		return false // an attribute
	case isIdentByte(c):
		return !jinjaKeyword(s, k)
	}
	return false
}

// parseTest parses a test after "is" at s[i:] as jinja2's parser does:
// [not] name, then its arguments, in parentheses or one bare primary
// with its attributes, subscripts and calls. It returns the name ("" when
// it cannot tell), whether it is negated, where the test ends and its
// arguments as a parenthesized list ("" for none).
func parseTest(s string, i int) (name string, neg bool, end int, args string) {
	word := func(at int) (string, int) {
		at = spaceEnd(s, at)
		e := at
		for e < len(s) && isIdentByte(s[e]) {
			e++
		}
		return s[at:e], e
	}
	name, end = word(i)
	if name == "not" {
		neg = true
		name, end = word(end)
	}
	if name == "" || '0' <= name[0] && name[0] <= '9' {
		return "", false, 0, ""
	}
	k := spaceEnd(s, end)
	if k == len(s) {
		return name, neg, end, ""
	}
	switch c := s[k]; {
	case c == '.':
		return "", false, 0, "" // a dotted test name
	case c == '(':
		close := closeBracket(s, k)
		if close < 0 {
			return "", false, 0, ""
		}
		return name, neg, close + 1, s[k : close+1]
	case c == '\'' || c == '"' || c == '[' || c == '{' || '0' <= c && c <= '9' || isIdentByte(c):
		if arg, _ := word(k); jinjaKeywords[arg] {
			// else, or and and end the test in jinja2; it would read
			// another keyword as a name, or fail ("is": tests do not
			// chain without an operator): the Go engine reads on
			return name, neg, end, ""
		}
		e := primaryEnd(s, k)
		if e < 0 {
			return "", false, 0, ""
		}
		return name, neg, e, "(" + s[k:e] + ")"
	}
	return name, neg, end, ""
}

// primaryEnd returns where the primary expression at s[i] ends, with its
// attributes, subscripts and calls (jinja2's parse_primary and
// parse_postfix: a name, a number, adjacent string literals, or a
// bracketed expression), or -1 when it cannot tell.
func primaryEnd(s string, i int) int {
	e := i
	switch c := s[i]; {
	case c == '\'' || c == '"':
		for e < len(s) && (s[e] == '\'' || s[e] == '"') {
			q := skipQuoted(s, e)
			if q >= len(s) {
				return -1
			}
			e = q + 1
			k := spaceEnd(s, e)
			if k < len(s) && (s[k] == '\'' || s[k] == '"') {
				e = k
			}
		}
	case '0' <= c && c <= '9':
		e = numberEnd(s, i)
	case c == '[' || c == '{' || c == '(':
		close := closeBracket(s, i)
		if close < 0 {
			return -1
		}
		e = close + 1
	default:
		for e < len(s) && isIdentByte(s[e]) {
			e++
		}
	}
	for {
		k := spaceEnd(s, e)
		if k == len(s) {
			return e
		}
		switch s[k] {
		case '.':
			a := spaceEnd(s, k+1)
			n := a
			for n < len(s) && isIdentByte(s[n]) {
				n++
			}
			if n == a {
				return -1
			}
			e = n
		case '[', '(':
			close := closeBracket(s, k)
			if close < 0 {
				return -1
			}
			e = close + 1
		default:
			return e
		}
	}
}

// numberEnd returns where the number literal at s[i] ends: digits and
// underscores, a fraction, an exponent.
func numberEnd(s string, i int) int {
	digits := func(at int) int {
		for at < len(s) && ('0' <= s[at] && s[at] <= '9' || s[at] == '_') {
			at++
		}
		return at
	}
	e := digits(i)
	if e+1 < len(s) && s[e] == '.' && '0' <= s[e+1] && s[e+1] <= '9' {
		e = digits(e + 1)
	}
	if e < len(s) && (s[e] == 'e' || s[e] == 'E') {
		k := e + 1
		if k < len(s) && (s[k] == '+' || s[k] == '-') {
			k++
		}
		if k < len(s) && '0' <= s[k] && s[k] <= '9' {
			e = digits(k)
		}
	}
	return e
}

// closeBracket returns the index of the bracket closing the one at
// s[open] ('(', '[' or '{'), skipping string literals and nested
// brackets, or -1.
func closeBracket(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '\'', '"':
			i = skipQuoted(s, i)
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}

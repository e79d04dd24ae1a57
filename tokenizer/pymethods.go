package tokenizer

import (
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// jinja2 calls a string's methods as Python's str methods; the Go engine
// has its own, whose table cannot be replaced either, and some differ:
//
//   - strip(), lstrip() and rstrip() without chars (or chars None) strip
//     Go's white space (strip) or only space, tab, CR and LF (lstrip,
//     rstrip), where Python strips all of str.isspace (U+001C to U+001F,
//     U+0085, U+00A0, U+2000 to U+200A, U+3000, ...), and strip(None)
//     strips the characters of "None";
//   - split() without a separator splits at Go's white space, without
//     U+001C to U+001F, and split(sep, maxsplit) ignores maxsplit
//     (vLLM's DeepSeek-V3.1 tool template cuts a message at its first
//     "</think>" with split('</think>', 1));
//   - title() and capitalize() leave the other letters' case (Python
//     lowercases them), and title() starts a word only after space, tab or
//     LF (Python: after any character that is not cased);
//   - upper(), lower(), title() and capitalize() map case with Go's simple
//     mappings, where Python's full ones change some letters' length and
//     lower a final Σ to ς ("ß".upper() is "SS", "ΌΣΟΣ".lower() "όσος"),
//     and capitalize() writes the first letter in upper case, not title
//     case ("ǆa": Python "ǅa"); swapcase() is missing;
//   - a dict's keys(), values(), items() and get() are a namespace's too
//     (jinja2's Namespace has no such methods: an error), and get() looks
//     a key that is not a string up by its str() ({"1": 2}.get(1) is 2,
//     None in Python); dict.get() without a key is no error.
//
// pyMethods rewrites such a call in the template's source into a filter of
// the same value, which render passes as a template variable, as
// pyFilters does for filters: X.strip(args) becomes (X|kvroute_strip(args)).
// The case methods are pyCase's (pycase.go), the dict methods
// namespace.go's.

// pyMethodNames maps a string method pyMethods rewrites to its filter's
// name.
var pyMethodNames = map[string]string{
	"strip":      "kvroute_strip",
	"lstrip":     "kvroute_lstrip",
	"rstrip":     "kvroute_rstrip",
	"split":      "kvroute_split",
	"title":      "kvroute_title",
	"capitalize": "kvroute_capitalize",
	"upper":      "kvroute_upper",
	"lower":      "kvroute_lower",
	"swapcase":   "kvroute_swapcase",
	"keys":       "kvroute_keys",
	"values":     "kvroute_values",
	"items":      "kvroute_items",
	"get":        "kvroute_get",
}

// pyMethodVars are the filters of pyMethodNames, by name.
var pyMethodVars = map[string]jinja.Value{
	"kvroute_strip":      pyStripMethod("strip", true, true),
	"kvroute_lstrip":     pyStripMethod("lstrip", true, false),
	"kvroute_rstrip":     pyStripMethod("rstrip", false, true),
	"kvroute_split":      jinja.NewCallable("kvroute_split", pySplit),
	"kvroute_title":      pyCaseMethod("title", (*pyCase).title),
	"kvroute_capitalize": pyCaseMethod("capitalize", (*pyCase).capitalize),
	"kvroute_upper":      pyCaseMethod("upper", (*pyCase).upper),
	"kvroute_lower":      pyCaseMethod("lower", (*pyCase).lower),
	"kvroute_swapcase":   pyCaseMethod("swapcase", (*pyCase).swapcase),
	"kvroute_keys":       pyDictView("keys", dictKeys),
	"kvroute_values":     pyDictView("values", dictValues),
	"kvroute_items":      pyDictView("items", dictItems),
	"kvroute_get":        pyDictGet,
}

// pyMethods returns src with each call of a method of pyMethodNames
// (".strip(" after an operand, in an expression or statement tag, outside
// string literals) rewritten as a filter of its operand:
// X.strip(args) as (X|kvroute_strip(args)), X.strip() as
// (X|kvroute_strip). The operand X is the postfix chain before the dot:
// names, attributes, subscripts and calls ("messages[0]['content']",
// "f(x).y"), a parenthesized expression or a string literal. A call whose
// operand or closing parenthesis it cannot tell is left as it is, and so
// are templates with {% raw %}.
func pyMethods(src string) string {
	if rawTagRE.MatchString(src) || !hasPyMethodCall(src) {
		return src
	}
	return rewriteTags(src, rewriteMethods)
}

// hasPyMethodCall reports whether src may call a method of pyMethodNames.
func hasPyMethodCall(src string) bool {
	for name := range pyMethodNames {
		if strings.Contains(src, "."+name+"(") {
			return true
		}
	}
	return false
}

// rewriteMethods rewrites the method calls of one tag's text s (see
// pyMethods); ok is false when it has none.
func rewriteMethods(s string) (out string, ok bool) {
	for j := 0; j < len(s); j++ {
		switch c := s[j]; c {
		case '\'', '"':
			j = skipQuoted(s, j)
			continue
		case '.':
		default:
			continue
		}
		e := j + 1
		for e < len(s) && isIdentByte(s[e]) {
			e++
		}
		name, known := pyMethodNames[s[j+1:e]]
		if !known || e >= len(s) || s[e] != '(' {
			continue
		}
		end := closeParen(s, e)
		start := operandStart(s, j)
		if end < 0 || start == j {
			continue
		}
		head := "(" + s[start:j] + "|" + name
		repl := head
		if strings.TrimSpace(s[e+1:end]) != "" {
			repl += s[e : end+1] // the arguments, as they are
		}
		repl += ")"
		s = s[:start] + repl + s[end+1:]
		ok = true
		j = start + len(head) - 1 // the arguments may call methods too
	}
	return s, ok
}

// skipQuoted returns the index of the quote closing the string literal
// opened at s[i] (len(s) when it is not closed).
func skipQuoted(s string, i int) int {
	q := s[i]
	for i++; i < len(s) && s[i] != q; i++ {
		if s[i] == '\\' {
			i++
		}
	}
	return min(i, len(s))
}

// closeParen returns the index of the parenthesis closing the one at
// s[open], skipping string literals and nested brackets, or -1.
func closeParen(s string, open int) int {
	if i := closeBracket(s, open); i >= 0 && s[i] == ')' {
		return i
	}
	return -1
}

// operandStart returns where the postfix chain ending just before s[dot]
// starts, or dot when there is none: a name, a parenthesized expression,
// a list or a string literal, then attributes, subscripts and calls
// (jinja2 allows white space between them: "a . b [0]").
func operandStart(s string, dot int) int {
	i, need := dot, true // s[i:dot] is the chain so far; need: an element must come before it
	for {
		k := spaceStart(s, i)
		if k == 0 {
			break
		}
		c := s[k-1]
		if !need {
			switch {
			case c == '.':
				i, need = k-1, true
				continue
			case (s[i] == '(' || s[i] == '[') && (c == ')' || c == ']' || isIdentByte(c) && !jinjaKeyword(s, k)):
				i, need = k, true // a call or a subscript of what comes before
				continue
			case strings.IndexByte("([{,:=~+-*/%<>", c) < 0 && !(isIdentByte(c) && jinjaKeyword(s, k)):
				return dot // after something it cannot tell (the Go engine reads more than jinja2)
			}
			return i
		}
		switch {
		case c == ')' || c == ']' || c == '}':
			if i = openBracket(s, k-1); i < 0 {
				return dot
			}
		case c == '\'' || c == '"':
			if i = openQuote(s, k-1); i < 0 {
				return dot
			}
		case isIdentByte(c):
			i = k
			for i > 0 && isIdentByte(s[i-1]) {
				i--
			}
			if d := s[i]; '0' <= d && d <= '9' || jinjaKeyword(s, k) {
				return dot // a number, or an operator such as "not"
			}
		default:
			return dot
		}
		need = false
	}
	if need {
		return dot
	}
	return i
}

// isSpaceByte reports whether c is white space between jinja2's tokens.
func isSpaceByte(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// spaceEnd returns the index of the first byte at or after i in s that is
// not white space (isSpaceByte).
func spaceEnd(s string, i int) int {
	for i < len(s) && isSpaceByte(s[i]) {
		i++
	}
	return i
}

// spaceStart returns the index after the last byte before i in s that is
// not white space (isSpaceByte).
func spaceStart(s string, i int) int {
	for i > 0 && isSpaceByte(s[i-1]) {
		i--
	}
	return i
}

// jinjaKeywords are the words of jinja2's syntax that come before an
// expression (operators and statement names), which are not names.
var jinjaKeywords = map[string]bool{
	"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true, "elif": true,
	"for": true, "set": true, "print": true, "do": true, "with": true, "filter": true, "call": true,
	"macro": true, "include": true, "import": true, "from": true, "extends": true, "block": true, "return": true,
}

// jinjaKeyword reports whether the word ending at s[end] is in jinjaKeywords.
func jinjaKeyword(s string, end int) bool {
	i := end
	for i > 0 && isIdentByte(s[i-1]) {
		i--
	}
	return jinjaKeywords[s[i:end]]
}

// openBracket returns the index of the bracket opening the one closed at
// s[close], skipping string literals backwards, or -1.
func openBracket(s string, close int) int {
	depth := 0
	for i := close; i >= 0; i-- {
		switch c := s[i]; c {
		case '\'', '"':
			if i = openQuote(s, i); i < 0 {
				return -1
			}
		case ')', ']', '}':
			depth++
		case '(', '[', '{':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}

// openQuote returns the index of the quote opening the string literal
// whose closing quote is s[close] (skipping quotes escaped with a
// backslash), or -1.
func openQuote(s string, close int) int {
	q := s[close]
	for i := close - 1; i >= 0; i-- {
		if s[i] != q {
			continue
		}
		n := 0 // the backslashes before s[i]
		for i-n > 0 && s[i-n-1] == '\\' {
			n++
		}
		if n%2 == 0 {
			return i
		}
	}
	return -1
}

// methodSelf is the string a rewritten method is called on (the filter's
// first argument): an error, as jinja2's, for anything else.
func methodSelf(method string, args []jinja.Value) (string, error) {
	if len(args) == 0 || !args[0].IsString() {
		return "", errors.New("'" + method + "': no such method of that value (not a string)")
	}
	return args[0].AsString(), nil
}

// pyArg is a method's argument given by position pos (counted after the
// string) or by name; ok is false when it is absent.
func pyArg(args []jinja.Value, kwargs map[string]jinja.Value, pos int, name string) (jinja.Value, bool) {
	if v, ok := kwargs[name]; ok {
		return v, true
	}
	if pos+1 < len(args) {
		return args[pos+1], true
	}
	return jinja.Undefined(), false
}

// pyStripMethod is Python's str.strip, lstrip or rstrip(chars=None, /):
// chars None or absent strips str.isspace's white space (pyIsSpace).
func pyStripMethod(method string, left, right bool) jinja.Value {
	return jinja.NewCallable("kvroute_"+method, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		s, err := methodSelf(method, args)
		if err != nil {
			return jinja.Undefined(), err
		}
		if len(kwargs) > 0 || len(args) > 2 {
			return jinja.Undefined(), errors.New("str." + method + "() takes at most one argument, and no keyword arguments")
		}
		chars, ok := pyArg(args, nil, 0, "")
		cut := pyIsSpace
		if ok && !chars.IsNone() {
			if !chars.IsString() {
				return jinja.Undefined(), errors.New(method + " arg must be None or str")
			}
			set := chars.AsString()
			cut = func(r rune) bool { return strings.ContainsRune(set, r) }
		}
		if left {
			s = strings.TrimLeftFunc(s, cut)
		}
		if right {
			s = strings.TrimRightFunc(s, cut)
		}
		return jinja.NewString(s), nil
	})
}

// pySplit is Python's str.split(sep=None, maxsplit=-1).
func pySplit(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	s, err := methodSelf("split", args)
	if err != nil {
		return jinja.Undefined(), err
	}
	maxsplit := -1
	if v, ok := pyArg(args, kwargs, 1, "maxsplit"); ok {
		if !v.IsInt() {
			return jinja.Undefined(), errors.New("split: maxsplit must be an integer")
		}
		maxsplit = int(max(min(v.AsInt(), 1<<30), -1))
	}
	var parts []string
	sep, ok := pyArg(args, kwargs, 0, "sep")
	switch {
	case !ok || sep.IsNone():
		parts = pySplitSpace(s, maxsplit)
	case !sep.IsString():
		return jinja.Undefined(), errors.New("split: must be str or None")
	case sep.AsString() == "":
		return jinja.Undefined(), errors.New("split: empty separator")
	case maxsplit < 0:
		parts = strings.Split(s, sep.AsString())
	default:
		parts = strings.SplitN(s, sep.AsString(), maxsplit+1)
	}
	items := make([]jinja.Value, len(parts))
	for i, p := range parts {
		items[i] = jinja.NewString(p)
	}
	return jinja.NewList(items), nil
}

// pySplitSpace is Python's s.split(None, maxsplit): the runs of
// non-white-space (pyIsSpace), at most maxsplit splits (negative: no
// limit), the rest after the last split kept whole but for its leading
// white space.
func pySplitSpace(s string, maxsplit int) []string {
	parts := []string{}
	i := 0
	skip := func() {
		for i < len(s) {
			r, n := utf8.DecodeRuneInString(s[i:])
			if !pyIsSpace(r) {
				return
			}
			i += n
		}
	}
	for ; maxsplit != 0; maxsplit-- {
		skip()
		if i == len(s) {
			return parts
		}
		j := i
		for i < len(s) {
			r, n := utf8.DecodeRuneInString(s[i:])
			if pyIsSpace(r) {
				break
			}
			i += n
		}
		parts = append(parts, s[j:i])
	}
	skip()
	if i < len(s) {
		parts = append(parts, s[i:])
	}
	return parts
}

// pyCaseMethod is a case mapping of pycase.go as a string method taking
// no arguments.
func pyCaseMethod(method string, f func(*pyCase, string) string) jinja.Value {
	return jinja.NewCallable("kvroute_"+method, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		s, err := methodSelf(method, args)
		if err != nil {
			return jinja.Undefined(), err
		}
		if len(args) > 1 || len(kwargs) > 0 {
			return jinja.Undefined(), errors.New("str." + method + "() takes no arguments")
		}
		return jinja.NewString(f(new(pyCase), s)), nil
	})
}

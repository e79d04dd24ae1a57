package tokenizer

import (
	"errors"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/internal/pyjson"
)

// transformers' apply_chat_template renders templates with jinja2, whose
// filters are Python's. Some of them differ in the Go engine where a prompt
// shows it:
//
//   - tojson, which transformers defines as Python's json.dumps(x,
//     ensure_ascii=False, indent=indent, separators=separators,
//     sort_keys=sort_keys): the Go engine writes a float by Go's %g (2.0
//     as "2", 1e6 as "1e+06": Python writes "2.0" and "1000000.0"), and
//     with an indent (Llama 3.1's template writes each tool with
//     tojson(indent=4)) it sorts the keys of objects;
//   - string, Python's str() (pystr.go): the Go engine writes a float by
//     %g too, None as "" (Python: "None") and a list's or dict's strings
//     in single quotes as they are; Qwen3-Coder's template writes each
//     tool call argument that is not an object or a list with it;
//   - trim, Python's str.strip(chars): without chars the Go engine strips
//     Go's white space (unicode.IsSpace), which lacks the separators
//     U+001C to U+001F that Python strips; Llama 3.x's templates trim
//     every message's content with it;
//   - upper, lower and capitalize, Python's str.upper, lower and
//     capitalize, with full case mappings (pycase.go), where the Go
//     engine's are Go's simple ones ("ß"|upper: "SS" and "ß") and its
//     capitalize writes the first letter in upper case, not title case;
//   - title, jinja2's own, not str.title (pyCase.jinjaTitle), where the Go
//     engine's starts a word after anything but a letter or digit
//     ("they're"|title: "They're" and "They'Re");
//   - items and list, which are errors for a namespace (namespace.go) and,
//     list, for None, a number or a boolean (Python cannot iterate them),
//     where the Go engine takes a namespace for a dict;
//   - join, str(d).join(map(str, value)) (pyJoin), where the Go engine
//     writes each item as it prints it ([none, 2.0]|join(',') is ",2",
//     "None,2.0" in Python) and joins only a list (a string's characters
//     and a dict's keys are what Python iterates), and takes a dotted
//     attribute ("a.b", "0") as one key.
//
// The Go engine's filter table cannot be replaced, but a filter it does
// not know is looked up among the template's variables: pyFilters renames
// these filters in the template's source, and render passes pyToJSON,
// pyString, pyTrim and (to a template that uses them, prefixedFilterVars)
// the case, items and list filters as those variables.

// The names the filters are renamed to.
const (
	tojsonName = "kvroute_tojson"
	stringName = "kvroute_string"
	trimName   = "kvroute_trim"
	// filterPrefix starts the names of the case, items and list filters
	// (prefixedFilterVars), which are not the string and dict methods' of
	// the same names (pyMethodNames): those refuse a value that is not a
	// string, or a dict.
	filterPrefix = "kvroute_filter_"
)

// pyFilterNames maps a filter pyFilters renames to its new name.
var pyFilterNames = map[string]string{"tojson": tojsonName, "string": stringName, "trim": trimName,
	"upper": filterPrefix + "upper", "lower": filterPrefix + "lower",
	"capitalize": filterPrefix + "capitalize", "title": filterPrefix + "title",
	"items": filterPrefix + "items", "list": filterPrefix + "list", "join": filterPrefix + "join"}

// prefixedFilterVars are the filters of pyFilterNames named with
// filterPrefix, by name: jinja2's do_upper, do_lower, do_capitalize and
// do_title, each of soft_str(value) (pyStr), and its items and list.
var prefixedFilterVars = map[string]jinja.Value{
	filterPrefix + "upper":      pyCaseFilter("upper", (*pyCase).upper),
	filterPrefix + "lower":      pyCaseFilter("lower", (*pyCase).lower),
	filterPrefix + "capitalize": pyCaseFilter("capitalize", (*pyCase).capitalize),
	filterPrefix + "title":      pyCaseFilter("title", (*pyCase).jinjaTitle),
	filterPrefix + "items":      pyItemsFilter,
	filterPrefix + "list":       pyListFilter,
	filterPrefix + "join":       jinja.NewCallable(filterPrefix+"join", pyJoin),
}

// pyCaseFilter is a case mapping of pycase.go as a jinja2 filter of
// str(value), taking no arguments.
func pyCaseFilter(name string, f func(*pyCase, string) string) jinja.Value {
	return jinja.NewCallable(filterPrefix+name, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(args) > 1 || len(kwargs) > 0 {
			return jinja.Undefined(), errors.New(name + ": takes no arguments")
		}
		if len(args) == 0 {
			return jinja.NewString(""), nil
		}
		return jinja.NewString(f(new(pyCase), pyStr(args[0]))), nil
	})
}

// pyFilters returns src with each use of the filters of pyFilterNames
// ("| tojson", in an expression or statement tag, outside string
// literals) renamed. Templates with {% raw %} are left as they are.
func pyFilters(src string) string {
	if !hasPyFilterName(src) || rawTagRE.MatchString(src) {
		return src
	}
	return rewriteTags(src, renameFilters)
}

// hasPyFilterName reports whether src may use a filter of pyFilterNames.
func hasPyFilterName(src string) bool {
	for name := range pyFilterNames {
		if strings.Contains(src, name) {
			return true
		}
	}
	return false
}

// renameFilters renames the filters of pyFilterNames in one tag's text s;
// ok is false when it has none.
func renameFilters(s string) (out string, ok bool) {
	var b strings.Builder
	i := 0 // s[:i] is written
	for j := 0; j < len(s); j++ {
		switch c := s[j]; c {
		case '\'', '"':
			for j++; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' {
					j++
				}
			}
		case '|':
			k := spaceEnd(s, j+1)
			e := k
			for e < len(s) && isIdentByte(s[e]) {
				e++
			}
			name, known := pyFilterNames[s[k:e]]
			if !known {
				continue
			}
			b.WriteString(s[i:k])
			b.WriteString(name)
			i = e
			j = i - 1
		}
	}
	if i == 0 {
		return s, false
	}
	b.WriteString(s[i:])
	return b.String(), true
}

// rewriteTags returns src with the text of each expression and statement
// tag ({{ }}, {% %}; not comments) rewritten by rewrite, which reports
// whether it changed it (pyFilters, pyMethods).
func rewriteTags(src string, rewrite func(string) (string, bool)) string {
	return rewriteTagsOf(src, func(s string, _ bool) (string, bool) { return rewrite(s) })
}

// rewriteTagsOf is rewriteTags with a rewrite told whether the tag is a
// statement ({% %}) or an expression ({{ }}).
func rewriteTagsOf(src string, rewrite func(s string, statement bool) (string, bool)) string {
	var b strings.Builder
	i := 0 // src[:i] is written
	for open, end := range tagsIn(src) {
		if src[open+1] == '#' {
			continue
		}
		inner, ok := rewrite(src[open+2:end-2], src[open+1] == '%')
		if !ok {
			continue
		}
		b.WriteString(src[i : open+2])
		b.WriteString(inner)
		i = end - 2
	}
	if i == 0 {
		return src
	}
	b.WriteString(src[i:])
	return b.String()
}

// rawTagRE matches a {% raw %} tag, whose text jinjaTrimGuard and
// pyFilters cannot tell from tags.
var rawTagRE = regexp.MustCompile(`\{%[-+]?\s*raw\s*[-+]?%\}`)

func isIdentByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// pyToJSON is transformers' tojson filter: json.dumps(args[0],
// ensure_ascii=False, indent=None, separators=None, sort_keys=False),
// those four settable by position or by name (an indent above 64 spaces
// is cut to 64).
var pyToJSON = jinja.NewCallable(tojsonName, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: no value")
	}
	var e pyJSON
	opt := func(pos int, name string) (jinja.Value, bool) {
		if v, ok := kwargs[name]; ok {
			return v, true
		}
		if pos < len(args) {
			return args[pos], true
		}
		return jinja.Undefined(), false
	}
	if v, ok := opt(1, "ensure_ascii"); ok {
		e.ascii = v.IsTruthy()
	}
	e.item, e.key = ", ", ": "
	if v, ok := opt(2, "indent"); ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsString():
			e.indent = v.AsString()
		case v.IsInt():
			e.indent = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		case v.IsBool() && v.AsBool():
			e.indent = " "
		case !v.IsBool():
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
		e.indented, e.item = true, ","
	}
	if v, ok := opt(3, "separators"); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		e.item, e.key = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := opt(4, "sort_keys"); ok {
		e.sortKeys = v.IsTruthy()
	}
	if err := e.value(args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(string(e.b)), nil
})

// pyString is jinja2's string filter, Python's str() (pyStr): a float as
// its repr ("2.0", "nan", "inf"), None as "None", an undefined value as
// "", a list or a dict as its repr (strings in Python's quotes).
var pyString = jinja.NewCallable(stringName, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	if args[0].IsString() {
		return args[0], nil
	}
	return jinja.NewString(pyStr(args[0])), nil
})

// pyJoin is jinja2's join filter, join(value, d="", attribute=None):
// str(d) between the str() (pyStr) of the items of value (a list's items,
// a string's characters, a dict's keys, nothing of an undefined value;
// Python's TypeError for anything else), or, with attribute, of each
// item's attribute (pyAttribute).
func pyJoin(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 || len(args) > 3 {
		return jinja.Undefined(), errors.New("join: takes a value, d and attribute")
	}
	opt := [2]jinja.Value{jinja.NewString(""), jinja.None()} // d, attribute
	for i, name := range []string{"d", "attribute"} {
		v, named := kwargs[name]
		switch {
		case named && i+1 < len(args):
			return jinja.Undefined(), errors.New("join: got multiple values for argument '" + name + "'")
		case named:
			opt[i] = v
		case i+1 < len(args):
			opt[i] = args[i+1]
		}
	}
	for name := range kwargs {
		if name != "d" && name != "attribute" {
			return jinja.Undefined(), errors.New("join: unexpected keyword argument '" + name + "'")
		}
	}
	items, err := pyListFilter.AsCallable().Fn(args[:1], nil)
	if err != nil {
		return jinja.Undefined(), errors.New("join: " + strings.TrimPrefix(err.Error(), "list: "))
	}
	sep := pyStr(opt[0])
	var b []byte
	for i, it := range items.AsList().Items {
		if i > 0 {
			b = append(b, sep...)
		}
		if !opt[1].IsNone() {
			if it, err = pyAttribute(it, opt[1]); err != nil {
				return jinja.Undefined(), err
			}
		}
		b = appendPyStr(b, it)
	}
	return jinja.NewString(string(b)), nil
}

// pyAttribute is jinja2's make_attrgetter(attribute)(v), as join, map and
// the like read an item's attribute: each of the attribute's parts in
// turn (a string's dot-separated parts, those of digits as integers),
// an integer as an index of a list or a string (negative from its end),
// a string as a key of a dict or an attribute of a namespace; undefined
// when there is none, and jinja2's UndefinedError when the value is
// undefined already.
func pyAttribute(v, attribute jinja.Value) (jinja.Value, error) {
	var parts []jinja.Value
	if attribute.IsString() {
		for _, p := range strings.Split(attribute.AsString(), ".") {
			if p == "" || strings.Trim(p, "0123456789") != "" {
				parts = append(parts, jinja.NewString(p))
				continue
			}
			n, err := strconv.ParseInt(p, 10, 64)
			if err != nil {
				n = math.MaxInt64 // past any end
			}
			parts = append(parts, jinja.NewInt(n))
		}
	} else {
		parts = []jinja.Value{attribute}
	}
	for _, p := range parts {
		if v.IsUndefined() {
			return jinja.Undefined(), errors.New("join: UndefinedError: the value has no attribute " + pyStr(p))
		}
		index, isIndex := int64(0), false
		switch {
		case p.IsInt():
			index, isIndex = p.AsInt(), true
		case p.IsBool():
			index, isIndex = int64(btoi(p.AsBool())), true
		}
		var next jinja.Value // undefined
		switch {
		case isIndex && v.IsList():
			items := v.AsList().Items
			if index < 0 {
				index += int64(len(items))
			}
			if 0 <= index && index < int64(len(items)) {
				next = items[index]
			}
		case isIndex && v.IsString():
			runes := []rune(v.AsString())
			if index < 0 {
				index += int64(len(runes))
			}
			if 0 <= index && index < int64(len(runes)) {
				next = jinja.NewString(string(runes[index]))
			}
		case p.IsString() && v.IsDict():
			if it, ok := v.AsDict().Data[p.AsString()]; ok && p.AsString() != namespaceMark {
				next = it
			}
		}
		v = next
	}
	return v, nil
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pyTrim is jinja2's trim filter: str(value).strip(chars), chars by
// position or by name; without them (or None) Python's white space
// (pyIsSpace).
var pyTrim = jinja.NewCallable(trimName, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	s := pyStr(args[0])
	chars, ok := kwargs["chars"]
	if len(args) > 1 {
		chars, ok = args[1], true
	}
	if !ok || chars.IsNone() || chars.IsUndefined() {
		return jinja.NewString(strings.TrimFunc(s, pyIsSpace)), nil
	}
	if !chars.IsString() {
		return jinja.Undefined(), errors.New("trim: chars must be a string or None")
	}
	return jinja.NewString(strings.Trim(s, chars.AsString())), nil
})

// pyIsSpace reports whether Python's str.isspace is true of r: Go's
// unicode.IsSpace and the information separators U+001C to U+001F
// (Unicode's bidirectional class B or S).
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || 0x1c <= r && r <= 0x1f
}

// pyJSON writes values as Python's json.dumps does.
type pyJSON struct {
	b         []byte
	ascii     bool   // ensure_ascii
	indented  bool   // indent is not None
	indent    string // one level of indentation
	item, key string // separators
	sortKeys  bool
}

func (e *pyJSON) newline(level int) {
	if e.indented {
		e.b = append(e.b, '\n')
		for range level {
			e.b = append(e.b, e.indent...)
		}
	}
}

func (e *pyJSON) value(v jinja.Value, level int) error {
	if level > maxJSONDepth {
		return errors.New("tojson: value nested too deep")
	}
	switch {
	case v.IsBool():
		e.b = strconv.AppendBool(e.b, v.AsBool())
	case v.IsInt():
		e.b = strconv.AppendInt(e.b, v.AsInt(), 10)
	case v.IsFloat():
		e.b = appendPyFloat(e.b, v.AsFloat())
	case v.IsString():
		e.b = pyjson.AppendString(e.b, v.AsString(), e.ascii)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			e.b = append(e.b, "[]"...)
			return nil
		}
		e.b = append(e.b, '[')
		for i, it := range items {
			if i > 0 {
				e.b = append(e.b, e.item...)
			}
			e.newline(level + 1)
			if err := e.value(it, level+1); err != nil {
				return err
			}
		}
		e.newline(level)
		e.b = append(e.b, ']')
	case isNamespace(v):
		return errors.New("tojson: Object of type Namespace is not JSON serializable")
	case v.IsDict():
		d := v.AsDict()
		keys := d.Keys
		if len(keys) == 0 {
			e.b = append(e.b, "{}"...)
			return nil
		}
		if e.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		e.b = append(e.b, '{')
		for i, k := range keys {
			if i > 0 {
				e.b = append(e.b, e.item...)
			}
			e.newline(level + 1)
			e.b = pyjson.AppendString(e.b, k, e.ascii)
			e.b = append(e.b, e.key...)
			if err := e.value(d.Data[k], level+1); err != nil {
				return err
			}
		}
		e.newline(level)
		e.b = append(e.b, '}')
	default: // None, and what the Go engine's tojson also writes as null
		e.b = append(e.b, "null"...)
	}
	return nil
}

// appendPyFloat appends f as Python's repr (and so json.dumps) writes it:
// the shortest digits that read back as f, in positional notation with at
// least one fractional digit ("2.0", "1000000.0") when the decimal exponent
// is in [-4, 16), otherwise in scientific notation with a signed exponent
// of at least two digits ("1e+16", "1.5e-05"); NaN and the infinities as
// json.dumps writes them.
func appendPyFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	}
	var buf [32]byte
	s := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // -d.ddde±dd
	if s[0] == '-' {
		dst = append(dst, '-')
		s = s[1:]
	}
	e := slices.Index(s, 'e')
	exp, _ := strconv.Atoi(string(s[e+1:]))
	digits := make([]byte, 0, e)
	for _, c := range s[:e] {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	if exp < -4 || exp >= 16 {
		dst = append(dst, digits[0])
		if len(digits) > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if exp < 0 {
			dst, exp = append(dst, '-'), -exp
		} else {
			dst = append(dst, '+')
		}
		if exp < 10 {
			dst = append(dst, '0')
		}
		return strconv.AppendInt(dst, int64(exp), 10)
	}
	point := exp + 1 // digits before the decimal point
	switch {
	case point <= 0:
		dst = append(dst, "0."...)
		for range -point {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	case point >= len(digits):
		dst = append(dst, digits...)
		for range point - len(digits) {
			dst = append(dst, '0')
		}
		return append(dst, ".0"...)
	}
	dst = append(dst, digits[:point]...)
	dst = append(dst, '.')
	return append(dst, digits[point:]...)
}

// filterBlockPrefix starts the names of the macros pyFilterBlocks renders
// a filter block's or a block set's body in.
const filterBlockPrefix = "kvroute_fb_"

// pyFilterBlocks returns src with each {% filter F %}body{% endfilter %}
// block and each block set, {% set T %}body{% endset %} or
// {% set T | F %}body{% endset %}, rewritten as a macro of the body and
// a print or an assignment of its call through F:
//
//	{%A macro kvroute_fb_N() B%}body{%C endmacro %}{{ kvroute_fb_N()|F }}{# D#}
//	{%A macro kvroute_fb_N() B%}body{%C endmacro %}{% set T = kvroute_fb_N()|F %}{# D#}
//
// where A, B, C and D are the opening and closing tags' whitespace
// control markers ("-", "+" or none; the comment, a block tag with the
// closing tag's right marker, removes what that tag's right side removed:
// the newline trim_blocks takes, or all white space for "-"). jinja2
// renders both blocks' bodies in an inner frame: an assignment in the
// body stays inside it ({% set x = 2 %} in a filter block leaves x as it
// was after it), while the body reads the variables around it and
// changes a namespace's attributes; a macro's body is such a frame in the
// Go engine too, where its filter block and block set render the body in
// the frame around them (an assignment in it leaks out). The Go engine
// also applies only a filter its own table knows, by name, to a filter
// block (upper, not the Python-exact filter pyFilters renames |upper to,
// and a filter with arguments or a chain not at all: it writes the body
// as it is), takes "T | F" for a block set's name, and sets a variable
// named "ns.x" for {% set ns.x %}; a filter in {{ }} or {% set %} may be
// any, and is pyFilters' as in any expression. Unmatched tags, a filter
// tag whose expression does not start with a name, a block set whose
// target is not a name or a name's attribute, and templates with
// {% raw %} are left as they are.
func pyFilterBlocks(src string) string {
	if !strings.Contains(src, "endfilter") && !strings.Contains(src, "endset") || rawTagRE.MatchString(src) {
		return src
	}
	type tag struct {
		start, end  int
		left, right string // whitespace control markers
		set         bool   // a block set (or its endset), not a filter block
		target      string // a block set's target
		expr        string // the filter expression (a block set's may be ""); "" for a closing tag
		pair        int    // the index of the matching tag; -1 for none
		ok          bool   // an opening tag pyFilterBlocks rewrites
	}
	var tags []tag
	var open [2][]int // the indexes in tags of the filter tags and block set tags open, innermost last
	for start, end := range tagsIn(src) {
		if src[start+1] != '%' {
			continue
		}
		left, word, rest, right := splitStatement(src[start+2 : end-2])
		rest = strings.TrimSpace(rest)
		switch word {
		case "filter":
			ok := rest != "" && (rest[0] == '_' || 'a' <= rest[0]|0x20 && rest[0]|0x20 <= 'z')
			open[0] = append(open[0], len(tags))
			tags = append(tags, tag{start: start, end: end, left: left, right: right, expr: rest, pair: -1, ok: ok})
		case "set":
			target, filter, block := blockSetTarget(rest)
			if !block {
				continue // an assignment, which has no endset
			}
			open[1] = append(open[1], len(tags))
			tags = append(tags, tag{start: start, end: end, left: left, right: right, set: true, target: target, expr: filter, pair: -1, ok: target != ""})
		case "endfilter", "endset":
			k := 0
			if word == "endset" {
				k = 1
			}
			if len(open[k]) == 0 {
				continue
			}
			o := open[k][len(open[k])-1]
			open[k] = open[k][:len(open[k])-1]
			if !tags[o].ok || rest != "" {
				continue
			}
			tags[o].pair = len(tags)
			tags = append(tags, tag{start: start, end: end, left: left, right: right, set: k == 1, pair: o})
		}
	}
	var b strings.Builder
	i := 0 // src[:i] is written
	n := 0
	names := make(map[int]string) // an opening tag's macro, by its index
	for k, t := range tags {
		if t.pair < 0 {
			continue
		}
		b.WriteString(src[i:t.start])
		i = t.end
		if t.ok {
			name := filterBlockPrefix + strconv.Itoa(n)
			n++
			names[k] = name
			b.WriteString("{%" + t.left + " macro " + name + "() " + t.right + "%}")
			continue
		}
		o := tags[t.pair]
		call := names[t.pair] + "()"
		if o.expr != "" {
			call += "|" + o.expr
		}
		b.WriteString("{%" + t.left + " endmacro %}")
		if o.set {
			b.WriteString("{% set " + o.target + " = " + call + " %}")
		} else {
			b.WriteString("{{ " + call + " }}")
		}
		b.WriteString("{# " + t.right + "#}")
	}
	if i == 0 {
		return src
	}
	b.WriteString(src[i:])
	return b.String()
}

// blockSetTarget parses what follows "set" in a statement tag, s (trimmed):
// block is whether it is a block set (no "=" outside string literals),
// target its target when it is a name or a name's attribute ("" for
// anything else, or a filter that does not start with a name) and filter
// what follows a "|" after it ("" for none).
func blockSetTarget(s string) (target, filter string, block bool) {
	for j := 0; j < len(s); j++ {
		switch s[j] {
		case '\'', '"':
			j = skipQuoted(s, j)
		case '=':
			return "", "", false
		}
	}
	e := 0
	for e < len(s) && isIdentByte(s[e]) {
		e++
	}
	if e < len(s) && s[e] == '.' {
		e++
		for e < len(s) && isIdentByte(s[e]) {
			e++
		}
	}
	target, rest := s[:e], strings.TrimLeft(s[e:], " \t\r\n")
	if target == "" || target[0] >= '0' && target[0] <= '9' || target[len(target)-1] == '.' {
		return "", "", true
	}
	switch {
	case rest == "":
		return target, "", true
	case rest[0] == '|':
		if f := strings.TrimSpace(rest[1:]); f != "" && (f[0] == '_' || 'a' <= f[0]|0x20 && f[0]|0x20 <= 'z') {
			return target, f, true
		}
	}
	return "", "", true
}

// splitStatement splits a statement tag's text s (between "{%" and "%}")
// into its whitespace control markers left and right ("-", "+" or ""),
// its first word and the rest.
func splitStatement(s string) (left, word, rest, right string) {
	if s != "" && (s[0] == '-' || s[0] == '+') {
		left, s = s[:1], s[1:]
	}
	if n := len(s); n > 0 && (s[n-1] == '-' || s[n-1] == '+') {
		right, s = s[n-1:], s[:n-1]
	}
	s = strings.TrimLeft(s, " \t\r\n")
	e := 0
	for e < len(s) && isIdentByte(s[e]) {
		e++
	}
	return left, s[:e], s[e:], right
}

package tokenizer

import (
	"errors"
	"strings"

	"github.com/ardanlabs/jinja"
)

// jinja2 compiles a comparison to Python's ==, !=, <, <=, >, >=, in and
// not in, chained as Python chains them; the Go engine has its own, which
// differ on values a chat template sees:
//
//   - == and != compare kinds strictly: 1 == 1.0 is true there, but
//     true == 1, false == 0, [1, 2] == [1.0, 2] and {"a": 1} == {"a": 1.0}
//     are false (Python: true);
//   - in and not in find a list's item with that strictness (1 in [true]
//     is false there), and are false rather than Python's TypeError for
//     1 in "abc", [1] in {} or x in 5;
//   - <, <=, > and >= order through float conversions: "10" < "9" is false
//     there (Python compares strings by code point: true), a string
//     against a number is a number's comparison with 0 (Python: a
//     TypeError), and so is None;
//   - a chain, a < b < c, is (a < b) < c there, a < b and b < c in
//     Python.
//
// pyCompares rewrites each comparison in the template's source into a
// filter of its first operand, which render passes as a template variable
// as pyFilters does for filters, with the operators as strings and the
// other operands as arguments: "a == b" becomes
// "((a)|kvroute_cmp('==', (b)))", each operand in parentheses and the
// whole in parentheses, so that neither engine's precedence can split
// them. The operands are found by a parser of jinja2's expression
// grammar (parser.py's parse_compare and what it calls), which the tag's
// other text passes through unchanged.

// compareName is the name of the filter pyCompares rewrites comparisons
// into.
const compareName = "kvroute_cmp"

// pyCompareVars is pyCompares' filter, by name.
var pyCompareVars = map[string]jinja.Value{compareName: jinja.NewCallable(compareName, pyCompareChain)}

// pyCompareChain is Python's a op1 b op2 c ...: each operator of its
// arguments (a, "op1", b, "op2", c, ...) applied to the operands on its
// sides in turn, false at the first that is (and Python's error at the
// first that raises one), true when all are.
func pyCompareChain(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(kwargs) > 0 || len(args) < 3 || len(args)%2 == 0 {
		return jinja.Undefined(), errors.New("comparison: malformed operands")
	}
	for i := 1; i+1 < len(args); i += 2 {
		if !args[i].IsString() {
			return jinja.Undefined(), errors.New("comparison: malformed operator")
		}
		ok, err := pyCompareOp(args[i-1], args[i].AsString(), args[i+1])
		if err != nil {
			return jinja.Undefined(), err
		}
		if !ok {
			return jinja.NewBool(false), nil
		}
	}
	return jinja.NewBool(true), nil
}

// pyCompareOp is Python's a op b for one of jinja2's comparison operators.
func pyCompareOp(a jinja.Value, op string, b jinja.Value) (bool, error) {
	switch op {
	case "==":
		return pyEqual(a, b), nil
	case "!=":
		return !pyEqual(a, b), nil
	case "in", "not in":
		in, err := pyIn(a, b)
		return in != (op == "not in"), err
	}
	c, ordered, err := pyCompare(a, b)
	if err != nil || !ordered {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, errors.New("comparison: unknown operator " + op)
}

// pyCompares returns src with each comparison (in an expression or
// statement tag) rewritten as a call of compareName (see above); and, as
// they need the same parse, each for loop's iterable X as (X)|iterName,
// each attribute assignment's value, {% set ns.x = V %}, as
// (V)|setAttrName(ns) (namespace.go), and each print and ~ that the Go
// engine may write otherwise than Python's str() through stringName and
// catName (pystr.go). A tag it cannot parse as jinja2 does, and
// templates with {% raw %}, are left as they are.
func pyCompares(src string) string {
	if !mayRewrite(src) || rawTagRE.MatchString(src) {
		return src
	}
	return rewriteTagsOf(src, rewriteComparisons)
}

// mayRewrite reports whether src may hold a comparison, a for loop, an
// assignment, a print or a ~ that pyCompares rewrites.
func mayRewrite(src string) bool {
	return strings.ContainsAny(src, "=<>~") || strings.Contains(src, "in") || strings.Contains(src, "{{")
}

// rewriteComparisons rewrites the comparisons, loop iterables and
// attribute assignments (see pyCompares) of one tag's text s (between
// "{{" and "}}" or "{%" and "%}", with its whitespace control markers);
// ok is false when it has none, or when it cannot parse the tag.
func rewriteComparisons(s string, statement bool) (out string, ok bool) {
	body := s
	left, right := "", ""
	if body != "" && (body[0] == '-' || body[0] == '+') {
		left, body = body[:1], body[1:]
	}
	if n := len(body); n > 0 && (body[n-1] == '-' || body[n-1] == '+') {
		right, body = body[n-1:], body[:n-1]
	}
	p := &cmpParser{src: body}
	if !p.tokenize() || statement && (len(p.toks) == 0 || p.toks[0].kind != tokNameKind) {
		return s, false
	}
	var b strings.Builder
	if statement {
		if !p.statement(&b) {
			return s, false
		}
	} else if !p.tuple(&b, true) {
		return s, false
	}
	if p.pos != len(p.toks) {
		return s, false
	}
	text := b.String()
	if !statement && p.kind == kindAny {
		// a print of what the Go engine may write otherwise: through
		// Python's str()
		operand := strings.TrimLeft(text, " \t\r\n")
		text = text[:len(text)-len(operand)] + "(" + operand + ")|" + stringName
		p.changed = true
	}
	if !p.changed {
		return s, false
	}
	return left + text + body[p.lastEnd():] + right, true
}

// The kinds of cmpParser's tokens.
const (
	tokNameKind = iota
	tokNumberKind
	tokStringKind
	tokOpKind // an operator or a bracket
)

// cmpToken is a token of a tag's text: src[start:end].
type cmpToken struct {
	kind       int
	start, end int
}

// cmpParser parses a tag's text by jinja2's grammar, writing it out with
// its comparisons rewritten (see pyCompares). Each method that parses a
// construct writes the tokens it reads, each with the white space before
// it, to b and reports whether the text is that construct.
type cmpParser struct {
	src     string
	toks    []cmpToken
	pos     int
	changed bool     // a comparison was rewritten
	kind    exprKind // of the value of the construct parsed last
}

// exprKind is what cmpParser tells of an expression's value: whether the
// Go engine writes it (in a {{ }} or as an operand of ~) as Python's str()
// does (pystr.go).
type exprKind uint8

// The kinds of values, from the least known.
const (
	kindAny    exprKind = iota // anything: a float, None, a list, ...
	kindPlain                  // a string, an integer or a boolean
	kindString                 // a string
)

// or is the kind of a value that is either one of a kind a or one of b.
func (a exprKind) or(b exprKind) exprKind { return min(a, b) }

// filterKinds are the kinds of the values of the filters that make a
// string, an integer or a boolean whatever they are given (those
// pyFilters renames are Python's, under both names), the kinds of the
// filters pyCompares writes included.
var filterKinds = map[string]exprKind{
	"tojson": kindString, "string": kindString, "trim": kindString, "upper": kindString, "lower": kindString,
	"capitalize": kindString, "title": kindString, "join": kindString, "replace": kindString, "indent": kindString,
	tojsonName: kindString, stringName: kindString, trimName: kindString, catName: kindString,
	filterPrefix + "upper": kindString, filterPrefix + "lower": kindString,
	filterPrefix + "capitalize": kindString, filterPrefix + "title": kindString, filterPrefix + "join": kindString,
	"length": kindPlain, "count": kindPlain, "wordcount": kindPlain, compareName: kindPlain,
}

// cmpOps are jinja2's operators, longest first.
var cmpOps = []string{"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "|", ".", ",", ":", "=", "<", ">",
	"(", ")", "[", "]", "{", "}"}

// tokenize splits p.src into tokens as jinja2's lexer does; it is false
// for a character jinja2 has no token for.
func (p *cmpParser) tokenize() bool {
	s := p.src
	for i := 0; ; {
		i = spaceEnd(s, i)
		if i == len(s) {
			return true
		}
		start := i
		switch c := s[i]; {
		case c == '\'' || c == '"':
			i = skipQuoted(s, i)
			if i >= len(s) {
				return false
			}
			i++
			p.toks = append(p.toks, cmpToken{tokStringKind, start, i})
			continue
		case '0' <= c && c <= '9':
			i = numberEnd(s, i)
			p.toks = append(p.toks, cmpToken{tokNumberKind, start, i})
			continue
		case isIdentByte(c):
			for i < len(s) && isIdentByte(s[i]) {
				i++
			}
			p.toks = append(p.toks, cmpToken{tokNameKind, start, i})
			continue
		}
		found := false
		for _, op := range cmpOps {
			if strings.HasPrefix(s[i:], op) {
				p.toks = append(p.toks, cmpToken{tokOpKind, start, i + len(op)})
				i += len(op)
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
}

// text is the text of token i ("" past the end).
func (p *cmpParser) text(i int) string {
	if i >= len(p.toks) {
		return ""
	}
	return p.src[p.toks[i].start:p.toks[i].end]
}

// lastEnd is where the last token read ends.
func (p *cmpParser) lastEnd() int {
	if p.pos == 0 {
		return 0
	}
	return p.toks[p.pos-1].end
}

// is reports whether the next token is an operator or a name with text
// t.
func (p *cmpParser) is(t string) bool {
	return p.pos < len(p.toks) && p.text(p.pos) == t && p.toks[p.pos].kind != tokStringKind
}

// take writes the next token with the white space before it.
func (p *cmpParser) take(b *strings.Builder) {
	b.WriteString(p.src[p.lastEnd():p.toks[p.pos].end])
	p.pos++
}

// expect takes the next token when it is t.
func (p *cmpParser) expect(b *strings.Builder, t string) bool {
	if !p.is(t) {
		return false
	}
	p.take(b)
	return true
}

// statement parses a statement tag's text: the expressions of the
// statements that hold some, the others' text as it is.
func (p *cmpParser) statement(b *strings.Builder) bool {
	kw := p.text(0)
	p.take(b)
	switch kw {
	case "if", "elif":
		return p.tuple(b, false)
	case "for":
		// parse_for: an assignment target, "in", the iterable (a tuple
		// without a conditional expression), then "if" and a condition,
		// then "recursive"
		for p.pos < len(p.toks) && !p.is("in") {
			if k := p.toks[p.pos].kind; k != tokNameKind && !p.is(",") && !p.is("(") && !p.is(")") {
				return false // a target is names
			}
			p.take(b)
		}
		if !p.expect(b, "in") {
			return false
		}
		var iter strings.Builder
		if !p.tuple(&iter, false) {
			return false
		}
		// through iterName, which refuses what Python cannot iterate
		it := iter.String()
		if strings.HasSuffix(it, ")|"+iterName) {
			b.WriteString(it) // rewritten before
		} else {
			operand := strings.TrimLeft(it, " \t\r\n")
			b.WriteString(it[:len(it)-len(operand)] + "(" + operand + ")|" + iterName)
			p.changed = true
		}
		if p.expect(b, "if") && !p.expression(b, true) {
			return false
		}
		p.expect(b, "recursive")
		return true
	case "set":
		// an assignment (a block set has no "=" and nothing to parse)
		target := p.pos
		for p.pos < len(p.toks) && !p.is("=") {
			p.take(b)
		}
		if p.pos == len(p.toks) {
			return true
		}
		p.take(b)
		if p.pos-target != 4 || p.text(target+1) != "." || p.toks[target].kind != tokNameKind {
			return p.tuple(b, true)
		}
		// an attribute's: through setAttrName, which refuses any object
		// but a namespace
		var value strings.Builder
		if !p.tuple(&value, true) {
			return false
		}
		v, guard := value.String(), ")|"+setAttrName+"("+p.text(target)+")"
		if strings.HasSuffix(v, guard) {
			b.WriteString(v) // rewritten before
			return true
		}
		operand := strings.TrimLeft(v, " \t\r\n")
		b.WriteString(v[:len(v)-len(operand)] + "(" + operand + guard)
		p.changed = true
		return true
	}
	if kw == "call" {
		// the caller's parameters, as they are, then the call
		if p.is("(") {
			for depth := 0; p.pos < len(p.toks); {
				if p.is("(") {
					depth++
				} else if p.is(")") {
					depth--
				}
				p.take(b)
				if depth == 0 {
					break
				}
			}
		}
		return p.expression(b, true)
	}
	// other statements: as they are (the Go engine's macro tag splits its
	// parameters at every comma, a rewritten default's too)
	for p.pos < len(p.toks) {
		p.take(b)
	}
	return true
}

// tuple parses parse_tuple: expressions separated by commas, a trailing
// comma allowed.
func (p *cmpParser) tuple(b *strings.Builder, condexpr bool) bool {
	for n := 0; ; n++ {
		if !p.expression(b, condexpr) {
			return false
		}
		comma := p.expect(b, ",")
		if comma || n > 0 {
			p.kind = kindAny // a tuple
		}
		if !comma || !p.startsExpression() {
			return true
		}
	}
}

// startsExpression reports whether the next token may start an
// expression.
func (p *cmpParser) startsExpression() bool {
	if p.pos == len(p.toks) {
		return false
	}
	switch t := p.text(p.pos); p.toks[p.pos].kind {
	case tokNameKind:
		return !jinjaKeywords[t] || t == "not"
	case tokOpKind:
		return t == "(" || t == "[" || t == "{" || t == "-" || t == "+"
	}
	return true
}

// expression parses parse_expression: a conditional expression when
// condexpr, else an or.
func (p *cmpParser) expression(b *strings.Builder, condexpr bool) bool {
	if !p.or(b) {
		return false
	}
	k := p.kind
	for condexpr && p.is("if") {
		p.take(b)
		if !p.or(b) {
			return false
		}
		if p.expect(b, "else") { // without, an undefined value: "" in both
			if !p.expression(b, true) {
				return false
			}
			k = k.or(p.kind)
		}
	}
	p.kind = k
	return true
}

func (p *cmpParser) or(b *strings.Builder) bool { return p.binary(b, p.and, eitherKind, "or") }

func (p *cmpParser) and(b *strings.Builder) bool { return p.binary(b, p.not, eitherKind, "and") }

func (p *cmpParser) not(b *strings.Builder) bool {
	if p.expect(b, "not") {
		if !p.not(b) {
			return false
		}
		p.kind = kindPlain
		return true
	}
	return p.compare(b)
}

// compare parses parse_compare: a math1, then comparison operators each
// with a math1. A comparison is written as compareName's call.
func (p *cmpParser) compare(b *strings.Builder) bool {
	var first strings.Builder
	if !p.math1(&first) {
		return false
	}
	k := p.kind
	var rest strings.Builder
	n := 0
	for {
		op := ""
		switch {
		case p.is("==") || p.is("!=") || p.is("<") || p.is("<=") || p.is(">") || p.is(">="):
			op = p.text(p.pos)
			p.pos++
		case p.is("in"):
			op = "in"
			p.pos++
		case p.is("not") && p.pos+1 < len(p.toks) && p.text(p.pos+1) == "in" && p.toks[p.pos+1].kind == tokNameKind:
			op = "not in"
			p.pos += 2
		}
		if op == "" {
			break
		}
		var operand strings.Builder
		if !p.math1(&operand) {
			return false
		}
		rest.WriteString(", '" + op + "', (" + strings.TrimLeft(operand.String(), " \t\r\n") + ")")
		n++
	}
	if n == 0 {
		b.WriteString(first.String())
		p.kind = k
		return true
	}
	p.changed = true
	p.kind = kindPlain
	f := first.String()
	operand := strings.TrimLeft(f, " \t\r\n")
	b.WriteString(f[:len(f)-len(operand)])
	b.WriteString("((")
	b.WriteString(operand)
	b.WriteString(")|" + compareName + "(")
	b.WriteString(strings.TrimPrefix(rest.String(), ", "))
	b.WriteString("))")
	return true
}

// binary parses operands of next joined by the operators ops; the kind
// of the value is, for each operator in turn, kind of the kind of what
// is before it, the operator and the kind of the operand after it.
func (p *cmpParser) binary(b *strings.Builder, next func(*strings.Builder) bool, kind func(exprKind, string, exprKind) exprKind, ops ...string) bool {
	if !next(b) {
		return false
	}
	k := p.kind
	for {
		op := ""
		for _, o := range ops {
			if p.is(o) {
				op = o
				break
			}
		}
		if op == "" {
			p.kind = k
			return true
		}
		p.take(b)
		if !next(b) {
			return false
		}
		k = kind(k, op, p.kind)
	}
}

// eitherKind is the kind of or's and and's value: either operand.
func eitherKind(a exprKind, _ string, b exprKind) exprKind { return a.or(b) }

// anyKind is the kind of an arithmetic operation's value.
func anyKind(exprKind, string, exprKind) exprKind { return kindAny }

// addKind is the kind of + and -'s value: a + of a string is a string in
// the Go engine (and a string or jinja2's error).
func addKind(a exprKind, op string, b exprKind) exprKind {
	if op == "+" && (a == kindString || b == kindString) {
		return kindString
	}
	return kindAny
}

func (p *cmpParser) math1(b *strings.Builder) bool {
	return p.binary(b, p.concat, addKind, "+", "-")
}

// concat parses ~: jinja2's is the operands' str() joined, the Go
// engine's their printing. A concatenation of an operand that it may
// print otherwise (exprKind) is written as catName's call,
// "((a)|kvroute_cat((b), (c)))", which also keeps the Go engine, whose ~
// binds less tightly than + and -, from splitting it.
func (p *cmpParser) concat(b *strings.Builder) bool {
	var first strings.Builder
	if !p.math2(&first) {
		return false
	}
	k := p.kind
	if !p.is("~") {
		b.WriteString(first.String())
		return true
	}
	plain := first.String() // the text as it is
	var args strings.Builder
	for p.is("~") {
		plain += p.src[p.lastEnd():p.toks[p.pos].end]
		p.pos++
		var operand strings.Builder
		if !p.math2(&operand) {
			return false
		}
		k = k.or(p.kind)
		plain += operand.String()
		args.WriteString(", (" + strings.TrimLeft(operand.String(), " \t\r\n") + ")")
	}
	p.kind = kindString
	if k != kindAny {
		b.WriteString(plain)
		return true
	}
	p.changed = true
	f := first.String()
	operand := strings.TrimLeft(f, " \t\r\n")
	b.WriteString(f[:len(f)-len(operand)])
	b.WriteString("((" + operand + ")|" + catName + "(" + strings.TrimPrefix(args.String(), ", ") + "))")
	return true
}

func (p *cmpParser) math2(b *strings.Builder) bool {
	return p.binary(b, p.pow, anyKind, "*", "/", "//", "%")
}

func (p *cmpParser) pow(b *strings.Builder) bool {
	return p.binary(b, func(b *strings.Builder) bool { return p.unary(b, true) }, anyKind, "**")
}

// unary parses parse_unary: signs, a primary and its postfixes, then
// (withFilter) filters, tests and calls.
func (p *cmpParser) unary(b *strings.Builder, withFilter bool) bool {
	if p.is("-") || p.is("+") {
		p.take(b)
		if !p.unary(b, false) {
			return false
		}
		p.kind = kindAny
	} else if !p.primary(b) {
		return false
	} else if p.toks[p.pos-1].kind == tokNameKind && ownMacro(p.text(p.pos-1)) && p.is("(") {
		if !p.call(b) {
			return false
		}
		p.kind = kindString // a macro's value
	}
	k, start := p.kind, p.pos
	if !p.postfix(b) {
		return false
	}
	p.kind = k
	if p.pos != start {
		p.kind = kindAny // an attribute, an item, a call's value
	}
	if withFilter {
		return p.filterExpr(b)
	}
	return true
}

// ownMacro reports whether name is a macro's that this package's
// rewrites write (pyLoopBodies, pyWithBlocks, pyFilterBlocks).
func ownMacro(name string) bool {
	return strings.HasPrefix(name, loopBodyPrefix) || strings.HasPrefix(name, withBlockPrefix) || strings.HasPrefix(name, filterBlockPrefix)
}

// operatorWords are the keywords that join or end expressions, never an
// operand of one (primary).
var operatorWords = map[string]bool{"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true}

// primary parses parse_primary: a name or constant, adjacent string
// literals, a number, a parenthesized tuple, a list or a dict.
func (p *cmpParser) primary(b *strings.Builder) bool {
	if p.pos == len(p.toks) {
		return false
	}
	p.kind = kindAny
	switch t := p.text(p.pos); p.toks[p.pos].kind {
	case tokNameKind:
		if operatorWords[t] {
			// Not an operand as the Go engine parses: it compiles {% for
			// x in if[] %} (and renders no iteration), but not the
			// rewrite's (if[])|kvroute_iter. The tag is left as it is.
			return false
		}
		p.take(b)
		switch t {
		case "true", "false", "True", "False":
			p.kind = kindPlain
		}
		return true
	case tokNumberKind:
		p.take(b)
		if !strings.ContainsAny(t, ".eE_") {
			p.kind = kindPlain // an integer
		}
		return true
	case tokStringKind:
		for p.pos < len(p.toks) && p.toks[p.pos].kind == tokStringKind {
			p.take(b)
		}
		p.kind = kindString
		return true
	}
	switch p.text(p.pos) {
	case "(":
		p.take(b)
		if p.is(")") {
			p.take(b)
			return true // a tuple
		}
		return p.tuple(b, true) && p.expect(b, ")") // the tuple's kind, or its one expression's
	case "[":
		ok := p.items(b, "]", false)
		p.kind = kindAny
		return ok
	case "{":
		ok := p.items(b, "}", true)
		p.kind = kindAny
		return ok
	}
	return false
}

// items parses a list's or a dict's items (pairs) up to close, after the
// opening bracket.
func (p *cmpParser) items(b *strings.Builder, close string, pairs bool) bool {
	p.take(b)
	for !p.is(close) {
		if !p.expression(b, true) {
			return false
		}
		if pairs && (!p.expect(b, ":") || !p.expression(b, true)) {
			return false
		}
		if !p.expect(b, ",") {
			break
		}
	}
	return p.expect(b, close)
}

// postfix parses parse_postfix: attributes, subscripts and calls.
func (p *cmpParser) postfix(b *strings.Builder) bool {
	for {
		switch {
		case p.is("."):
			p.take(b)
			if p.pos == len(p.toks) || p.toks[p.pos].kind != tokNameKind && p.toks[p.pos].kind != tokNumberKind {
				return false
			}
			p.take(b)
		case p.is("["):
			p.take(b)
			for !p.is("]") {
				if !p.subscribed(b) {
					return false
				}
				if !p.expect(b, ",") {
					break
				}
			}
			if !p.expect(b, "]") {
				return false
			}
		case p.is("("):
			if !p.call(b) {
				return false
			}
		default:
			return true
		}
	}
}

// subscribed parses parse_subscribed: an expression or a slice.
func (p *cmpParser) subscribed(b *strings.Builder) bool {
	if !p.is(":") && !p.expression(b, true) {
		return false
	}
	for range 2 {
		if !p.expect(b, ":") {
			return true
		}
		if !p.is("]") && !p.is(",") && !p.is(":") && !p.expression(b, true) {
			return false
		}
	}
	return true
}

// call parses parse_call_args: arguments in parentheses, by position, by
// name, *args and **kwargs.
func (p *cmpParser) call(b *strings.Builder) bool {
	p.take(b) // (
	for !p.is(")") {
		switch {
		case p.is("*") || p.is("**"):
			p.take(b)
		case p.pos+1 < len(p.toks) && p.toks[p.pos].kind == tokNameKind && p.text(p.pos+1) == "=":
			p.take(b)
			p.take(b)
		}
		if !p.expression(b, true) {
			return false
		}
		if !p.expect(b, ",") {
			break
		}
	}
	return p.expect(b, ")")
}

// filterExpr parses parse_filter_expr: filters, tests and calls. The kind
// of the value is the last filter's of filterKinds, a test's a boolean.
func (p *cmpParser) filterExpr(b *strings.Builder) bool {
	k := p.kind
	for {
		switch {
		case p.is("|"):
			p.take(b)
			name := p.pos
			if !p.dottedName(b) {
				return false
			}
			k = kindAny
			if p.pos == name+1 {
				k = filterKinds[p.text(name)]
			}
			if p.is("(") && !p.call(b) {
				return false
			}
		case p.is("is"):
			k = kindPlain
			p.take(b)
			p.expect(b, "not")
			if !p.dottedName(b) {
				return false
			}
			switch {
			case p.is("("):
				if !p.call(b) {
					return false
				}
			case p.pos < len(p.toks) && (p.toks[p.pos].kind != tokOpKind || p.is("[") || p.is("{")) &&
				!p.is("else") && !p.is("or") && !p.is("and"):
				// a bare argument: a primary and its postfixes
				if p.is("is") || !p.primary(b) || !p.postfix(b) {
					return false
				}
			}
		case p.is("("):
			k = kindAny
			if !p.call(b) {
				return false
			}
		default:
			p.kind = k
			return true
		}
	}
}

// dottedName parses a filter's or test's name: names joined by dots.
func (p *cmpParser) dottedName(b *strings.Builder) bool {
	for {
		if p.pos == len(p.toks) || p.toks[p.pos].kind != tokNameKind {
			return false
		}
		p.take(b)
		if !p.is(".") {
			return true
		}
		p.take(b)
	}
}

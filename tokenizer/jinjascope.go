package tokenizer

import (
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// loopBodyPrefix starts the names of the macros pyLoopBodies renders a for
// loop's body in.
const loopBodyPrefix = "kvroute_lb_"

// pyLoopBodies returns src with the body of each for loop whose iterations
// may see each other's assignments rewritten as a macro and its call:
//
//	{% for x in y R%}body{%L endfor %}
//	{% for x in y R%}{% macro kvroute_lb_N() R%}body{%L endmacro %}{{ kvroute_lb_N() }}{%L endfor %}
//
// (and so before an {% else %} of the loop; and an else part that
// assigns a variable, which jinja2 keeps in its own frame too, the Go
// engine in the frame around the loop, from after the else tag), where R
// and L are the for (else) tag's right and the closing tag's left
// whitespace control markers,
// which the macro's tags repeat so that they trim what the loop's tags
// trimmed. jinja2 renders each iteration of a loop's body in a frame of
// its own, which starts from the variables around the loop: an
// assignment in one iteration is gone in the next ({% set x = x + i %}
// adds i to the x from before the loop each time), as a macro's body
// starts from them at each call; the Go engine renders all iterations in
// one frame, which keeps it. A body is rewritten only when an iteration
// may read a variable the body assigns before it assigns it
// (needsOwnFrame): a body that assigns each variable before it reads it
// renders alike in both, without the macro's cost. A loop with
// {% break %} or {% continue %} (which would cut the macro's output with
// the iteration's) or "recursive", unmatched tags, and templates with
// {% raw %} are left as they are.
func pyLoopBodies(src string) string {
	if !strings.Contains(src, "endfor") || !strings.Contains(src, "set") || rawTagRE.MatchString(src) {
		return src
	}
	var tags []jinjaTag
	var stack []int // the indexes in tags of the blocks open, innermost last
	keep := make(map[int]bool)
	for start, end := range tagsIn(src) {
		if src[start+1] == '#' {
			continue
		}
		t := jinjaTag{start: start, end: end, close: -1}
		if src[start+1] == '{' {
			t.rest = src[start+2 : end-2]
			tags = append(tags, t)
			continue
		}
		t.stmt = true
		t.left, t.word, t.rest, t.right = splitStatement(src[start+2 : end-2])
		i := len(tags)
		tags = append(tags, t)
		switch t.word {
		case "for", "if", "macro", "call", "filter":
			stack = append(stack, i)
		case "set":
			if _, _, block := blockSetTarget(strings.TrimSpace(t.rest)); block {
				stack = append(stack, i)
			}
		case "else", "elif":
			if n := len(stack); n > 0 {
				tags[stack[n-1]].mids = append(tags[stack[n-1]].mids, i)
			}
		case "break", "continue":
			for k := len(stack) - 1; k >= 0; k-- {
				if tags[stack[k]].word == "for" {
					keep[stack[k]] = true
					break
				}
			}
		case "endfor", "endif", "endmacro", "endcall", "endfilter", "endset":
			n := len(stack)
			if n == 0 || "end"+tags[stack[n-1]].word != t.word {
				return src // unmatched: the Go engine or jinja2 refuses it anyway
			}
			tags[stack[n-1]].close, tags[i].close = i, stack[n-1]
			stack = stack[:n-1]
		}
	}
	if len(stack) > 0 {
		return src
	}
	type insert struct {
		at   int
		text string
	}
	var ins []insert
	n := 0
	for o, t := range tags {
		if !t.stmt || t.word != "for" || keep[o] {
			continue
		}
		if _, recursive := cutKeyword(t.rest, "recursive"); recursive {
			continue
		}
		bodyEnd := t.close
		if len(t.mids) > 0 {
			bodyEnd = t.mids[0]
		}
		frame := func(open, close int) {
			name := loopBodyPrefix + strconv.Itoa(n)
			n++
			ins = append(ins, insert{tags[open].end, "{% macro " + name + "() " + tags[open].right + "%}"},
				insert{tags[close].start, "{%" + tags[close].left + " endmacro %}{{ " + name + "() }}"})
		}
		if needsOwnFrame(tags, o+1, bodyEnd) {
			frame(o, bodyEnd)
		}
		if bodyEnd != t.close && len(assignedNames(tags, bodyEnd+1, t.close)) > 0 {
			frame(bodyEnd, t.close) // the else part's assignments stay in it
		}
	}
	if len(ins) == 0 {
		return src
	}
	// In source order: two insertions are at one position only for an
	// empty body, whose opening (appended first) comes first.
	slices.SortStableFunc(ins, func(a, b insert) int { return a.at - b.at })
	var out strings.Builder
	i := 0
	for _, in := range ins {
		out.WriteString(src[i:in.at])
		out.WriteString(in.text)
		i = in.at
	}
	out.WriteString(src[i:])
	return out.String()
}

// jinjaTag is a tag of a template, as pyLoopBodies reads it.
type jinjaTag struct {
	start, end  int
	stmt        bool   // a statement ({% %}), not an expression ({{ }})
	left, right string // a statement's whitespace control markers
	word, rest  string // a statement's first word and the rest; an expression's text
	close       int    // a block's closing tag (and a closing tag's opening one); -1 for none
	mids        []int  // a block's else and elif tags
}

// needsOwnFrame reports whether the loop body tags[from:to] may read a
// variable it assigns (with a {% set %} of its own, not a nested loop's or
// macro's) before assigning it in the same iteration: whether an
// iteration may see what the one before it assigned, which the Go engine
// keeps and jinja2 does not. It follows definite assignment through
// {% if %} branches (a variable is assigned after an if when every
// branch, an else among them, assigns it); a nested block's or an
// expression's mention of such a variable where it is not definitely
// assigned is a read.
func needsOwnFrame(tags []jinjaTag, from, to int) bool {
	names := assignedNames(tags, from, to)
	if len(names) == 0 {
		return false
	}
	_, ok := definitelyAssigned(tags, from, to, names, map[string]bool{})
	return !ok
}

// assignedNames returns the variables tags[from:to] assign with a
// {% set %} of their own (not a nested loop's, macro's or block's).
func assignedNames(tags []jinjaTag, from, to int) map[string]bool {
	names := make(map[string]bool)
	for i := from; i < to; i++ {
		t := tags[i]
		switch {
		case !t.stmt:
		case t.word == "set" && t.close < 0:
			for _, n := range setNames(t.rest) {
				names[n] = true
			}
		case t.close > i && t.word != "if":
			i = t.close // a nested loop's, macro's or block's assignments are its own
		}
	}
	return names
}

// definitelyAssigned walks tags[from:to] with the variables of names
// assigned so far, assigned: it returns those assigned after them, and
// false when a tag reads one of names that is not assigned there.
func definitelyAssigned(tags []jinjaTag, from, to int, names, assigned map[string]bool) (map[string]bool, bool) {
	reads := func(text string) bool {
		for _, n := range mentionedNames(text) {
			if names[n] && !assigned[n] {
				return true
			}
		}
		return false
	}
	for i := from; i < to; i++ {
		t := tags[i]
		switch {
		case !t.stmt:
			if reads(t.rest) {
				return nil, false
			}
		case t.word == "set" && t.close < 0:
			target, value, isAssign := strings.Cut(t.rest, "=")
			if reads(value) || !isAssign && reads(target) {
				return nil, false
			}
			if isAssign && !strings.Contains(target, ".") {
				assigned = maps.Clone(assigned)
				for _, n := range setNames(t.rest) {
					assigned[n] = true
				}
			}
		case t.word == "if" && t.close > i:
			// each branch from what is assigned before the if; after it,
			// what every branch assigned (and, without an else, what was)
			var after map[string]bool
			bounds := append(append([]int{i}, t.mids...), t.close)
			hasElse := false
			for k := 0; k+1 < len(bounds); k++ {
				cond := tags[bounds[k]]
				if cond.word == "else" {
					hasElse = true
				} else if reads(cond.rest) {
					return nil, false
				}
				got, ok := definitelyAssigned(tags, bounds[k]+1, bounds[k+1], names, assigned)
				if !ok {
					return nil, false
				}
				after = intersect(after, got)
			}
			if !hasElse {
				after = intersect(after, assigned)
			}
			assigned = after
			i = t.close
		case t.close > i:
			// a nested block: every mention in it is a read
			for k := i; k <= t.close; k++ {
				if reads(tags[k].rest) {
					return nil, false
				}
			}
			i = t.close
		default:
			if reads(t.rest) {
				return nil, false
			}
		}
	}
	return assigned, true
}

// intersect is the names in both a and b, or b when a is nil.
func intersect(a, b map[string]bool) map[string]bool {
	if a == nil {
		return b
	}
	out := make(map[string]bool)
	for n := range a {
		if b[n] {
			out[n] = true
		}
	}
	return out
}

// setNames returns the variables a set tag's text after "set" assigns:
// the names before "=" (or a block set's name), none for a namespace's
// attribute.
func setNames(rest string) []string {
	target, _, _ := strings.Cut(rest, "=")
	if i := strings.IndexByte(target, '|'); i >= 0 {
		target = target[:i] // a block set's filter
	}
	if strings.Contains(target, ".") {
		return nil
	}
	var names []string
	for _, n := range strings.Split(target, ",") {
		n = strings.Trim(n, " \t\r\n()")
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}

// mentionedNames returns the names in a tag's text s: identifiers outside
// string literals that are not an attribute's (after a ".").
func mentionedNames(s string) []string {
	var names []string
	for j, e := range wordsIn(s) {
		if k := spaceStart(s, j); (k == 0 || s[k-1] != '.') && (s[j] < '0' || s[j] > '9') {
			names = append(names, s[j:e])
		}
	}
	return names
}

// cutKeyword reports whether the word kw stands alone in s (outside
// string literals).
func cutKeyword(s, kw string) (before string, found bool) {
	for j, e := range wordsIn(s) {
		if s[j:e] == kw {
			return s[:j], true
		}
	}
	return s, false
}

// wordsIn yields the start and end of each run of identifier bytes
// (isIdentByte: names, keywords, numbers' digits) in a tag's text s,
// outside string literals.
func wordsIn(s string) iter.Seq2[int, int] {
	return func(yield func(start, end int) bool) {
		for j := 0; j < len(s); j++ {
			c := s[j]
			if c == '\'' || c == '"' {
				j = skipQuoted(s, j)
				continue
			}
			if !isIdentByte(c) {
				continue
			}
			e := j
			for e < len(s) && isIdentByte(s[e]) {
				e++
			}
			if !yield(j, e) {
				return
			}
			j = e - 1
		}
	}
}

// withBlockPrefix starts the names of the macros pyWithBlocks renders a
// {% with %} block's body in.
const withBlockPrefix = "kvroute_wb_"

// pyWithBlocks returns src with each {% with a = x, b = y %}body{% endwith %}
// block, which the Go engine does not parse, rewritten as a macro of the
// body taking the block's names as parameters and a call of it with the
// values:
//
//	{%A macro kvroute_wb_N(a, b) B%}body{%C endmacro %}{{ kvroute_wb_N(x, y) }}{# D#}
//
// where A, B, C and D are the with and endwith tags' whitespace control
// markers (as pyFilterBlocks writes them). jinja2 evaluates the values in
// the frame around the block (b = a reads the a from before it) and
// renders the body in a frame of its own, as a macro's call and body are.
// A with tag whose assignments are not names and values (or whose values
// hold a tag delimiter), unmatched tags, and templates with {% raw %} are
// left as they are.
func pyWithBlocks(src string) string {
	if !strings.Contains(src, "endwith") || rawTagRE.MatchString(src) {
		return src
	}
	type tag struct {
		start, end  int
		left, right string
		names, vals []string
		ok          bool
		pair        int
	}
	var tags []tag
	var open []int
	for start, end := range tagsIn(src) {
		if src[start+1] != '%' {
			continue
		}
		left, word, rest, right := splitStatement(src[start+2 : end-2])
		switch word {
		case "with":
			t := tag{start: start, end: end, left: left, right: right, pair: -1, ok: true}
			if rest = strings.TrimSpace(rest); rest != "" {
				for _, a := range splitTopLevel(rest, ',') {
					name, val, ok := cutAssign(a)
					if !ok || !isName(name) || hasDelimiter(val) {
						t.ok = false
						break
					}
					t.names, t.vals = append(t.names, name), append(t.vals, val)
				}
			}
			open = append(open, len(tags))
			tags = append(tags, t)
		case "endwith":
			if len(open) == 0 {
				continue
			}
			o := open[len(open)-1]
			open = open[:len(open)-1]
			if !tags[o].ok || strings.TrimSpace(rest) != "" {
				continue
			}
			tags[o].pair = len(tags)
			tags = append(tags, tag{start: start, end: end, left: left, right: right, pair: o})
		}
	}
	var b strings.Builder
	i, n := 0, 0
	names := make(map[int]string)
	for k, t := range tags {
		if t.pair < 0 {
			continue
		}
		b.WriteString(src[i:t.start])
		i = t.end
		if t.pair > k {
			name := withBlockPrefix + strconv.Itoa(n)
			n++
			names[k] = name
			b.WriteString("{%" + t.left + " macro " + name + "(" + strings.Join(t.names, ", ") + ") " + t.right + "%}")
			continue
		}
		o := tags[t.pair]
		b.WriteString("{%" + t.left + " endmacro %}{{ " + names[t.pair] + "(" + strings.Join(o.vals, ", ") + ") }}{# " + t.right + "#}")
	}
	if i == 0 {
		return src
	}
	b.WriteString(src[i:])
	return b.String()
}

// hasDelimiter reports whether s holds a tag's delimiter ("{{", "}}",
// "{%", "%}", "{#", "#}"), which a value moved into another tag would
// end or open it with.
func hasDelimiter(s string) bool {
	for _, d := range []string{"{{", "}}", "{%", "%}", "{#", "#}"} {
		if strings.Contains(s, d) {
			return true
		}
	}
	return false
}

// splitTopLevel splits s at each sep outside string literals and
// brackets.
func splitTopLevel(s string, sep byte) []string {
	var parts []string
	depth, from := 0, 0
	for j := 0; j < len(s); j++ {
		switch c := s[j]; {
		case c == '\'' || c == '"':
			j = skipQuoted(s, j)
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case c == sep && depth == 0:
			parts = append(parts, s[from:j])
			from = j + 1
		}
	}
	return append(parts, s[from:])
}

// cutAssign splits "name = value" at its "=" (not one of ==, !=, <=, >=),
// both trimmed; ok is false when there is none or either is empty.
func cutAssign(s string) (name, value string, ok bool) {
	for j := 0; j < len(s); j++ {
		switch c := s[j]; {
		case c == '\'' || c == '"':
			j = skipQuoted(s, j)
		case c == '=' && (j+1 >= len(s) || s[j+1] != '=') && (j == 0 || strings.IndexByte("=!<>", s[j-1]) < 0):
			name, value = strings.TrimSpace(s[:j]), strings.TrimSpace(s[j+1:])
			return name, value, name != "" && value != ""
		}
	}
	return "", "", false
}

// isName reports whether s is a name (not a keyword).
func isName(s string) bool {
	if s == "" || '0' <= s[0] && s[0] <= '9' || jinjaKeywords[s] {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isIdentByte(s[i]) {
			return false
		}
	}
	return true
}

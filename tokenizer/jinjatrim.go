package tokenizer

import (
	"iter"
	"strings"
)

// github.com/ardanlabs/jinja (v1.8.0) applies a tag's whitespace control
// to the nearest text on that side even when another tag lies between:
// in `{% if x %}{{ y }}\n{% endif %}` the if's trim_blocks removes the
// "\n" after {{ y }}, which jinja2 keeps (the if is followed by no text at
// all), and `{{ a -}}{{ b }}\n` loses the "\n" too. jinjaTrimGuard puts
// the whitespace jinja2 would remove there anyway between two adjacent
// tags when the first trims rightwards (a block tag's trim_blocks, or
// any tag's "-" marker): a "\n" that both engines remove and that stops
// the Go engine's search (comments trim like statements). The same holds
// leftwards for a "-" marker on the second tag (a " " then). A block tag's lstrip_blocks looking leftwards
// past an expression is not guarded: no text renders empty there in both.
// Templates with {% raw %} are left as they are.
//
// It also drops one newline that ends the template, as jinja2 does (its
// keep_trailing_newline is off in apply_chat_template's environment) and
// the Go engine does not.
func jinjaTrimGuard(src string) string {
	if s, ok := strings.CutSuffix(src, "\n"); ok {
		src = strings.TrimSuffix(s, "\r")
	}
	if rawTagRE.MatchString(src) {
		return src
	}
	if len(src) > 2 && src[0] == '{' && (src[1] == '{' || src[1] == '%' || src[1] == '#') && src[2] != '-' {
		// The Go engine takes the first text as the template's start
		// even after a tag (`{% for %}  {% if %}` loses its spaces):
		// a first text before the first tag, which that tag's added
		// "-" removes in both, is the start instead.
		src = "\n" + src[:2] + "-" + src[2:]
	}
	var b strings.Builder
	i := 0
	for open, end := range tagsIn(src) {
		b.WriteString(src[i:end])
		i = end
		if end+1 >= len(src) || src[end] != '{' || src[end+1] != '{' && src[end+1] != '%' && src[end+1] != '#' {
			continue // no tag right after
		}
		trimRight := src[end-3] == '-'
		block := src[open+1] != '{' // a statement or a comment: trim_blocks applies
		trimLeft := end+2 < len(src) && src[end+2] == '-'
		switch {
		case trimLeft:
			b.WriteByte(' ')
		case block || trimRight:
			b.WriteByte('\n')
		}
	}
	b.WriteString(src[i:])
	return b.String()
}

// tagsIn yields the start and end (just after its closer) of each tag of
// src ({{ }}, {% %} and {# #}) in order, until one is not closed.
func tagsIn(src string) iter.Seq2[int, int] {
	return func(yield func(start, end int) bool) {
		for at := 0; ; {
			start := indexTagOpen(src, at)
			if start < 0 {
				return
			}
			end := tagEnd(src, start)
			if end < 0 || !yield(start, end) {
				return
			}
			at = end
		}
	}
}

// indexTagOpen returns the index of the next "{{", "{%" or "{#" in s at or
// after i, or -1.
func indexTagOpen(s string, i int) int {
	for {
		j := strings.IndexByte(s[i:], '{')
		if j < 0 || i+j+1 >= len(s) {
			return -1
		}
		if c := s[i+j+1]; c == '{' || c == '%' || c == '#' {
			return i + j
		}
		i += j + 1
	}
}

// tagEnd returns the index just after the closer of the tag opened at
// open ("}}", "%}" or "#}"), skipping quoted strings in expressions and
// statements, or -1 when the tag is not closed.
func tagEnd(s string, open int) int {
	closer := "}}"
	switch s[open+1] {
	case '%':
		closer = "%}"
	case '#':
		j := strings.Index(s[open+2:], "#}")
		if j < 0 {
			return -1
		}
		return open + 2 + j + 2
	}
	for i := open + 2; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			for i++; i < len(s) && s[i] != c; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case strings.HasPrefix(s[i:], closer):
			return i + 2
		}
	}
	return -1
}

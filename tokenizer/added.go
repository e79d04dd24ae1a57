package tokenizer

import (
	"slices"
	"unicode"
	"unicode/utf8"
)

// addedMatcher finds added tokens in a text, leftmost-longest as HuggingFace's
// AddedVocabulary does.
type addedMatcher struct {
	byFirst   [256][]*hfAddedToken // candidates by first byte, longest first
	byContent map[string]*hfAddedToken
}

func newAddedMatcher(tokens []hfAddedToken) addedMatcher {
	m := addedMatcher{byContent: make(map[string]*hfAddedToken, len(tokens))}
	for i := range tokens {
		a := &tokens[i]
		if _, dup := m.byContent[a.Content]; dup {
			continue
		}
		m.byContent[a.Content] = a
		m.byFirst[a.Content[0]] = append(m.byFirst[a.Content[0]], a)
	}
	for i := range m.byFirst {
		slices.SortStableFunc(m.byFirst[i], func(a, b *hfAddedToken) int { return len(b.Content) - len(a.Content) })
	}
	return m
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

// matchAt returns the added token whose content starts at s[i], if any.
func (m *addedMatcher) matchAt(s string, i int) *hfAddedToken {
	for _, a := range m.byFirst[s[i]] {
		if len(s)-i < len(a.Content) || s[i:i+len(a.Content)] != a.Content {
			continue
		}
		if a.SingleWord {
			if i > 0 {
				if r, _ := utf8.DecodeLastRuneInString(s[:i]); isWordRune(r) {
					continue
				}
			}
			if e := i + len(a.Content); e < len(s) {
				if r, _ := utf8.DecodeRuneInString(s[e:]); isWordRune(r) {
					continue
				}
			}
		}
		return a
	}
	return nil
}

// split calls fn for each piece of s in order: text between added tokens with
// tok == nil (never empty), and each added token with its token.
func (m *addedMatcher) split(s string, fn func(seg string, tok *hfAddedToken)) {
	if len(m.byContent) == 0 {
		if s != "" {
			fn(s, nil)
		}
		return
	}
	start := 0 // start of the pending text
	for i := 0; i < len(s); i++ {
		if m.byFirst[s[i]] == nil {
			continue
		}
		a := m.matchAt(s, i)
		if a == nil {
			continue
		}
		from, to := i, i+len(a.Content)
		if a.LStrip {
			for from > start {
				r, n := utf8.DecodeLastRuneInString(s[start:from])
				if !unicode.IsSpace(r) {
					break
				}
				from -= n
			}
		}
		if a.RStrip {
			for to < len(s) {
				r, n := utf8.DecodeRuneInString(s[to:])
				if !unicode.IsSpace(r) {
					break
				}
				to += n
			}
		}
		if from > start {
			fn(s[start:from], nil)
		}
		fn(s[from:to], a)
		start = to
		i = to - 1
	}
	if start < len(s) {
		fn(s[start:], nil)
	}
}

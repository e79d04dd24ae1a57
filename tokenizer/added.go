package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedMatcher finds added tokens in a text, leftmost-longest as HuggingFace's
// AddedVocabulary does, with a byte trie.
type addedMatcher struct {
	first     [256]bool  // bytes that start some token
	nodes     []trieNode // nodes[0] is the root
	byContent map[string]*hfAddedToken
}

type trieNode struct {
	labels   []byte  // edge bytes
	children []int32 // child node of each edge
	tok      *hfAddedToken
}

func (n *trieNode) child(b byte) int32 {
	for i, l := range n.labels {
		if l == b {
			return n.children[i]
		}
	}
	return -1
}

// newAddedMatcher returns a matcher of tokens. With normalize non-nil the
// tokens are matched in normalized text by their normalized content, as
// HuggingFace's AddedVocabulary does for tokens marked normalized; byContent
// keeps their content as written.
func newAddedMatcher(tokens []hfAddedToken, normalize func(string) string) addedMatcher {
	m := addedMatcher{
		nodes:     make([]trieNode, 1),
		byContent: make(map[string]*hfAddedToken, len(tokens)),
	}
	for i := range tokens {
		a := &tokens[i]
		if _, dup := m.byContent[a.Content]; dup {
			continue
		}
		m.byContent[a.Content] = a
		pattern := a.Content
		if normalize != nil {
			pattern = normalize(pattern)
		}
		if pattern == "" {
			continue
		}
		m.first[pattern[0]] = true
		n := int32(0)
		for j := 0; j < len(pattern); j++ {
			c := m.nodes[n].child(pattern[j])
			if c < 0 {
				c = int32(len(m.nodes))
				m.nodes = append(m.nodes, trieNode{})
				m.nodes[n].labels = append(m.nodes[n].labels, pattern[j])
				m.nodes[n].children = append(m.nodes[n].children, c)
			}
			n = c
		}
		if m.nodes[n].tok == nil { // two contents may normalize alike: the first wins
			m.nodes[n].tok = a
		}
	}
	return m
}

// isWordRune reports whether r is a word character as the regex \w of Rust's
// regex crate (Unicode's): Alphabetic (letters, letter numbers such as Ⅻ,
// Other_Alphabetic), marks, decimal digits, connector punctuation (_, ‿) and
// the joiners U+200C and U+200D, as of Unicode 16.0 (Go's tables are
// 15.0's: unicode16.go has the rest). HuggingFace's AddedVocabulary checks
// single_word tokens with it; other numbers (², ①) are not word characters.
func isWordRune(r rune) bool {
	if r < utf8.RuneSelf {
		return r == '_' || ('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z')
	}
	return unicode.In(r, unicode.L, unicode.M, unicode.Nd, unicode.Nl, unicode.Pc,
		unicode.Other_Alphabetic, unicode.Join_Control) || unicode.Is(unicode16Word, r)
}

// singleWordOK reports whether a match s[i:e] of a single_word token stands
// alone (no word character touches it).
func singleWordOK(s string, i, e int) bool {
	if i > 0 {
		if r, _ := utf8.DecodeLastRuneInString(s[:i]); isWordRune(r) {
			return false
		}
	}
	if e < len(s) {
		if r, _ := utf8.DecodeRuneInString(s[e:]); isWordRune(r) {
			return false
		}
	}
	return true
}

// matchAt returns the longest added token whose content starts at s[i], and
// the end of its match.
func (m *addedMatcher) matchAt(s string, i int) (best *hfAddedToken, end int) {
	n := int32(0)
	for j := i; j < len(s); j++ {
		if n = m.nodes[n].child(s[j]); n < 0 {
			break
		}
		if a := m.nodes[n].tok; a != nil {
			best, end = a, j+1
		}
	}
	return best, end
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
		if !m.first[s[i]] {
			continue
		}
		a, to := m.matchAt(s, i)
		if a == nil {
			continue
		}
		if a.SingleWord && !singleWordOK(s, i, to) {
			// Rejected whole, as HuggingFace's leftmost-longest matcher
			// does: no shorter or overlapping token is looked for in it.
			i = to - 1
			continue
		}
		from := i
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

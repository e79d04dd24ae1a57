package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Hand-written parsers for the two big fields of a tokenizer.json, the vocab
// (~150k entries) and the merges (~150-280k), 5-10x faster than
// encoding/json's reflection. The input has already been checked to be valid
// JSON by encoding/json (they run on json.RawMessage), but they still verify
// every byte they read and return errors, never panic.

type jsonScanner struct {
	b []byte
	i int
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) expect(c byte) error {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != c {
		return fmt.Errorf("offset %d: want %q", s.i, c)
	}
	s.i++
	return nil
}

// peek returns the next non-space byte, or 0 at the end.
func (s *jsonScanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *jsonScanner) str() (string, error) {
	if err := s.expect('"'); err != nil {
		return "", err
	}
	start := s.i
	escaped := false
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			escaped = true
			s.i += 2
			continue
		case '"':
			raw := s.b[start:s.i]
			s.i++
			if !escaped {
				return string(raw), nil
			}
			var out string
			if err := json.Unmarshal(s.b[start-1:s.i], &out); err != nil {
				return "", err
			}
			return out, nil
		}
		s.i++
	}
	return "", errors.New("unterminated string")
}

func (s *jsonScanner) uint32() (uint32, error) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	n, err := strconv.ParseUint(string(s.b[start:s.i]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("offset %d: want a token id: %w", start, err)
	}
	return uint32(n), nil
}

// hfVocab is a tokenizer.json vocab: {"token": id, ...}.
type hfVocab map[string]uint32

func (v *hfVocab) UnmarshalJSON(data []byte) error {
	s := jsonScanner{b: data}
	if s.peek() == 'n' { // null
		*v = nil
		return nil
	}
	if err := s.expect('{'); err != nil {
		return fmt.Errorf("vocab: %w", err)
	}
	m := make(hfVocab, len(data)/16)
	if s.peek() == '}' {
		*v = m
		return nil
	}
	for {
		k, err := s.str()
		if err != nil {
			return fmt.Errorf("vocab: %w", err)
		}
		if err := s.expect(':'); err != nil {
			return fmt.Errorf("vocab: %w", err)
		}
		id, err := s.uint32()
		if err != nil {
			return fmt.Errorf("vocab %q: %w", k, err)
		}
		m[k] = id
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			*v = m
			return nil
		default:
			return fmt.Errorf("vocab: offset %d: want ',' or '}'", s.i)
		}
	}
}

// hfMerges reads both merge encodings: ["a b", ...] and [["a", "b"], ...].
type hfMerges [][2]string

func (m *hfMerges) UnmarshalJSON(data []byte) error {
	s := jsonScanner{b: data}
	if s.peek() == 'n' { // null
		*m = nil
		return nil
	}
	if err := s.expect('['); err != nil {
		return fmt.Errorf("merges: %w", err)
	}
	out := make(hfMerges, 0, len(data)/12)
	if s.peek() == ']' {
		*m = out
		return nil
	}
	for {
		var pair [2]string
		switch s.peek() {
		case '"':
			str, err := s.str()
			if err != nil {
				return fmt.Errorf("merge %d: %w", len(out), err)
			}
			a, b, ok := cutSpace(str)
			if !ok {
				return fmt.Errorf("merge %d %q has no space", len(out), str)
			}
			pair = [2]string{a, b}
		case '[':
			s.i++
			a, err := s.str()
			if err == nil {
				err = s.expect(',')
			}
			var b string
			if err == nil {
				b, err = s.str()
			}
			if err == nil {
				err = s.expect(']')
			}
			if err != nil {
				return fmt.Errorf("merge %d: want a pair of strings: %w", len(out), err)
			}
			pair = [2]string{a, b}
		default:
			return fmt.Errorf("merge %d: offset %d: want a string or a pair", len(out), s.i)
		}
		out = append(out, pair)
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			*m = out
			return nil
		default:
			return fmt.Errorf("merges: offset %d: want ',' or ']'", s.i)
		}
	}
}

func cutSpace(s string) (a, b string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

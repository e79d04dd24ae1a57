package emulator

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/tokenizer"
)

// textID maps an engine output token id to a regular id of the built-in
// tokenizer, so that every generated token renders to a pseudo-word (the
// engine's vocabulary differs from the tokenizer's, and its low ids are the
// tokenizer's special tokens).
func textID(t uint32) uint32 {
	const n = tokenizer.BuiltinVocabSize - tokenizer.BuiltinFirstRegular
	return tokenizer.BuiltinFirstRegular + t%n
}

// builtinWords renders the regular ids of the built-in tokenizer from a
// table of 85 syllables, so that rendering a generated token is a few
// multiplications and loads from a table that stays in the L1 cache (a
// table of every id, 1 MiB, costs a cache miss per token in a busy fleet).
// The built-in Decode renders regular id 16+r as a full stop when r%61 ==
// 0, a comma when r%53 == 0, and otherwise as a space and two syllables:
// r's two low base-85 digits, each a consonant and a vowel (17 x 5). Decode
// has no state across ids, so the concatenation equals Decode of the
// sequence. The table is built from Decode and checked against it for
// every regular id on first use (a few milliseconds); ok is false
// (renderTokens then calls Decode) if that layout ever changes. A word is
// packed in one uint64, its bytes from the low end and its length in the top
// byte: one 8-byte store per token.
var builtinWords = sync.OnceValues(func() (*wordTables, bool) {
	tok := tokenizer.Builtin()
	id := []uint32{0}
	word := func(r uint32) (uint64, bool) {
		id[0] = tokenizer.BuiltinFirstRegular + r
		w := tok.Decode(id)
		if len(w) > 7 {
			return 0, false
		}
		var b [8]byte
		copy(b[:], w)
		b[7] = byte(len(w))
		return binary.LittleEndian.Uint64(b[:]), true
	}
	wt := new(wordTables)
	var ok1, ok2 bool
	wt.stop, ok1 = word(0)
	wt.comma, ok2 = word(53)
	if !ok1 || !ok2 {
		return nil, false
	}
	for a := range uint32(syllables) {
		// The word of an r = a + 85k that is neither a multiple of 61 nor
		// of 53: its first syllable is a's.
		r := a + syllables
		for r%61 == 0 || r%53 == 0 {
			r += syllables
		}
		w, ok := word(r)
		if !ok || w>>56 != 5 {
			return nil, false
		}
		wt.syl[a] = uint16(w >> 8)
	}
	const n = tokenizer.BuiltinVocabSize - tokenizer.BuiltinFirstRegular
	for r := uint32(0); r < n; r++ {
		if w, ok := word(r); !ok || w != wt.word(r) {
			return nil, false
		}
	}
	return wt, true
})

// syllables is the number of syllables: 17 consonants x 5 vowels.
const syllables = 85

// wordTables are builtinWords' tables.
type wordTables struct {
	stop, comma uint64
	syl         [syllables]uint16 // two bytes each
}

// word returns the packed text of regular id 16+r.
func (wt *wordTables) word(r uint32) uint64 {
	switch {
	case r%61 == 0:
		return wt.stop
	case r%53 == 0:
		return wt.comma
	}
	return 5<<56 | uint64(wt.syl[r/syllables%syllables])<<24 | uint64(wt.syl[r%syllables])<<8 | ' '
}

// renderTokens appends the text of generated tokens to dst.
func renderTokens(tok tokenizer.Tokenizer, dst []byte, ids []uint32, scratch []uint32) ([]byte, []uint32) {
	if tok == tokenizer.Builtin() {
		if wt, ok := builtinWords(); ok {
			const n = tokenizer.BuiltinVocabSize - tokenizer.BuiltinFirstRegular
			dst = slices.Grow(dst, 7*len(ids)+8) // room for each 8-byte store
			k := len(dst)
			buf := dst[:cap(dst)]
			for _, t := range ids {
				w := wt.word(t % n) // textID(t) - BuiltinFirstRegular
				binary.LittleEndian.PutUint64(buf[k:], w)
				k += int(w >> 56)
			}
			return dst[:k], scratch
		}
	}
	scratch = scratch[:0]
	for _, t := range ids {
		scratch = append(scratch, textID(t))
	}
	return append(dst, tok.Decode(scratch)...), scratch
}

// appendEncoder is the built-in tokenizer's Encode into a caller's slice.
type appendEncoder interface {
	AppendEncode(dst []uint32, text string) []uint32
}

// encode is Tokenizer.Encode; for the built-in tokenizer the ids go into a
// slice sized for English text (about 3.6 bytes a token) up front, so that
// it does not grow (Encode's starts at one id per 4 bytes).
func (s *Server) encode(text string) []uint32 {
	if s.cfg.Tokenizer == tokenizer.Builtin() {
		if ae, ok := s.cfg.Tokenizer.(appendEncoder); ok {
			return ae.AppendEncode(make([]uint32, 0, len(text)/3+8), text)
		}
	}
	return s.cfg.Tokenizer.Encode(text)
}

// encodeChat is encode(tokenizer.RenderChatML(msgs, true)) with the prompt
// rendered into a recycled buffer (the ids are all that is kept).
func (s *Server) encodeChat(msgs []tokenizer.Message) []uint32 {
	buf := getBody()
	*buf = appendChatML((*buf)[:0], msgs)
	ids := s.encode(bytesString(*buf))
	putBody(buf)
	return ids
}

// appendChatML appends tokenizer.RenderChatML(msgs, true) to dst (a test
// compares the two).
func appendChatML(dst []byte, msgs []tokenizer.Message) []byte {
	n := len(tokenizer.ChatMLStart) + len("assistant\n")
	for _, m := range msgs {
		n += len(tokenizer.ChatMLStart) + len(m.Role) + 1 + len(m.Content) + len(tokenizer.ChatMLEnd) + 1
	}
	dst = slices.Grow(dst, n)
	for _, m := range msgs {
		dst = append(dst, tokenizer.ChatMLStart...)
		dst = append(dst, m.Role...)
		dst = append(dst, '\n')
		dst = append(dst, m.Content...)
		dst = append(dst, tokenizer.ChatMLEnd...)
		dst = append(dst, '\n')
	}
	dst = append(dst, tokenizer.ChatMLStart...)
	return append(dst, "assistant\n"...)
}

// stopMatch finds the earliest stop string in text that ends at or after
// from (the first byte not checked before). It returns the index where the
// match starts and the stop string, or -1.
func stopMatch(text []byte, from int, stops []string) (int, string) {
	best, which := -1, ""
	for _, s := range stops {
		if s == "" {
			continue
		}
		start := max(0, from-len(s)+1)
		if i := strings.Index(string(text[start:]), s); i >= 0 {
			if j := start + i; best < 0 || j < best {
				best, which = j, s
			}
		}
	}
	return best, which
}

// mix64 is SplitMix64's finaliser: a cheap, well-spread hash of x.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// eosAt draws the position of the model's EOS token for a request with the
// given seed: geometric with the given mean, at least 1. mean <= 0 means the
// model never emits EOS (0).
func eosAt(seed uint64, mean float64) int {
	if mean <= 0 {
		return 0
	}
	u := (float64(mix64(seed^0x656f73)>>11) + 0.5) / (1 << 53) // (0,1)
	n := 1 + int(math.Floor(math.Log(u)/math.Log1p(-1/math.Max(mean, 1.0000001))))
	return max(1, n)
}

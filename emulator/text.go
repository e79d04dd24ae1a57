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

// builtinWords is the text of every regular id of the built-in tokenizer,
// built on first use (a few milliseconds): rendering generated tokens is
// then a table lookup per token. The built-in Decode has no state across
// ids, so the concatenation equals Decode of the sequence. Every word is at
// most 7 bytes (5 today), so each is packed in one uint64, its bytes from
// the low end and its length in the top byte: one 1 MiB table, one load
// and one 8-byte store per token. ok is false if a word were longer.
var builtinWords = sync.OnceValues(func() ([]uint64, bool) {
	tok := tokenizer.Builtin()
	words := make([]uint64, tokenizer.BuiltinVocabSize)
	id := []uint32{0}
	for i := tokenizer.BuiltinFirstRegular; i < tokenizer.BuiltinVocabSize; i++ {
		id[0] = uint32(i)
		w := tok.Decode(id)
		if len(w) > 7 {
			return nil, false
		}
		var b [8]byte
		copy(b[:], w)
		b[7] = byte(len(w))
		words[i] = binary.LittleEndian.Uint64(b[:])
	}
	return words, true
})

// renderTokens appends the text of generated tokens to dst.
func renderTokens(tok tokenizer.Tokenizer, dst []byte, ids []uint32, scratch []uint32) ([]byte, []uint32) {
	if tok == tokenizer.Builtin() {
		if words, ok := builtinWords(); ok {
			dst = slices.Grow(dst, 7*len(ids)+8) // room for each 8-byte store
			n := len(dst)
			buf := dst[:cap(dst)]
			for _, t := range ids {
				w := words[textID(t)]
				binary.LittleEndian.PutUint64(buf[n:], w)
				n += int(w >> 56)
			}
			return dst[:n], scratch
		}
	}
	scratch = scratch[:0]
	for _, t := range ids {
		scratch = append(scratch, textID(t))
	}
	return append(dst, tok.Decode(scratch)...), scratch
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

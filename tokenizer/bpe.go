package tokenizer

import (
	"container/heap"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// byteLevelRunes maps each byte to the rune that GPT-2's byte-level BPE uses
// for it: printable Latin-1 bytes map to themselves, the others to U+0100+n.
var byteLevelRunes, byteLevelBytes = func() (enc [256]rune, dec map[rune]byte) {
	dec = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			enc[b] = rune(b)
		} else {
			enc[b] = rune(256 + n)
			n++
		}
		dec[enc[b]] = byte(b)
	}
	return enc, dec
}()

// appendByteLevel appends the byte-level form of s (each byte as its rune).
func appendByteLevel(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = utf8.AppendRune(dst, byteLevelRunes[s[i]])
	}
	return dst
}

// bpe is a byte-level BPE model: vocabulary, merge ranks, and a cache of the
// ids of recent words. Safe for concurrent use.
type bpe struct {
	vocab        map[string]uint32
	byteIDs      [256]uint32 // id of each single byte's token
	hasByte      [256]bool
	merges       map[uint64]mergeRule // (left id, right id) -> rule
	ignoreMerges bool                 // a word found whole in vocab is one token

	// cache holds the ids of recent words: a direct-mapped table indexed by
	// the word's hash, read and written without locks (a slot is replaced
	// whole), so it is bounded and safe for concurrent use.
	cache []atomic.Pointer[wordEntry]
}

type wordEntry struct {
	word string
	ids  []uint32
}

type mergeRule struct {
	rank, id uint32
}

// wordCacheSlots is the size of the word cache; maxCachedWord the longest
// word (in bytes) it holds.
const (
	wordCacheSlots = 1 << 16
	maxCachedWord  = 64
)

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// appendWord appends the ids of one pre-token (raw bytes) to dst.
func (m *bpe) appendWord(dst []uint32, word string) []uint32 {
	if len(word) == 1 {
		if m.hasByte[word[0]] {
			return append(dst, m.byteIDs[word[0]])
		}
		return dst
	}
	if len(word) > maxCachedWord || m.cache == nil {
		return m.encodeWord(dst, word)
	}
	slot := &m.cache[xxh3.HashString(word)&(wordCacheSlots-1)]
	if e := slot.Load(); e != nil && e.word == word {
		return append(dst, e.ids...)
	}
	start := len(dst)
	dst = m.encodeWord(dst, word)
	// Clone: word points into the caller's text, which must not be retained.
	slot.Store(&wordEntry{word: strings.Clone(word), ids: append([]uint32(nil), dst[start:]...)})
	return dst
}

type symbol struct {
	id         uint32
	prev, next int32 // neighbours, -1 at the ends
	dead       bool
}

type candidate struct {
	rank, id uint32
	pos      int32 // left symbol
	left     uint32
	right    uint32
}

type candHeap []candidate

func (h candHeap) Len() int { return len(h) }
func (h candHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h candHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// encodeWord runs the BPE merges on word, lowest rank first and leftmost
// first among equal ranks, as HuggingFace tokenizers does.
func (m *bpe) encodeWord(dst []uint32, word string) []uint32 {
	if m.ignoreMerges {
		var buf [256]byte
		if id, ok := m.vocab[string(appendByteLevel(buf[:0], word))]; ok {
			return append(dst, id)
		}
	}
	if len(word) <= smallWord {
		return m.encodeSmall(dst, word)
	}
	return m.encodeHeap(dst, word)
}

// encodeHeap is encodeWord for any length: merge candidates in a heap, symbols
// in a linked list, O(n log n).
func (m *bpe) encodeHeap(dst []uint32, word string) []uint32 {
	syms := make([]symbol, 0, len(word))
	for i := 0; i < len(word); i++ {
		if !m.hasByte[word[i]] {
			continue // a byte with no token: dropped (no such vocabulary in practice)
		}
		syms = append(syms, symbol{id: m.byteIDs[word[i]], prev: int32(len(syms) - 1), next: int32(len(syms) + 1)})
	}
	if len(syms) == 0 {
		return dst
	}
	syms[len(syms)-1].next = -1
	h := make(candHeap, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, candidate{rank: r.rank, id: r.id, pos: int32(i), left: syms[i].id, right: syms[i+1].id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(candidate)
		l := &syms[c.pos]
		if l.dead || l.id != c.left || l.next < 0 {
			continue
		}
		r := &syms[l.next]
		if r.id != c.right {
			continue
		}
		// Merge r into l.
		l.id = c.id
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = c.pos
		}
		if l.prev >= 0 {
			p := &syms[l.prev]
			if mr, ok := m.merges[pairKey(p.id, l.id)]; ok {
				heap.Push(&h, candidate{rank: mr.rank, id: mr.id, pos: l.prev, left: p.id, right: l.id})
			}
		}
		if l.next >= 0 {
			n := &syms[l.next]
			if mr, ok := m.merges[pairKey(l.id, n.id)]; ok {
				heap.Push(&h, candidate{rank: mr.rank, id: mr.id, pos: c.pos, left: l.id, right: n.id})
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

// smallWord is the longest word (in bytes) encoded by encodeSmall.
const smallWord = 32

const noMerge = ^uint32(0)

// encodeSmall is encodeWord for short words, without allocations: the ranks
// of adjacent pairs live in an array that is scanned for the lowest (leftmost
// on ties) and updated around each merge.
func (m *bpe) encodeSmall(dst []uint32, word string) []uint32 {
	var (
		ids   [smallWord]uint32
		ranks [smallWord]uint32 // rank of the pair (i, i+1); noMerge if none
		into  [smallWord]uint32 // id of the merged pair
	)
	n := 0
	for i := 0; i < len(word); i++ {
		if m.hasByte[word[i]] {
			ids[n] = m.byteIDs[word[i]]
			n++
		}
	}
	pair := func(i int) {
		if r, ok := m.merges[pairKey(ids[i], ids[i+1])]; ok {
			ranks[i], into[i] = r.rank, r.id
		} else {
			ranks[i] = noMerge
		}
	}
	for i := 0; i+1 < n; i++ {
		pair(i)
	}
	for n > 1 {
		best := -1
		bestRank := noMerge
		for i := 0; i+1 < n; i++ {
			if ranks[i] < bestRank {
				best, bestRank = i, ranks[i]
			}
		}
		if best < 0 {
			break
		}
		ids[best] = into[best]
		copy(ids[best+1:n-1], ids[best+2:n])
		copy(ranks[best+1:n-1], ranks[best+2:n])
		copy(into[best+1:n-1], into[best+2:n])
		n--
		if best > 0 {
			pair(best - 1)
		}
		if best+1 < n {
			pair(best)
		}
	}
	return append(dst, ids[:n]...)
}

package tokenizer

import (
	"container/list"
	"sync"

	"github.com/zeebo/xxh3"
)

// CacheConfig configures a Cache. Zero values take the defaults.
type CacheConfig struct {
	// MaxTokens bounds the cache's memory, in token ids' worth (4 bytes
	// each): every id held counts one, and every entry (a cached segment)
	// counts entryCost more for its bookkeeping, so that the cache holds
	// about 4 x MaxTokens bytes whatever its segments' lengths. Least
	// recently used entries are evicted beyond it. Default 1<<20 (4 MiB).
	MaxTokens int
	// MinSegmentBytes is the shortest segment worth caching; shorter ones are
	// encoded directly (their words hit the tokenizer's word cache anyway).
	// Default 64.
	MinSegmentBytes int
}

// CacheStats counts a Cache's work.
type CacheStats struct {
	Hits, Misses        uint64 // cached segments found / encoded and stored
	HitBytes, MissBytes uint64 // text bytes served from the cache / encoded
	Entries, Tokens     int    // current size: entries, and the token ids they hold
}

// entryCost is what an entry's bookkeeping (its LRU element, the entry and
// its map slot: about 175 bytes on 64-bit platforms) counts against
// CacheConfig.MaxTokens, in token ids of 4 bytes. Counting the ids alone,
// a cache of short segments took 51 MB at the default budget of 1<<20 ids
// (313,099 entries of 3.35 ids each on Llama 3).
const entryCost = 44

// Cache encodes text like its HF tokenizer, reusing the token ids of text
// segments it has seen, so that each turn of a multi-turn conversation only
// tokenizes what is new.
//
// Why this is exact: a HuggingFace tokenizer first cuts the text at added
// tokens (<|im_start|>, <|im_end|>, <|eot_id|>, ...), and encodes each piece
// between them independently (normalization, pre-tokenization and BPE never
// look across an added token). Chat templates end and start every message
// with such tokens. Cache keys each piece by a 128-bit hash of its text and
// stores its ids, so a conversation's earlier messages (and a system prompt or
// document shared by many conversations, wherever it appears) are looked up
// rather than re-encoded. This covers the longest previously tokenized
// message-boundary prefix, which a prefix-keyed cache would reuse, and more.
// For the Llama 3 and Qwen pre-tokenizer, long segments are also cut at line
// starts (a newline followed by an ASCII letter), where that pre-tokenizer
// always ends a piece, so a document shared by completion prompts without
// special tokens is reused paragraph by paragraph.
// Encode(text) always equals the tokenizer's Encode(text); tests check it.
//
// A Cache is safe for concurrent use.
type Cache struct {
	tok       *HF       // nil in front of the built-in tokenizer
	seg       segmenter // tok, or the built-in tokenizer
	maxTokens int       // the budget: ids held + entryCost per entry
	minBytes  int
	lineCuts  bool // segments are also cut at line starts (see lineCutsExact)

	mu     sync.Mutex // protects the fields below
	lru    list.List  // of *cacheEntry, most recent first
	byKey  map[xxh3.Uint128]*list.Element
	tokens int // token ids held
	stats  CacheStats
}

type cacheEntry struct {
	key xxh3.Uint128
	ids []uint32
}

// NewCache returns an empty cache in front of tok.
func NewCache(tok *HF, cfg CacheConfig) *Cache {
	c := newCache(tok, cfg)
	c.tok, c.lineCuts = tok, lineCutsExact(tok)
	return c
}

// NewBuiltinCache returns an empty cache in front of the built-in tokenizer
// (Builtin). It is exact for the same reason: the built-in tokenizer starts
// a chunk after every special token and ends one before it (the last space
// before a special token stays with its whitespace, as at the end of the
// text), so the text between special tokens encodes alone. Its
// EncodeAddSpecial is Encode (the built-in tokenizer adds no special token)
// and it has no chat template (RenderChat uses ChatML).
func NewBuiltinCache(cfg CacheConfig) *Cache {
	return newCache(builtin{}, cfg)
}

func newCache(seg segmenter, cfg CacheConfig) *Cache {
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 1 << 20
	}
	if cfg.MinSegmentBytes <= 0 {
		cfg.MinSegmentBytes = 64
	}
	return &Cache{seg: seg, maxTokens: cfg.MaxTokens, minBytes: cfg.MinSegmentBytes,
		byKey: make(map[xxh3.Uint128]*list.Element)}
}

// segmenter is what a Cache needs of its tokenizer: the text cut at its
// special tokens (split calls fn with each segment between them, and with
// each special token's id and special true), and the ids of a segment.
type segmenter interface {
	Tokenizer
	split(text string, fn func(seg string, id uint32, special bool))
	appendSegment(dst []uint32, seg string) []uint32
}

func (t *HF) split(text string, fn func(seg string, id uint32, special bool)) {
	t.added.split(text, func(seg string, tok *hfAddedToken) {
		if tok != nil {
			fn("", tok.ID, true)
			return
		}
		fn(seg, 0, false)
	})
}

var _ Tokenizer = (*Cache)(nil)

// Encode returns the ids of text, equal to the tokenizer's Encode(text).
func (c *Cache) Encode(text string) []uint32 {
	return c.AppendEncode(make([]uint32, 0, len(text)/3+4), text)
}

// EncodeAddSpecial is the tokenizer's EncodeAddSpecial through the cache
// (a completion prompt, as vLLM encodes it).
func (c *Cache) EncodeAddSpecial(text string) []uint32 {
	t := c.tok
	if t == nil {
		return c.Encode(text)
	}
	ids := make([]uint32, 0, len(text)/3+4+len(t.prefixIDs)+len(t.suffixIDs))
	ids = append(ids, t.prefixIDs...)
	ids = c.AppendEncode(ids, text)
	return append(ids, t.suffixIDs...)
}

// Decode is the tokenizer's Decode.
func (c *Cache) Decode(ids []uint32) string { return c.seg.Decode(ids) }

// Tokenizer returns the HuggingFace tokenizer the cache is in front of (nil
// for NewBuiltinCache's).
func (c *Cache) Tokenizer() *HF { return c.tok }

// ChatTemplate is the tokenizer's ChatTemplate (ErrNoChatTemplate for the
// built-in tokenizer).
func (c *Cache) ChatTemplate() (*ChatTemplate, error) {
	if c.tok == nil {
		return nil, ErrNoChatTemplate
	}
	return c.tok.ChatTemplate()
}

// VocabSize is the tokenizer's VocabSize.
func (c *Cache) VocabSize() int {
	if c.tok == nil {
		return BuiltinVocabSize
	}
	return c.tok.VocabSize()
}

// EOS is the tokenizer's EOS.
func (c *Cache) EOS() (uint32, bool) {
	if c.tok == nil {
		return builtin{}.EOS()
	}
	return c.tok.EOS()
}

// AppendEncode appends the ids of text to dst.
func (c *Cache) AppendEncode(dst []uint32, text string) []uint32 {
	if b, ok := c.seg.(builtin); ok {
		// A direct call: the callback (and dst, which it updates) stay on
		// the stack instead of two allocations per call.
		b.split(text, func(seg string, id uint32, special bool) { dst = c.appendPiece(dst, seg, id, special) })
		return dst
	}
	return c.appendSplit(dst, text)
}

// appendSplit is AppendEncode through the segmenter's split.
func (c *Cache) appendSplit(dst []uint32, text string) []uint32 {
	c.seg.split(text, func(seg string, id uint32, special bool) { dst = c.appendPiece(dst, seg, id, special) })
	return dst
}

// appendPiece appends the ids of one piece of split's: a special token's
// id, or a segment's ids.
func (c *Cache) appendPiece(dst []uint32, seg string, id uint32, special bool) []uint32 {
	switch {
	case special:
		return append(dst, id)
	case len(seg) < c.minBytes:
		return c.seg.appendSegment(dst, seg)
	case c.lineCuts:
		return c.appendLines(dst, seg)
	}
	return c.appendCached(dst, seg)
}

// appendLines cuts seg into pieces of at least minBytes at line starts (a
// newline followed by an ASCII letter) and looks each piece up.
func (c *Cache) appendLines(dst []uint32, seg string) []uint32 {
	start := 0
	for p := start + c.minBytes; p < len(seg); p++ {
		if seg[p-1] == '\n' && isASCIILetter(seg[p]) {
			dst = c.appendCached(dst, seg[start:p])
			start = p
			p += c.minBytes - 1
		}
	}
	if len(seg)-start < c.minBytes {
		return c.seg.appendSegment(dst, seg[start:])
	}
	return c.appendCached(dst, seg[start:])
}

func isASCIILetter(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

// lineCutsExact reports whether a segment of tok's text may be cut before an
// ASCII letter that follows a newline without changing its ids: true for the
// cl100k-family pre-tokenizer alone (no alternative of its pattern matches
// across such a position: the piece ending in the newline cannot take a
// letter, and the next one starts at the letter), with a Unicode
// normalization form or no normalizer (an ASCII letter composes with nothing
// before it) and no added tokens matched after normalization.
func lineCutsExact(tok *HF) bool {
	if len(tok.splitters) != 1 || tok.prefixSp || len(tok.addedNorm.byContent) > 0 {
		return false
	}
	_, ok := tok.splitters[0].(llamaSplitter)
	return ok
}

func (c *Cache) appendCached(dst []uint32, seg string) []uint32 {
	key := xxh3.HashString128(seg)
	c.mu.Lock()
	if e, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(e)
		dst = append(dst, e.Value.(*cacheEntry).ids...)
		c.stats.Hits++
		c.stats.HitBytes += uint64(len(seg))
		c.mu.Unlock()
		return dst
	}
	c.mu.Unlock()

	start := len(dst)
	dst = c.seg.appendSegment(dst, seg)
	n := len(dst) - start
	if n+entryCost > c.maxTokens {
		return dst
	}
	ids := make([]uint32, n)
	copy(ids, dst[start:])

	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Misses++
	c.stats.MissBytes += uint64(len(seg))
	if _, ok := c.byKey[key]; ok { // stored meanwhile by another goroutine
		return dst
	}
	c.byKey[key] = c.lru.PushFront(&cacheEntry{key: key, ids: ids})
	c.tokens += n
	for c.tokens+entryCost*len(c.byKey) > c.maxTokens {
		back := c.lru.Back()
		e := back.Value.(*cacheEntry)
		c.lru.Remove(back)
		delete(c.byKey, e.key)
		c.tokens -= len(e.ids)
	}
	return dst
}

// Stats returns the counters and the current size.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Entries, s.Tokens = len(c.byKey), c.tokens
	return s
}

package workload

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/zeebo/xxh3"
)

// TraceBlockSize is the block size, in tokens, of Mooncake trace hash ids.
const TraceBlockSize = 512

// MaxLen is the longest prompt or output, in tokens, a trace line may
// give (ReadTrace) and the longest length a generator parameter may give
// (Param.Max): 1Mi tokens, the context of the longest-context models
// commonly served (the built-in engine profiles hold 128k). Above it a
// request's prompt only takes seconds to hash, and gigabytes, before the
// engines refuse it.
const MaxLen = 1 << 20

// Synthetic token space: segment tokens are drawn uniformly from
// [FirstTokenID, FirstTokenID+NumTokenIDs), valid ids in every common
// vocabulary. There is one id per synthetic word (see TokenWord), so a
// prompt's tokens and its text determine each other. A block of 16 tokens
// still has 2^128 possible contents.
const (
	FirstTokenID = 1000
	NumTokenIDs  = 256
)

// Segment is a run of prompt tokens named by a content key: its tokens are
// the first Len tokens of the deterministic stream keyed by Key (see
// SegmentTokens). Two segments with the same key and length have the same
// tokens and text, so prompts built from the same segments share a prefix.
type Segment struct {
	Key uint64
	Len int
}

// Request is one request of a workload: when it arrives, who sends it, its
// prompt and how many tokens it asks for. It is shared by the simulator and
// the load generator.
//
// The prompt is given in one of three forms, in order of precedence:
// explicit Tokens, explicit Text, or Segments (the synthetic form every trace
// and generator produces). Tokens/PromptTokens and Text/PromptText
// materialise whichever form is present.
type Request struct {
	// ID is unique within the workload ("r000042" by default).
	ID string
	// Arrival is the request's arrival offset from the start of the workload.
	Arrival time.Duration
	// Session groups the turns of one conversation ("" = none).
	Session string
	// Tenant names the sender for fairness experiments ("" = default).
	Tenant string
	// Adapter names the LoRA adapter the request is for ("" = the base
	// model): the router routes it in the base model's pool to an engine
	// that serves the adapter (kvroute.Request.Adapter), and the engine
	// keys its blocks with the name (engine.Request.LoRA), so its prompt
	// shares no cached block with the base model's or another adapter's
	// (BlockHashes keys it so too).
	Adapter string
	// PromptLen is the prompt length in tokens.
	PromptLen int
	// OutputLen is the number of tokens to generate (max_tokens, with EOS
	// ignored where the server allows it).
	OutputLen int
	// Segments describe a synthetic prompt; their lengths sum to PromptLen.
	Segments []Segment
	// HashIDs are the trace's 512-token block ids (Mooncake hash_ids) when
	// the request came from, or was written to, a trace; nil otherwise.
	HashIDs []uint64
	// Tokens, when set, is the literal prompt in token ids.
	Tokens []uint32
	// Text, when set, is the literal prompt text.
	Text string
}

// Validate reports whether the request is internally consistent.
func (r *Request) Validate() error {
	if r.PromptLen < 0 || r.OutputLen < 0 {
		return fmt.Errorf("workload: request %q: negative length (prompt %d, output %d)", r.ID, r.PromptLen, r.OutputLen)
	}
	if r.Arrival < 0 {
		return fmt.Errorf("workload: request %q: negative arrival %v", r.ID, r.Arrival)
	}
	if r.Tokens != nil && len(r.Tokens) != r.PromptLen {
		return fmt.Errorf("workload: request %q: %d tokens but prompt length %d", r.ID, len(r.Tokens), r.PromptLen)
	}
	if len(r.Segments) > 0 {
		n := 0
		for _, s := range r.Segments {
			if s.Len <= 0 {
				return fmt.Errorf("workload: request %q: segment of length %d", r.ID, s.Len)
			}
			n += s.Len
		}
		if n != r.PromptLen {
			return fmt.Errorf("workload: request %q: segments cover %d tokens but prompt length %d", r.ID, n, r.PromptLen)
		}
	}
	return nil
}

// PromptTokens returns the prompt as token ids: Tokens if set, else the
// segments' synthetic tokens. It returns nil for a text-only request.
func (r *Request) PromptTokens() []uint32 {
	if r.Tokens != nil {
		return r.Tokens
	}
	if len(r.Segments) == 0 {
		return nil
	}
	out := make([]uint32, 0, r.PromptLen)
	for _, s := range r.Segments {
		out = AppendSegmentTokens(out, s)
	}
	return out
}

// PromptText returns the prompt as text: Text if set, else the words of the
// prompt's tokens (see TokenWord), one word per token separated by spaces.
func (r *Request) PromptText() string {
	if r.Text != "" || (r.Tokens == nil && len(r.Segments) == 0) {
		return r.Text
	}
	var b strings.Builder
	b.Grow(r.PromptLen * 7)
	if r.Tokens != nil {
		for i, t := range r.Tokens {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(TokenWord(t))
		}
		return b.String()
	}
	first := true
	var buf []uint32
	for _, s := range r.Segments {
		buf = AppendSegmentTokens(buf[:0], s)
		for _, t := range buf {
			if !first {
				b.WriteByte(' ')
			}
			first = false
			b.WriteString(TokenWord(t))
		}
	}
	return b.String()
}

// splitmix64 is the SplitMix64 step: a fast, well-mixed 64-bit generator
// and finaliser.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// AppendSegmentTokens appends the tokens of s to dst: token i is drawn from
// a SplitMix64 stream seeded by s.Key, so equal keys give equal tokens and a
// shorter segment is a prefix of a longer one with the same key.
func AppendSegmentTokens(dst []uint32, s Segment) []uint32 {
	state := splitmix64(s.Key ^ 0x6b76726f757465) // "kvroute"
	for range s.Len {
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		dst = append(dst, FirstTokenID+uint32(z%NumTokenIDs))
	}
	return dst
}

// TokenWord returns the word that stands for token t in synthetic text:
// one of 256 distinct common English words of at most five letters, chosen
// by t mod 256 (a bijection on the synthetic ids). Equal tokens give equal words, so equal segments give equal
// text. The built-in tokenizer (package tokenizer) encodes every such word,
// and every " word", as exactly one token, so a prompt's text encodes to
// exactly PromptLen built-in tokens with block boundaries where the
// segments put them; BPE vocabularies also spend about one token per word.
func TokenWord(t uint32) string { return words[t%uint32(len(words))] }

// BlockHashes appends to dst the chained 64-bit hashes of the prompt's full
// blocks of blockSize tokens (PromptLen/blockSize of them) and returns the
// extended slice.
//
// For segment prompts this is the fast path: no token is materialised. Each
// block is described by the pieces of segments it covers, (key, offset,
// length), and h[i] = mix(h[i-1], pieces of block i). Two prompts get equal
// h[i] exactly when their first i+1 blocks hold the same tokens (up to
// 64-bit collisions) and they name the same Adapter, which is the equality
// the engine's prefix cache sees: an adapter's chain starts from a root
// derived from its name (the base model's from 0), as the engine keys
// every block of an adapter's request with its name. For Tokens or Text
// prompts the tokens are hashed with xxh3. The values are not those of
// kvindex.HashTokens (nor HashTokensKeyed); use one function for every
// party that compares hashes (index, engine model) in a simulation.
func (r *Request) BlockHashes(blockSize int, dst []uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	if r.Tokens == nil && len(r.Segments) > 0 {
		return segmentBlockHashes(r.Segments, r.root(), blockSize, dst)
	}
	toks := r.Tokens
	if toks == nil && r.Text != "" {
		// Text-only prompt: hash its bytes in blockSize*4-byte chunks.
		return textBlockHashes(r.Text, r.root(), blockSize*4, dst)
	}
	var buf [8]byte
	prev := r.root()
	for i := 0; i+blockSize <= len(toks); i += blockSize {
		h := xxh3.New()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = h.Write(buf[:])
		var tb [4]byte
		for _, t := range toks[i : i+blockSize] {
			binary.LittleEndian.PutUint32(tb[:], t)
			_, _ = h.Write(tb[:])
		}
		prev = h.Sum64()
		dst = append(dst, prev)
	}
	return dst
}

// root is the parent of the prompt's first block in BlockHashes' chain: 0
// for the base model, a key derived from the name for a LoRA adapter, so
// that no block of an adapter's prompt has the hash of a block of the base
// model's or another adapter's.
func (r *Request) root() uint64 {
	if r.Adapter == "" {
		return 0
	}
	return splitmix64(hashString(r.Adapter) ^ 0x6c6f7261) // "lora"
}

func textBlockHashes(text string, prev uint64, blockChars int, dst []uint64) []uint64 {
	for i := 0; i+blockChars <= len(text); i += blockChars {
		prev = xxh3.HashStringSeed(text[i:i+blockChars], prev)
		dst = append(dst, prev)
	}
	return dst
}

func segmentBlockHashes(segs []Segment, prev uint64, blockSize int, dst []uint64) []uint64 {
	si, off := 0, 0 // current segment and offset within it
	for {
		h, sj, o, ok := hashRange(chainSeed(prev), segs, si, off, blockSize)
		if !ok {
			return dst
		}
		prev = h
		dst = append(dst, h)
		si, off = sj, o
	}
}

// chainSeed derives a block's starting state from its parent's hash.
func chainSeed(parent uint64) uint64 { return parent*0x9e3779b97f4a7c15 ^ 0x243f6a8885a308d3 }

// hashRange folds the pieces of the n tokens starting at segment si, offset
// off into h. It returns the position after them, and ok=false when fewer
// than n tokens remain.
func hashRange(h uint64, segs []Segment, si, off, n int) (uint64, int, int, bool) {
	for n > 0 && si < len(segs) {
		take := min(segs[si].Len-off, n)
		h = splitmix64(h ^ splitmix64(segs[si].Key))
		h = splitmix64(h ^ uint64(off)<<32 ^ uint64(take))
		n -= take
		off += take
		if off == segs[si].Len {
			si++
			off = 0
		}
	}
	return h, si, off, n == 0
}

// seekSegments returns the segment index and offset of token position pos.
func seekSegments(segs []Segment, pos int) (int, int) {
	for i, s := range segs {
		if pos < s.Len {
			return i, pos
		}
		pos -= s.Len
	}
	return len(segs), 0
}

// words are 256 distinct common English words of at most five letters used
// for synthetic text: the built-in tokenizer (package tokenizer) encodes each
// of them, with or without its leading space, as exactly one token.
var words = [256]string{
	"the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with",
	"his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all",
	"were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if",
	"will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him",
	"into", "time", "has", "look", "two", "more", "write", "go", "see", "no", "way", "could", "my", "than", "first", "water",
	"been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part",
	"over", "new", "sound", "take", "only", "work", "know", "place", "year", "live", "me", "back", "give", "most", "very", "after",
	"thing", "our", "just", "name", "good", "man", "think", "say", "great", "where", "help", "much", "line", "right", "too", "mean",
	"old", "any", "same", "tell", "boy", "came", "want", "show", "also", "form", "three", "small", "set", "put", "end", "does",
	"well", "large", "must", "big", "even", "such", "turn", "here", "why", "ask", "went", "men", "read", "need", "land", "home",
	"us", "move", "try", "kind", "hand", "again", "off", "play", "spell", "air", "away", "house", "point", "page", "found", "study",
	"still", "learn", "world", "high", "every", "near", "add", "food", "own", "below", "plant", "last", "keep", "tree", "never", "start",
	"city", "earth", "eye", "light", "head", "under", "story", "saw", "left", "few", "while", "along", "might", "close", "seem", "next",
	"hard", "open", "begin", "life", "those", "both", "paper", "got", "group", "often", "run", "until", "side", "feet", "car", "mile",
	"night", "walk", "white", "able", "acid", "age", "ago", "alive", "am", "area", "arm", "army", "art", "baby", "bad", "bag",
	"ball", "band", "bank", "bar", "base", "bath", "bear", "beat", "bed", "beer", "bell", "belt", "best", "bird", "bit", "black",
}

// hashString is FNV-1a 64.
func hashString(s string) uint64 {
	var h uint64 = 0xcbf29ce484222325
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return h
}

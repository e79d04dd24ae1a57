package kvindex

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Seeds of the two hash chains. Token and text chains use different seeds so
// that a token block and a text block with the same bytes never share a key.
const (
	tokenSeed uint64 = 0x6b76726f75746531 // "kvroute1"
	textSeed  uint64 = 0x6b76726f75746532 // "kvroute2"
)

// littleEndian reports whether uint32 slices can be hashed in place: the
// hashes are defined over the little-endian encoding of the token ids.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// HashTokens appends to dst the chained hashes of the full blocks of tokens
// and returns the extended slice: h[0] = H(seed, block 0), h[i] = H(h[i-1],
// block i), where H is seeded XXH3-64 over the little-endian bytes of the
// block's token ids. A trailing partial block is not hashed. Hashes are never
// 0 (0 is mapped to 1) so callers may use 0 as "no block".
//
// Two prompts share h[i] exactly when (up to hash collisions) they share
// their first (i+1)*blockSize tokens. HashTokens returns dst unchanged when
// blockSize <= 0.
func HashTokens(tokens []uint32, blockSize int, dst []uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	dst = grow(dst, n)
	h := tokenSeed
	var buf []byte
	if !littleEndian {
		buf = make([]byte, 4*blockSize)
	}
	for i := 0; i < n; i++ {
		blk := tokens[i*blockSize : (i+1)*blockSize]
		var b []byte
		if littleEndian {
			b = unsafe.Slice((*byte)(unsafe.Pointer(&blk[0])), 4*blockSize)
		} else {
			for j, t := range blk {
				binary.LittleEndian.PutUint32(buf[4*j:], t)
			}
			b = buf
		}
		h = nonZero(xxh3.HashSeed(b, h))
		dst = append(dst, h)
	}
	return dst
}

// HashText is HashTokens over the bytes of text, in blocks of blockChars
// bytes (the router's approximate mode when no tokenizer is configured). The
// text chain uses a different seed from the token chain.
func HashText(text string, blockChars int, dst []uint64) []uint64 {
	if blockChars <= 0 {
		return dst
	}
	n := len(text) / blockChars
	if n == 0 {
		return dst
	}
	return hashTextFrom(text, blockChars, 0, n, textSeed, dst)
}

// HashTextAfter returns HashText(text, blockChars, prevHashes[:0]) given
// prevHashes = HashText(prev, blockChars, nil) (a prefix of it will do):
// the leading blocks that text shares with prev byte for byte have the
// same hashes, so those are kept and only the rest are hashed. Comparing
// a block costs about half of hashing it, so a request that repeats the
// previous one's system prompt or conversation skips that share of the
// hashing.
func HashTextAfter(text, prev string, blockChars int, prevHashes []uint64) []uint64 {
	if blockChars <= 0 {
		return prevHashes[:0]
	}
	n := len(text) / blockChars
	k := 0
	for k < n && k < len(prevHashes) && (k+1)*blockChars <= len(prev) &&
		text[k*blockChars:(k+1)*blockChars] == prev[k*blockChars:(k+1)*blockChars] {
		k++
	}
	h := textSeed
	if k > 0 {
		h = prevHashes[k-1]
	}
	return hashTextFrom(text, blockChars, k, n, h, prevHashes[:k])
}

// hashTextFrom appends to dst the hashes of text's blocks from to n-1, h
// being the hash of the block before them (textSeed for none).
func hashTextFrom(text string, blockChars, from, n int, h uint64, dst []uint64) []uint64 {
	dst = grow(dst, n-from)
	for i := from; i < n; i++ {
		h = nonZero(xxh3.HashStringSeed(text[i*blockChars:(i+1)*blockChars], h))
		dst = append(dst, h)
	}
	return dst
}

// ChainHash returns the key of one block given its parent's key (0 for the
// first block) and its token ids: HashTokens is ChainHash applied block by
// block. The precise index uses it to compute keys for blocks reported by
// KV events.
func ChainHash(parent uint64, block []uint32) uint64 {
	if parent == 0 {
		parent = tokenSeed
	}
	if len(block) == 0 {
		return nonZero(xxh3.HashSeed(nil, parent))
	}
	if littleEndian {
		return nonZero(xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&block[0])), 4*len(block)), parent))
	}
	buf := make([]byte, 4*len(block))
	for j, t := range block {
		binary.LittleEndian.PutUint32(buf[4*j:], t)
	}
	return nonZero(xxh3.HashSeed(buf, parent))
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

func grow(dst []uint64, n int) []uint64 {
	if cap(dst)-len(dst) < n {
		nd := make([]uint64, len(dst), len(dst)+n)
		copy(nd, dst)
		dst = nd
	}
	return dst
}

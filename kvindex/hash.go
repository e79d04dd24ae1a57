package kvindex

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/internal/extrakeys"
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
	return hashTokensFrom(tokens, tokenSeed, 0, blockSize, dst)
}

// HashTokensSalted is HashTokens for a request with vLLM's cache_salt: the
// chain starts from SaltRoot(salt) rather than the seed, so no block of it
// has the key of a block of another salt's prompt or of an unsalted one,
// as the engine model's xxh3 chain keys a salted request's blocks. An
// empty salt is HashTokens.
func HashTokensSalted(tokens []uint32, salt string, blockSize int, dst []uint64) []uint64 {
	return hashTokensFrom(tokens, SaltRoot(salt), 0, blockSize, dst)
}

// HashTokensKeyed is HashTokensSalted for a request to a LoRA adapter: vLLM
// gives every block of such a request the extra key lora_name (and the
// first block, with a cache_salt, the tuple (lora_name, salt)), so each
// block's parent key is XORed with BlockKey of its extra keys, as the
// precise index folds the per-block extra_keys of a BlockStored event
// (Stored.Salts). No block of an adapter's prompt has the key of the base
// model's or another adapter's. An empty lora is HashTokensSalted.
func HashTokensKeyed(tokens []uint32, lora, salt string, blockSize int, dst []uint64) []uint64 {
	if lora == "" {
		return HashTokensSalted(tokens, salt, blockSize, dst)
	}
	return hashTokensFrom(tokens, fold(tokenSeed, BlockKey(lora, salt)), BlockKey(lora, ""), blockSize, dst)
}

// BlockKey is the hash of a block's extra_keys entry as the event decoder
// hashes it: XXH3-64 (0 mapped to 1) of the msgpack of the tuple of the
// adapter's name and the salt, each only when non-empty
// (extrakeys.AppendBlock); 0 when both are empty (no extra keys).
func BlockKey(lora, salt string) uint64 { return extrakeys.Hash(lora, salt) }

// fold is a block's parent key with its extra keys' hash k folded in, as
// the precise index folds a Stored salt: parent XOR k, read as the seed
// when that is 0 (ChainHash reads a 0 parent as the seed).
func fold(parent, k uint64) uint64 {
	if r := parent ^ k; r != 0 {
		return r
	}
	return tokenSeed
}

// SaltRoot is the parent of a salted prompt's first block in the token
// chain: the seed XOR BlockKey("", salt) (a 0 result is the seed, as ChainHash
// reads a 0 parent); for the empty salt, the seed. A vLLM engine reports a
// salted first block's extra_keys in its BlockStored event, which the
// precise index folds into the block's parent so (Stored.Salts): a salted
// request's HashTokensSalted keys are those the index gives the blocks an
// engine stored for the same salt. engine.SaltRoot is the same function.
func SaltRoot(salt string) uint64 { return saltedRoot(tokenSeed, salt) }

// saltedRoot is seed XOR BlockKey("", salt), or seed for the empty salt or a 0
// result (ChainHash reads a 0 parent as the seed).
func saltedRoot(seed uint64, salt string) uint64 {
	if salt == "" {
		return seed
	}
	if r := seed ^ BlockKey("", salt); r != 0 {
		return r
	}
	return seed
}

// textRoot is the text chain's root for a request to adapter lora ("":
// the base model) with cache_salt salt: the text seed XOR BlockKey(lora,
// salt), or the seed for a 0 result. For the base model it is the text
// chain's SaltRoot.
func textRoot(lora, salt string) uint64 {
	if r := textSeed ^ BlockKey(lora, salt); r != 0 {
		return r
	}
	return textSeed
}

// hashTokensFrom chains tokens' full blocks from root, folding step into
// the parent of every block after the first (0: none).
func hashTokensFrom(tokens []uint32, root, step uint64, blockSize int, dst []uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	dst = grow(dst, n)
	h := root
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
		if step != 0 && i > 0 {
			h = fold(h, step)
		}
		h = nonZero(xxh3.HashSeed(b, h))
		dst = append(dst, h)
	}
	return dst
}

// HashText appends to dst the chained hashes of text's full blocks of
// blockChars bytes (the router's approximate mode when no tokenizer is
// configured), as HashTokens does for tokens: h[i] depends on blocks 0..i,
// a trailing partial block is not hashed, and no hash is 0. Its chain is
// built differently (see hashTextFrom) and from a different seed, so a
// text block and a token block never share a key.
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
// bytes costs a fraction of hashing them, so a request that repeats the
// previous one's system prompt or conversation skips most of that share
// of the hashing.
func HashTextAfter(text, prev string, blockChars int, prevHashes []uint64) []uint64 {
	hashes, _ := HashTextShared(text, prev, blockChars, prevHashes)
	return hashes
}

// HashTextShared is HashTextAfter, and also returns how many leading
// blocks text was found to share with prev (whose hashes were kept): text
// and prev are equal byte for byte up to shared x blockChars. The router
// keeps a copy of the last prompt to compare the next with, and copies
// only what follows those.
func HashTextShared(text, prev string, blockChars int, prevHashes []uint64) (hashes []uint64, shared int) {
	return HashTextSharedSalted(text, "", prev, blockChars, prevHashes)
}

// HashTextSharedSalted is HashTextShared for a request with vLLM's
// cache_salt: the chain starts from a root the salt determines, as
// HashTokensSalted's, so a salted prompt shares no block key with another
// salt's or an unsalted one. prevHashes must be prev's hashes with the
// same salt.
func HashTextSharedSalted(text, salt, prev string, blockChars int, prevHashes []uint64) (hashes []uint64, shared int) {
	return HashTextSharedKeyed(text, "", salt, prev, blockChars, prevHashes)
}

// HashTextSharedKeyed is HashTextSharedSalted for a request to a LoRA
// adapter lora: the chain starts from the text seed XOR BlockKey(lora,
// salt), so an adapter's prompt shares no block key with the base
// model's, another adapter's or another salt's, as the engine shares no
// cached block between them (vLLM keys every block of an adapter's
// request with its name). The text chain is the router's own guess of
// what it routed (the approximate index), never compared with an
// engine's keys, so the root alone keys it apart: every key after it
// chains from it. prevHashes must be prev's hashes with the same
// adapter and salt. An empty lora is HashTextSharedSalted.
func HashTextSharedKeyed(text, lora, salt, prev string, blockChars int, prevHashes []uint64) (hashes []uint64, shared int) {
	if blockChars <= 0 {
		return prevHashes[:0], 0
	}
	n := len(text) / blockChars
	k := min(n, len(prevHashes), len(prev)/blockChars)
	k = sharedBlocks(text[:k*blockChars], prev[:k*blockChars], blockChars)
	h := textRoot(lora, salt)
	if k > 0 {
		h = prevHashes[k-1]
	}
	return hashTextFrom(text, blockChars, k, n, h, prevHashes[:k]), k
}

// sharedBlocks returns how many leading blocks of blockChars bytes a and b
// have equal. It compares runs of blocks, doubling from 16 while they are
// equal, then, from where one was not, runs of 16 and single blocks: one
// long comparison runs at the memory's speed, where one per block pays a
// call each.
func sharedBlocks(a, b string, blockChars int) int {
	n := min(len(a), len(b)) / blockChars
	k := 0
	for run := 16; k < n; run *= 2 {
		end := min(k+run, n) * blockChars
		if a[k*blockChars:end] != b[k*blockChars:end] {
			break
		}
		k = end / blockChars
	}
	for k+16 <= n && a[k*blockChars:(k+16)*blockChars] == b[k*blockChars:(k+16)*blockChars] {
		k += 16
	}
	for k < n && a[k*blockChars:(k+1)*blockChars] == b[k*blockChars:(k+1)*blockChars] {
		k++
	}
	return k
}

// hashTextFrom appends to dst the hashes of text's blocks from to n-1, h
// being the hash of the block before them (textSeed for none). Each
// block's bytes are hashed alone (XXH3-64, unseeded) and folded into the
// chain (chainText), so the blocks' hashes do not wait for each other and
// the processor overlaps some of the work. Seeding each block's hash
// with the one before, as HashTokens does (the engine's keys are defined
// so), makes every block wait for the last: 32 KiB in 128-byte blocks
// took 2.25-2.29 us that way, 2.04-2.05 us this way (BenchmarkHashText,
// side by side).
func hashTextFrom(text string, blockChars, from, n int, h uint64, dst []uint64) []uint64 {
	dst = grow(dst, n-from)
	if blockChars == 128 {
		return hashText128(text[from*128:n*128], h, dst)
	}
	for i := from; i < n; i++ {
		h = chainText(h, xxh3.HashString(text[i*blockChars:(i+1)*blockChars]))
		dst = append(dst, h)
	}
	return dst
}

// hashText128 is hashTextFrom for blocks of 128 bytes: it appends to dst
// (with room for them) the chained hashes of text's blocks, all of them
// full, h being the hash of the block before them. It is xxh3Len128 and
// chainText written out in the loop: as a call per block, xxh3Len128 made
// the loop save and reload its registers around each (32 KiB,
// BenchmarkHashText/chars=128 side by side: 2.05-2.27 us -> 1.97-2.03 us).
// TestHashText128 checks it against them.
func hashText128(text string, h uint64, dst []uint64) []uint64 {
	n := len(text) / 128
	out := dst[len(dst) : len(dst)+n]
	for j := range out {
		b := (*[128]byte)(unsafe.Pointer(unsafe.StringData(text[j*128:])))
		r := func(i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }
		// xxh3Len128's folds, two at a time.
		h0, l0 := bits.Mul64(r(0)^0xbe4ba423396cfeb8, r(8)^0x1cad21f72c81017c)
		h1, l1 := bits.Mul64(r(112)^0xdb979083e96dd4de, r(120)^0x1f67b3b7a4a44072)
		acc := (h0 ^ l0) + (h1 ^ l1)
		h0, l0 = bits.Mul64(r(16)^0x78e5c0cc4ee679cb, r(24)^0x2172ffcc7dd05a82)
		h1, l1 = bits.Mul64(r(96)^0x8e2443f7744608b8, r(104)^0x4c263a81e69035e0)
		acc += (h0 ^ l0) + (h1 ^ l1)
		h0, l0 = bits.Mul64(r(32)^0xcb00c391bb52283c, r(40)^0xa32e531b8b65d088)
		h1, l1 = bits.Mul64(r(80)^0x4ef90da297486471, r(88)^0xd8acdea946ef1938)
		acc += (h0 ^ l0) + (h1 ^ l1)
		h0, l0 = bits.Mul64(r(48)^0x3f349ce33f76faa8, r(56)^0x1d4f0bc7c7bbdcf9)
		h1, l1 = bits.Mul64(r(64)^0x3159b4cd4be0518a, r(72)^0x647378d9c97e9fc8)
		acc += 0x1bbcd8c2f5e54380 + (h0 ^ l0) + (h1 ^ l1)
		acc ^= acc >> 37
		acc *= 0x165667919e3779f9
		acc ^= acc >> 32
		// chainText.
		hi, lo := bits.Mul64(h^0x9e3779b97f4a7c15, acc^0xc2b2ae3d27d4eb4f)
		h = nonZero(hi ^ lo)
		out[j] = h
	}
	return dst[:len(dst)+n]
}

// xxh3Len128 is xxh3.HashString of exactly 128 bytes (unseeded XXH3-64):
// its path for 17-128 bytes written out for that length, with its reads
// at fixed offsets and the default secret's words as constants. The
// router's default block size is 128 bytes; its prompts' hashing takes
// about 10% less CPU time so (BenchmarkHashText, user time side by side:
// 1.63-1.72 s against 1.77-1.93 s). TestXXH3Len128 checks it against xxh3.
// hashText128 has it written out in its loop; it is kept as the reference
// for that (TestHashText128).
func xxh3Len128(b *[128]byte) uint64 {
	r := func(i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }
	fold := func(x, y uint64) uint64 {
		hi, lo := bits.Mul64(x, y)
		return hi ^ lo
	}
	acc := uint64(0x1bbcd8c2f5e54380) // 128 * PRIME64_1, mod 2^64
	acc += fold(r(0)^0xbe4ba423396cfeb8, r(8)^0x1cad21f72c81017c)
	acc += fold(r(112)^0xdb979083e96dd4de, r(120)^0x1f67b3b7a4a44072)
	acc += fold(r(16)^0x78e5c0cc4ee679cb, r(24)^0x2172ffcc7dd05a82)
	acc += fold(r(96)^0x8e2443f7744608b8, r(104)^0x4c263a81e69035e0)
	acc += fold(r(32)^0xcb00c391bb52283c, r(40)^0xa32e531b8b65d088)
	acc += fold(r(80)^0x4ef90da297486471, r(88)^0xd8acdea946ef1938)
	acc += fold(r(48)^0x3f349ce33f76faa8, r(56)^0x1d4f0bc7c7bbdcf9)
	acc += fold(r(64)^0x3159b4cd4be0518a, r(72)^0x647378d9c97e9fc8)
	// XXH3's avalanche.
	acc ^= acc >> 37
	acc *= 0x165667919e3779f9
	return acc ^ acc>>32
}

// chainText folds a block's content hash c into the hash h of the blocks
// before it: the two halves of the 128-bit product of h and c, each xored
// with a constant first, xored together (XXH3 folds its input so). It is a
// multiply on the chain's critical path, where a seeded XXH3 of the block
// was the whole block's hash. Like any 64-bit key it collides with
// probability about 2^-64 per pair of distinct prefixes; the product is 0,
// whatever the other operand, only when h or c equals its constant, as
// likely.
func chainText(h, c uint64) uint64 {
	hi, lo := bits.Mul64(h^0x9e3779b97f4a7c15, c^0xc2b2ae3d27d4eb4f)
	return nonZero(hi ^ lo)
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

package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/internal/extrakeys"
)

// Digest is a block hash in its full form. Hashes shorter than 32 bytes
// (the 64-bit default) are stored right-aligned, so Key is always the last 8
// bytes read big-endian: for vLLM's sha256 algorithms that is exactly the int
// vLLM publishes in KV events (int.from_bytes(digest, "big") & (2**64-1)).
type Digest [32]byte

// Key returns the 64-bit form of d used as the cache key and in KV events.
func (d Digest) Key() uint64 { return binary.BigEndian.Uint64(d[24:]) }

// digestOf returns the Digest whose Key is k.
func digestOf(k uint64) Digest {
	var d Digest
	binary.BigEndian.PutUint64(d[24:], k)
	return d
}

// HashFunc computes chained prefix-cache block hashes: the hash of block i is
// Block(hash of block i-1, tokens of block i), and the parent of block 0 is
// None(). Implementations must be deterministic and safe for concurrent use
// (the built-in ones are stateless).
type HashFunc interface {
	// Name is the algorithm's name as vLLM's --prefix-caching-hash-algo
	// spells it ("sha256", "sha256_cbor"), or "xxh3" for the default.
	Name() string
	// None returns the parent of the first block (vLLM's NONE_HASH).
	None() Digest
	// Block returns the hash of one full block of tokens given its parent.
	Block(parent Digest, tokens []uint32) Digest
	// Salted returns the hash of a sequence's first block (its parent
	// None()) with vLLM's cache_salt as the block's extra key
	// (generate_block_hash_extra_keys adds the salt to the block starting
	// at token 0 only): the chains of two salts, or of a salt and none,
	// share no block, so neither request can hit the other's cache. It is
	// Keyed(None(), tokens, "", salt).
	Salted(tokens []uint32, salt string) Digest
	// Keyed returns the hash of one full block given its parent, with the
	// extra keys vLLM's generate_block_hash_extra_keys gives a block of a
	// text prompt: the LoRA adapter's name (lora_request.lora_name, on
	// every block of an adapter's request) then the cache_salt (the caller
	// passes it for the block starting at token 0 only), each only when
	// non-empty; with both empty it is Block. No block of an adapter's
	// request has the key of the base model's or another adapter's.
	Keyed(parent Digest, tokens []uint32, lora, salt string) Digest
}

// Hash function names accepted by NewHashFunc.
const (
	HashXXH3       = "xxh3"
	HashSHA256     = "sha256"
	HashSHA256CBOR = "sha256_cbor"
)

// DefaultNoneHashSeed is the seed vLLM uses for NONE_HASH with the sha256
// algorithms when PYTHONHASHSEED is unset (vLLM PR #51875).
const DefaultNoneHashSeed = "vllm-none-hash"

// NewHashFunc returns the named hash function. seed is the NONE_HASH seed
// string for the sha256 algorithms ("" means DefaultNoneHashSeed; vLLM uses
// $PYTHONHASHSEED when set, e.g. "0"); it is ignored by xxh3.
func NewHashFunc(name, seed string) (HashFunc, error) {
	if seed == "" {
		seed = DefaultNoneHashSeed
	}
	switch name {
	case HashXXH3, "":
		return XXH3(), nil
	case HashSHA256:
		return SHA256(seed), nil
	case HashSHA256CBOR:
		return SHA256CBOR(seed), nil
	}
	return nil, fmt.Errorf("engine: unknown hash function %q (want %s, %s or %s)", name, HashXXH3, HashSHA256, HashSHA256CBOR)
}

// XXH3 returns the default fast 64-bit chained hash. It is the same chain as
// kvindex.HashTokens: h[0] = XXH3-64 seeded with 0x6b76726f75746531 over the
// little-endian bytes of block 0, h[i] = XXH3-64 seeded with h[i-1] over
// block i, with 0 mapped to 1. So a router hashing prompts with kvindex
// computes the very keys this engine publishes in its KV events.
func XXH3() HashFunc { return xxh3Hash{} }

const xxh3Seed uint64 = 0x6b76726f75746531 // "kvroute1", kvindex's token seed

type xxh3Hash struct{}

func (xxh3Hash) Name() string { return HashXXH3 }
func (xxh3Hash) None() Digest { return digestOf(xxh3Seed) }

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func (xxh3Hash) Block(parent Digest, tokens []uint32) Digest {
	return digestOf(xxh3Block(parent.Key(), tokens))
}

// Salted chains the first block from the salt's root (SaltRoot) instead of
// the seed, as kvindex.HashTokensSalted does.
func (xxh3Hash) Salted(tokens []uint32, salt string) Digest {
	return digestOf(xxh3Block(SaltRoot(salt), tokens))
}

// Keyed folds the block's extra keys into its parent (ExtraKey), as
// kvindex.HashTokensKeyed does.
func (xxh3Hash) Keyed(parent Digest, tokens []uint32, lora, salt string) Digest {
	return digestOf(xxh3Block(foldKey(parent.Key(), ExtraKey(lora, salt)), tokens))
}

// ExtraKey is the hash of a block's extra keys in the xxh3 chain: XXH3-64
// (0 mapped to 1) of the msgpack of the tuple of the adapter's name and
// the salt, each only when non-empty (extrakeys.AppendBlock), the
// extra_keys entry a BlockStored event carries for the block; 0 when both
// are empty. It is kvindex.BlockKey: the xxh3 chain XORs it into the
// block's parent key (a 0 result is the seed), so a router hashing an
// adapter's prompt with kvindex.HashTokensKeyed computes the keys this
// engine publishes.
func ExtraKey(lora, salt string) uint64 { return extrakeys.Hash(lora, salt) }

// foldKey is parent with the extra keys' hash k folded in: parent XOR k,
// the seed when that is 0 (k = 0: parent).
func foldKey(parent, k uint64) uint64 {
	if r := parent ^ k; r != 0 {
		return r
	}
	return xxh3Seed
}

// SaltRoot is the parent of a salted chain's first block in the xxh3 chain:
// the seed XOR the XXH3-64 (0 mapped to 1) of the msgpack of (salt,), the
// extra_keys entry a BlockStored event carries for the block (a 0 result
// is the seed). It is kvindex.SaltRoot (TestSaltedXXH3MatchesKVIndex), so
// that a router hashing a salted prompt computes the keys this engine
// publishes, and those its index gives the blocks from their tokens and
// extra keys.
func SaltRoot(salt string) uint64 { return foldKey(xxh3Seed, ExtraKey("", salt)) }

func xxh3Block(parent uint64, tokens []uint32) uint64 {
	if len(tokens) == 0 {
		return nonZero(xxh3.HashSeed(nil, parent))
	}
	var b []byte
	if littleEndian {
		b = unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
	} else {
		b = make([]byte, 4*len(tokens))
		for i, t := range tokens {
			binary.LittleEndian.PutUint32(b[4*i:], t)
		}
	}
	return nonZero(xxh3.HashSeed(b, parent))
}

// chainPrompt is chainKeys from the start of a chain (None()), every
// block keyed with the adapter lora and the first salted when salt is set
// (HashFunc.Keyed).
func chainPrompt(h HashFunc, lora, salt string, tokens []uint32, bs int, keys []uint64) (Digest, []uint64) {
	if (salt == "" && lora == "") || len(tokens) < bs {
		return chainKeys(h, h.None(), tokens, bs, lora, keys)
	}
	first := h.Keyed(h.None(), tokens[:bs], lora, salt)
	return chainKeys(h, first, tokens[bs:], bs, lora, append(keys, first.Key()))
}

// chainKeys appends to keys the keys of the blocks of tokens (bs tokens
// each; len(tokens) a multiple of bs), chained from parent, each keyed
// with the adapter lora ("" for the base model), and returns the last
// block's digest (parent when there is none), as h.Keyed block after
// block would. For xxh3, the default, a digest is its key, so the chain runs
// on the keys: the Digest values passed through HashFunc cost four times the
// hash (BenchmarkHashBlock: 28.7 ns a block; xxh3.HashSeed alone on the same
// 64 bytes, 7.2 ns), and Add chains every full block of a prompt.
func chainKeys(h HashFunc, parent Digest, tokens []uint32, bs int, lora string, keys []uint64) (Digest, []uint64) {
	n := len(tokens) / bs
	if _, ok := h.(xxh3Hash); ok {
		if n == 0 {
			return parent, keys
		}
		k, step := parent.Key(), ExtraKey(lora, "")
		for i := range n {
			k = xxh3Block(foldKey(k, step), tokens[i*bs:(i+1)*bs])
			keys = append(keys, k)
		}
		return digestOf(k), keys
	}
	for i := range n {
		if lora == "" {
			parent = h.Block(parent, tokens[i*bs:(i+1)*bs])
		} else {
			parent = h.Keyed(parent, tokens[i*bs:(i+1)*bs], lora, "")
		}
		keys = append(keys, parent.Key())
	}
	return parent, keys
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// SHA256 returns vLLM's "sha256" prefix-caching hash: sha256 of the pickle
// (protocol 5) of the tuple (parent_digest_bytes, tuple(token_ids),
// extra_keys), with NONE_HASH = sha256(pickle(seed)). extra_keys is None
// but for an adapter's block, (lora_name,), and a salted first block,
// (cache_salt,) or (lora_name, cache_salt); multimodal extra keys are not
// modelled.
func SHA256(seed string) HashFunc {
	h := sha256Pickle{}
	h.none = sha256.Sum256(pickleString(nil, seed))
	return h
}

type sha256Pickle struct{ none Digest }

func (h sha256Pickle) Name() string { return HashSHA256 }
func (h sha256Pickle) None() Digest { return h.none }

func (h sha256Pickle) Block(parent Digest, tokens []uint32) Digest {
	var buf [1024]byte
	return sha256.Sum256(pickleBlock(buf[:0], &parent, tokens, "", ""))
}

func (h sha256Pickle) Salted(tokens []uint32, salt string) Digest {
	var buf [1024]byte
	return sha256.Sum256(pickleBlock(buf[:0], &h.none, tokens, "", salt))
}

func (h sha256Pickle) Keyed(parent Digest, tokens []uint32, lora, salt string) Digest {
	var buf [1024]byte
	return sha256.Sum256(pickleBlock(buf[:0], &parent, tokens, lora, salt))
}

// Pickle opcodes (Python's pickle module, protocol 5).
const (
	opProto          = 0x80
	opFrame          = 0x95
	opShortBinBytes  = 'C'
	opShortBinUnicod = 0x8c
	opBinUnicode     = 'X'
	opMemoize        = 0x94
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opBinInt         = 'J'
	opLong1          = 0x8a
	opMark           = '('
	opTuple          = 't'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opEmptyTuple     = ')'
	opNone           = 'N'
	opStop           = '.'
)

// pickleFrame wraps body (the opcodes after the frame header, ending in
// STOP) in PROTO 5 + FRAME as CPython's C pickler writes it for small
// objects.
func pickleFrame(dst []byte, body func([]byte) []byte) []byte {
	dst = append(dst, opProto, 5, opFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	start := len(dst)
	dst = body(dst)
	binary.LittleEndian.PutUint64(dst[start-8:start], uint64(len(dst)-start))
	return dst
}

func pickleString(dst []byte, s string) []byte {
	return pickleFrame(dst, func(b []byte) []byte {
		return append(pickleStr(b, s), opStop)
	})
}

// pickleStr appends a str's opcodes (a memoized unicode string; s is UTF-8,
// as a Python str pickles).
func pickleStr(b []byte, s string) []byte {
	if len(s) < 256 {
		b = append(b, opShortBinUnicod, byte(len(s)))
	} else {
		b = append(b, opBinUnicode)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	}
	b = append(b, s...)
	return append(b, opMemoize)
}

// pickleBlock pickles (parent, tuple(tokens), extra keys): None when lora
// and salt are empty, else the tuple of those of them that are not,
// (lora,), (salt,) or (lora, salt). CPython frames a pickle of more than
// 64 KiB in several frames: keys that long are not pickled as vLLM
// pickles them. Nor are an adapter's name and a salt that are one Python
// object (the pickler memoizes by identity and would refer back to the
// first), as CPython's cached one-character strings can be.
func pickleBlock(dst []byte, parent *Digest, tokens []uint32, lora, salt string) []byte {
	dst = append(dst, opProto, 5, opFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	start := len(dst)
	dst = append(dst, opShortBinBytes, 32)
	dst = append(dst, parent[:]...)
	dst = append(dst, opMemoize)
	switch n := len(tokens); {
	case n == 0:
		dst = append(dst, opEmptyTuple)
	case n <= 3:
		dst = pickleInts(dst, tokens)
		dst = append(dst, opTuple1+byte(n-1), opMemoize)
	default:
		dst = append(dst, opMark)
		dst = pickleInts(dst, tokens)
		dst = append(dst, opTuple, opMemoize)
	}
	switch {
	case lora == "" && salt == "":
		dst = append(dst, opNone)
	case lora == "":
		dst = append(pickleStr(dst, salt), opTuple1, opMemoize)
	case salt == "":
		dst = append(pickleStr(dst, lora), opTuple1, opMemoize)
	default:
		dst = append(pickleStr(pickleStr(dst, lora), salt), opTuple2, opMemoize)
	}
	dst = append(dst, opTuple3, opMemoize, opStop)
	binary.LittleEndian.PutUint64(dst[start-8:start], uint64(len(dst)-start))
	return dst
}

func pickleInts(dst []byte, tokens []uint32) []byte {
	for _, t := range tokens {
		switch {
		case t <= 0xff:
			dst = append(dst, opBinInt1, byte(t))
		case t <= 0xffff:
			dst = append(dst, opBinInt2, byte(t), byte(t>>8))
		case t <= 0x7fffffff:
			dst = append(dst, opBinInt, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		default:
			// LONG1: little-endian two's complement; a high bit needs a 0 byte.
			dst = append(dst, opLong1, 5, byte(t), byte(t>>8), byte(t>>16), byte(t>>24), 0)
		}
	}
	return dst
}

// SHA256CBOR returns vLLM's "sha256_cbor" prefix-caching hash: sha256 of the
// canonical CBOR encoding of (parent_digest_bytes, [token_ids...],
// extra_keys), with NONE_HASH = sha256(cbor(seed)); extra_keys is null but
// for an adapter's block, [lora_name], and a salted first block,
// [cache_salt] or [lora_name, cache_salt].
func SHA256CBOR(seed string) HashFunc {
	b := cborHead(nil, 3, uint64(len(seed)))
	b = append(b, seed...)
	return sha256CBOR{none: sha256.Sum256(b)}
}

type sha256CBOR struct{ none Digest }

func (h sha256CBOR) Name() string { return HashSHA256CBOR }
func (h sha256CBOR) None() Digest { return h.none }

func (h sha256CBOR) Block(parent Digest, tokens []uint32) Digest {
	var buf [1024]byte
	b := cborBlock(buf[:0], &parent, tokens)
	return sha256.Sum256(append(b, 0xf6)) // null
}

func (h sha256CBOR) Salted(tokens []uint32, salt string) Digest {
	return h.Keyed(h.none, tokens, "", salt)
}

func (h sha256CBOR) Keyed(parent Digest, tokens []uint32, lora, salt string) Digest {
	var buf [1024]byte
	b := cborBlock(buf[:0], &parent, tokens)
	switch {
	case lora == "" && salt == "":
		b = append(b, 0xf6) // null
	case salt == "":
		b = cborText(append(b, 0x81), lora) // an array of one text string
	case lora == "":
		b = cborText(append(b, 0x81), salt)
	default:
		b = append(b, 0x82)
		b = cborText(cborText(b, lora), salt)
	}
	return sha256.Sum256(b)
}

func cborText(b []byte, s string) []byte {
	return append(cborHead(b, 3, uint64(len(s))), s...)
}

// cborBlock appends the head of the 3-array, the parent and the tokens: all
// but the extra keys.
func cborBlock(b []byte, parent *Digest, tokens []uint32) []byte {
	b = append(b, 0x83, 0x58, 32)
	b = append(b, parent[:]...)
	b = cborHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		b = cborHead(b, 0, uint64(t))
	}
	return b
}

// cborHead appends a CBOR head of the given major type and argument in its
// shortest (canonical) form.
func cborHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= 0xff:
		return append(dst, m|24, byte(v))
	case v <= 0xffff:
		return append(dst, m|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(dst, m|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	dst = append(dst, m|27)
	return binary.BigEndian.AppendUint64(dst, v)
}

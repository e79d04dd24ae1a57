// Package extrakeys encodes the extra_keys entries of vLLM's block hashes as
// its KV events carry them (msgpack, as msgspec writes them), for the engine
// model and the router's prefix indexes to agree on a salted block's key.
package extrakeys

import "github.com/zeebo/xxh3"

// AppendBlock appends the msgpack of the extra_keys tuple vLLM's
// generate_block_hash_extra_keys gives a block of a text prompt: the LoRA
// adapter's name (lora_request.lora_name, on every block of an adapter's
// request) then the request's cache_salt (on the block starting at token 0
// only, so callers pass "" for the others), each only when non-empty. The
// tuple is a msgpack array (fixarray) of strings, each in its shortest form
// (fixstr, str8, str16 or str32). With both empty the block has no extra
// keys (vLLM's None) and b is returned unchanged.
func AppendBlock(b []byte, lora, salt string) []byte {
	n := 0
	if lora != "" {
		n++
	}
	if salt != "" {
		n++
	}
	if n == 0 {
		return b
	}
	b = append(b, 0x90|byte(n))
	if lora != "" {
		b = appendString(b, lora)
	}
	if salt != "" {
		b = appendString(b, salt)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = append(b, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(b, s...)
}

// Hash is the hash of a block's extra_keys entry as the router's event
// decoder hashes each entry's bytes: XXH3-64 (0 mapped to 1) of
// AppendBlock(lora, salt), the key the engine model's xxh3 chain and the
// router's prefix indexes fold into the block's parent; 0 when both are
// empty (the block has no extra keys).
func Hash(lora, salt string) uint64 {
	if lora == "" && salt == "" {
		return 0
	}
	var buf [128]byte
	if h := xxh3.Hash(AppendBlock(buf[:0], lora, salt)); h != 0 {
		return h
	}
	return 1
}

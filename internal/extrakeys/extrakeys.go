// Package extrakeys encodes the extra_keys entries of vLLM's block hashes as
// its KV events carry them (msgpack, as msgspec writes them), for the engine
// model and the router's prefix indexes to agree on a salted block's key.
package extrakeys

// AppendCacheSalt appends the msgpack of the 1-tuple (salt,), the entry
// vLLM's generate_block_hash_extra_keys gives a first block salted with a
// request's cache_salt: fixarray 1, then the string in its shortest form
// (fixstr, str8, str16 or str32).
func AppendCacheSalt(b []byte, salt string) []byte {
	b = append(b, 0x91)
	switch n := len(salt); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = append(b, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(b, salt...)
}

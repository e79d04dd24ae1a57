// Package kvindex answers "which endpoints already hold this prompt's
// prefix?" for the router.
//
// A prompt is cut into blocks (the engine's block size in tokens, or a
// number of characters in approximate mode) and each full block gets a
// chained 64-bit hash (HashTokens, HashText): equal hashes at position i
// mean equal prompts up to the end of block i. The indexes map those keys to
// endpoints:
//
//   - Approx records what the router itself sent where (an LRU per endpoint
//     with a TTL). It needs no tokenizer and no engine support, and is only
//     as right as the engine's eviction is predictable.
//   - Index is fed by the engines' own KV-cache events (see package signals
//     for the subscriber): exact, including evictions and the CPU tier.
//
// Both Match a prompt's hashes to, per endpoint, the number of leading blocks
// it holds. The package does no I/O, starts no goroutines and never reads
// the clock: callers pass now. Both indexes are safe for concurrent use.
package kvindex

// Package kvindex answers "which endpoints already hold this prompt's
// prefix?" for the router.
//
// A prompt is cut into blocks (the engine's block size in tokens, or a
// number of bytes in approximate character mode) and each full block gets a
// chained 64-bit hash (HashTokens, HashText, ChainHash): equal hashes at
// position i mean equal prompts up to the end of block i (HashTextAfter
// reuses the previous prompt's hashes for the blocks it shares with it).
// Two indexes map
// those keys to endpoints, and both Match a prompt's hashes to, per
// endpoint, the number of leading blocks it holds (a Hit):
//
//   - Approx records what the router itself sent where: an LRU per endpoint,
//     bounded by the endpoint's capacity in blocks, each entry trusted for a
//     TTL. It needs no tokenizer and no engine support and is only as right
//     as the engine's eviction is predictable. Its block table is its own
//     single-writer table, lock-free for readers like Index's; each
//     endpoint's recency order is a tree of the chains it holds (runs of
//     blocks stamped with their last Record), so recording a prompt an
//     endpoint already holds costs a few lookups, not one per block.
//   - Index is fed by the engines' own KV-cache events (package signals has
//     the subscriber): exact, including evictions and the CPU tier.
//
// # Index
//
// Blocks are keyed by the router's chained hash over token ids, computed from
// each BlockStored's token ids and its parent's key, so requests hashed with
// HashTokens match whatever hash function or seed the engine uses. Each
// endpoint keeps a map from the engine's block hashes to keys (to apply
// BlockRemoved and to find a new block's parent), and counts the GPU copies
// of a block stored more than once: vLLM does not de-duplicate its cache and
// reports each copy's BlockStored and BlockRemoved, so a block stays until
// its last copy is removed. A BlockStored whose parent
// was never seen (the router subscribed late, events were lost) cannot be
// keyed and is counted as an orphan. A BlockStored without token ids (vLLM's
// CPU offloading names the blocks it copies by engine hash alone) adds its
// tier to blocks the endpoint stored earlier with their tokens; blocks it
// never did are skipped (ErrUnknownBlocks). Blocks whose engine hash covers more
// than tokens (LoRA, multimodal inputs, cache salt) are keyed with a salt so
// plain prompts never match them; a LoRA adapter's request hashed with
// HashTokensKeyed (its name and cache_salt folded in as the salts of the
// events' extra_keys are) matches the blocks an engine stored for it.
//
// Layout: endpoints are numbered in groups of 64; per group two tables (GPU,
// CPU) map a key to a 64-bit mask of the endpoints holding it. The tables
// are sharded open-addressing arrays read with atomic loads only, so Match
// takes no lock and never waits for a writer (see table.go for why a
// reader always sees a consistent state). Match walks the prompt's blocks
// once, intersecting masks, and stops when no endpoint is left. Memory is
// about 50 bytes per (block, endpoint) entry; Capacity bounds the entries
// (random eviction from the largest endpoint, a safety net: the engines'
// BlockRemoved events normally keep the index at their cache sizes).
//
// The package does no I/O, starts no goroutines and never reads the clock:
// callers pass now. Index and Approx are safe for concurrent use; an Approx
// built with ApproxConfig.Serialized (the router's, used under its lock)
// leaves serialising its calls to its caller.
package kvindex

// Package workload holds the requests that the simulator (package sim) and
// the load generator (package bench) replay: Mooncake JSONL traces and
// seeded generators, with their arrival processes.
//
// # Requests and synthetic prompts
//
// A Request carries its arrival offset (time.Duration since the workload's
// start), session and tenant ids, the LoRA adapter it is for (Adapter, ""
// for the base model), PromptLen and OutputLen, and its prompt in
// one of three forms: explicit Tokens ([]uint32), explicit Text, or
// Segments. Traces and generators produce Segments: a Segment{Key, Len} is
// the first Len tokens of a deterministic SplitMix64 stream seeded by Key,
// with token ids in [FirstTokenID, FirstTokenID+NumTokenIDs). Equal keys give
// equal tokens, so prompts that share leading segments share a prefix.
//
// Text is derived from tokens, one word per token: token t becomes
// TokenWord(t), one of 256 common English words of at most five letters,
// separated by single spaces. Equal blocks therefore have equal text (and
// different blocks differ, with overwhelming probability). The emulated
// engine's built-in tokenizer (tokenizer.Builtin) encodes each word as
// exactly one token, so the text of a PromptLen-token prompt is PromptLen
// built-in tokens and the trace's block sharing is exactly the sharing the
// engine sees (the built-in ids differ from the synthetic ids, but one maps
// to the other one to one). Real BPE vocabularies also spend about one
// token per word.
//
// # Mooncake traces
//
// ReadTrace parses JSONL records {"timestamp" (ms), "input_length",
// "output_length", "hash_ids"} where each hash id names a 512-token block
// (the last one partial); a missing key (hash_ids may give way to
// kvroute's segments, tokens or text), an input_length or output_length
// of 0 (an engine refuses an empty prompt; a request generates a token)
// and a length above MaxLen tokens are errors. Block
// i becomes Segment{Key: hash_ids[i], Len: 512 or the remainder}, so equal hash ids are equal token blocks and the sharing
// in the trace is the sharing the engines see. WriteTrace writes the same
// format plus optional fields (id, arrival_ns, session, tenant, adapter,
// segments, tokens, text); reading the output back gives equal requests. A
// Mooncake trace names no adapter: its requests are the base model's.
//
// # Block hashes
//
// Request.BlockHashes(blockSize, dst) returns chained 64-bit hashes of the
// prompt's full blocks at any engine block size. For segment prompts it
// never materialises tokens: a block is hashed from the (key, offset, length)
// pieces of the segments it covers, which identifies its tokens exactly. A
// LoRA adapter's request (Adapter) chains its blocks from a root derived
// from the adapter's name, so its blocks share no hash with the base
// model's or another adapter's, as the engine keys every block of an
// adapter's request with its name (engine.Request.LoRA); AssignHashIDs and
// Oracle see the same separation. Use the same function everywhere hashes
// are compared in one simulation. Oracle
// computes the infinite-cache hit-rate bound of a request stream (HitRate;
// CachedTokens, the prompt tokens it had cached).
//
// # Generators
//
// Generate(name, Options) runs one of Generators(): chat (multi-turn
// sessions, growing history, think time), rag (hot documents with Zipf
// popularity), sysprompt (a few long shared system prompts), storm (a burst
// on one hot prefix over background traffic), tenants (a skewed tenant mix),
// lora (a multi-tenant LoRA deployment: requests for N adapters,
// AdapterName(i), with shares proportional to 1/(i+1)^skew, and base_share
// for the base model; each adapter's requests share its own system prompt,
// which shares no cached block with another adapter's).
// Options give the seed, request count, duration, arrival process (Poisson,
// gamma with a CV, constant; a rate of at most MaxRate, 1e6 requests/s,
// since arrival times are whole nanoseconds) and the generator's documented
// Params, each refused outside its range (Param.Min and Max, whole numbers
// for counts; a length is at most MaxLen tokens, and so is every drawn
// length; a prompt adding up to more than MaxLen is an error, as in a
// trace). The same options always give the same workload.
// Workload.ScaleRate scales the arrival rate of any workload, traces
// included, by a factor in (0, 1e9] that does not stretch the last arrival
// beyond MaxSpan (100 years).
//
// Nothing in this package does I/O except the Read/Write functions, and no
// type is safe for concurrent mutation; a Request may be read concurrently.
package workload

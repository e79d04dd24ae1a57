// Package engine is a deterministic model of one vLLM-like inference engine:
// continuous batching, a paged KV cache with automatic prefix caching, and a
// roofline step-time model. It is pure: no I/O, no goroutines, no wall clock.
// The caller owns time: Add and Step take the virtual time now (a
// time.Duration since the caller's epoch), and Step returns how long the
// modelled step takes. The simulator (package sim) steps engines in virtual
// time; the emulator (package emulator) steps one in real time, sleeping for
// each step's Duration. An Engine is not safe for concurrent use.
//
// A driver adds requests with Add, calls Step (or StepInto, which reuses the
// caller's StepResult so a busy loop allocates nothing) while HasWork, and
// advances its clock by each StepResult.Duration. Outputs carry one token per
// request per step with its timing (TTFT, inter-token latency, and on the
// last output queue, prefill and decode times); Stats carries what vLLM's
// /metrics reports. Profile.StepTime, PrefillTime and DecodeTime expose the
// cost model to planners; StepCost is the same with its constants derived
// once, and its ChunkedPrefill prices a prefill of any number of
// budget-sized steps (each also decoding a batch) in O(1), the steps' sum
// in closed form. PrefixHit probes the cache without touching it.
// DecodeRun looks ahead over the coming plain decode steps (how many until a
// request finishes, and how long they take) and MinStepTime bounds any
// step from below, so a real-time driver can sleep through steps nobody
// observes and compute them later at their own start times; DecodeSteps
// computes such a run at once, the step in which requests finish included,
// with exactly the results of stepping it (tokens, block allocations and
// evictions, prefix-cache entries, the finished requests' outputs, events,
// Stats), visiting a request only at the steps where its tokens reach a block
// boundary and at the run's ends (DecodeStepsBefore: up to the step in
// progress when an input arrives). A driver that needs only each request's
// first and last outputs sets StepResult.Summarize (and
// DecodedRun.Summarize): the other tokens then come as a count and runs of
// equal inter-token latencies, each placed among the outputs, rather than
// an Output (or a DecodedSeq) each.
//
// # Scheduling (vLLM V1)
//
// Each Step is one scheduler iteration with a token budget of
// MaxNumBatchedTokens. Running requests are served first, in admission order:
// a decoding request takes one token, a request still prefilling takes
// min(remaining prompt, budget) tokens (chunked prefill). When a running
// request needs a block and none is free, the newest running request is
// preempted (its blocks freed, its progress discarded: recompute) and put back
// at the front of the waiting queue, as vLLM does. If nothing was preempted,
// waiting requests are admitted in FCFS order while the budget and
// MaxNumSeqs allow: each first reuses the longest run of its leading blocks
// found in the prefix cache (never the whole prompt: one token is always
// computed), then prefills the rest in budget-sized chunks. A request
// produces a token in the step where all its known tokens have been
// computed.
//
// # LoRA adapters
//
// A request served by a LoRA adapter names it (Request.LoRA, vLLM's
// lora_name). Its blocks' hashes carry the name among their extra keys
// (HashFunc.Keyed), so the base model's and each adapter's requests
// share no cached block. With Config.MaxLoRAs (vLLM's --max-loras) a step
// schedules requests of at most that many adapters: the running requests
// are scheduled first whatever their adapters, then a waiting request
// whose adapter is not among the step's when they are MaxLoRAs already
// is skipped (it keeps its place at the head of the queue) and the
// requests behind it are considered, as vLLM V1's scheduler does.
// AppendLoRAs reports the running and waiting adapters
// (vllm:lora_requests_info). Requests that MaxLoRAs keeps out do not end
// a plain decode run (DecodeRun, DecodeSteps): the steps skip them all. Adapter weights are not modelled: no load
// time when an adapter first serves, no extra compute per step (vLLM
// loads an adapter in the step that first schedules it, from disk or
// its CPU cache, a cost this model leaves out).
//
// # Disaggregated prefill (P/D)
//
// A prefill leg (Request.HoldKV) keeps its blocks when it finishes, until
// Release. A decode leg whose KV the driver moves itself
// (Request.RemoteKV, the emulator's; of any length: the driver decides
// whether a prompt shorter than a block moves) is scheduled as vLLM's scheduler
// schedules a request its KV connector loads asynchronously: admitted in
// FCFS order like any waiting request (while the budget and max_num_seqs
// allow, though it takes neither), it takes its prefix-cache hit and
// blocks for the rest of its prompt at once, or waits in the queue when
// they do not fit; then it holds them, computing nothing, counted in
// Stats.Waiting (and Loading) and in KVUsage, until the driver calls
// LoadedKV. StepResult.Loads reports each admission with the tokens to
// move (the prompt past the local hit). When the KV arrived, the received
// full blocks are cached (BlockStored) in the step that schedules it,
// which computes only the last prompt token, as vLLM's
// _update_waiting_for_remote_kv does; when it failed, the request
// computes its prompt past its local hit (kv_load_failure_policy
// "recompute"), in the blocks it holds (with no local hit it frees them
// and is admitted again; see LoadedKV). Aborted
// while its KV arrives, it is reported at once and leaves Waiting, but its
// blocks stay held (Stats.AbortedLoading) until LoadedKV says the transfer
// ended, as vLLM frees them only then. The simulator's
// decode legs (Request.SkipPrefill) skip the wait: their KV is taken as
// there when they are admitted.
//
// # KV cache and prefix caching
//
// The cache is NumGPUBlocks blocks of BlockSize tokens, of which, as in
// vLLM's BlockPool, block 0 is the null block, never allocated: requests
// hold the other NumGPUBlocks - 1 (Profile.UsableBlocks; BlockIDs are
// vLLM's, 1 and up), and KVUsage is used / (NumGPUBlocks - 1), as
// vllm:kv_cache_usage_perc, while Stats.NumGPUBlocks counts the null block,
// as vllm:cache_config_info does. A full block is keyed
// by a hash chained over its parent block's hash and its token ids (HashFunc:
// the default XXH3 chain equals kvindex.HashTokens; SHA256 and SHA256CBOR
// reproduce vLLM's sha256 and sha256_cbor algorithms with their NONE_HASH
// seed, byte for byte; with a LoRA adapter's or a cache_salt's extra
// keys, as vLLM's generate_block_hash_extra_keys gives them). Requests given as BlockHashes (the simulator's fast
// path, no token ids) use those keys directly. Blocks are reference counted;
// a block whose last reference is dropped joins the tail of the free queue
// but keeps its hash, so it can still be hit; allocation pops the head of the
// queue and evicts its hash. This is vLLM's FreeKVCacheBlockQueue order (LRU
// by time freed; a finished request's blocks are freed tail first so its
// prefix outlives its suffix). Blocks are cached as soon as they are
// allocated for tokens whose ids are known, as vLLM does, and the step's KV
// events report it: BlockStored (with parent hash, token ids, block size and
// medium "GPU"), BlockRemoved on eviction (one event listing the hashes an
// allocation evicts; the emulator sends one per block, as vLLM does; a
// stored block of an adapter's request names the adapter, KVEvent.LoRA),
// AllBlocksCleared after ResetPrefixCache.
//
// Like vLLM's block pool the cache does not de-duplicate: a request that
// computes a block another one already cached (the last full block of a
// prompt whose earlier blocks were hits, since one token is always
// computed; or equal outputs of requests with equal prompts and seeds)
// caches its copy under the same hash and reports it with its own
// BlockStored. A lookup hits the copy cached first of those still cached;
// evicting a copy reports BlockRemoved for the hash while the other copies
// stay cached and hittable, so a consumer of the events counts copies
// (kvindex.Index does).
//
// # Step time
//
// Step time follows the roofline form of the project's papers.md section 4.8:
//
//	GEMMs      max(weight bytes / (BW x eff), 2 N_active x tokens / (peak x MFU))
//	prefill    attention FLOPs q x (p + q/2) per chunk, or the cached-context KV read
//	decode     KV bytes of every decoding sequence's context / (BW x eff)
//	TP         two all-reduces per layer (latency + ring bytes over NVLink)
//	overheads  fixed per step + per scheduled sequence
//
// so prefill time grows with uncached tokens and the cached context they
// attend to, decode time with batch size and total context, and small steps
// sit on the weight-read floor. Profiles carry the model shape, the GPU and
// the efficiencies; the 8B/H100 one is checked against BLIS's published fit
// for vLLM on that hardware (cost_test.go).
//
// # What is approximated
//
//   - No real model runs: output tokens are pseudo-random ids from the
//     request's seed; EOS is emitted only at Request.EOSAt. Sampler computes
//     them from the request alone, so a driver need not collect them.
//   - Costs are an analytic roofline, not measured kernels: no CUDA-graph
//     batch padding, no sampler or detokeniser cost beyond a per-sequence
//     constant, no async scheduling overlap, no speculative decoding.
//   - One KV cache group (no hybrid/sliding-window models), no
//     multimodal extra keys (LoRA's and cache_salt's are: Request.LoRA,
//     Request.CacheSalt), no CPU offload tier.
//   - LoRA adapters change block hashes and scheduling only: their
//     weights cost no load time and no compute (see LoRA adapters).
//
// Prefix-cache query and hit counters count lookups as vLLM's exported
// ones (vllm:prefix_cache_queries, _hits) do: a request's first, not a
// preempted request's new lookup (vLLM counts those apart, unexported),
// and again the new lookup of a request whose KV load failed with no
// local hit (LoadedKV).
package engine

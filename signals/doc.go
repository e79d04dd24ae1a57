// Package signals gives the router its view of each engine: metrics scraped
// from the engine's /metrics (ParseMetrics, Scraper), the router's own
// dispatches layered on top of them (View), and the engine's KV-cache events
// (Subscriber) that feed the precise prefix index (kvindex.Index). Manager
// runs the scrape loops and subscribers of a set of endpoints.
//
// # Metrics
//
// ParseMetrics reads a body with the Prometheus text parser (expfmt) and
// normalises it (Metrics); the flavour is detected from the metric names or
// forced. A text page whose every line a mirror of expfmt's rules vouches
// for is handed to expfmt with only the families read (parsefilter.go:
// about 70 us for a vLLM page instead of 0.9 ms), with identical results
// and errors; any other page is parsed whole:
//
//	flavour      waiting                    running                  KV usage                    prefix hits / queries (tokens)
//	vllm         vllm:num_requests_waiting  vllm:num_requests_running vllm:kv_cache_usage_perc   vllm:prefix_cache_{hits,queries}_total
//	vllm-legacy  (same)                     (same)                    vllm:gpu_cache_usage_perc  vllm:gpu_prefix_cache_{hits,queries}_total
//	sglang       sglang:num_queue_reqs      sglang:num_running_reqs   sglang:token_usage         sglang:cached_tokens_total / prompt_tokens_total
//	llamacpp     llamacpp:requests_deferred /slots: busy slots          /slots (see below)         prompt_tokens_cached_total / (+ prompt_tokens_total)
//	tgi          tgi_queue_size             tgi_batch_current_size    (none)                     (none)
//
// SGLang's waiting adds a P/D server's queues ahead of its work
// (--disaggregation-mode): sglang:num_prefill_bootstrap_queue_reqs
// (formerly sglang:num_prefill_prealloc_queue_reqs),
// sglang:num_decode_prealloc_queue_reqs and
// sglang:num_decode_transfer_queue_reqs; not the prefill inflight queue,
// whose requests are prefilled and wait only for their KV to be read.
//
// llama.cpp removed its KV gauges from /metrics in 2025 (PR #13660); a
// llama.cpp page (forced or detected) makes the scraper read the server's
// GET /slots too, at the same URL with the path's last element "metrics"
// replaced by "slots" (query kept), and GET /props once (again when the
// slot count changes or after failures): ParseSlots, ParseProps. What it
// adds (applySlots):
//
//	Running           the slots with is_processing (llamacpp:requests_processing counts the same)
//	TotalSlots        /props total_slots (-np), else the slots listed; BusySlots the busy ones
//	KVTokens          the busy slots' n_prompt_tokens: the tokens of the slot's cached sequence
//	                  (prompt and output so far) whose KV it holds; newer builds only
//	KVCapacityTokens  the sum of the slots' n_ctx (exact without --kv-unified; with it every slot's
//	                  n_ctx is the whole shared cache: configure kv_capacity_tokens instead)
//	KVUsage           KVTokens over KVCapacityTokens
//
// An idle slot keeps its last prompt cached (a new request overwrites it),
// so its tokens are not counted as used, as vLLM's kv_cache_usage_perc
// leaves out the cached blocks no request holds. A build without
// n_prompt_tokens (or a server none of whose slots ran a task yet) gives no
// KV figures: only the busy slots, never an invented number. Waiting stays
// llamacpp:requests_deferred (/slots has no queue). With KVTokens the View
// computes KV usage from the tokens over its capacity (a configured one
// first). /slots never fails a scrape: a 404 or 501 (--no-slots) is one
// INFO line and the signals come from /metrics alone, /slots asked again
// after SlotsRetry (1 min); any other failure is one WARN per failure
// streak. The other way round, llama.cpp serves /metrics only with
// --metrics (else its 501 "This server does not support metrics endpoint")
// but /slots by default: a server whose /metrics answers that 501 (flavour
// auto or llamacpp; 404 too for llamacpp) is read from /slots alone
// (slotsAlone), its waiting requests unknown, logged once each way.
//
// A llama.cpp server's LoRA adapters are read from its GET /lora-adapters
// (same URL, "lora-adapters" for "metrics"): ParseLoRAAdapters, named by
// the router as LlamaAdapters says (path, file name without ".gguf",
// task_name), carried by each of its Metrics (LlamaAdapters) and View
// (View.LlamaAdapters) for the router to name an adapter by its id in a
// request's "lora" list. The list is read at the first scrape, every
// ScrapeConfig.LoRAListInterval (10 s) and at the first scrape after a
// failed one, as a restart may change it; a 404 or 501 (a build without
// the endpoint) lists none, another failure keeps the last list.
//
// vLLM's vllm:cache_config_info gives the block size and the number of GPU
// blocks (KV capacity), vllm:lora_requests_info the adapters running and
// waiting and max_lora (Load.LoRA while the signals are fresh). Series
// of several data-parallel engines are summed (ratios averaged) by
// ParseMetrics. SGLang publishes its scheduler gauges once per scheduler
// worker, labelled with its ranks: the copies of one data-parallel group's
// numbers (series differing only in tp_rank, pp_rank, moe_ep_rank: its
// pipeline stages, and its tensor-parallel ranks with
// --enable-metrics-for-all-schedulers) count once, the largest copy;
// data-parallel groups (dp_rank, DP attention's too) add up, their
// token_usage averaged weighted by max_total_num_tokens. With
// --enable-priority-scheduling its queue gauges carry a per-priority
// breakdown (priority="<n>") beside the total (priority=""): only the
// total counts. ParseMetricsRanks instead gives each rank of a vLLM
// --data-parallel-size server the series of its own engine="<rank>" label
// (vllm:cache_config_info included), for a Target with Ranks: one scrape of
// the server per interval, each rank's View observing its own signals, a
// failed scrape (or a rank with no series) that rank's failure.
//
// # The stale-signal model
//
// A scrape is a photograph of the engine taken at some instant S; by the time
// the router decides, the photograph is old and the router has sent more
// requests since. A View keeps the last photograph and the transitions the
// router itself caused or witnessed after S, and adds them up:
//
//	time ──────────────────────────────────────────────────────────────────►
//	        S1 (scrape sent)              S2 (scrape sent)       now
//	        │ engine: W=2 R=5             │ engine: W=3 R=6       │
//	   d1 ──┤   d2    d3   ft1   done4    │   d5    d6   ft2      │ Load(now)
//	        │   └─────┴────┴─────┴─ log ──┼──►dropped (in S2)     │
//	        │                             │   └─────┴────┴─ log ──┤
//	                                        Load = W,R of S2 + transitions after S2
//
// The transitions:
//
//	Dispatch  (d)         waiting +1, KV tokens +prompt
//	FirstToken (ft)       waiting -1, running +1 (the engine moved it to decode)
//	Done before its ft    waiting -1, KV tokens -prompt
//	Done after its ft     running -1, KV tokens -prompt
//
// Reconciliation: when a scrape sampled at S arrives (Observe), every
// transition at or before S is assumed visible in the engine's own numbers
// and dropped from the log; transitions after S stay on top of the new
// numbers. Nothing is counted twice, and a burst of dispatches between two
// scrapes raises the endpoint's Waiting at once, so the burst does not pile
// onto the node that looked emptiest in the last scrape. The scraper passes
// the time the scrape request was sent as S: a dispatch racing the scrape is
// then counted on top until the next scrape, which errs towards over-counting
// load rather than under-counting it. KV usage moves by the prompt tokens of
// the same transitions divided by the KV capacity (from
// vllm:cache_config_info or configuration).
//
// Staleness: once the photograph is older than ViewConfig.StaleAfter
// (default 1s), or MaxConsecutiveErrors scrapes in a row failed, Load
// reports Stale and falls back on router-local counts alone: Waiting =
// requests in flight without a first token, Running = those with one,
// KVUsage = their tokens over the KV capacity.
// Failed scrapes are counted and reported (Snapshot), never silently
// trusted. InFlight, InFlightTokens and DecodeTokens are always router-local
// and so always fresh.
//
// The prefix-cache hit rate is the rate of the engine's token counters over
// the scrapes of the last ViewConfig.HitRateWindow (a counter going down
// means the engine restarted and starts a new window); unknown (-1) while
// the signals are stale.
//
// A View never reads the clock: callers (the proxy with time.Now, the
// simulator with virtual time) pass now in. Views are safe for concurrent
// use.
//
// # Scraping
//
// A Scraper is one endpoint's loop, modelled on Prometheus' scrape loop:
// the first scrape waits Offset(endpoint, interval) so that endpoints spread
// over the interval (default 100 ms), each scrape has a timeout (default 1s;
// scrapes of one endpoint never overlap) and a body size cap (4 MiB), the http.Client is passed in, and
// a failed scrape is recorded with View.ObserveError. Manager owns the loops:
// Sync starts, restarts and stops them (waiting for each to exit; a changed
// endpoint whose KV-event target is the same keeps its subscriber, one whose
// target changed has its entries removed from the old Sink before a new
// subscriber starts from scratch; one whose MetricsURL changed has its
// View's scraped signals forgotten, View.ResetSignals, so that neither the
// old source's last observation nor its counters pass for the new
// one's), Close stops all; its per-endpoint metrics
// (EndpointMetrics: kvroute_endpoint_signal_age_seconds,
// kvroute_endpoint_scrape_errors_total, kvroute_endpoint_waiting,
// ..._running, ..._kv_usage, KV-event counters, labelled "endpoint"; and
// kvroute_endpoint_inflight) are collected from the live state on the
// Registerer it was given. The router (package proxy) exports the same
// EndpointMetrics labelled "model" and "endpoint". Lock order:
// Manager.mu, then a View's, Scraper's or Subscriber's own lock.
//
// # KV-cache events
//
// A Subscriber follows one engine's ZMQ PUB socket ([topic, seq, payload]
// messages, payload a msgpack EventBatch in either of vLLM's encodings,
// decoded by EventDecoder) and applies BlockStored, BlockRemoved and
// AllBlocksCleared to a Sink. Sequence numbers:
//
//	seq == next          apply
//	seq >  next (gap)    replay [next, seq) from the engine's ROUTER socket over a DEALER
//	                     (send ["", next], read ["", seq, payload] until seq -1); if there is no
//	                     replay socket or the replay cannot fill the gap: drop the endpoint's
//	                     entries (resync), then apply
//	seq <  next          the engine restarted: drop its entries, catch up, apply
//	new connection, nothing applied yet (start, or after a restart)
//	                     catch up at once: replay and apply whatever history the engine
//	                     still buffers (batches that also arrive on the SUB socket are
//	                     skipped); with no history or no answer, the first batch does:
//	first batch, seq > 0 catch up: replay whatever history the engine still buffers
//	                     (a catch-up applies the replayed batches after their last hole
//	                     only, and before a first batch only those that end just before it);
//	                     no replay socket: warn that the seq batches before it are lost
//	                     (their blocks, and those stored on top of them, stay unindexed)
//	first batch on a new connection, seq >= next
//	                     replay from next-1 and compare that batch's bytes: the same
//	                     engine -> fill the gap; different -> it restarted (drop its
//	                     entries, catch up from 0); no replay socket -> resync, unless
//	                     the last connection only went idle and seq == next
//	new dialled connection after a failed one
//	                     the same check at once, before any batch (a restarted engine
//	                     publishes nothing until it serves a request): the same engine
//	                     -> apply the batches it published meanwhile (in the answer);
//	                     restarted, replay failed or no replay socket -> drop its
//	                     entries and take the next batch as a new subscription's
//	new connection to a listening socket (tcp, ipc), after its ZMTP handshake
//	                     the same check at once, before any of its batches; then a catch-up
//	                     if nothing of the engine's is trusted
//
// A data-parallel rank's subscription (SubscriberConfig.DataParallel: vLLM's
// rank r publishes on the configured tcp port + r) checks each batch's
// data_parallel_rank: a batch naming another rank is not applied (its
// blocks are in another rank's cache), only counted (RankMismatches) and
// logged once; a batch without one is applied.
//
// Events of one KV cache group feed the Sink: group 0, or, once a
// BlockStored names a full-attention group (kv_cache_spec_kind), that
// group (a hybrid model's group 0 may be a sliding-window or Mamba one). A
// BlockStored without token ids (vLLM's CPU offloading names its copies by
// hash alone) adds its tier to blocks the endpoint stored with their tokens.
//
// Run owns the sockets and re-dials after failures or a silence of
// IdleReconnect (at once). After failures it backs off as gRPC does:
// DialRetry (500ms) times 1.6 per failure in a row, up to MaxDialRetry
// (5s), each pause spread by ±20% so that the subscriptions of engines that
// went down together do not re-dial in lockstep; a connection made resets
// it. In listen mode the listening socket
// stays bound for all of Run, with no idle timer. EncodeEventBatch writes
// the same payloads (for the engine emulator and tests).
//
// Every ZMTP connection, dialled or accepted, reads through a frame
// scanner (zmqframe.go): a peer that announces a frame or multipart
// message over SubscriberConfig.MaxFrameSize (default 64 MiB) is dropped
// before zmq4 allocates for it; a session reads at most 64 messages and
// MaxFrameSize bytes ahead of their handling. A replay answer that passes
// SubscriberConfig.MaxReplayBatches (default 10000, vLLM's default
// buffer_steps) or MaxReplayBytes (512 MiB) without its end marker fails
// and none of it is applied. A listening socket reads each peer's side
// of the handshake itself, within ReplayTimeout, before zmq4 takes the
// connection (zmqlisten.go): a peer that connects and stays silent is
// dropped and never holds up another engine's connection; so is a peer
// whose READY names another socket type than PUB or XPUB (zmq4 would
// reject it, and it must not pass for an engine's reconnection).
package signals

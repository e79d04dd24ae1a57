// Package emulator is `kvroute engine`: an HTTP server that speaks vLLM's
// wire protocols around the deterministic engine model of package engine, so
// that the router, the benchmarks and the demo run against something that
// behaves like a real inference fleet without a GPU.
//
// A Server serves:
//
//   - POST /v1/completions and POST /v1/chat/completions, streaming and not,
//     in current vLLM's exact JSON and SSE shapes (package openai: a whole
//     response with every field of vLLM's model, null service_tier,
//     system_fingerprint, token_ids, prompt_token_ids, prompt_logprobs and
//     the message's refusal, annotations, audio, function_call and
//     reasoning, which was reasoning_content before vLLM 0.16; completions
//     chunks dumped whole, "usage":null included; chat chunks with the
//     fields vLLM's serving code sets, the first one's top-level
//     prompt_token_ids and the others' token_ids null; with
//     return_token_ids the prompt's ids and the generated tokens' ids
//     (every token counted in completion_tokens, an EOS that ended the
//     answer included, up to a stop string's match) fill them: a whole
//     response's prompt_token_ids (the completions choice's, the chat
//     response's) and its choice's token_ids, a stream's first chunk's
//     prompt_token_ids (chat: the role chunk's; completions: the
//     choice's) and each content chunk's token_ids, the ids of its
//     tokens, recomputed with the engine's Sampler; a chat request
//     with add_generation_prompt false answered in its last message's
//     role, as vLLM's get_chat_request_role answers it; the response id
//     "cmpl-" or "chatcmpl-" and the X-Request-Id header's value, else
//     the body's request_id, else 32 random hex digits), with vLLM's
//     errors (status, type, param and, for prompts longer than the model's
//     context, the message of its current renderer) for bad input, 404 for
//     another model, and FastAPI's 404 and 405 for unknown routes and
//     methods; chat content given as a list of parts is read as vLLM
//     reads it for a text-only model (the text of its text, input_text,
//     output_text, refusal and thinking parts and of plain strings, joined
//     with "\n"), and an image, audio or video part is vLLM's 400 "<model>
//     is not a multimodal model"; usage always has
//     prompt_tokens_details.cached_tokens (streamed usage chunks too), as
//     vLLM's with --enable-prompt-tokens-details, which is off by default,
//     but for one thing: vLLM leaves the details out (null, or absent from
//     a usage chunk) when no prompt token was cached, where the emulator
//     reports cached_tokens 0 (the router and kvroute bench read an absent
//     count as 0 from an engine that has reported one);
//     logprobs and top_logprobs get vLLM's checks (its request models'
//     check_logprobs, as "Bad Request" errors, then the limit of
//     Config.MaxLogprobs, --max-logprobs, default 20), and a request that
//     passes them and asks for logprobs (chat logprobs true, a completions
//     logprobs that is not null) a 400 with param "logprobs": the engine
//     model computes no token probabilities, and the emulator refuses
//     rather than return made-up ones a client would trust (options.go);
//     tools and tool_choice get vLLM's check_tool_usage, and a chat request
//     whose tool_choice is "auto", given or implied by its tools, vLLM's
//     400 ("auto" tool choice requires --enable-auto-tool-choice ...)
//     unless Config.EnableAutoToolChoice; no tool calls are generated
//     either way (tool_calls stays []);
//     a cache_salt (a non-empty string, else vLLM's 400) keys the prompt's
//     first block as vLLM's does, so that only requests with the same salt
//     share cached blocks (engine.Request.CacheSalt), and that block's
//     BlockStored event carries the extra_keys entry (cache_salt,);
//     with LoRA (Config.LoRA, vLLM's --enable-lora and --lora-modules) a
//     request whose model names an adapter is served by it
//     (engine.Request.LoRA): every block of its prompt is keyed with the
//     adapter's name, so it shares no cached block with the base model or
//     another adapter, its BlockStored events carry lora_id (the
//     adapter's int id: the n-th module's is n, a runtime load's the next),
//     lora_name and each block's extra_keys entry (lora_name,), (lora_name,
//     cache_salt) on a salted first block, and its responses carry the
//     adapter's name as their model; a model that is neither the served
//     one nor an adapter gets vLLM's 404 ("The model `x` does not
//     exist."); the engine model schedules at most LoRAConfig.MaxLoRAs
//     adapters a step, skipping a waiting request of another as vLLM's
//     scheduler does (engine.Config.MaxLoRAs); GET /v1/models lists the
//     adapters after the served model (root: the module's path, parent:
//     the served model, max_model_len null), vllm:lora_requests_info is in
//     /metrics (vLLM flavours; labels max_lora, running_lora_adapters and
//     waiting_lora_adapters, comma-joined, no model_name or engine; one
//     series per label set seen, its value the wall-clock time it was last
//     set, at each stats publication rather than at each step), and with
//     LoRAConfig.RuntimeUpdating (VLLM_ALLOW_RUNTIME_LORA_UPDATING) POST
//     /v1/load_lora_adapter and /v1/unload_lora_adapter answer as vLLM's
//     do (lora.go). No adapter weights are read; their load time and
//     compute are not modelled; like vLLM, NewDP refuses LoRA with more
//     than one rank;
//   - GET /metrics in the vLLM (current or legacy names), SGLang or llama.cpp
//     flavour, on a private Prometheus registry; a request a stop string
//     ended counts, in vllm:generation_tokens_total, its finish (reason
//     stop, request_generation_tokens; its decode, inference and
//     end-to-end times end at the match) and inter_token_latency_seconds
//     (recorded with its finish), the tokens up to the match, as vLLM's
//     output processor does, not those the engine produced before its
//     abort arrived (iteration_tokens_total too: a step with such a
//     request's outputs is observed once its handler searched their
//     tokens, as vLLM's front end observes a step once it processed it);
//     a request whose client left records no finish (vLLM's front end
//     forgets it: request_success_total has no "abort" for it, the
//     per-request histograms nothing), its tokens until then counted; a
//     decode engine's request whose KV is being pulled from the prefill
//     engine counts as waiting (vllm:num_requests_waiting and the load
//     header's num_requests_waiting, as vLLM's scheduler keeps it in its
//     waiting queue until its KV arrived; llamacpp:requests_deferred) and
//     its blocks in vllm:kv_cache_usage_perc (see Disaggregation); the
//     current vLLM names add the KV connector's prefix-cache counters
//     (vllm:external_prefix_cache_queries_total and ..._hits_total: at a
//     request's first scheduling, its prompt tokens past the local
//     prefix-cache hit, and those the connector moves; recorded for every
//     request of an engine with a P/D role, which vLLM runs with a
//     connector, and for every decode leg) and the prompt tokens by source
//     (vllm:prompt_tokens_by_source_total{source="local_compute",
//     "local_cache_hit", "external_kv_transfer"},
//     vllm:prompt_tokens_cached_total, vllm:prompt_tokens_recomputed_total,
//     as vLLM's PromptTokenStats counts them at a request's first token: a
//     decode leg of an n-token prompt, h of them hit locally, adds 1, h and
//     n-h, n-1 cached and 1 recomputed); the vllm prefix-cache counters
//     count the local lookup only (queries the whole prompt, hits the local
//     hit); the SGLang flavour has SGLang's P/D queue gauges (under the
//     names of the SGLang its labels model:
//     num_prefill_prealloc_queue_reqs, since renamed
//     num_prefill_bootstrap_queue_reqs), from the engine's state:
//     num_prefill_prealloc_queue_reqs the prefill legs waiting for their
//     decode engine's bootstrap, not yet in the engine (see
//     Disaggregation), num_prefill_inflight_queue_reqs the prefilled
//     requests whose KV is held for a decode engine (not pulled yet, or
//     being pulled), num_decode_prealloc_queue_reqs the decode legs queued
//     for KV space, num_decode_transfer_queue_reqs those holding it in
//     their KV pull (none of them in num_queue_reqs, the engine's own
//     waiting queue, or num_running_reqs);
//   - GET /health, GET /v1/models, GET /version (Version: the oldest vLLM
//     release whose response shapes the emulator emits, 0.16.0, with the
//     local label +kvroute.emulator), POST /tokenize, POST
//     /detokenize ({"tokens": [...]} -> {"prompt": text}, special tokens
//     kept, ids the tokenizer does not know skipped) and POST
//     /reset_prefix_cache as vLLM has them, and vLLM's in-band load report
//     (the endpoint-load-metrics response header, on request);
//   - with the llama.cpp flavour, llama.cpp's GET /slots and GET /props
//     (slots.go; tools/server/server-context.cpp's shapes): the engine's
//     batch shown as max_num_seqs slots (llama.cpp's -np), a running
//     request in one slot for as long as it runs (the least recently used
//     idle one when it starts), n_prompt_tokens the tokens whose KV it
//     holds, an idle slot keeping its last task's numbers as last
//     published; n_ctx is max_model_len, as with llama.cpp's --kv-unified
//     (all slots share one cache); ?fail_on_no_slot=1 is llama.cpp's 503
//     "no slot available" when no slot is idle, Config.NoSlots
//     (--no-slots) its 501 on /slots; /props gives total_slots and
//     default_generation_settings.n_ctx;
//   - with the llama.cpp flavour, llama.cpp's LoRA adapter API instead of
//     vLLM's naming (llamalora.go): LoRAConfig.Modules are the adapters
//     llama.cpp's --lora loads at start, the n-th with id n-1 at global
//     scale 1 (LoRAConfig.RuntimeUpdating is refused); GET /lora-adapters
//     lists them ([{"id", "path", "scale", "task_name", "prompt_prefix"}],
//     server_task_result_get_lora's shape, as the router's
//     signals.ParseLoRAAdapters reads it; none without LoRAConfig.Enable);
//     POST /lora-adapters [{"id": 0, "scale": 0.5}] sets the global
//     scales (unlisted adapters to 0; {"success": true}), a body that is
//     not an array llama.cpp's 400 "Request body must be an array", an id
//     the server does not have its 500 "invalid adapter id"; a request's
//     "lora" list of the same form gives its scales (unlisted adapters at
//     0; without it the global scales apply), a "lora" that is not an
//     array or names an id the server does not have llama.cpp's 400 in its
//     error shape ({"error": {"code", "message", "type":
//     "invalid_request_error"}}). The adapters a request runs with (scale
//     not 0) are its engine.Request.LoRA, as a vLLM adapter named by
//     "model" is (several: their names joined with "+"): its blocks keyed
//     with it, its responses naming it as their model (llama.cpp answers
//     in the served model's name; the emulator names the adapter so that a
//     client sees which one ran); "model" selects no adapter there. Scales
//     are not modelled (0.5 keys blocks as 1 does). These are the builds
//     whose parse_lora_request refuses an unknown id; later ones ignore it;
//   - KV-cache events over ZMQ (a PUB socket and the replay ROUTER socket),
//     array or map encoded, exactly as vLLM publishes them (one
//     BlockRemoved per evicted block; a block two requests computed is
//     cached twice, each copy with its own BlockStored);
//   - prefill/decode disaggregation in vLLM's NixlConnector form
//     (kv_transfer_params) or SGLang's bootstrap form, with a small side
//     channel (POST /internal/kv/pull) that the decode engine calls on the
//     prefill engine to pull and release the held KV blocks (in the
//     NixlConnector form, for the transfer time of the prompt tokens past
//     the decode engine's own prefix-cache hit, as vLLM pulls only those).
//
// Prompts are tokenized with tokenizer.Builtin (chat messages rendered with
// the ChatML template first, with the generation prompt unless the request
// sets add_generation_prompt false, cut after the final message's content
// for continue_final_message); generated token ids come from the engine model
// (seeded, so a request's text is deterministic for a seed) and are rendered
// to text with the same tokenizer. With another Config.Tokenizer (a
// HuggingFace tokenizer, `kvroute engine --tokenizer`) prompts are encoded as
// vLLM encodes them: chat messages through the tokenizer's chat template
// (each message with the keys vLLM's ConversationMessage keeps: an
// assistant's tool_calls, a tool message's tool_call_id, a name, ...),
// completion prompts with its special tokens (BOS) unless the request's
// add_special_tokens is false; the generated ids, drawn
// from the model's vocabulary with the tokenizer's EOS, are decoded by it with
// special tokens skipped, and a stream holds back the first bytes of a
// character until its last byte is generated (a chunk due meanwhile is
// sent with empty text, as one whose text a stop string holds back: vLLM
// sends a chunk for every output that has tokens). A chat
// request's add_generation_prompt, continue_final_message,
// chat_template_kwargs (whose own add_generation_prompt and
// continue_final_message the request's override, whose tools override the
// request's, and whose null and "auto" values are unset, as in vLLM:
// tokenizer.ChatRequest.Vars), tools, documents and reasoning_effort (as
// reasoning_effort and enable_thinking) reach the template as in vLLM; a
// chat template of the request's own, or kwargs naming "messages" or
// "conversation", are vLLM's 400s (tools left out when tool_choice is "none"
// with Config.ExcludeToolsWhenToolChoiceNone, vLLM's
// --exclude-tools-when-tool-choice-none), and add_special_tokens true adds
// the tokenizer's special tokens to the rendered prompt, unless
// chat_template_kwargs' tokenize is true (vLLM then has transformers
// encode the rendering, without them; its padding and truncation
// arguments are not followed).
//
// One goroutine, started by Run, owns the engine model: it takes the
// requests handlers queued, steps the model, sleeps the modelled step time
// (divided by Config.Speed), then hands the step's tokens to the waiting
// handlers in one batch. Handlers of non-streaming requests are woken once,
// when their request finishes (they recompute its tokens with the engine's
// Sampler rather than have the loop collect them); streaming handlers at
// every token, or with
// Config.StreamInterval n (vLLM's --stream-interval) at the first token,
// then every n tokens and at the last. Run returns when its context is
// cancelled, after failing every live request and stopping the KV-event
// publisher.
//
// # Timing
//
// The engine model runs Speed times faster than its profile (engine.Config
// Speed), so its clock is real time since the Server started. A request is
// queued at the current time; each step starts where the previous one
// ended, and the loop sleeps until the step's end before delivering its
// tokens (steps shorter than 50 us are not slept, so very high speeds run
// as fast as the CPU allows). When the loop falls more than 2 ms behind real
// time (a starved CPU) the model's clock jumps forward: the lag shows up as
// latency, as it would on a real engine. The engine's own timings (TTFT,
// inter-token latency, queue time in /metrics) are therefore the model's,
// and what clients observe adds HTTP and scheduling overhead.
//
// # CPU cost
//
// Waking a process is the emulator's main CPU cost at --speed 1 (a step is
// ~6 ms on the 8B profile; each wake-up costs a few microseconds on bare
// metal and ~100 us in a virtual machine). So the loop does not wake at
// steps nobody observes: when the coming steps are plain decode steps
// (engine.DecodeRun) that finish no request, wake no handler and publish
// no KV events, it sleeps until the end of that run, then computes the
// steps that started meanwhile, each at its own start time and after
// exactly the commands that arrived before it (commands carry their
// arrival time), so outputs, times and metrics are those of stepping at
// every boundary. A new request that can only be observed when it finishes
// (its output tokens x engine.MinStepTime later, at the earliest) does not
// wake the loop either; when it joins the model it lengthens the run, and
// the loop, waking at the run's old end, sleeps through the step then in
// progress and the rest of the run at once. So a non-streamed request costs
// the loop about one timed wake-up (its finish) whatever its length. The
// steps slept through, and the finish that ends them, are then computed at
// once (engine.DecodeSteps; the step in progress when the loop woke too,
// unless a request finishes in it, rather than stepped alone): the loop
// records each step's batch size and latencies in the metrics as stepping
// would, and the streams' token counts, without a StepResult per step, and
// wakes the finished requests' handlers as it would after stepping. While
// no handler is woken before its request finishes, neither such a run nor
// a step the loop takes reports the running requests' tokens one by one:
// the engine summarises the tokens that neither start nor finish a request
// (engine.StepResult.Summarize, engine.DecodedRun.Summarize) as a count and
// runs of equal inter-token latencies, in the order the metrics record
// them. A GET /metrics during such a run first brings the snapshot up to
// date.
// Streaming at every token needs a wake-up per step and a write per chunk,
// as in vLLM; --stream-interval divides the writes.
// TestFleetCPU (KVROUTE_SOAK=1) measures the CPU of 16 engine processes
// under load, with their threads' context switches and the loop's timed
// wake-ups per request (KVROUTE_SOAK_FLOOR=1: side by side with a fleet of
// trivial servers that only sleep and answer, fed the same requests;
// KVROUTE_SOAK_FLOOR=first measures that fleet first), on
// engines whose KV caches it fills first, so that every block evicts one
// as in an engine that has served for a while; BenchmarkHandlerCPU the
// code's cost without the wake-ups, BenchmarkLoop the engine loop's alone,
// BenchmarkLoopWake the loop's with its memory cold at each wake-up, as it
// wakes in the soak (about once a request, at a finish).
// Much of a process's CPU per request is Go's runtime and net/http, the
// floor's as well: each wake-up that makes a system call also wakes its
// sysmon thread, which then polls every 20 us while the process is busy,
// and with GOMAXPROCS > 1 a woken goroutine wakes a second thread; running
// each engine process with GOMAXPROCS=1 (KVROUTE_SOAK_PROCS=1) saves about
// a third of the context switches. In the soak, sysmon's wake-ups are most
// of a process's context switches (1,805/s in the engines' process against
// 1,512/s in the floor's, whose other threads switched as often), and each
// costs about 18 us of CPU: about a quarter more on every microsecond the
// engine loop spends. A timer slack of 500 us on every thread of both
// processes (/proc/<tid>/timerslack_ns) cut both processes' CPU by about
// 70 us per request and the difference between them by nothing measurable,
// so the engine does not set one. On Linux the loop sleeps on a timerfd
// in Go's network poller, armed and read with raw system calls, rather
// than on a runtime timer (wakeTimer, waketimer_linux.go): the runtime
// waits for its timers with epoll_wait's millisecond timeout, so each of
// the loop's timers woke the process twice (a little early, then up to 1
// ms late), and sysmon, asleep until the next runtime timer, woke with it
// and polled through the loop's work; the timerfd wakes the poller once,
// on time, and sysmon only at the response's write. In the soak, side by
// side with the build before it (and the floor), that cost 62.1 us per
// request less (median of three rounds, range 40.3 to 65.1; 66.5, range
// 23.2 to 83.7, with the floor's fleet first), with 7.2 to 8.0 context
// switches per request instead of 10.4 to 11.8 (the floor's: 9.8 to
// 10.6); the engines' median above the floor was 68.4 and 55.0 us in
// those runs, the build before's rounds 103.8 to 151.0. Run again the
// same day on a busier host (the floor's own cost 331 to 424 us per
// request, 276 that morning): 35.6 us less than the build before (range
// 15.0 to 35.9), and, with the floor alone, 95.0 and 97.9 us above it in
// two runs (ranges 84.5 to 107.2 and 72.9 to 99.4; the build before had
// 92.1 that morning, and 106.7 to 136.8 above the floor in the run beside
// this build). Later, on a quiet host (no other job running): 69.4
// us over three rounds (range 62.3 to 120.8), and over five rounds after 90
// s of unmeasured load, 100.8 (80.1 to 145.6) with the engines' fleet first
// and 83.6 (62.2 to 118.3) with the floor's first, the mean of the two
// orders 92.2; the dearest rounds were those in which either process still
// grew its heap (0.4 to 1.8 page faults per request). Against the floor
// that holds as many requests (KVROUTE_SOAK_FLOOR_STEP=11ms: 138 in flight
// per engine, the engines 134 to 137), five rounds after 60 s of load: 88.3 (62.6
// to 151.2) with the engines first and 84.3 (62.1 to 102.0) with the floor
// first; on a later build, again quiet, with the floor first, 93.9 (63.9
// to 107.6), and on a later one (2026-12-05, after LoRA forms for
// llama.cpp and SGLang's short-prompt bootstrap) 88.6 (71.6 to 99.2;
// mean 85.7, standard error 5.9), and on a later one (2026-12-05, after
// llama.cpp's LoRA adapter API) 106.3 (68.1 to 125.2; mean 98.8, standard
// error 12.6), and again later that day with no change to the emulator
// or the engine model, 101.5 (64.1 to 122.7; mean 93.5, standard error
// 11.3), and after the engine's deferred keys stopped starting a run on a
// key with a copy (a table probe per request), 104.1 (67.4 to 141.1; mean
// 103.0, standard error 11.9), and again later that day with no change to
// the emulator's serving path, 110.5 (92.1 to 139.7; mean 113.6, standard
// error 8.3), and in a run of seven rounds of 30 s after 60 s of load
// (again no change to the serving path) 98.7 (77.1 to 160.8; mean 99.8,
// standard error 10.9). The dearest rounds are those in which a process
// still grows its heap: the soak also summarises the rounds in which every
// fleet stayed under 0.1 page faults per request (steadyFaults in
// fleet_test.go), the steady state of a fleet that has served for a while;
// in that run the first round had 1.9 faults per request in the engines'
// process and cost 160.8 us, and the 4 steady rounds 99.6 (77.1 to 100.7;
// mean 94.0, standard error 5.6). After 90 s of load, in two runs of eight
// rounds of 30 s that day (KVROUTE_SOAK_WARM=90 KVROUTE_SOAK_ROUNDS=8
// KVROUTE_SOAK_SECONDS=30 KVROUTE_SOAK_FLOOR=first
// KVROUTE_SOAK_FLOOR_STEP=11ms, with KVROUTE_SOAK_CONNS=140,
// KVROUTE_SOAK_TOKENS=1000, KVROUTE_SOAK_STREAM=0, KVROUTE_SOAK_PROCS=1 and
// KVROUTE_SOAK_PER_PROCESS=16; the floor's fleet first, the order that
// favours it), the medians were 91.6 (75.6 to 139.4; mean 96.5, standard
// error 6.7) and 87.8 (57.6 to 117.7; mean 83.5, standard error 7.0), and
// over their steady rounds (six in each; the others had 0.8 to 1.0 faults
// per request) 90.2 (75.6 to 95.2; mean 88.2, standard error 2.8) and 73.2
// (57.6 to 96.2; mean 75.4, standard error 5.8); with the engines' fleet
// first (KVROUTE_SOAK_FLOOR=1), 88.1 (48.1 to 132.9; mean 88.1, standard
// error 8.6), and 86.0 over its 7 steady rounds (48.1 to 102.2; mean 81.7,
// standard error 6.7): 21 of the day's 23 steady rounds were under 100 us.
// So the cost above the floor is under 100 us in the median of all but
// four of these runs, and in 54 of their 84 rounds;
// single rounds, those in which the heap grew, reach 161 us. A lower GOGC
// for the engines (25: the process holds 16 engines' models, about 100 MB
// of live heap, and at the default 100 it collected 12 times in a run of
// four and a half minutes, at 25 42 times) measured 80.9 us above the
// floor over three rounds against 102.4 for the default in runs one after
// the other, but side by side over five rounds the default cost a median
// 49.4 us less than it: the lower GOGC saved only the rounds in which the
// default's heap still grew (1.3 and 2.1 faults per request). So the
// engine leaves GOGC alone.
// Streamed at every token it is far above: the floor then streams too (a
// chunk per token at the tick of a ticker its open streams share), and at
// 20 requests/s of 1,000 streamed tokens (200/s is past what two cores
// can write for either fleet: the floor alone costs 14.1 to 14.4 ms of CPU
// per 1,000 streamed tokens, a write and a flush each) the engines cost
// 4.9 to 5.9 ms per 1,000 tokens above it over three rounds (median 5.7),
// with 306 to 325 context switches per request against the floor's 129
// to 135: each engine's loop wakes at every step (137 a second, 150 per
// request) to hand that step's tokens to a batch of 8 streams, where each
// of the floor's 16 tickers (runtime timers, 91 ticks a second) serves 15.
// Above the floor (whole responses),
// the cost is the engine loop's (about a third of an engine process's
// CPU, by perf), and the loop's is memory latency: each wake-up reads
// every running request's state cold, and each block a request allocates
// touches a block at random (and a table slot, for a prompt block;
// without KV events an output block's key is deferred until a lookup
// could reach it, see the engine
// package's deferred.go), and an arriving prompt's prefix hit reads a
// table slot and a block at random per cached block (loaded ahead in a
// short loop, so that their misses overlap: the engine's hitsAhead;
// BenchmarkInterleaved16 there steps 16 engines in turn, as the soak's
// process hosts them). An engine allocates its requests' state in slabs
// (the engine's seqSlab, and blockIDs for their arrays of block ids, which
// each block a request's tokens reach appends to), so that reading them
// all misses few pages, and the TLB less. Huge pages for the whole process
// would do more: with the host's transparent huge pages set to "always"
// rather than "madvise", an engine process whose huge pages were turned off
// (prctl PR_SET_THP_DISABLE) cost a median 51 us per request more than the
// same build with them, side by side over three rounds, the latter's fleet
// first (which the harness favours by about 7-17 us; see TestFleetCPU); how
// much of that the floor, a Go server too, would also gain was not measured
// side by side. The block pool's arrays alone on huge pages (madvise on
// their memory) measured no gain (medians -2.9 and +3.0 us over three and
// five rounds); mapped outside the Go heap, 2 MiB-aligned and advised
// before their first touch (the engine process then held 96 MiB of
// AnonHugePages), they measured dearer: a median of +28.2 us per request
// over five rounds, the huge-page fleet first. So the engine does not ask
// for them.
//
// # Data parallelism
//
// NewDP runs N Servers (ranks) behind one HTTP endpoint, as vLLM's
// --data-parallel-size N with internal load balancing: each rank has its
// own engine model, KV cache, loop goroutine and KV-event publisher
// (Config.DataParallelRank: its engine label in /metrics, its
// data_parallel_rank in event batches, its endpoints offset as vLLM offsets
// them, tcp port + rank). Rank 0's handler parses and validates every
// generation request, then hands it to the rank named by the
// X-data-parallel-rank header or, without one, to the rank vLLM's front end
// picks (DP.pick); a rank out of range is vLLM's 400 error (a single
// Server checks the header too). The DP's /metrics merges every rank's
// families; /health fails when any rank's loop has stopped. In a P/D role
// each rank holds and pulls its own KV under its engine id (<id>_dp<r>):
// the DP's side channel finds the rank a pull names (DP.handlePull), and
// Rank(k).SideChannelHandler serves rank k alone, on its own port as vLLM
// gives each rank one (`kvroute engine --side-channel-listen` listens on
// port + rank with the NIXL protocol).
//
// # Disaggregation
//
// See PullRequest for the side channel. A decode leg (do_remote_prefill,
// or an SGLang bootstrap room on a decode engine) is scheduled by the
// engine model as vLLM's scheduler schedules a request whose KV its
// connector loads (engine.Request.RemoteKV): admitted in FCFS order, it
// takes its local prefix-cache hit and KV blocks for its whole prompt, or
// waits, queued, until they fit; only then does its handler pull the KV
// (the transfer time of the tokens past the local hit; in the SGLang form,
// of whole pages, the engine's blocks, the last one partial or not, as
// SGLang's transfer engine moves a page's bytes per page), while the
// engine holds the blocks and counts the request waiting. With
// NixlConnector a prompt shorter than a block is computed locally, with no
// pull, as vLLM moves no KV for it; SGLang moves it (a partial page). An
// SGLang decode engine has no prefix cache (SGLang forces a decode
// engine's to a chunk cache: no hit, no cached block, no KV event), so it
// pulls every prompt whole, unless
// Config.DisaggregationDecodeEnableRadixCache (SGLang's
// --disaggregation-decode-enable-radix-cache, PR #19746, off by default):
// it then caches as any engine, and its pull moves only the pages past its
// local hit, as SGLang's decode engine tells the prefill engine the
// page-aligned prefix it matched (decode_prefix_len) and the prefill
// engine sends the pages past it (pop_bootstrapped's start_send_idx). Its
// local hit, as any, leaves the last prompt token out: a prompt of whole
// pages all cached moves its last page, where SGLang moves none. No series
// of SGLang's metrics collector counts that prefix as such (newer SGLang's
// prefill engines observe the transfer's size,
// sglang:kv_transfer_total_mb, which this flavour does not have); the
// emulated decode engine's hit is in its prefix-cache metrics
// (sglang:cached_tokens_total, sglang:cache_hit_rate). When the KV arrived
// the received full blocks are cached (BlockStored events, as vLLM's
// _update_waiting_for_remote_kv caches them) and the request computes its
// last prompt token, then decodes (usage cached_tokens: the prompt less
// that token). A client that leaves before the pull starts aborts the request, and with NixlConnector
// the decode engine tells the prefill engine, which frees the blocks it
// held for it (as vLLM's worker notifies it of a read of no blocks) rather
// than when their lease expires; so does a NixlConnector decode leg the
// engine rejects before taking it (a model or LoRA adapter it does not
// serve, vLLM's 404; a prompt over the context; ...), after its answer, as
// vLLM's serving layer has the connector notify the prefill engine of
// such a rejection (Server.rejectedRemote). A LoRA adapter's legs name
// it as their model on both engines: each keys the prompt's blocks with
// it (kv_transfer_params carry no adapter), so a decode engine caches the
// blocks it pulled under the adapter's keys. A client that leaves during
// the pull aborts the request at once; with NixlConnector
// the transfer runs to its end and only then are the blocks it writes
// into freed, on both engines, as vLLM frees them; with SGLang's protocol
// the pull stops and the decode engine frees them at once, as SGLang does
// (Server.pullFor). With SGLang's protocol the decode engine's pull is
// also the room's bootstrap: a prefill leg waits, not added to the engine
// model, until the decode engine admitted its decode leg with KV blocks
// for the whole prompt and pulled (as SGLang's prefill engine keeps a
// request in its bootstrap queue until its KV sender leaves
// KVPoll.Bootstrapping, which it does once the decode engine sent the
// room's destination, and the decode engine sends it only once it
// pre-allocated the request: PrefillBootstrapQueue.pop_bootstrapped,
// DecodePreallocQueue.pop_preallocated), whichever of the two legs
// reached the prefill engine first (Server.awaitBootstrap); it is computed
// then, and answered once the decode engine took its room's KV (SGLang's
// prefill engine returns a request from its inflight queue when the
// transfer ended: Server.awaitPeer). A leg still waiting
// Config.BootstrapTimeout (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s)
// after it arrived fails with SGLang's 500 ("Request <room> timed out
// after <s>s in KVPoll.Bootstrapping"), never computed (a streamed leg's
// 200 and headers go out at once, as SGLang's StreamingResponse sends
// them before its generator waits: its stream then carries the error
// event); its client leaving (a router cancelling the leg
// when the decode leg failed) takes it out at once, and a leg computed
// already has its blocks freed at once (Server.endRoom), as do a leg's
// whose pull left meanwhile. So a decode leg the decode engine refused
// (SGLang's decode engine tells the prefill engine nothing then) costs
// the prefill engine no compute and no blocks. Every leg waits for its
// bootstrap, a prompt shorter than a block too, as SGLang's
// PrefillBootstrapQueue takes every request whatever its length. An SGLang
// engine addresses a LoRA adapter as SGLang does: "model" as
// "<base>:<adapter>", else the body's lora_path; it does not check the
// model name (a "model" naming an adapter alone is the base model's
// request), answers in the request's model as given, and refuses an
// adapter it does not serve with SGLang's 400 in SGLang's flat error shape
// ({"object":"error","message":"The following requested LoRA adapters are
// not loaded: ...","type":"BadRequestError","param":null,"code":400}),
// before taking the request (Server.resolveAdapter); a streamed request
// gets it as SGLang streams it, its tokenizer manager acquiring the
// adapter inside the response's generator: a 200 whose stream is that
// ErrorResponse under "error" in Python's json.dumps form (data: {"error":
// {"object": "error", ...}}) and data: [DONE]; each engine keys the
// prompt's blocks with the adapter, as in vLLM's form. A decode engine
// whose pull fails fails the request with a 500 (Config.LoadFailure
// "fail", the default, as vLLM's kv_load_failure_policy; the engine aborts
// it) or recomputes the prompt locally with a warning ("recompute": past
// its local prefix-cache hit, into the blocks it holds, as vLLM truncates
// the computed tokens at the first block that failed; with no local hit
// the blocks are freed and the request admitted again).
//
// The Server's methods are safe for concurrent use.
package emulator

// Package proxy is kvroute serve's HTTP side: the OpenAI-compatible routing
// proxy in front of a fleet of inference engines.
//
// For POST /v1/completions and /v1/chat/completions a request is read once
// (bounded by limits.max_body_bytes), scanned by openai.ParseRequest for
// what routing needs, routed by its model to that model's router.Router
// (a LoRA adapter's, config models[].adapters, to its base model's, with
// kvroute.Request.Adapter set: only endpoints serving it are candidates,
// its blocks keyed by it; /v1/models lists adapters with their parent;
// see LoRA adapters below for the forms a client names one in),
// and forwarded byte for byte (but for a LoRA adapter named in another form
// than the engine reads) by an httputil.ReverseProxy to the chosen
// engine. Server-sent events are flushed chunk by chunk; a client that goes
// away cancels the upstream request. A failure before the first response
// byte reaches the client is retried on another endpoint (retry.attempts),
// counted in kvroute_retries_total by reason: connect_error (the dial
// failed: the engine never saw the request, and a data-parallel server's
// other ranks are skipped too), upstream_reset (the connection failed after
// the request was sent and before the first body byte: the engine may
// have run part of the work, typically a vLLM server that crashed
// mid-generation of a non-streamed answer, or one that sent a stream's
// headers and died before its first token; its other ranks stay eligible)
// or status_5xx (a 5xx response; its body, up to 64 KiB, is kept to replay
// if no endpoint is left; a larger one is answered with the router's own
// error under the engine's status, never cut). A response's status and headers go to the
// client with its first body byte (or its end, for an empty body), so a
// failure between the engine's headers and its first byte has sent the
// client nothing; with no retry left it is answered 502 (504 if silent).
// A failure after the first byte is not retried: it ends an event stream
// with vLLM's error event and "data: [DONE]", and aborts another response
// (a content-encoded stream too: an event appended to it would be corrupt).
// Such a failure counts against the endpoint's passive health
// (router.fail_threshold consecutive failures eject it), and a response
// counts as the endpoint's success only once it has ended whole, so an
// engine whose streams all break midway is ejected like one that fails
// before its first byte. So does a stream that ends with the engine's own
// error event under a 5xx code (openai.EndsWithErrorEvent: vLLM's 500 for
// a request its engine failed after the 200); one with a 4xx code, a
// request the engine refused after its 200, counts as its success.
// With timeouts.upstream_header set, it bounds both the wait for an
// engine's response headers (504, not retried) and each silence of the
// response after them: a wait for the first byte as long is answered 504,
// not retried, as a wait for the headers; a stream from an engine that
// hangs mid-response (SIGSTOP, a wedged GPU) ends with a 504 error event
// rather than holding its client, and a 5xx whose body goes silent is
// retried without its body, or, with no retry left, answered 504. Every
// HTTP-facing error goes through openai.WriteError.
//
// One file per concern: proxy.go (Options, New, routes), handler.go (the
// inference request path), lora.go (the forms a LoRA adapter is named in), queue.go (the queue escape hatch: a pool's line
// of held requests), disagg.go (P/D pools: disagg.Planner and
// disagg.Handoff), upstream.go (transport and reverse proxies), retry.go
// (what is retried), streaming.go (first byte, mid-stream failures, silent responses),
// healthcheck.go (active checks), metrics.go (Prometheus), admin.go (admin,
// debug, health and models endpoints), ui.go (the dashboard at /ui),
// clientip.go (trusted clients, routing and forwarding headers, request IDs), session.go
// (session affinity keys), serve.go (the http.Server and graceful
// shutdown), signals.go (engine metrics scraping and KV-event
// subscriptions feeding the routers), precise.go (token-level prefix
// matching: tokenizer, chat template, block hashes, precise index),
// buffers.go (recycled prompt buffers), feedback.go (the engine's
// usage, read from the response's tail) and reload.go (live endpoint
// changes: a pool's endpoint set, Reload).
//
// # LoRA adapters
//
// A client names a LoRA adapter as vLLM reads one, "model": "<adapter>", or
// as SGLang does: "model": "<base>:<adapter>" (split at its first colon, when
// <base> is a served model and the whole name is not itself a model or an
// adapter; an empty adapter names the base model) or the base model with
// "lora_path": "<adapter>" (openai.RequestInfo.LoRAPath: a batch's list
// names one adapter, else 400). Each is routed alike (lora.go: resolveModel);
// an adapter the model does not have is the router's 404, and "model" and
// "lora_path" naming two adapters a 400 naming both. Each attempt's body is
// the one its engine reads the request's routing from (openai.AdapterForm):
// a vLLM engine's "model" is the adapter and it gets no "lora_path"; an SGLang
// engine's "lora_path" is the adapter, its "model" as sent (the base
// model's when it has a colon SGLang would split). A body already in the
// engine's form, which a request for the base model by its name always is,
// goes byte for byte; another is rewritten once per form (openai.NameAdapter)
// and a retry on an engine of the other kind takes that kind's body. A TGI
// engine reads vLLM's form (its OpenAI routes take "model" as the
// adapter_id). A llama.cpp server names its adapters by their index in its
// GET /lora-adapters, which its scrape reads (signals.LlamaAdapters: an
// adapter is named by its file name without ".gguf", its path or its
// task_name): each attempt's body lists every adapter of the server in
// "lora", the request's at its scale (the listed one, 1 where that is 0)
// and the others at 0, a base model's request included (without "lora"
// the server applies each adapter at its global scale), with "model" the
// base model and no lora_path (openai.NameLlamaAdapter, built once per
// adapter list). A server whose list does not have the request's adapter
// is no candidate for it (router.Route, as an endpoint the config does
// not give the adapter: /debug/decisions says so of it); when every
// endpoint that would serve it is such a server, the client gets the
// router's 404 model_not_found (its param the field the client named the
// adapter in) naming what each lists, and no endpoint is tried. A server
// whose list is not known (no scrape yet, scraping off) stays a
// candidate: an attempt on it, or on a server whose list changed since
// the pick, is not sent but retried on another endpoint
// (kvroute_retries_total reason adapter_not_listed; the endpoint's
// health is not at fault), else answered with 503 adapter_list_unknown
// (or the 404 naming what that server lists); a base model's request to
// a server listing no adapters, or whose list is not known, goes as
// sent. The engine's kind is its endpoint's signals.flavor (vllm,
// vllm-legacy, sglang, llamacpp, tgi), else the flavour its last scrape
// detected (signals.View.Flavor); unknown (no scrape yet, scraping off),
// the body goes as sent. A P/D pool's legs carry their protocol's form (nixl:
// vLLM's; sglang: lora_path, set by the handoff).
//
// # Data-parallel engines
//
// An endpoint with data_parallel_size N > 1 (a vLLM --data-parallel-size
// server: N engine cores behind one URL) is N endpoints to the router,
// ID#dp0 ... ID#dp<N-1> (ID#dp<S> ... with data_parallel_start_rank S),
// each with its own reverse proxy, which sets X-Data-Parallel-Rank to its
// place behind the URL (0 ... N-1, how vLLM's server indexes its engine
// cores) on every upstream request, retries included. Every reverse proxy drops a client's copy of that header first,
// trusted client or not, so that no client overrides the router's pin (P/D
// legs forward only disagg.ForwardHeaders, and each leg to a rank sets that
// rank's header itself). One scrape of the server's metrics per interval
// is split by engine label among the ranks (signals.Target.Ranks); rank r
// subscribes to the kv_events addresses with the tcp port + r (r being the
// global rank, from S on). One active
// health check of the URL applies to all its ranks (vLLM's /health answers
// for the whole server), while passive ejection counts each rank's own
// failures: a rank that errors leaves the rotation, its siblings stay.
//
// # Queue escape hatch
//
// When the policy sheds a request's first placement with the "queue"
// action (kv-aware's overload: queue, every endpoint over its load cap),
// the request is held in its pool's line for at most retry.queue_wait
// instead of being answered 429 at once. While requests wait in a pool's
// line, a request arriving at that pool is not routed but joins the line
// behind them, so a request arriving just as room frees does not overtake
// those that waited longer; with the line empty, routing is unchanged.
// The line is first come first served within a tenant and takes tenants
// in turn. Only its head routes: at once when its turn comes after
// others', then again as soon as the router signals drained load (a
// flight got its first token or ended: router.Router.Drained) or after a
// pause (10 ms doubling to 200 ms, for load that drains only in the
// engines' signals). A request that waited behind others and is then shed
// with another action than "queue" is answered as it would have been at
// an empty line. When queue_wait runs out the client gets 429 with
// Retry-After, saying how long it waited; a client that goes away frees
// its place, and at a shutdown's drain deadline the request is answered
// 503 like the others in progress. kvroute_queued_requests_total counts
// the requests held, shed ones and those in line behind others alike.
// Retries (later attempts) are not queued.
//
// # Tenants
//
// A request's tenant (kv-aware's tenant fairness, the line's turns) is a
// trusted client's X-Kvroute-Tenant header; else the API key it
// authenticates with (Authorization: Bearer), named "key:" and the first
// 8 bytes of its SHA-256 in hex, so the key itself appears in no log,
// decision or metric; else the body's "user" field (one that starts with
// "key:" is named "user:" and the value, so that it cannot join an API
// key's tenant). A client cannot mint API keys as it can "user" values to
// take more turns.
// P/D pools queue their first placements the same way
// (disagg.HandoffConfig.Admit).
//
// # Signals and precise mode
//
// RunSignals (run by Serve) scrapes every endpoint's metrics (signals.*
// of its model, per-endpoint overrides) into its router's signals.View,
// and follows the KV-cache events of endpoints with kv_events into the
// model's precise kvindex.Index. With precise.tokenizer set, each request's
// prompt is tokenized as the engines do (chat rendered with the model's
// chat template, ChatML for the built-in tokenizer, with the request's
// add_generation_prompt, continue_final_message, chat_template_kwargs,
// tools, documents and reasoning_effort as vLLM applies them (tokenizer.ChatRequest.Vars:
// the kwargs' tools over the request's, their null and "auto" values unset), the messages and tools given the shape
// vLLM gives them, tokenizer.ChatTemplate.RenderJSON) and hashed in KV
// blocks before routing; without it the router matches character blocks.
// A request the engine refuses or renders with inputs the router cannot
// build (a batch of prompts, an image part, tools that are an empty list,
// a chat template of the request's own) is matched on characters. Precise mode assumes the engines run without
// --exclude-tools-when-tool-choice-none (vLLM's default): a request whose
// tool_choice is "none" is rendered with its tools.
// The usage the engine reports at the end of a response (cached_tokens of
// prompt_tokens_details) reaches learning policies in kvroute.Outcome and
// the kvroute_prefix_cached_tokens_total and kvroute_prompt_tokens_total
// counters. vLLM leaves prompt_tokens_details out of an answer that had
// no prompt token cached, so once an endpoint has reported cached_tokens,
// an answer of its without them counts 0 cached; before, unknown (not
// counted).
//
// # Debug endpoints
//
// /debug/decisions lists each model's recent decisions, /debug/endpoints
// each model's policy and endpoint status. A P/D pool's policy reads "pd"
// (disagg.PolicyName), as its decisions name it, with prefill_policy the
// configured policy that places the prefill stage; PUT /admin/policy does
// not switch a P/D pool's policy (409).
//
// # Live endpoint changes
//
// Reload (kvroute serve calls it on SIGHUP) takes a new configuration as
// written (config.Decode), applies its defaults (an endpoint's signals
// settings left unset inherit the running model's), validates it whole,
// and applies each model's endpoint list while
// requests flow: the router takes the new list (router.Router.SetEndpoints:
// endpoints that stay keep their routing state), and each added endpoint
// gets its reverse proxy, scrape loop, KV-event subscription and health
// probe, while a removed one's are stopped and waited for, its
// precise-index entries removed and its metric series deleted. Requests in
// progress on a removed endpoint finish; they are counted in the metrics
// without its label. A pool's endpoints are an immutable endpointSet read
// through an atomic pointer. A P/D pool's endpoints change the same way:
// its planner forgets what it kept of the endpoints removed (or whose ID
// now names another engine or role), and a leg routed to an endpoint
// removed before it was sent is placed again (disagg.HandoffConfig.Live);
// a change that would make a model aggregated or disaggregated is refused.
// The models' LoRA adapters change live too: the adapter table is replaced
// whole through an atomic pointer (ReloadResult.Adapters).
// Nothing else is applied live: the other fields that differ are logged
// (ReloadResult.Restart). Reloads are counted in
// kvroute_config_reloads_total{result}, kvroute_config_last_reload_successful
// and kvroute_config_last_reload_success_timestamp_seconds.
//
// A Proxy is safe for concurrent use. Its background work, the active
// health checks and the engine signals, runs inside Serve (or
// RunHealthChecks and RunSignals) and stops with its context.
package proxy

// Package proxy is kvroute serve's HTTP side: the OpenAI-compatible routing
// proxy in front of a fleet of inference engines.
//
// For POST /v1/completions and /v1/chat/completions a request is read once
// (bounded by limits.max_body_bytes), scanned by openai.ParseRequest for
// what routing needs, routed by its model to that model's router.Router,
// and forwarded byte for byte by an httputil.ReverseProxy to the chosen
// engine. Server-sent events are flushed chunk by chunk; a client that goes
// away cancels the upstream request. A connect error or a 5xx before the
// first response byte is retried on another endpoint (retry.attempts); a
// failure after it ends an event stream with vLLM's error event and
// "data: [DONE]". Every HTTP-facing error goes through openai.WriteError.
//
// One file per concern: proxy.go (Options, New, routes), handler.go (the
// inference request path), upstream.go (transport and reverse proxies),
// retry.go (what is retried), streaming.go (first byte, mid-stream
// failures), healthcheck.go (active checks), metrics.go (Prometheus),
// admin.go (admin, debug, health and models endpoints), clientip.go
// (trusted clients, routing headers, request IDs), serve.go (the
// http.Server and graceful shutdown), signals.go (engine metrics scraping
// and KV-event subscriptions feeding the routers), precise.go (token-level
// prefix matching: tokenizer, chat template, block hashes, precise index)
// and feedback.go (the engine's usage, read from the response's tail).
//
// # Signals and precise mode
//
// RunSignals (run by Serve) scrapes every endpoint's metrics (signals.*
// of its model, per-endpoint overrides) into its router's signals.View,
// and follows the KV-cache events of endpoints with kv_events into the
// model's precise kvindex.Index. With precise.tokenizer set, each request's
// prompt is tokenized as the engines do (chat rendered with the model's
// chat template, ChatML for the built-in tokenizer) and hashed in KV
// blocks before routing; without it the router matches character blocks.
// The usage the engine reports at the end of a response (cached_tokens of
// prompt_tokens_details) reaches learning policies in kvroute.Outcome and
// the kvroute_prefix_cached_tokens_total and kvroute_prompt_tokens_total
// counters.
//
// A Proxy is safe for concurrent use. Its background work, the active
// health checks and the engine signals, runs inside Serve (or
// RunHealthChecks and RunSignals) and stops with its context.
package proxy

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
// (trusted clients, routing headers, request IDs) and serve.go (the
// http.Server and graceful shutdown).
//
// A Proxy is safe for concurrent use. Its only background work, the active
// health checks, runs inside Serve or RunHealthChecks and stops with their
// context.
package proxy

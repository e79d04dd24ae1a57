package kvroute

import "time"

// Request is the routing view of one inference request: only what routing
// needs, parsed once from the client's body. The body itself is forwarded
// untouched.
type Request struct {
	// ID is the request ID, propagated to the engine as X-Request-Id.
	ID string
	// Model is the model whose pool routes the request: the requested
	// model name, or the base model of the LoRA adapter requested.
	Model string
	// Adapter is the LoRA adapter the request names in its "model" field
	// ("" = the base model): the engine runs it on Model's weights, and
	// only endpoints that serve it (Endpoint.ServesAdapter) may take it.
	// The forwarded body keeps the adapter's name, which is what vLLM
	// expects.
	Adapter string
	// Tenant identifies the tenant for fairness ("" = default tenant).
	Tenant string
	// SessionKey is the session or document affinity key ("" = none).
	SessionKey string
	// Prompt is the canonical prompt text: for completions the prompt, for chat
	// the messages rendered in a form that cannot collide across message
	// boundaries. Policies that hash text (the peers' baselines) read it.
	Prompt string
	// PromptTokens is the prompt length in tokens (exact when a tokenizer is
	// configured, estimated otherwise).
	PromptTokens int
	// MaxTokens is the requested output limit (0 = engine default).
	MaxTokens int
	// Stream reports whether the client asked for server-sent events.
	Stream bool
	// BlockSize is the number of tokens (or characters, in approximate
	// character mode) per entry of BlockHashes.
	BlockSize int
	// BlockHashes are the chained hashes of the prompt's full blocks, the keys
	// the prefix indexes use. Nil when the model has no prefix index.
	BlockHashes []uint64
	// CacheSalt is the request's cache_salt (vLLM's: the engine keys the
	// prompt's first block with it, so only requests with the same salt
	// share cached blocks); the prompt's block hashes are salted with it
	// (kvindex.HashTokensKeyed, HashTextSharedKeyed, with Adapter). "" =
	// none.
	CacheSalt string
	// Arrival is when the router received the request.
	Arrival time.Time
}

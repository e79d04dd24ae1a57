package kvroute

import (
	"slices"
	"time"
)

// Load is one endpoint's load as the router sees it at decision time: the
// engine's last scraped signals, corrected by what the router dispatched
// itself since that scrape (see package signals for the staleness model).
type Load struct {
	// Waiting and Running are the engine's queue and batch, including the
	// router's own dispatches since the last observation.
	Waiting int `json:"waiting"`
	Running int `json:"running"`
	// KVUsage is the fraction 0..1 of the engine's KV blocks in use.
	KVUsage float64 `json:"kv_usage"`
	// KVCapacityTokens is the engine's KV capacity in tokens (0 = unknown).
	KVCapacityTokens int `json:"kv_capacity_tokens"`
	// InFlight is the number of requests the router holds open to the engine
	// right now. It is always fresh.
	InFlight int `json:"in_flight"`
	// InFlightTokens is the sum of prompt tokens of InFlight requests that have
	// not yet produced a first token (prefill work the router knows is queued).
	InFlightTokens int `json:"in_flight_tokens"`
	// DecodeTokens is the router's estimate of the context held by requests
	// that are decoding on the engine.
	DecodeTokens int `json:"decode_tokens"`
	// PrefixHitRate is the engine's recent prefix-cache hit rate (tokens), or
	// -1 when unknown.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// ObservedAt is when the engine signals were scraped (zero = never).
	ObservedAt time.Time `json:"observed_at,omitzero"`
	// Stale reports that the engine signals are older than the configured
	// limit; Waiting and Running are then router-local estimates only.
	Stale bool `json:"stale"`
	// LoRA is what the engine reports of its LoRA adapters; nil when it
	// reports nothing (no --enable-lora, an engine without the metric) or
	// its signals are stale. Shared, never modified.
	LoRA *LoRALoad `json:"lora,omitempty"`
}

// LoRALoad is an engine's LoRA adapters as its metrics report them
// (vLLM's vllm:lora_requests_info). It is immutable once built.
type LoRALoad struct {
	// Running are the adapters of the requests in the engine's batch,
	// sorted: vLLM batches requests of at most Max distinct adapters.
	Running []string `json:"running,omitempty"`
	// Waiting are the adapters of the queued requests, sorted.
	Waiting []string `json:"waiting,omitempty"`
	// Max is the engine's --max-loras, the distinct adapters one batch may
	// hold (0 = unknown).
	Max int `json:"max,omitempty"`
}

// Active reports whether the engine has requests of adapter running or
// waiting: the adapter is loaded, or being loaded.
func (a *LoRALoad) Active(adapter string) bool {
	return a != nil && (sortedHas(a.Running, adapter) || sortedHas(a.Waiting, adapter))
}

// Runs reports whether the engine has requests of adapter in its batch.
func (a *LoRALoad) Runs(adapter string) bool { return a != nil && sortedHas(a.Running, adapter) }

func sortedHas(list []string, s string) bool {
	_, ok := slices.BinarySearch(list, s)
	return ok
}

// Age returns how old the engine signals are at now (0 when never observed).
func (l Load) Age(now time.Time) time.Duration {
	if l.ObservedAt.IsZero() {
		return 0
	}
	return now.Sub(l.ObservedAt)
}

// Queue returns the work ahead of a new request: engine waiting plus running,
// or the router's in-flight count if that is larger (it is fresher).
func (l Load) Queue() int {
	q := l.Waiting + l.Running
	if l.InFlight > q {
		return l.InFlight
	}
	return q
}

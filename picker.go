package kvroute

import (
	"fmt"
	"strings"
	"time"
)

// Tier is where a cached prefix lives on an endpoint.
type Tier uint8

const (
	// TierNone means nothing is cached.
	TierNone Tier = iota
	// TierGPU is device memory: a hit skips prefill outright.
	TierGPU
	// TierCPU is host memory (offloaded): a hit costs a load but no compute.
	TierCPU
)

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	}
	return "none"
}

// Candidate is one endpoint as a Picker sees it: its load and how much of the
// request's prompt it already caches. The caller fills candidates from its
// health, signals and prefix indexes before calling Pick, so pickers stay pure.
type Candidate struct {
	Endpoint *Endpoint
	// Healthy is false for ejected or failing endpoints; pickers never choose
	// an unhealthy candidate.
	Healthy bool
	Load    Load
	// CachedBlocks is the number of leading prompt blocks (Request.BlockHashes)
	// that the endpoint holds, and Tier where the best of them live.
	CachedBlocks int
	Tier         Tier
	// CachedTokens is CachedBlocks converted to tokens (capped at the prompt).
	CachedTokens int
	// Precise reports that CachedBlocks comes from the engine's own KV events
	// rather than from the router's record of what it routed.
	Precise bool
	// Evicts reports that the router's record of the endpoint's cache (what
	// it routed there, sized from its KV capacity: the approximate index,
	// or, for an endpoint with KV events, the blocks its dispatches wrote
	// there) has no room for the prompt blocks the endpoint does not hold:
	// sending the request there pushes other prompts' blocks out.
	Evicts bool
	// Horizon, when Evicts, is how long that record keeps a block nobody
	// sends again (the age of its least recent entry): a cache that turns
	// over faster than prompts come back keeps none of them.
	Horizon time.Duration
}

// Score is one candidate's part in a decision: the inputs the policy used
// and the score it computed. Lower Value is better unless the policy says
// otherwise in Decision.Reason.
type Score struct {
	Endpoint string  `json:"endpoint"`
	Value    float64 `json:"score"`
	// Eligible is false when a filter (health, load cap) removed the
	// candidate; Why then says which.
	Eligible bool   `json:"eligible"`
	Why      string `json:"why,omitempty"`
	// Parts are the named terms of Value (e.g. queue_ms, prefill_ms).
	Parts []Part `json:"parts,omitempty"`
}

// Part is a named term of a score.
type Part struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// Decision is a Picker's answer: which candidate, and why.
type Decision struct {
	// Index is the chosen candidate's index, or -1 when none could be chosen.
	Index int `json:"index"`
	// Endpoint is the chosen endpoint's ID ("" when none).
	Endpoint string `json:"endpoint"`
	// Policy names the policy that decided.
	Policy string `json:"policy"`
	// Reason is a short human explanation (e.g. "affinity: 12/14 blocks
	// cached"). A picker that defers its explanations to the router's
	// decision log may leave only its head ("affinity") here: the log's
	// copy (router.Decisions) has it whole.
	Reason string `json:"reason"`
	// Scores holds one entry per candidate when the picker explains itself;
	// pickers may leave it nil when the caller did not ask for explanations.
	Scores []Score `json:"scores,omitempty"`
	// Shed is set when no candidate is acceptable and the policy asks the
	// caller to reject (429) or queue the request rather than overload a node.
	Shed bool `json:"shed,omitempty"`
}

// None returns a decision that chose nothing, with a reason.
func None(policy, reason string) Decision {
	return Decision{Index: -1, Policy: policy, Reason: reason}
}

// Chose returns a decision for candidate i.
func Chose(policy string, cands []Candidate, i int, reason string) Decision {
	return Decision{Index: i, Endpoint: cands[i].Endpoint.ID, Policy: policy, Reason: reason}
}

// String renders a decision on one line for logs.
func (d Decision) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s -> %q (%s)", d.Policy, d.Endpoint, d.Reason)
	return b.String()
}

// Picker chooses an endpoint for a request among candidates. Implementations
// are pure: no I/O, no goroutines, no wall clock (now is passed in). A Picker
// may keep state (round-robin position, its own routing history) and is then
// not safe for concurrent use unless its doc says so; the router serialises
// calls per model.
type Picker interface {
	Pick(now time.Time, req *Request, cands []Candidate) Decision
}

// PickerFunc adapts a function to the Picker interface.
type PickerFunc func(now time.Time, req *Request, cands []Candidate) Decision

// Pick calls f.
func (f PickerFunc) Pick(now time.Time, req *Request, cands []Candidate) Decision {
	return f(now, req, cands)
}

// Outcome is what happened to a routed request, fed back to pickers that
// learn (optional interface Learner).
type Outcome struct {
	Endpoint string
	// PromptTokens and CachedTokens as the engine reported them (CachedTokens
	// -1 when the engine did not say).
	PromptTokens, CachedTokens int
	// QueueDepth is the candidate's Load.Queue() at decision time.
	QueueDepth int
	// TTFT is the observed time to first token; zero when the request failed.
	TTFT time.Duration
	// Failed reports an error response or a transport failure.
	Failed bool
	// Decode marks the decode leg of a disaggregated request: its TTFT is
	// the KV pull and one decode step after the prefill leg, not a
	// prefill, so a learner of prefill rates skips it.
	Decode bool
}

// Learner is implemented by pickers that learn from outcomes (e.g. per
// endpoint prefill rates from observed TTFTs).
type Learner interface {
	Observe(now time.Time, o Outcome)
}

// Releaser is implemented by pickers that keep per-request state (bounded
// load hashing, tenant fairness) and must hear when a request ends.
type Releaser interface {
	Release(now time.Time, req *Request, endpoint string)
}

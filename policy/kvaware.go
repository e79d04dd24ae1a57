package policy

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// KVAwareParams configures the kv-aware policy. The zero value is not the
// default: start from DefaultKVAwareParams (New does). The rates describe one
// engine; the defaults are fitted to the default engine profile
// (llama-3.1-8b-h100: engine.Profile PrefillTime and DecodeTime). For other
// engines derive them from the profile, or set learn=true. The rates,
// weights, slacks and tolerances are at most 1e9 (Validate).
type KVAwareParams struct {
	// PrefillUsPerToken is the prefill compute time per uncached prompt token,
	// in microseconds. Default 20 (about 50k tokens/s).
	PrefillUsPerToken float64 `param:"prefill_us_per_token"`
	// AttnUsPerTokenPerKTok is the extra prefill time per token per 1000
	// tokens of context it attends to (cached prefix plus half the new part),
	// in microseconds. Default 0.7.
	AttnUsPerTokenPerKTok float64 `param:"attn_us_per_token_per_ktok"`
	// StepOverheadUs is the fixed time of one engine iteration (weights read,
	// scheduling), in microseconds. Default 6000.
	StepOverheadUs float64 `param:"step_overhead_us"`
	// DecodeUsPerToken is the time one running sequence adds to every engine
	// iteration (its decode token), in microseconds. Default 2.
	DecodeUsPerToken float64 `param:"decode_us_per_token"`
	// DecodeUsPerCtxKTok is the time every 1000 tokens of decoding context
	// (Load.DecodeTokens) add to an iteration (KV reads), in microseconds.
	// Default 45.
	DecodeUsPerCtxKTok float64 `param:"decode_us_per_ctx_ktok"`
	// MaxBatchedTokens is the engine's token budget per iteration
	// (max_num_batched_tokens, the chunked-prefill chunk). Default 8192.
	MaxBatchedTokens int `param:"max_batched_tokens"`
	// QueuedRequestMs is the prior wait each request ahead in the engine
	// queue adds beyond its prefill work (memory or batch-slot waits), in
	// milliseconds; learning replaces it. Default 1. The queue counted is
	// Load.Queue(), waiting plus running (or the router's in-flight count
	// when larger), so the requests that are decoding are charged too: in
	// a burst's later part it is most of the estimate (tenants at 650
	// req/s, seed 1: after the first second the chosen engine ran and
	// queued 177 requests on average, and the estimates were 175 ms above
	// the TTFTs, 291 against 116 ms). It then works as a
	// least-request term: at 0 the README rows at seeds 1-8 (2026-12-06)
	// were within 1% on most rows, but tenants at 150 and 200 req/s 2.3%
	// and 2.9% higher (at 7 and 8 of the 8 seeds) and the trace at its own
	// rate 1.8% (the bursts and the trace at four times its rate moved
	// within their noise).
	QueuedRequestMs float64 `param:"queued_request_ms"`
	// MeanPromptTokens is the prior uncached size of an engine-queued request
	// the router did not dispatch itself; learning replaces it with the mean
	// uncached size of the requests it routes. Default 1024.
	MeanPromptTokens int `param:"mean_prompt_tokens"`
	// Learn enables online learning of the rates from Observe: per endpoint,
	// an exponential moving average of milliseconds per uncached token (from
	// requests that met an empty queue) and of milliseconds per queued
	// request (from the rest). Default false: the defaults fit the default
	// profile, and in the simulator learning from TTFTs (which include
	// interference the model does not see) added noise, not accuracy.
	Learn bool `param:"learn"`
	// LearnPerEndpoint keeps separate learned rates per endpoint (for
	// fleets of unlike engines); otherwise one fleet-wide rate is learned.
	// Default false: on like engines per-endpoint rates mostly learn noise.
	LearnPerEndpoint bool `param:"learn_per_endpoint"`
	// LearnAlpha is the weight of a new observation in the moving averages.
	// Default 0.1.
	LearnAlpha float64 `param:"learn_alpha"`
	// LearnMinSamples is the number of observations an endpoint needs before
	// its learned rate replaces the fleet-wide one (and the fleet-wide one
	// replaces the prior). Default 8.
	LearnMinSamples int `param:"learn_min_samples"`

	// C is the bounded-load factor. The bound is max(C x mean, mean +
	// InflightSlack) in-flight requests (counting the new one): the session
	// ring never places a session above it, and an endpoint above it while
	// congested (or above twice it at any time) is capped: it keeps no
	// affinity credit. Default 1.25.
	C float64 `param:"c"`
	// InflightSlack is an absolute allowance over the mean in-flight count
	// that the cap never goes below (C x mean is tiny at low load and would
	// cap every node; KubeAI issue #519). Default 4.
	InflightSlack float64 `param:"inflight_slack"`
	// QueueCap caps an endpoint whose engine waiting queue (Load.Waiting)
	// reaches it; 0 disables. Default 256: a capped candidate is not
	// eligible while another is under the cap, so in a fleet-wide overload
	// the one endpoint that dips under it takes every request until it is
	// over again (at 64, in the simulated chat workload, that herding put a
	// quarter second more queue on one engine than on the others).
	QueueCap int `param:"queue_cap"`
	// KVCap caps an endpoint whose KV usage (Load.KVUsage) reaches it; 1
	// disables. Default 1 (see Caps in the KVAware doc).
	KVCap float64 `param:"kv_cap"`
	// Overload says what to do when every healthy endpoint is over its queue
	// or KV cap: "least-loaded" (default) picks anyway, as it picks when
	// some are under the caps (the lowest estimate, session affinity and
	// ties as usual; the reason starts "overloaded, ");
	// "shed" and "queue" return Decision{Shed: true}, and the router answers
	// 429 with Retry-After or holds the request for a bounded wait (the
	// decision's Reason starts with "shed:" or "queue:").
	Overload string `param:"overload"`

	// TieMs and TieFrac define ties: candidates whose estimate is within
	// max(TieMs, TieFrac x best) of the best are tied, and the pick among
	// them is the less loaded of two drawn at random. Defaults 1 ms and 0.01.
	// TieFrac 0 (ties only within 1 ms) balanced the cold chat burst (550
	// req/s) better, its mean p99 TTFT over seeds 1-8 2.4% lower, but the
	// other bursts worse: rag at 420 req/s +4.3%, tenants at 650 req/s
	// +10.7% (+38% at seed 8, its throughput 12% lower at one seed). Over
	// seeds 1-40 (2026-12-06; eight seeds of a burst leave a standard error
	// of 2-5 points) it was chat -2.0% (standard error 0.2 points),
	// sysprompt at 1000 req/s +0.8% (0.2), rag +1.0% (1.5), tenants +2.3%
	// (1.9) and storm at 320 req/s -0.4% (0.5), with tenants' throughput
	// 12-16% lower at three seeds (seed 29: 129.4 against 154.8 req/s). A
	// window relative to the best candidate's TTFT estimate (queue plus
	// prefill) rather than its score, whose decode and work terms widen
	// it, was not kept either: at 0.01, 0.02 and 0.03 of the estimate the
	// trace at its own rate was 0.9%, 2.8% and 2.0% lower and chat at 550
	// req/s 1.3%, 1.4% and 0.8%, but tenants at 650 req/s 3.2%, 3.0% and
	// 2.8% higher, the trace at four times its rate 6.4%, 3.1% and 3.3%,
	// and rag at 180 req/s +433% at seed 6 with 0.02 (the README rows,
	// seeds 1-8).
	TieMs   float64 `param:"tie_ms"`
	TieFrac float64 `param:"tie_frac"`

	// SessionSlackMs and SessionTolerance bound how much worse than the best
	// score a session's ring target may be and still be chosen:
	// score(target) <= best x (1+SessionTolerance) + SessionSlackMs.
	// Defaults 2 ms and 0: the hint breaks near-ties and keeps a session
	// together when the prefix index has nothing to say, but never costs a
	// cache hit the index knows of (a 25 ms / 25% hint cost 30% of p99 TTFT
	// on the simulated chat workload by pulling turns away from their cache).
	SessionSlackMs   float64 `param:"session_slack_ms"`
	SessionTolerance float64 `param:"session_tolerance"`
	// VirtualNodes is the number of points per endpoint on the session ring.
	// Default 256.
	VirtualNodes int `param:"virtual_nodes"`

	// CPUHitCost is the fraction of the prefill time still paid for prompt
	// tokens cached in host memory (Tier CPU): loading them is not free.
	// Default 0.1.
	CPUHitCost float64 `param:"cpu_hit_cost"`
	// Replicate enables demand-driven replica sets for hot prefixes (see the
	// KVAware doc). Default true.
	Replicate bool `param:"replicate"`
	// HotSpread caps a holder of a hot prefix (one whose in-flight demand
	// exceeds one endpoint's share, C x mean in-flight) once its in-flight
	// count is over the bound, congested or not, so the prefix's next
	// request becomes a new replica elsewhere; only while some endpoint
	// without the prefix is uncongested and at most at the mean in-flight
	// (in a burst on a cold fleet spreading would add misses to busy
	// queues: tenants at 650 req/s, seeds 5-8, went +4% -> +15% without
	// that condition). Without it a prefix whose
	// prompts are mostly cached never congests its holders' queues: they
	// keep it while running well above the mean, and their slower decode
	// steps set the p99 (the shared-system-prompt workload). Default true.
	HotSpread bool `param:"hot_spread"`
	// HotSlack tightens HotSpread's bound for a settled hot prefix: once the
	// prefix has had requests in flight for HotSettle without a break and
	// some endpoint without it is idle (no prefill queued, in-flight at
	// most the mean), a holder is capped above m + HotSlack in-flight
	// requests (m the mean, counting the new one) instead of the in-flight
	// bound. The bound alone lets a replica set stop growing while its
	// holders run up to C x the mean: with several hot prefixes the sets
	// overlap unevenly (in the shared-system-prompt workload each of 4
	// prompts sat on 3 of 8 endpoints, so some endpoints held two prompts
	// and some one) and the policy cannot move load between sets, because
	// a non-holder costs the whole prefix's prefill; holders ran at 72 in
	// flight while others idled at 45. A replica costs one prefill, paid
	// once, so for a prefix that stays hot it is worth growing the set
	// until holders are level with the fleet; on an idle endpoint that
	// prefill delays no queued request. Default 2 (sysprompt at 100 req/s,
	// seeds 1-4: p99 TTFT +4.9% -> -0.6% against round-robin; 0 and 1 did
	// the same there, 1 cost the tenants workload a point).
	HotSlack float64 `param:"hot_slack"`
	// HotSettle is how long a prefix must have had requests in flight
	// without a break before HotSlack applies: a replica made for a short
	// burst is used by little more than the burst, and its prefill lands
	// while the fleet is busiest (with no settling time, hot bursts on a
	// cold fleet lost up to 25 points of p99 TTFT: sysprompt at 1000 req/s
	// -31% -> -6% against the best baseline). Default 5s.
	HotSettle time.Duration `param:"hot_settle"`
	// SpareFull keeps a small shared prefix (a system prompt) from pulling
	// requests onto a cache that thrashes. A small hit (under a quarter of
	// the prompt's tokens cached) on a candidate whose cache is full
	// (kvroute.Candidate.Evicts) and turns over within ThrashHorizon is
	// credited no more than an eligible candidate with room for the
	// request caches, and loses ties to candidates without such a hit:
	// the request goes where it evicts nothing, instead of pushing out
	// the blocks of the prompts that share the prefix before they come
	// back. Preble's rule (explore unless more is cached than new),
	// applied only where exploiting thrashes. Without it, 64 sessions of
	// 8k-token prompts behind one 1k-token system prompt all went to its
	// one holder, whose cache holds 16 of them, and each turn found only
	// the system prompt cached while 63 endpoints idled
	// (BenchmarkDecisionKVAware64, sessions=64). Applied to every full
	// cache (no horizon), the Mooncake trace's first 3,000 requests lost
	// 5% of p99 TTFT. Default true.
	SpareFull bool `param:"spare_full"`
	// ThrashHorizon is how soon a full cache must turn over (its least
	// recent block's age, kvroute.Candidate.Horizon) for SpareFull to
	// count it as thrashing: a block kept for less is gone before a
	// person answers. Default 2s.
	ThrashHorizon time.Duration `param:"thrash_horizon"`
	// TrimKVUsage is the KV usage from which a holder outside a hot
	// prefix's replica set loses its credit (the shrinking half of
	// Replicate): below it a surplus replica costs no cache space that is
	// needed. Default 0.9.
	TrimKVUsage float64 `param:"trim_kv_usage"`
	// TenantFairness makes a tenant above its fair share of in-flight
	// requests lose affinity first. Default true.
	TenantFairness bool `param:"tenant_fairness"`
	// PendingTTL bounds how long per-request state waits for Release before it
	// is dropped (a router that never releases cannot grow it without bound).
	// Default 10m.
	PendingTTL time.Duration `param:"pending_ttl"`
	// WorkWeight weighs the prefill compute a request adds to an endpoint
	// (its uncached tokens) on top of its own TTFT: that work delays every
	// request queued behind it, so a cache hit is worth more than the time
	// it saves this request. 0 ranks by estimated TTFT alone. Default 1.
	// It is what sends a long prompt to the engine holding most of it even
	// behind a long prefill there: on the trace at seed 4 a 77,799-token
	// prompt with 74,240 cached on one engine went there behind a cold
	// 112,941-token prompt that arrived at the same instant (estimate 7.0 s,
	// TTFT 6.98 s) rather than to an idle engine (3.7 s), its added work
	// weighted 1.875 (the fleet's mean waiting 0.875). Keeping the pick
	// within max(1.5 x, 1 s more than) the best TTFT estimate moved only the
	// trace rows (no other README row's run changed, seeds 1-8): at its own
	// rate 0.9% lower, at four times it 7.3% higher, where the prompts it
	// sends elsewhere are prefilled again. Not kept.
	WorkWeight float64 `param:"work_weight"`
	// WorkLoadGain scales WorkWeight with the fleet's mean waiting queue:
	// weight = WorkWeight x (1 + WorkLoadGain x mean waiting). On a busy fleet
	// every token saved shortens many queues, so affinity is worth more;
	// the load caps still keep it from piling onto one node. Default 1.
	// Over the README's burst rows at seeds 1-40 (2026-12-06), 0.5 took
	// tenants at 650 req/s 8.9% higher in mean p99 TTFT (standard error 2.2
	// points) and 2 chat at 550 req/s 1.5% higher (0.3), the other bursts
	// within the noise; capping the weight at 3 took chat at 550 req/s
	// 2.1% higher (0.3) and tenants 6.6% (2.2), and at 6 moved no burst
	// beyond its noise (under 1%).
	WorkLoadGain float64 `param:"work_load_gain"`
	// ProgressTokPerMs is the prefill progress, in tokens per millisecond,
	// credited to an endpoint's queue head since it started (the last first
	// token there, or a dispatch to its empty queue), up to one engine step
	// (or the head's size), when the router reports first tokens: the
	// chunks of a long prompt already prefilled are no longer queued work.
	// 0 disables. Default 25, about half the default profile's pure-prefill
	// rate (48 tokens/ms): the head shares steps with decodes and may wait
	// for KV memory (in the simulator 25 did better than 15, 35 or 45).
	ProgressTokPerMs float64 `param:"progress_tok_per_ms"`
	// StepPhase adds to the queue estimate the rest of the engine step in
	// progress (step_wait_ms): an engine runs its batch in steps, and a
	// request that arrives during one starts its prefill at the next. A step
	// ends where first tokens come out, so the step in progress is taken to
	// have begun at the last first token the router reported there
	// (FirstToken) and to last the step the estimate prices (step, below);
	// once that is over the wait is half a step, its mean. An idle engine
	// (nothing running or queued), or one that has not given a first token yet
	// (its steps are unknown), has none. Past what the fleet completes, where
	// the steps run 100-130 ms long with the batches they hold, this is a
	// third of a TTFT that the other terms cannot tell apart between engines:
	// in the simulator, over seeds 1-40 (2026-12-06), it took the mean p99
	// TTFT of sysprompt at 130 req/s 6.4% lower (standard error 0.1 points;
	// from 2% above round-robin's to 4% below) and of tenants at 200 req/s
	// 3.6% lower (0.3), moved the other rows of the README's tables by under
	// 2% (sysprompt at 100 req/s +0.3%, standard error 0.1; the trace at four
	// times its rate +1.6%, 0.8 over seeds 1-40 at three decode weights; the
	// bursts within their noise), but tipped rag at 180 req/s at seed 38, a
	// run past what the fleet completes whose p99 is set by when the first
	// engine's KV fills, from 0.50-1.06 s to 1.43-3.17 s over five
	// perturbations of DecodeWeight. Counting the prefill chunk of a queued
	// engine's step in its length did worse (storm at 320 req/s +9%); the wait
	// only on engines without a queue gained nothing. Default true.
	StepPhase bool `param:"step_phase"`

	// DecodeWeight weighs the request's own decode time at the step time
	// the endpoint will have once the requests the router holds open there
	// decode (OutputTokens x decode step; see Estimate): it steers
	// decode-heavy work away from nodes whose batches are or are about to
	// be slow, which keeps TPOT and throughput level when affinity would
	// otherwise concentrate decodes. Default 0.1. In the simulator, over
	// the README's burst rows and seeds 1-6, it raised the lowest
	// throughput against the best baseline from -7.6% to -1.5% (rag at
	// 420 req/s) and from -9.0% to -0.5% (tenants at 650 req/s) at the
	// same mean p99 TTFT margin (the sum over the rows -55.6 -> -56.0
	// points); with the step as the batch is now, 0.1 gave up p99 TTFT
	// for it, and on the projected step 0.15 and 0.2 did (rag at 420
	// req/s +3% and +13% over 6 and 2 seeds, against -4%).
	// It trades TTFT for decode speed, and past what a fleet completes
	// that trade can sort the work: on the tenants workload at 200/s
	// (seed 5) one engine held only light tenants' prompts, whose short
	// contexts made its projected step 61 ms against the others' 95-113, so
	// their requests kept going there (894 in flight against 444-681,
	// with the highest queue estimate, 1.29 s against 0.57-0.79) until
	// its KV filled and it preempted; that run's p99 TTFT is 829.6 ms
	// against round-robin's 321.6. Denying the decode advantage to a
	// candidate over the in-flight bound (its decode term raised to the
	// largest of those within it) gave 303.9 ms there, but took the
	// conversation trace at four times its rate from 15.27 and 14.52 s to
	// 17.75 and 15.52 s (seeds 1 and 5) and tenants at 650/s from 153.3
	// to 136.3 req/s (seed 1); only over the bound while congested, 550.2
	// ms, with the trace worse at six of seeds 1-8 (-18% to +14%). Denied
	// where the KV is full instead (DecodeKVCap, on by default), 312.6 ms.
	// Scaled down for long prompts (by 16384/P past 16,384 tokens), it
	// took the conversation trace at its own rate from a mean p99 of 4.68
	// to 4.63 s, but at four times its rate from 16.16 to 17.24 s (paired
	// over seeds 1-8 and four perturbations of the weight: standard errors
	// 0.02 and 0.34 s): there the long prompts' decode placement still
	// pays.
	DecodeWeight float64 `param:"decode_weight"`
	// DecodeKVCap denies the decode advantage to a candidate whose KV
	// usage (Load.KVUsage) reaches it: its decode term is raised to the
	// largest of the eligible candidates'. An engine whose KV is full runs
	// the batch its memory holds, not the one its load would make: its
	// step is short because the contexts that fit are, and a request sent
	// there waits for memory before it decodes at all (the queue estimate
	// does not see that wait). 1 disables. Default 0.95. In the simulator
	// it took tenants at 200/s from a mean p99 TTFT of 340 to 265 ms over
	// seeds 1-8, each run with DecodeWeight scaled by 1.001, 0.999, 1.002
	// and 0.998 (paired difference -75 ms, standard error 29; seed 5 829.6
	// -> 312.6 ms, its preemptions 43 -> 0), left every other README row
	// (and the LoRA rows at seeds 1-2) bit for bit as they were, and moved
	// the conversation trace at four times its rate by +0.26 s (standard
	// error 0.25; a mean of 16.0 s) over 64 such paired runs. 0.97 and
	// 0.99 did worse there (+0.44 s over 32; seed 5 of tenants 357.7 ms at
	// 0.99), 0.999 too (645.8 ms). Capping such a candidate outright
	// (KVCap 0.95, which also takes its cache credit away) fixes tenants
	// as well but costs the trace 47-131%: there the engines holding the
	// long prompts are full, and their hits are worth the wait.
	DecodeKVCap float64 `param:"decode_kv_cap"`
	// OutputTokens is the expected output length for DecodeWeight (capped
	// by the request's max_tokens). Default 256.
	OutputTokens int `param:"output_tokens"`
	// AdapterLoad is the time an engine takes to load a LoRA adapter it
	// has no request of running or waiting (vllm:lora_requests_info)
	// before a request for it can start: vLLM's worker LoRA manager reads
	// the adapter's safetensors (a rank-16 adapter of an 8B model's
	// attention and MLP projections is some 40-170 MB) into host memory
	// and copies them into a GPU slot on a miss, tens of milliseconds from
	// a local disk. One still in vLLM's host cache (--max-cpu-loras)
	// activates in a few ms, one fetched from a hub takes seconds: the
	// default sits between. Where the engine's --max-loras slots
	// (max_lora) are taken by other adapters, the request also waits for a
	// slot, priced in decodes of OutputTokens steps (see the LoRA
	// paragraph of the estimate below). An endpoint whose signals give no
	// adapters (none yet, or no --enable-lora metric) is taken to have the
	// max_lora other endpoints report, and to run the adapters the policy
	// has requests in flight for there; where none reports one, it pays
	// AdapterLoad unless the policy has requests for the adapter in flight
	// there. Only
	// requests for an adapter (kvroute.Request.Adapter) pay any of it: the
	// base model's decisions are unchanged. 0 prices a load at nothing
	// (the slot wait remains). Default 50ms.
	AdapterLoad time.Duration `param:"adapter_load"`
	// AdapterHold is how long an engine is taken to keep the LoRA
	// adapter the policy last routed there in its GPU slots once its
	// requests have ended (vLLM keeps it until another adapter needs the
	// slot), so that with --max-loras 1 an adapter's next request goes back
	// to it and another adapter's does not take its place while an engine
	// is free (see adapterCost). 0 forgets an adapter as its last request
	// ends. Default 10s.
	AdapterHold time.Duration `param:"adapter_hold"`
	// Explain fills Decision.Scores with every candidate's estimate and its
	// parts. The Reason is always set. Turn it off on a hot path that does
	// not log decisions (it is the policy's only sizeable allocation).
	// Default true.
	Explain bool `param:"explain"`
}

// Overload modes.
const (
	OverloadLeastLoaded = "least-loaded"
	OverloadShed        = "shed"
	OverloadQueue       = "queue"
)

// DefaultKVAwareParams returns the kv-aware defaults documented on each field.
func DefaultKVAwareParams() KVAwareParams {
	return KVAwareParams{
		PrefillUsPerToken:     20,
		AttnUsPerTokenPerKTok: 0.7,
		StepOverheadUs:        6000,
		DecodeUsPerToken:      2,
		DecodeUsPerCtxKTok:    45,
		MaxBatchedTokens:      8192,
		QueuedRequestMs:       1,
		MeanPromptTokens:      1024,
		Learn:                 false,
		LearnAlpha:            0.1,
		LearnMinSamples:       8,
		C:                     1.25,
		InflightSlack:         4,
		QueueCap:              256,
		KVCap:                 1,
		Overload:              OverloadLeastLoaded,
		TieMs:                 1,
		TieFrac:               0.01,
		SessionSlackMs:        2,
		SessionTolerance:      0,
		VirtualNodes:          256,
		CPUHitCost:            0.1,
		Replicate:             true,
		HotSpread:             true,
		HotSlack:              2,
		HotSettle:             5 * time.Second,
		TrimKVUsage:           0.9,
		SpareFull:             true,
		ThrashHorizon:         2 * time.Second,
		TenantFairness:        true,
		PendingTTL:            10 * time.Minute,
		Explain:               true,
		WorkWeight:            1,
		WorkLoadGain:          1,
		ProgressTokPerMs:      25,
		StepPhase:             true,
		OutputTokens:          256,
		DecodeWeight:          0.1,
		DecodeKVCap:           0.95,
		AdapterLoad:           50 * time.Millisecond,
		AdapterHold:           10 * time.Second,
	}
}

// Validate reports the first out-of-range field, naming its param. The
// estimate's rates, weights, slacks and tolerances are at most
// maxNumberParam.
func (p KVAwareParams) Validate() error {
	n := NameKVAware
	for _, c := range []struct {
		name string
		v    float64
	}{
		{"prefill_us_per_token", p.PrefillUsPerToken}, {"attn_us_per_token_per_ktok", p.AttnUsPerTokenPerKTok},
		{"step_overhead_us", p.StepOverheadUs}, {"decode_us_per_token", p.DecodeUsPerToken},
		{"decode_us_per_ctx_ktok", p.DecodeUsPerCtxKTok}, {"queued_request_ms", p.QueuedRequestMs},
		{"inflight_slack", p.InflightSlack}, {"tie_ms", p.TieMs}, {"session_slack_ms", p.SessionSlackMs},
		{"session_tolerance", p.SessionTolerance}, {"hot_slack", p.HotSlack}, {"work_weight", p.WorkWeight}, {"progress_tok_per_ms", p.ProgressTokPerMs}, {"work_load_gain", p.WorkLoadGain}, {"decode_weight", p.DecodeWeight},
	} {
		if err := check(n, c.name, c.v >= 0, "must be >= 0, got %v", c.v); err != nil {
			return err
		}
		if err := check(n, c.name, c.v <= maxNumberParam, "must be at most %g, got %v", maxNumberParam, c.v); err != nil {
			return err
		}
	}
	errs := []error{
		check(n, "prefill_us_per_token", p.PrefillUsPerToken > 0, "must be > 0, got %v", p.PrefillUsPerToken),
		check(n, "output_tokens", p.OutputTokens >= 0, "must be >= 0, got %d", p.OutputTokens),
		check(n, "max_batched_tokens", p.MaxBatchedTokens >= 1, "must be >= 1, got %d", p.MaxBatchedTokens),
		check(n, "mean_prompt_tokens", p.MeanPromptTokens >= 0, "must be >= 0, got %d", p.MeanPromptTokens),
		check(n, "learn_alpha", p.LearnAlpha > 0 && p.LearnAlpha <= 1, "must be in (0, 1], got %v", p.LearnAlpha),
		check(n, "learn_min_samples", p.LearnMinSamples >= 0, "must be >= 0, got %d", p.LearnMinSamples),
		check(n, "c", p.C >= 1, "must be >= 1, got %v", p.C),
		check(n, "queue_cap", p.QueueCap >= 0, "must be >= 0, got %d", p.QueueCap),
		check(n, "kv_cap", p.KVCap > 0 && p.KVCap <= 1, "must be in (0, 1], got %v", p.KVCap),
		check(n, "decode_kv_cap", p.DecodeKVCap > 0 && p.DecodeKVCap <= 1, "must be in (0, 1], got %v", p.DecodeKVCap),
		check(n, "overload", p.Overload == OverloadLeastLoaded || p.Overload == OverloadShed || p.Overload == OverloadQueue,
			"must be one of least-loaded, shed, queue, got %q", p.Overload),
		check(n, "tie_frac", p.TieFrac >= 0 && p.TieFrac < 1, "must be in [0, 1), got %v", p.TieFrac),
		check(n, "virtual_nodes", p.VirtualNodes >= 1 && p.VirtualNodes <= 4096, "must be in [1, 4096], got %d", p.VirtualNodes),
		check(n, "cpu_hit_cost", p.CPUHitCost >= 0 && p.CPUHitCost <= 1, "must be in [0, 1], got %v", p.CPUHitCost),
		check(n, "pending_ttl", p.PendingTTL > 0, "must be > 0, got %v", p.PendingTTL),
		check(n, "hot_settle", p.HotSettle >= 0, "must be >= 0, got %v", p.HotSettle),
		check(n, "thrash_horizon", p.ThrashHorizon >= 0, "must be >= 0, got %v", p.ThrashHorizon),
		check(n, "adapter_load", p.AdapterLoad >= 0, "must be >= 0, got %v", p.AdapterLoad),
		check(n, "adapter_hold", p.AdapterHold >= 0, "must be >= 0, got %v", p.AdapterHold),
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// KVAware is the default policy: it sends each request where its estimated
// time to first token is lowest, with per-candidate load caps, session
// affinity by bounded-load consistent hashing, demand-driven replication of
// hot prefixes, tenant fairness and an overload escape hatch.
//
// # Estimate
//
// For each healthy candidate, with own = PromptTokens - CachedTokens (the
// uncached part; CPU-tier hits pay CPUHitCost of their prefill):
//
//	queued  = max(own queued prefill, Waiting x mean uncached)
//	step    = StepOverheadUs + Running x DecodeUsPerToken + DecodeTokens/1000 x DecodeUsPerCtxKTok
//	queue   = queued x tok x (1 + attention over the queued prompts' own size)
//	          + ceil(queued/budget) x step + Queue() x QueuedRequestMs
//	          + step wait (the rest of the step in progress; StepPhase)
//	prefill = own x tok x (1 + attention over cached+own/2 context) + remaining steps x step
//	TTFT    = queue + prefill
//	dstep   = StepOverheadUs + (max(InFlight, Running) + 1) x DecodeUsPerToken
//	          + (DecodeTokens + InFlightTokens + PromptTokens)/1000 x DecodeUsPerCtxKTok
//	score   = TTFT + w x own x tok x attention + DecodeWeight x OutputTokens x dstep
//	          with w = WorkWeight x (1 + WorkLoadGain x mean waiting)
//
// A request for a LoRA adapter (Request.Adapter) adds to queue its
// adapter's cost on the endpoint (adapterCost): nothing where the engine
// holds the adapter in one of its max_lora slots (running or waiting in
// its signals, with requests the policy routed there in flight, or the
// adapter the policy last routed there within AdapterHold), AdapterLoad
// where a slot is free, and where other adapters hold every slot the wait
// for one: half a decode (OutputTokens steps) where each of them runs on
// another engine too, and where some run only there the busy period of
// their requests (SlotBusyPeriod: their requests keep coming and keep this
// one out), plus, where adapters contend for the slots, the wait it makes
// the other adapters at home there (AdapterHomes: each adapter's home is
// the engine the policy placed it on most lately) wait behind it in turn,
// at its own home too, unless it waits for a slot there and the demand of
// the adapters it shares its home with cannot be told from that of the
// least used other engine's (homeSettled). An adapter that runs on two engines
// leaves one whose slots are oversubscribed (another adapter waits there)
// for the other at the price of half a decode. So with few slots each
// adapter keeps engines of its own, a new one is given a free engine or
// one a replicated adapter leaves, a hot adapter spreads only when its
// queue is longer than the wait, and with more adapters than slots those
// that must share an engine keep sharing the same one, the least used
// paired up, whatever the order they came in, while adapters used alike
// stay where they are. (llm-d's lora-affinity-scorer scores
// active, free-slot and waiting states, 1, 0.8 and 0.6, but is not in its
// default profile; kv-aware prices them in its estimate.)
//
// where budget is MaxBatchedTokens less one token per running sequence, tok
// is PrefillUsPerToken (or the learned rate) and attention adds
// AttnUsPerTokenPerKTok per 1000 tokens of context. The own queued prefill
// is exact when the router reports first tokens (FirstToken, the
// router.FirstTokenObserver hook; the router and the simulator do): the
// uncached tokens of the requests the policy sent there that have no first
// token yet, less ProgressTokPerMs x the time since the queue head started
// (at most one step), and the queued prompts' size is their mean by
// tokens. A
// request's prompt stops counting at its first token, not at its end, and
// a holder's queue of cache hits counts as short. Without the hook it is
// approximated as InFlightTokens (the router's in-flight prompt tokens) x
// the uncached share of the requests the policy routed there and has not
// seen released (the fleet-wide share when it has none), and the size as
// their mean. The mean uncached size and the fleet-wide uncached share are
// moving averages over the requests it routed. The lowest score wins: the
// work term counts the prefill a request adds, which delays everyone queued
// behind it, so on a busy fleet a cache hit is worth more than the time it
// saves the request itself; the decode term keeps decode-heavy work off
// nodes whose batches are already slow (TPOT, throughput). The defaults
// match the default engine profile (llama-3.1-8b-h100); with Learn, Observe replaces tok and the per-queued-
// request cost by moving averages of measured TTFTs (fleet-wide, or per
// endpoint with LearnPerEndpoint).
//
// # Caps (per candidate, never fleet-wide)
//
// A candidate is capped when its waiting queue reaches QueueCap, its KV usage
// reaches KVCap (off by default: vLLM runs near full KV by design, and in
// the simulator a 0.95 cap stripped affinity from the best holder in over
// half the decisions under load; measured again on 2026-12-05, a 0.95 cap
// put the conversation trace at four times its rate at 38.30 s p99 TTFT
// against 15.27 (seed 1; worse than the best baseline by 47-131% at seeds
// 1-8, where without it it is better by 8% at seed 1 and 11-23% at seeds
// 5-8: its 85-123k-token prompts fill an engine's KV, and the cap takes
// their cache hits away), while on the tenants workload at 200/s, past
// what the fleet completes, it cut seed 5's p99 from 829.6 to 313.6 ms,
// where the engine the light tenants' requests went to filled its KV and
// preempted 43 of them, and changed none of the other 29 runs of the
// README's rows but the trace's at seeds 1 and 5; DecodeKVCap, on by
// default, now does as much there at no such cost), or, when it is congested (more
// prefill queued than one engine step takes), its in-flight count plus one would
// exceed max(C x m, m + InflightSlack) where m = (total in-flight + 1) /
// healthy (twice that caps it congested or not). A capped candidate gets no credit for its cache (it competes on
// load alone) and is never a session target, so affinity cannot pile load
// on a saturated node while others idle. Queue- and KV-capped candidates are
// not eligible at all while any other healthy candidate is under those caps.
// When every candidate is over them, Overload decides: shed or queue, or
// (least-loaded, the default) pick anyway, keeping affinity, since none is
// better off than another and dropping affinity would only add work.
// A small hit (under a quarter of the prompt cached) on a candidate whose
// full cache turns over within ThrashHorizon is credited no more than an
// eligible candidate with room caches, and loses ties (SpareFull).
//
// # Picking
//
// The lowest estimate wins. Candidates within max(TieMs, TieFrac x best) of
// the best are tied, and the pick among ties (including every miss on an
// idle fleet) is the less loaded of two drawn at random, never the first;
// for a request neither caches a quarter of, the one whose cache it pushes
// less out of (the router's record: room before a full cache, then the
// one keeping blocks longer) goes first (lessLoaded).
// With a SessionKey, the session's target on a consistent-hash ring with
// bounded loads (CHWBL: VirtualNodes per endpoint; walk clockwise past
// endpoints that are capped or whose in-flight would exceed the bound,
// congested or not) is chosen when it is not capped and its estimate is within SessionTolerance and SessionSlackMs of
// the best.
//
// # Hot prefixes
//
// The request's hot prefix is the deepest prefix any candidate caches
// (BlockHashes[d-1] for the largest CachedBlocks d). The policy counts the
// in-flight requests of each prefix (released by Release) and sizes its
// replica set as r = ceil(demand / share), share = max(1, C x mean
// in-flight per endpoint). Growing: when the holders are capped, the request
// goes to the next best estimate, and because the router records what it
// routed, that endpoint becomes a holder (a new replica). With HotSpread a
// holder of a hot prefix (demand above one share) is capped as soon as it
// is over the in-flight bound, congested or not: a prefix whose prompts are
// mostly cached never congests its holders' queues, and without it two
// holders of a shared system prompt ran at 1.4x the mean in-flight while
// the others idled (sysprompt at 100 req/s: p99 TTFT +15% over round-robin,
// +5% with it, over seeds 1-4). It applies only while an endpoint without
// the prefix has room (uncongested, in-flight at most the mean). A prefix
// in flight without a break for HotSettle, with an idle endpoint without
// it (no prefill queued), is settled: its holders are capped above the
// mean plus HotSlack instead, so its replica set keeps growing until its
// holders are level with the fleet (with the in-flight bound alone, each
// of the 4 shared system prompts stayed on 3 of 8 endpoints, unevenly
// overlapping sets the estimate could not balance across: +5% -> -1%).
// Shrinking: when
// more uncapped endpoints hold the prefix than r, only the r ranked first by
// rendezvous hash of (prefix, endpoint) keep affinity credit; the others,
// when their KV usage is at least TrimKVUsage (their cache space is
// needed), stop attracting that prefix and their copies age out of the
// index and the engine's cache. Below that a surplus replica costs nothing
// and keeps its credit (in the simulator, trimming replicas of caches with
// room to spare cost up to a third of p99 TTFT in cold starts). The ranking is stable, so the replica set does not churn.
//
// # Weights
//
// An endpoint's weight (kvroute.Endpoint.Weight) is its share of the
// fleet's capacity for the load bounds, not a speed: when the healthy
// candidates' weights differ, every in-flight bound above (the cap, the
// session ring's bound, HotSpread's and the tenant bound, and the "at most
// the mean" of an idle endpoint) is the fleet's scaled by the candidate's
// weight over the mean weight, as in consistent hashing with bounded loads
// with weights (cap = C x mean x weight / mean weight); the session ring
// gives each endpoint points in proportion to its weight (VirtualNodes for
// the largest), and tie breaks compare in-flight per unit of weight. The
// estimate does not use weights: it is built from the engine's own
// signals (its queue, batch and KV) and the rates, learned per endpoint
// with LearnPerEndpoint, which already tell a faster engine from a slower
// one; a weight there would count that twice. So with equal estimates
// (an idle fleet, sessions, ties) traffic follows the weights, and an
// endpoint of weight 2 may hold twice the in-flight requests of one of
// weight 1 before it is capped; which one is fastest is the estimate's to
// say. The hot-prefix replica count uses the mean endpoint's share. With
// equal weights every decision is the unweighted one.
//
// # Tenant fairness
//
// The policy counts in-flight requests per tenant (released by Release). A
// tenant above C x its fair share (tracked in-flight / active tenants) loses
// affinity preference first: for its requests a congested candidate is
// capped once its in-flight count plus one exceeds m + InflightSlack/2 (m as
// in Caps) rather than the in-flight bound, so its hot prefix spreads before
// it can crowd the holders other tenants depend on.
//
// # Explanation
//
// Every decision carries one Score per candidate (Value = the score, in ms;
// Parts queue_ms, prefill_ms, work_ms, decode_ms, cached_tokens credited,
// queued_tokens, in_flight, weight when it is not 1, adapter_ms (in
// queue_ms) with adapter_active or adapter_slots_full, and
// adapter_home_wait when adapter_ms holds the wait of the adapters at home
// there behind it or adapter_home_settled when, at the adapter's home, it
// would but their demand is settled (homeSettled), for a request for a
// LoRA adapter, and capped/
// replica_trimmed/thrashing/session_target flags when they apply; Why
// says which cap) and a Reason
// with the chosen candidate's TTFT estimate, built by the code that
// decides. Explain=false
// leaves Scores nil on hot paths that do not log decisions. After
// DeferExplanations (the router's decision log calls it) Pick leaves
// Scores nil too but keeps the candidate states it decided from, and
// Explain renders them with the same code when someone reads the log.
//
// KVAware keeps state (learned rates, in-flight accounting, the ring, scratch
// buffers) without locks: it is not safe for concurrent use. The router
// serialises calls per model, which is what it needs.
type KVAware struct {
	buf scoreBuf // explanation buffers, reused
	p   KVAwareParams
	rng *rand.Rand

	ring *ring
	eps  map[string]*epStats // learned rates per endpoint ID; deleted only by ForgetEndpoint
	// byPos remembers lookupStat's answer per candidate position; epsGen
	// counts the entries added to eps, which invalidates a nil answer.
	byPos  []posStat
	epsGen uint64
	all    epStats // fleet-wide learned rates

	meanUncached float64 // moving average of uncached tokens per routed request
	uncachedFrac float64 // moving average of uncached/prompt per routed request

	pending        map[pendingKey]pendingReq
	prefixInflight map[uint64]prefixDemand
	tenantInflight map[string]int
	// The LoRA adapters of the requests in flight on an endpoint, and
	// those the policy last routed there, are kept with its stats
	// (epStats.lora).
	//
	// adapterHome is each adapter's home, the endpoint the policy placed
	// it on most lately: an adapter contending for the slot of others at
	// home on an endpoint is charged their wait behind it (homeWait).
	adapterHome AdapterHomes
	// homes is homesOf's memory, for the Pick of a request for an
	// adapter: per adapter asked about, the endpoints where it runs or
	// has requests in flight; held is adapterCost's scratch, the adapters
	// one endpoint holds; poolMaxLoRA the largest max_lora a candidate's
	// signals report (0: none does), taken for an engine whose signals do
	// not say.
	homes []adapterCount
	// names interns the LoRA adapter names the policy keeps (intern),
	// and loraPos, per candidate position, the names of the LoRALoad
	// there, interned (loraNamesAt): heldAt compares names by address.
	names   map[string]string
	loraPos []loraNames
	// holdFrom is the Pick's holdFrom(now, AdapterHold), for heldAt.
	holdFrom time.Time
	// demand is each adapter's recent requests, for the wait behind an
	// adapter that holds a slot (adapterCost).
	demand AdapterDemand
	// viewCands is the candidates of the Pick adapterView was last called
	// for (read within that Pick only), and settled homeSettled's answer
	// for it: settledUnknown until adapterCost first asks.
	viewCands     []kvroute.Candidate
	settled       uint8
	held          []string
	poolMaxLoRA   int
	flightRun     kvroute.LoRALoad // adapterCost's stand-in for an engine's missing adapter signals
	tenantsActive int
	tracked       int // requests in pending
	picks         uint64
	sweepAt       int  // pending's size above which a Pick sweeps (past pendingSweepMin)
	sweeps        int  // sweeps done
	firstTokens   bool // the router reports first tokens (FirstToken)
	now           time.Time

	workW     float64 // this decision's weight of added work
	outTokens float64 // this request's expected output tokens
	adapter   string  // this request's LoRA adapter ("": the base model)
	// The estimate's terms that are the same for every candidate of a
	// Pick, computed once per Pick: the attention ratio and the rates of
	// a candidate without learned rates of its own (rates(nil)).
	ratio               float64
	fleetTok, fleetReq  float64
	fleetLearned, perEp bool
	// memo is estimate's, by candidate position (see estimateMemo).
	memo     []estimateMemo
	attnMemo attnMemo

	// deferred: the caller keeps explanations (DeferExplanations); target
	// is the last Pick's session target (-1: none) for KeepExplanation.
	deferred bool
	target   int
	// roomCached is the most tokens an eligible candidate with room caches
	// (SpareFull), the credit of a capFull candidate.
	roomCached int
	// why is the last Pick's reason as a deferring Pick leaves it to be
	// rendered (zero when it chose no endpoint: its reason is whole).
	why reasonFigures

	// scratch, reused across calls
	c       []candState
	elig    []int
	tie     []int
	holders []int
}

var (
	_ kvroute.Picker   = (*KVAware)(nil)
	_ kvroute.Learner  = (*KVAware)(nil)
	_ kvroute.Releaser = (*KVAware)(nil)
	_ interface {
		FirstToken(time.Time, *kvroute.Request, string)
	} = (*KVAware)(nil) // router.FirstTokenObserver
	_ interface {
		RecycleScores([]kvroute.Score, []kvroute.Part) ([]kvroute.Score, []kvroute.Part)
	} = (*KVAware)(nil) // router.ScoreRecycler
)

type epStats struct {
	tokMs, reqMs float64 // learned ms per uncached token, ms per queued request
	nTok, nReq   int
	// sumTok and sumSq are the sum and sum of squares of the uncached sizes
	// of the requests routed here and not yet released, sumPrompt the sum of
	// their prompt sizes.
	sumTok, sumSq, sumPrompt float64
	// pendTok and pendSq are the sum and sum of squares of the uncached
	// sizes of the requests routed here that have not produced a first
	// token yet (known when the router reports first tokens).
	pendTok, pendSq float64
	// progressAt is when the engine last started on its queue head (the
	// last first token here, or a dispatch to an empty queue); headMax
	// bounds the progress credited since then.
	progressAt time.Time
	headMax    float64
	// stepAt is when the last first token came from the endpoint (Unix
	// nanoseconds, 0: none yet): the end of one of its engine steps
	// (StepPhase).
	stepAt int64

	// lora is the LoRA adapters of the requests routed here, nil until
	// the first: kept apart, so that the stats every Pick reads for every
	// candidate stay small (120 bytes, with stepAt; 112 before it).
	lora *epLoRA
}

// epLoRA is the LoRA adapters of the requests a policy routed to an
// endpoint. They are kept with its stats, not in maps by endpoint ID,
// because a Pick has each candidate's stats at hand (byPos): looking them
// up by ID for every candidate (twice: adapterView and heldAt) was about a
// tenth of the decision for a request for an adapter
// (BenchmarkDecisionKVAware64/adapters, pprof).
type epLoRA struct {
	// flights is the adapters of the requests routed there and not yet
	// released, each with their count, in the order they came (track,
	// untrack): the engine has the adapter loaded, or loading, before its
	// next scrape says so.
	flights []adapterCount
	// last is the adapters the policy last routed there: an engine keeps
	// an adapter in its GPU slots until another takes its place, so an
	// adapter whose requests have all ended still holds the slot it used
	// for AdapterHold (see adapterCost).
	last adapterUses
}

// loraFor returns s's epLoRA, making it if s has none.
func (s *epStats) loraFor() *epLoRA {
	if s.lora == nil {
		s.lora = &epLoRA{}
	}
	return s.lora
}

// loraOf returns s's epLoRA, nil when s is nil or has none.
func (s *epStats) loraOf() *epLoRA {
	if s == nil {
		return nil
	}
	return s.lora
}

// adapterCount is a LoRA adapter and a count of it.
type adapterCount struct {
	adapter string
	n       int
}

// flying reports whether requests for adapter x are in flight there.
func (l *epLoRA) flying(x string) bool {
	return l != nil && slices.ContainsFunc(l.flights, func(f adapterCount) bool { return f.adapter == x })
}

// adapterKey names a LoRA adapter on an endpoint (AdapterHomes).
type adapterKey struct{ endpoint, adapter string }

// lookupStat returns the stats of candidate i, c, nil when there are none
// yet, and keeps the answer in k.byPos. A caller such as the router passes
// the same candidates in the same order every time, so Pick reuses the
// answer for position i while the candidate there has the same ID (a
// string comparison, which is a pointer comparison for the same string)
// and, for a nil answer, no stats were created since: one map lookup per
// candidate saved. (Pick makes that check itself, inline: as a call per
// candidate, epStat, it was 7% of a Pick in BenchmarkPick's profile.)
func (k *KVAware) lookupStat(i int, c *kvroute.Candidate) *epStats {
	if len(k.eps) == 0 {
		return nil
	}
	id := endpointID(c)
	s := k.eps[id]
	k.byPos[i] = posStat{id: id, s: s, gen: k.epsGen}
	return s
}

// posStat is lookupStat's memory of the stats of one candidate position.
type posStat struct {
	id  string
	s   *epStats // nil: none when gen was current
	gen uint64
}

// ForgetEndpoint implements router.EndpointForgetter: an endpoint removed
// from the pool (or replaced by another engine under its ID) takes its
// learned rates and in-flight sums with it, so that an engine added later
// under the ID starts from the fleet's rates, as a new endpoint does.
// Requests still in flight on it are no longer charged to any endpoint:
// their end does not touch the stats a new engine under the ID builds.
func (k *KVAware) ForgetEndpoint(id string) {
	if _, ok := k.eps[id]; !ok {
		return
	}
	delete(k.eps, id) // and the adapters in flight there, and last placed there
	k.epsGen++
	k.adapterHome.Forget(id)
	clear(k.byPos) // it may hold the deleted stats
	for key, pr := range k.pending {
		if pr.endpoint == id {
			pr.endpoint = ""
			k.pending[key] = pr
		}
	}
}

// stat returns id's stats, creating them.
func (k *KVAware) stat(id string) *epStats {
	s := k.eps[id]
	if s == nil {
		s = &epStats{}
		k.eps[id] = s
		k.epsGen++ // a nil kept by lookupStat may be stale now
	}
	return s
}

type pendingKey struct {
	id  string
	ptr *kvroute.Request // when the request has no ID
}

// reqKey returns req's key in a picker's per-request state: its ID, or the
// request itself when it has none.
func reqKey(req *kvroute.Request) pendingKey {
	if req.ID == "" {
		return pendingKey{ptr: req}
	}
	return pendingKey{id: req.ID}
}

// prefixDemand is a prefix's in-flight requests (tracked by the policy)
// and since when it has had any.
type prefixDemand struct {
	n     int
	since time.Time
}

type pendingReq struct {
	prefix   uint64 // hot-prefix key, 0 = none
	tenant   string
	endpoint string
	size     float64 // uncached tokens
	prompt   float64 // prompt tokens
	at       time.Time
	prefill  bool // no first token yet: size is queued prefill work
	adapter  string
}

// Cap flags of a candidate.
const (
	capQueue uint8 = 1 << iota
	capKV
	capInflight
	capTenant
	capTrimmed   // outside the hot prefix's replica set
	capSaturated // over a hard cap like every other candidate (no effect on affinity)
	capFull      // a small hit on a thrashing cache, with room elsewhere (SpareFull)
	decodeKVFull // KV full: the decode term raised to the largest (DecodeKVCap); no cap
)

// candState is a candidate's state in a Pick. It is 72 bytes (the adapter
// fields sit in the padding after flags, the step wait beside the credit,
// an int32 for it): Pick writes one per candidate, into memory that the
// router's decision log hands back seldom in cache (KeepExplanation), so
// the fewer lines the better; the estimate (queueMs + prefMs) and the
// decode term it used to keep too made it 80.
type candState struct {
	elig       bool // may be chosen
	overBound  bool // in-flight + 1 above the bound (session targets must not be)
	flags      uint8
	adapter    uint8   // the LoRA adapter's state there (adapterActive, ..., | adapterHomeWait or adapterHomeSettled), 0: a base-model request
	adapterMs  float32 // the adapter's load and slot wait, ms (in queueMs)
	credit     int32   // cached tokens credited (at most the prompt's, and math.MaxInt32)
	stepWaitMs float32 // the rest of the engine step in progress, ms (in queueMs; StepPhase)
	work       float64 // prefill compute this request adds to the endpoint, ms
	decode     float64 // the score's decode term: DecodeWeight x its decode time there, ms
	score      float64 // est() + work and decode terms: lower wins
	queueMs    float64
	prefMs     float64
	queued     float64  // uncached prompt tokens queued ahead (queuedTokens)
	es         *epStats // the endpoint's stats, nil when none: looked up once per Pick
}

// est returns the estimated TTFT, ms.
func (st *candState) est() float64 { return st.queueMs + st.prefMs }

// affinityCapped reports whether a cap takes the candidate's cache credit
// away. Queue and KV caps do not when every candidate is over them.
func (st *candState) affinityCapped() bool { return st.effFlags() != 0 }

// effFlags returns the caps in force: the flags less queue and KV caps that
// every candidate shares.
func (st *candState) effFlags() uint8 {
	f := st.flags &^ (capFull | decodeKVFull) // cut the credit, or the decode advantage; take no affinity away
	if f&capSaturated != 0 {
		f &^= capQueue | capKV | capSaturated
	}
	return f
}

const kvAwareParts = 10

// NewKVAware builds the kv-aware policy from params (nil = defaults).
func NewKVAware(params map[string]any, seed uint64) (*KVAware, error) {
	p := DefaultKVAwareParams()
	if err := decodeParams(NameKVAware, params, &p); err != nil {
		return nil, err
	}
	return NewKVAwareWith(p, seed)
}

// NewKVAwareWith builds the kv-aware policy from a params struct.
func NewKVAwareWith(p KVAwareParams, seed uint64) (*KVAware, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &KVAware{
		p:              p,
		rng:            newRand(seed),
		ring:           newRing(p.VirtualNodes, vnodeHash, true),
		eps:            make(map[string]*epStats),
		meanUncached:   float64(p.MeanPromptTokens),
		uncachedFrac:   1,
		pending:        make(map[pendingKey]pendingReq),
		prefixInflight: make(map[uint64]prefixDemand),
		tenantInflight: make(map[string]int),
	}, nil
}

// Params returns the policy's effective params.
func (k *KVAware) Params() KVAwareParams { return k.p }

// Pick implements kvroute.Picker.
func (k *KVAware) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	req = orEmpty(req)
	var scores []kvroute.Score
	if k.p.Explain && !k.deferred {
		scores = k.buf.get(cands, kvAwareParts)
	}
	k.target = -1
	k.why = reasonFigures{}
	n := len(cands)
	if cap(k.c) < n {
		k.c = make([]candState, n)
	}
	k.c = k.c[:n]
	k.now = now

	// Each candidate's state starts here, whole: clearing k.c first and
	// then setting two fields wrote it twice (k.c changes hands with the
	// router's decision log, so it is seldom in cache).
	if len(k.byPos) < n {
		k.byPos = append(k.byPos, make([]posStat, n-len(k.byPos))...)
	}
	// The loop also finds the deepest prefix a healthy candidate caches
	// (hotKey's depth) and whether one has a small hit on a thrashing
	// cache (spareFull's first question): as passes of their own, those
	// were a fifth of a Pick (BenchmarkDecisionKVAware64, pprof).
	P := max(req.PromptTokens, 0)
	total, healthy, waiting, deepest, smallThrash := 0, 0, 0, 0, false
	sumW, w0, weighted := 0, 0, false // the healthy candidates' weights: their sum, the first, whether they differ
	for i := range cands {
		st := &k.c[i]
		c := &cands[i]
		if !c.Healthy {
			*st = candState{}
			continue
		}
		w := weight(c)
		sumW += w
		if w0 == 0 {
			w0 = w
		}
		weighted = weighted || w != w0
		total += c.Load.InFlight
		waiting += max(c.Load.Waiting, 0)
		healthy++
		deepest = max(deepest, c.CachedBlocks)
		smallThrash = smallThrash || k.thrashing(c) && smallHit(c, P)
		es := k.byPos[i].s // the stats lookupStat found here, if still true
		if m := &k.byPos[i]; !sameString(m.id, endpointID(&cands[i])) || (es == nil && m.gen != k.epsGen) {
			es = k.lookupStat(i, &cands[i])
		}
		var queued float64
		if k.firstTokens && (es == nil || es.pendTok == 0) {
			// queuedTokens with no prefill of its own queued there (most
			// endpoints, most of the time), inline: its call per
			// candidate was 7% of a Pick (BenchmarkPick, pprof).
			queued = max(0, float64(max(cands[i].Load.Waiting, 0))*k.meanUncached)
		} else {
			queued = k.queuedTokens(&cands[i], es)
		}
		*st = candState{es: es, queued: queued}
	}
	if healthy == 0 {
		return noneHealthy(NameKVAware, cands, scores)
	}
	p := &k.p
	mean := float64(total+1) / float64(healthy)
	// With weights that differ, each candidate's in-flight bounds below
	// are the fleet's scaled by its weight over the mean weight (weighted
	// consistent hashing with bounded loads): its capacity share is its
	// share of the weights. wscale returns that factor, 1 when unweighted.
	meanW := float64(sumW) / float64(healthy)
	wscale := func(c *kvroute.Candidate) float64 {
		if !weighted {
			return 1
		}
		return float64(weight(c)) / meanW
	}
	k.workW = p.WorkWeight * (1 + p.WorkLoadGain*float64(waiting)/float64(max(healthy, 1)))
	k.adapter = req.Adapter
	if req.Adapter != "" {
		k.adapter = k.intern(req.Adapter)
		k.demand.Seen(now, req.Adapter)
		k.adapterView(cands)
	}
	k.outTokens = float64(p.OutputTokens)
	if req.MaxTokens > 0 {
		k.outTokens = float64(min(req.MaxTokens, p.OutputTokens))
	}
	inflightCap := math.Max(p.C*mean, mean+p.InflightSlack)
	hotCap := math.Min(inflightCap, mean+p.HotSlack) // a hot prefix's holders' bound (HotSpread)
	tenantOver := p.TenantFairness && k.tenantOver(req.Tenant)

	// The hot prefix: the deepest any candidate caches, and whether its
	// demand exceeds one endpoint's share.
	hot, depth := uint64(0), 0                                // the hot prefix's key and depth (0: none)
	share := math.Max(1, p.C*float64(total)/float64(healthy)) // one endpoint's share of a prefix's demand
	if p.Replicate {
		hot, depth = hotKey(req, deepest)
	}
	hotDepth := 0 // depth of a hot prefix whose over-bound holders are capped (HotSpread)
	hotBound := inflightCap
	if p.HotSpread && hot != 0 {
		if dem := k.prefixInflight[hot]; float64(dem.n+1) > share {
			// Only where a new replica would land on an idle-ish node: one
			// without the prefix, its queue uncongested and its in-flight
			// at most the mean (in a burst on a cold fleet every other
			// node is busy prefilling, and spreading adds misses to them).
			for i := range cands {
				c := &cands[i]
				if c.Healthy && c.CachedBlocks < depth && float64(c.Load.InFlight+1) <= mean*wscale(c) &&
					k.c[i].queued <= float64(p.MaxBatchedTokens) {
					hotDepth = depth
					if k.c[i].queued < 1 && now.Sub(dem.since) >= p.HotSettle {
						hotBound = hotCap
						break
					}
				}
			}
		}
	}

	// Caps.
	anyUnder := false
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		l := &cands[i].Load
		st := &k.c[i]
		if p.QueueCap > 0 && l.Waiting >= p.QueueCap {
			st.flags |= capQueue
		}
		if l.KVUsage >= p.KVCap && p.KVCap < 1 {
			st.flags |= capKV
		}
		if st.flags&(capQueue|capKV) == 0 {
			anyUnder = true
		}
		// The in-flight bound (and the tenant one) apply to congested
		// candidates: more prefill queued than one engine step takes.
		// Decoding requests barely delay a new prompt (the estimate's step
		// term covers them) and a step's worth of queued prefill is gone in
		// one iteration; capping those would strip affinity from nodes that
		// merely hold long generations (in the simulator that cost more p99
		// than any herding it prevented). Twice over the bound caps even an
		// uncongested candidate, so a hot prefix whose hits cost no prefill
		// still spreads.
		f := float64(l.InFlight + 1)
		capI, hotI, tenantI := inflightCap, hotBound, mean+p.InflightSlack/2
		if weighted {
			ws := wscale(&cands[i])
			capI, hotI, tenantI = capI*ws, hotI*ws, tenantI*ws
		}
		switch congested := st.queued > float64(p.MaxBatchedTokens); {
		case f > 2*capI || (congested && f > capI):
			st.flags |= capInflight
		case hotDepth > 0 && cands[i].CachedBlocks == hotDepth && f > hotI:
			st.flags |= capInflight
		case congested && tenantOver && f > tenantI:
			st.flags |= capTenant
		}
		st.overBound = f > capI
	}

	if !anyUnder {
		// Every candidate is over a hard cap: relative to each other none is,
		// so affinity stays on (dropping it would add prefill work to a
		// saturated fleet). The Overload mode still applies below.
		for i := range k.c {
			if k.c[i].flags&(capQueue|capKV) != 0 {
				k.c[i].flags |= capSaturated
			}
		}
	}

	if p.SpareFull && smallThrash {
		k.spareFull(req, cands, P)
	}

	// Hot prefix replica set.
	if hot != 0 {
		k.trimReplicas(cands, hot, depth, share)
	}

	// Estimates.
	k.ratio = p.AttnUsPerTokenPerKTok / p.PrefillUsPerToken
	k.fleetTok, k.fleetReq, k.fleetLearned = k.rates(nil)
	k.perEp = p.Learn && p.LearnPerEndpoint
	if len(k.memo) < n {
		k.memo = make([]estimateMemo, n)
	}
	// One pass estimates, judges (eligible: healthy, and under the queue
	// and KV caps unless none is or the request is shed) and collects the
	// eligible and their best score.
	shed := !anyUnder && p.Overload != OverloadLeastLoaded
	capsRule := anyUnder && !shed
	k.elig = k.elig[:0]
	best := math.Inf(1)
	full, most := false, 0.0 // an eligible candidate at DecodeKVCap; the largest decode term
	for i := range cands {
		st := &k.c[i]
		if !cands[i].Healthy {
			st.elig = false
			continue
		}
		if !st.affinityCapped() {
			st.credit = int32(min(max(cands[i].CachedTokens, 0), P, math.MaxInt32))
			if st.flags&capFull != 0 {
				st.credit = int32(min(int(st.credit), k.roomCached)) // SpareFull
			}
		}
		k.estimate(i, &cands[i], st, P)
		if st.elig = !(capsRule && st.flags&(capQueue|capKV) != 0); st.elig {
			k.elig = append(k.elig, i)
			best = min(best, st.score) // math.Min inline (see estimate)
			most = max(most, st.decode)
			full = full || cands[i].Load.KVUsage >= p.DecodeKVCap
		}
	}
	if full && p.DecodeKVCap < 1 {
		best = k.denyFullDecode(cands, most)
	}
	if shed {
		// Nothing is chosen: the explanation must not call any candidate
		// eligible (every one is over a hard cap).
		for i := range k.c {
			k.c[i].elig = false
		}
		explain(k.c, cands, scores)
		d := kvroute.None(NameKVAware, p.Overload+": every healthy candidate is over its queue or KV cap")
		d.Shed = true
		d.Scores = scores
		return d
	}
	explain(k.c, cands, scores)

	choice, how := -1, ""
	// Session affinity: the CHWBL target, honoured unless capped or clearly worse.
	if req.SessionKey != "" {
		k.ring.sync(cands)
		t := k.ring.walk(strHash(req.SessionKey), func(c int) bool {
			return k.c[c].elig && !k.c[c].affinityCapped() && !k.c[c].overBound
		})
		if t >= 0 {
			k.target = t
			if scores != nil {
				markTarget(scores, t)
			}
			if k.c[t].score <= best*(1+p.SessionTolerance)+p.SessionSlackMs {
				choice, how = t, "session"
			}
		}
	}
	if choice < 0 {
		tol := math.Max(p.TieMs, p.TieFrac*best)
		k.tie = k.tie[:0]
		for _, i := range k.elig {
			if k.c[i].score <= best+tol {
				k.tie = append(k.tie, i)
			}
		}
		switch len(k.tie) {
		case 1:
			choice, how = k.tie[0], "best"
		default:
			a, b := pickTwo(k.rng, k.tie)
			first, byRoom := k.lessLoaded(cands, b, a, P)
			if first {
				a = b
			}
			choice, how = a, "tie"
			if byRoom {
				how = "tie-room"
			}
		}
	}
	st := &k.c[choice]
	k.record(now, req, hot, endpointID(&cands[choice]), st, P)
	head := reasonHead(how, int(st.credit))
	if !anyUnder {
		if h, ok := overloadedHead[head]; ok {
			head = h
		} else {
			head = "overloaded, " + head // a head the table lacks: allocates
		}
	}
	why := reasonFigures{head: head, est: st.est(), queueMs: st.queueMs, prefMs: st.prefMs, credit: int(st.credit), P: P,
		adapter: st.adapter, adapterMs: float64(st.adapterMs)}
	if k.deferred {
		// The figures are rendered when someone reads the decision
		// (Explain): formatting them for every decision was an
		// allocation per decision.
		k.why = why
		return chose(NameKVAware, cands, choice, why.head, scores)
	}
	return chose(NameKVAware, cands, choice, why.String(), scores)
}

// spareFull applies SpareFull to the candidates of a request of P prompt
// tokens: a candidate with a small hit (smallHit) whose cache thrashes
// (thrashing) gets capFull when an eligible candidate (healthy, under the
// queue and KV caps) has room for the request's blocks and caches no more
// than it; its credit is then cut to the most such a candidate caches
// (k.roomCached), and ties go to a candidate without capFull. Pick calls it
// only when some healthy candidate has such a hit (seldom).
func (k *KVAware) spareFull(req *kvroute.Request, cands []kvroute.Candidate, P int) {
	if len(req.BlockHashes) == 0 || P == 0 {
		return
	}
	room := -1 // the most an eligible candidate with room caches
	for i := range cands {
		if c := &cands[i]; c.Healthy && !c.Evicts && k.c[i].flags&(capQueue|capKV) == 0 {
			room = max(room, c.CachedTokens)
		}
	}
	if room < 0 {
		return // no cache has room: a hit is worth what it saves
	}
	k.roomCached = room
	for i := range cands {
		if c := &cands[i]; c.Healthy && k.thrashing(c) && smallHit(c, P) && c.CachedTokens >= room {
			k.c[i].flags |= capFull
		}
	}
}

// thrashing reports whether c's cache is full and turns over within
// ThrashHorizon (SpareFull).
func (k *KVAware) thrashing(c *kvroute.Candidate) bool {
	return c.Evicts && c.Horizon < k.p.ThrashHorizon
}

// smallHit reports whether c caches some but under a quarter of a prompt
// of P tokens (SpareFull).
func smallHit(c *kvroute.Candidate, P int) bool {
	return c.CachedTokens > 0 && underQuarter(c.CachedTokens, P)
}

// underQuarter reports whether tokens are under a quarter of a prompt of
// P: a hit that small leaves most of the prompt to prefill (SpareFull,
// and cmpRoom's tie breaks).
func underQuarter(tokens, P int) bool { return 4*tokens < P }

// estimate fills st's TTFT estimate for candidate c.
func (k *KVAware) estimate(i int, c *kvroute.Candidate, st *candState, P int) {
	p := &k.p
	l := &c.Load
	tok, reqMs, learnedReq := k.fleetTok, k.fleetReq, k.fleetLearned
	if k.perEp && st.es != nil {
		tok, reqMs, learnedReq = k.rates(st.es)
	}
	own := float64(P - int(st.credit))
	cpu := 0.0
	if c.Tier == kvroute.TierCPU && st.credit > 0 {
		cpu = float64(st.credit)
	}
	queued := st.queued
	m := &k.memo[i]
	if run, dec := max(l.Running, 0), max(l.DecodeTokens, 0); !m.stepOK || run != m.running || dec != m.decodeTokens {
		m.running, m.decodeTokens, m.stepOK = run, dec, true
		m.stepMs = (p.StepOverheadUs + float64(run)*p.DecodeUsPerToken +
			float64(dec)/1000*p.DecodeUsPerCtxKTok) / 1000
		// The builtin min and max are math.Min and math.Max inline: they differ
		// only for a NaN against an infinity, which finite inputs rule out.
		m.budget = max(float64(p.MaxBatchedTokens-run), float64(p.MaxBatchedTokens)/4)
	}
	stepMs, budget := m.stepMs, m.budget
	stepsQ := queued // Ceil(±0/budget) is the same zero: no division for an empty queue
	if queued != 0 {
		stepsQ = math.Ceil(queued / budget)
	}
	stepsAll := max(m.ceilDiv(queued+own, budget), stepsQ+1)
	// Queued prompts attend over themselves too: weight the queued tokens by
	// the mean size of the requests routed there and not yet released
	// (sum of squares over sum), or by the mean uncached size when the
	// router has none of its own there.
	size := k.meanUncached
	if s := st.es; s != nil {
		switch {
		case k.firstTokens && s.pendTok > 0:
			size = s.pendSq / s.pendTok
		case !k.firstTokens && s.sumTok > 0:
			size = s.sumSq / s.sumTok
		}
	}
	ratio := k.ratio
	if b := math.Float64bits(size); !m.sizeOK || b != m.size {
		m.size, m.sizeOK = b, true
		m.sizeAttn = 1 + ratio*size/2000
	}
	queueMs := queued*tok*m.sizeAttn + stepsQ*stepMs
	if p.StepPhase && (l.Running > 0 || queued > 0) {
		st.stepWaitMs = float32(k.stepWait(st.es, stepMs))
		queueMs += float64(st.stepWaitMs)
	}
	if learnedReq {
		queueMs = math.Max(queueMs, float64(l.Queue())*reqMs)
	} else {
		queueMs += float64(l.Queue()) * reqMs
	}
	a := &k.attnMemo
	if !a.ok || int(st.credit) != a.credit || P != a.prompt {
		a.credit, a.prompt, a.ok = int(st.credit), P, true
		ctxK := (float64(st.credit) + own/2) / 1000
		a.attn = 1 + ratio*ctxK
	}
	attn := a.attn
	// The prompt's last token ends a step, which may hold later requests'
	// tokens too; pricing it as full wherever a queue was ahead (the rest
	// of its budget at the queued prompts' rate) took the bursts at seeds
	// 1-8 (2026-12-06) from a mean p99 of 228 to 273 ms for storm at 320
	// req/s, 376 to 444 ms for tenants at 650 and 353 to 379 ms for rag at
	// 420, so it was not kept (perhaps because the router does not know
	// where in an engine's current step its queue stands).
	prefMs := own*tok*attn + cpu*tok*p.CPUHitCost + (stepsAll-stepsQ)*stepMs
	if k.adapter != "" {
		var ms float64
		st.adapter, ms = k.adapterCost(i, c, st.es, stepMs)
		st.adapterMs = float32(ms)
		queueMs += float64(st.adapterMs)
	}
	st.queued, st.queueMs, st.prefMs = queued, queueMs, prefMs
	st.work = own * tok * attn
	st.decode = p.DecodeWeight * k.outTokens * decodeStepMs(p, l, P)
	st.score = st.est() + k.workW*st.work + st.decode
}

// stepWait returns how long a request sent to a busy endpoint whose
// stats are s (nil: none) waits for the engine step in progress to end,
// ms, for steps of stepMs (StepPhase): the rest of the step begun at its
// last first token, half a step when that is over, and nothing while no
// first token has come from it (its steps are unknown).
func (k *KVAware) stepWait(s *epStats, stepMs float64) float64 {
	if s == nil || s.stepAt == 0 {
		return 0
	}
	if el := float64(k.now.UnixNano()-s.stepAt) / 1e6; el >= 0 && el < stepMs {
		return stepMs - el
	}
	return stepMs / 2
}

// A LoRA adapter's state on an endpoint (candState.adapter).
const (
	adapterActive uint8 = 1 + iota // requests of it running or waiting: loaded
	adapterLoad                    // to be loaded into a free slot
	adapterSlot                    // to be loaded once another adapter leaves the full batch

	// adapterHomeWait, or'ed into adapterSlot, says the adapter's cost
	// holds the wait of the adapters at home there behind it (homeWait);
	// adapterHomeSettled that it would, at the adapter's own home, but
	// their demand and that of the other engines' cannot be told apart
	// (homeSettled): it is not charged.
	adapterHomeWait    uint8 = 1 << 7
	adapterHomeSettled uint8 = 1 << 6
	adapterFlags             = adapterHomeWait | adapterHomeSettled
)

// The answers of KVAware.homeSettled (KVAware.settled).
const (
	settledUnknown uint8 = iota // not asked yet in this Pick
	settledNo
	settledYes
)

// homeSettledSigmas is the number of standard deviations of the adapters'
// decayed request counts within which two demands cannot be told apart
// (homeSettled): a count decayed over AdapterDemandTau of requests
// arriving at rate r is n = r x AdapterDemandTau on average with a spread
// of about sqrt(n/2). 1.5 was chosen over 0 (never settled: the wait
// charged at the own home whatever the counts, as in commit 958173e), 1
// and 2 on the lora workload (kv-aware TTFT p99 summed over seeds,
// --max-loras 1, 4000 requests; charged away from home only, as before
// 958173e / 0 / 1.5): skew=0 on 6 engines, seeds 1-4, 8/s 21.93 / 20.10 /
// 17.47 s, 12/s 31.37 / 35.34 / 27.69 s, 20/s 76.05 / 88.24 / 74.28 s;
// the default skew at 20/s, seeds 1-10, 6 engines 60.12 / 53.37 / 49.62 s,
// 7 engines 25.69 / 20.85 / 22.76 s (worse than 0 there: seed 2 3.28 s
// against 2.36 and 2.78); 8 engines (--max-loras 1, 2 and 4 at 20 and
// 120/s, seeds 1-3) the same.
const homeSettledSigmas = 1.5

// adapterCost returns the state of the request's adapter on candidate c,
// whose step takes stepMs, and the time the engine takes to start it
// there, ms. vLLM batches requests of at most max_lora adapters (l.Max):
// its scheduler skips a waiting request of another adapter while every
// slot's adapter has a request in the batch, and requests of those
// adapters that arrive meanwhile join the batch ahead of it. An engine
// holds (adapterView) the adapters its signals show running or waiting,
// those of the policy's requests in flight there, the last l.Max adapters
// the policy routed there within AdapterHold (it keeps them in its slots
// until others take their place), and the request's adapter where the
// prefix indexes credit blocks of its prompt (they are keyed by the
// adapter: the engine ran it). For the request's adapter x:
//
//   - held, with no more adapters held than slots: active, no wait;
//   - not held, with a slot free: AdapterLoad;
//   - running there while more adapters are held than there are slots
//     (others wait for a slot): active, unless x runs on another engine
//     too; then a short wait (half a decode, OutputTokens/2 steps), so
//     that x's next requests go to its other engine and this one drains
//     for the waiting adapters; plus the wait of the adapters at home
//     there behind x (below), if any;
//   - otherwise x waits for a slot (plus AdapterLoad unless held): half a
//     decode when every adapter running there runs elsewhere too (they
//     leave, as above); else until the adapters that run only there have
//     no request left in the batch, as their requests keep coming and
//     keep x out: with lambda their arrival rate (each adapter's requests
//     the policy saw, decayed over 30 s) and D a decode (OutputTokens
//     steps), the mean busy period of an M/G/inf queue, (e^(lambda D) -
//     1) / lambda, at least half a decode and at most 100 (one decode
//     when no arrival was counted). x's requests there keep the slot from
//     the other adapters at home there (AdapterHomes), whose requests
//     then wait behind x's in turn: their arrival rate x D of them per x
//     request, each for x's busy period, is added (homeWait), at x's home
//     too, unless x waits for the slot at its home and the demand of the
//     adapters at home there is settled, within the counts' noise of the
//     least used other engine's (homeSettled; adapterHomeSettled). The
//     policy then gives a new adapter
//     an engine of its own while one has a free slot, else the engine of
//     an adapter that has another, else that of the least used adapters
//     (with fewer engines than adapters at --max-loras 1 some adapter
//     must wait behind another: behind a rarely used one it waits least);
//     a hot adapter spreads to a held engine only once its own queue is
//     longer than that, and adapters that share an engine keep sharing
//     that one rather than each take every other in turn, unless another
//     engine's adapters are used less than those it shares with, by more
//     than the counts' noise: then it goes there, and the least used
//     adapters pair up.
//
// An engine whose signals give no adapters (vLLM sets the series after
// its first step, so a cold fleet's first scrapes lack it) is taken to
// have the largest max_lora another candidate reports (a pool's engines
// are alike) and to run the adapters the policy has requests in flight
// for there: before this, a cold fleet's engines all looked free, and an
// adapter was put behind another that ran only there (35 s TTFTs in the
// lora workload, seed 3 at 120/s). With max_lora unknown everywhere (no
// --enable-lora metric) x is active where the engine has it running or
// waiting or the policy has requests for it in flight, else it pays
// AdapterLoad. On a prefill-only engine x never waits for a slot (the
// running prefill legs leave with their first token, within the queue
// estimate); it pays AdapterLoad unless held.
//
// c is candidate i, es its stats (nil: none).
func (k *KVAware) adapterCost(i int, c *kvroute.Candidate, es *epStats, stepMs float64) (uint8, float64) {
	load := float64(k.p.AdapterLoad) / float64(time.Millisecond)
	ep := endpointID(c)
	l := c.Load.LoRA
	x := k.adapter
	slots := k.poolMaxLoRA
	if l != nil && l.Max > 0 {
		slots = l.Max
	}
	if slots <= 0 {
		if l.Active(x) || es.loraOf().flying(x) {
			return adapterActive, 0
		}
		return adapterLoad, load
	}
	var running, waiting []string // l's, interned
	if l == nil {
		// No adapter signals yet (vLLM sets the series after an engine's
		// first step): the adapters the policy has requests for in flight
		// there run there.
		k.flightRun.Running = k.flightRun.Running[:0]
		if el := es.loraOf(); el != nil {
			for _, f := range el.flights {
				k.flightRun.Running = append(k.flightRun.Running, f.adapter)
			}
		}
		slices.Sort(k.flightRun.Running)
		l = &k.flightRun
		running = l.Running
	} else {
		running, waiting = k.loraNamesAt(i, l)
	}
	held, hasX := k.heldAt(c, es, running, waiting, slots)
	if c.Endpoint != nil && !c.Endpoint.Role.CanDecode() {
		// A prefill-only engine (a P/D pool's prefill stage) runs prefill
		// legs, each leaving with its first token: a slot frees as the
		// prompts queued ahead are computed, within queue_ms already (as
		// package disagg prices its prefill leg's wait).
		if hasX {
			return adapterActive, 0
		}
		return adapterLoad, load
	}
	switch {
	case hasX && len(held) <= slots:
		return adapterActive, 0
	case !hasX && len(held) < slots:
		return adapterLoad, load
	case l.Runs(x):
		wait := 0.0
		if k.homesOf(x) >= 2 {
			wait = k.outTokens / 2 * stepMs
		}
		if hw := k.homeWait(ep, x, k.outTokens*stepMs); hw > 0 {
			return adapterSlot | adapterHomeWait, wait + hw
		}
		if wait > 0 {
			return adapterSlot, wait
		}
		return adapterActive, 0
	}
	// The slot frees once the adapters that run only there have no
	// request left in the batch (SlotBusyPeriod of their arrival rate
	// and a decode), at least half a decode; half a decode where every
	// such adapter runs elsewhere too (they leave, as above).
	D := k.outTokens * stepMs
	lambda, pinned := 0.0, false
	for _, a := range held {
		if a != x && l.Runs(a) && k.homesOf(a) < 2 {
			pinned = true
			lambda += k.demand.Rate(k.now, a)
		}
	}
	wait := D / 2
	if pinned {
		busy := SlotBusyPeriod(lambda, time.Duration(D*float64(time.Millisecond)))
		wait = math.Max(D/2, float64(busy)/float64(time.Millisecond))
	}
	if hasX {
		load = 0
	}
	if hw := k.homeWait(ep, x, D); hw > 0 {
		if ep == k.adapterHome.Home(x) && k.homeSettled() {
			return adapterSlot | adapterHomeSettled, load + wait
		}
		return adapterSlot | adapterHomeWait, load + wait + hw
	}
	return adapterSlot, load + wait
}

// homeWait is the wait, ms, a request for adapter x on endpoint ep, whose
// slots other adapters contend for, makes the other adapters at home there
// (AdapterHomes) wait behind x's in turn: with lh their arrival rate, D a
// decode (ms) and B x's busy period (SlotBusyPeriod of x's rate and D),
// lh x D of their requests per x request on average, each for the rest of
// B (about its mean, for a length as variable as a busy period's; with
// half of it the lora workload's p99 at 20/s, seeds 1-3, was 6.47 s on 6
// engines and 2.80 s on 7 in the mean, against 6.42 and 2.60 s, when it
// was charged away from home only): lh x D x B. It is charged at x's own
// home too, for the adapters x shares it with: an adapter that shares its
// home with busier ones than those at home on another engine goes there,
// so the busy adapters keep engines of their own and the least used pair
// up. (Charged only away from home, the pairs were set by the order of the
// adapters' first requests and kept: with 8 adapters on 6 engines at
// --max-loras 1, 20/s, seed 1, the fourth busiest shared an engine with the
// fifth while the seventh had one of its own, and the p99 TTFT was 6.18 s;
// charged at home too, within the first 20 s the busiest four had one
// each, the fifth and sixth shared one and the seventh and eighth
// another: 5.02 s.) With
// adapters used alike no pairing is better than another, and, charged at
// its own home whatever the counts, the noise of the counts moved adapters
// between engines: with skew 0 on 6 engines, seeds 1-4, the p99 summed
// 35.34 s at 12/s and 88.24 s at 20/s, against 31.37 and 76.05 s when
// charged away from home only. So adapterCost does not charge it where x
// waits for a slot at its own home and the demands are settled
// (homeSettled): 27.69 and 74.28 s, and 4.66 s at seed 1 above (docs/RESULTS.md,
// "LoRA adapters"; the figures at homeSettledSigmas).
func (k *KVAware) homeWait(ep, x string, D float64) float64 {
	lh := k.homeRate(ep, x)
	if lh == 0 {
		return 0
	}
	bx := SlotBusyPeriod(k.demand.Rate(k.now, x), time.Duration(D*float64(time.Millisecond)))
	return lh * D / 1000 * float64(bx) / float64(time.Millisecond)
}

// homeSettled reports whether the request's adapter x is settled at its
// home h: whether nh, the decayed count of requests (rate x
// AdapterDemandTau) of the other adapters at home on h, and lo, the lowest
// such count on another candidate (x excluded there too), are within
// homeSettledSigmas standard deviations of each other, |nh - lo| <=
// homeSettledSigmas x sqrt((nh+lo)/2): then no engine's adapters are
// known to be used less than those x shares its home with, and x waiting
// at home is not charged their wait (adapterCost). With no other
// candidate it is settled. It is computed once per Pick, the first time
// adapterCost asks.
func (k *KVAware) homeSettled() bool {
	if k.settled == settledUnknown {
		k.settled = settledNo
		if k.settledAt(k.adapterHome.Home(k.adapter)) {
			k.settled = settledYes
		}
	}
	return k.settled == settledYes
}

// settledAt is homeSettled's answer for home h (false when x has none).
func (k *KVAware) settledAt(h string) bool {
	x := k.adapter
	if h == "" {
		return false
	}
	tau := AdapterDemandTau.Seconds() // a rate x tau is the decayed count
	nh := k.homeRate(h, x) * tau
	lo := math.Inf(1)
	for i := range k.viewCands {
		if ep := endpointID(&k.viewCands[i]); ep != h {
			lo = math.Min(lo, k.homeRate(ep, x)*tau)
		}
	}
	if math.IsInf(lo, 1) {
		return true
	}
	return math.Abs(nh-lo) <= homeSettledSigmas*math.Sqrt((nh+lo)/2)
}

// homeRate is the summed arrival rate, requests/s, of the adapters at
// home on ep other than x.
func (k *KVAware) homeRate(ep, x string) float64 {
	r := 0.0
	for _, a := range k.adapterHome.AtHome(ep) {
		if a != x {
			r += k.demand.Rate(k.now, a)
		}
	}
	return r
}

// heldAt returns the adapters the endpoint of candidate c (its stats es,
// nil when none; its signals' running and waiting adapters, interned; its
// max_lora slots) holds (see adapterCost), each once, in k.held, and
// whether the request's adapter is one of them. Every name it compares
// is interned (flights and last hold the policy's copies): they compare
// by address (sameAdapter): compared by content (a call to the runtime's
// memequal each, the names of a pool's adapters being alike in length)
// they took a third of heldAt's time (BenchmarkDecisionKVAware64/adapters,
// pprof).
func (k *KVAware) heldAt(c *kvroute.Candidate, es *epStats, running, waiting []string, slots int) (held []string, hasX bool) {
	h := k.held[:0]
	add := func(a string) {
		for _, b := range h {
			if sameAdapter(a, b) {
				return
			}
		}
		h = append(h, a)
		hasX = hasX || sameAdapter(a, k.adapter)
	}
	for _, a := range running {
		add(a)
	}
	for _, a := range waiting {
		add(a)
	}
	if el := es.loraOf(); el != nil {
		for _, f := range el.flights {
			add(f.adapter)
		}
		for _, u := range el.last[:el.last.held(k.holdFrom, slots)] {
			add(u.adapter)
		}
	}
	if c.CachedTokens > 0 {
		// Blocks of the adapter's prompt, keyed by the adapter: the engine
		// ran it, and took it into a slot, since the router last saw (a
		// request sent to it directly, or before the router restarted).
		add(k.adapter)
	}
	k.held = h
	return h, hasX
}

// intern returns the policy's copy of LoRA adapter name a, the same
// string for every a of the same content: names the policy interned
// compare by address (sameAdapter). The policy keeps one copy per name it
// has seen, in a request or in an engine's signals (as AdapterDemand keeps
// a count per name).
func (k *KVAware) intern(a string) string {
	if s, ok := k.names[a]; ok {
		return s
	}
	if k.names == nil {
		k.names = make(map[string]string)
	}
	s := strings.Clone(a)
	k.names[s] = s
	return s
}

// sameAdapter reports whether a == b for two names interned by the
// policy (intern): whether they are the same string in memory.
func sameAdapter(a, b string) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.StringData(a) == unsafe.StringData(b))
}

// loraNames is a candidate position's LoRA signals (a LoRALoad's running
// and waiting adapters) as loraNamesAt last saw them (src: running, then
// waiting), and interned.
type loraNames struct {
	src              []string
	running, waiting []string
}

// loraNamesAt returns the running and waiting adapters of l, candidate
// i's LoRALoad, interned. An endpoint's signals change with its scrapes,
// a few times a second, and a caller such as the router passes the same
// endpoints in the same order every time: the names are interned again
// only when they differ from the last ones at position i. They are
// compared one by one, by address first (the same LoRALoad's, or a
// scrape's that kept them, are the same strings), not by the LoRALoad's
// address, as a caller may reuse one.
func (k *KVAware) loraNamesAt(i int, l *kvroute.LoRALoad) (running, waiting []string) {
	if len(k.loraPos) <= i {
		k.loraPos = append(k.loraPos, make([]loraNames, i+1-len(k.loraPos))...)
	}
	m := &k.loraPos[i]
	if !m.same(l) {
		m.src = append(append(m.src[:0], l.Running...), l.Waiting...)
		m.running, m.waiting = m.running[:0], m.waiting[:0]
		for _, a := range l.Running {
			m.running = append(m.running, k.intern(a))
		}
		for _, a := range l.Waiting {
			m.waiting = append(m.waiting, k.intern(a))
		}
	}
	return m.running, m.waiting
}

// same reports whether l names the adapters m was made from, and keeps
// l's strings for the next comparison where they are other strings of the
// same names.
func (m *loraNames) same(l *kvroute.LoRALoad) bool {
	if len(m.running) != len(l.Running) || len(m.waiting) != len(l.Waiting) {
		return false
	}
	for j, a := range l.Running {
		if !m.keep(j, a) {
			return false
		}
	}
	for j, a := range l.Waiting {
		if !m.keep(len(l.Running)+j, a) {
			return false
		}
	}
	return true
}

// keep reports whether a is the name m.src[j] holds, and keeps a there.
func (m *loraNames) keep(j int, a string) bool {
	if b := m.src[j]; len(a) != len(b) || unsafe.StringData(a) != unsafe.StringData(b) && a != b {
		return false
	}
	m.src[j] = a
	return true
}

// adapterView readies the Pick of a request for an adapter: it fills
// k.poolMaxLoRA, and forgets the last Pick's homes (homesOf).
func (k *KVAware) adapterView(cands []kvroute.Candidate) {
	k.homes = k.homes[:0]
	k.poolMaxLoRA = 0
	k.viewCands, k.settled = cands, settledUnknown
	k.holdFrom = holdFrom(k.now, k.p.AdapterHold)
	for i := range cands {
		if l := cands[i].Load.LoRA; l != nil {
			k.poolMaxLoRA = max(k.poolMaxLoRA, l.Max)
		}
	}
}

// denyFullDecode raises the decode term of each eligible candidate whose
// KV usage reaches DecodeKVCap to most, the largest eligible one's (see
// KVAwareParams.DecodeKVCap), and returns the eligible candidates' best
// score after it.
func (k *KVAware) denyFullDecode(cands []kvroute.Candidate, most float64) float64 {
	best := math.Inf(1)
	for _, i := range k.elig {
		st := &k.c[i]
		if cands[i].Load.KVUsage >= k.p.DecodeKVCap && st.decode < most {
			st.score += most - st.decode
			st.decode = most
			st.flags |= decodeKVFull
		}
		best = min(best, st.score)
	}
	return best
}

// homesOf returns the number of the Pick's candidates where adapter a
// runs, or has requests in flight (unhealthy ones too): a's count in
// their signals' running adapters, plus one for each where it has
// flights and does not run. It is counted for an adapter when first asked
// (adapterCost asks of few), and kept for the rest of the Pick in k.homes.
// (Counted for every adapter of every candidate in adapterView, by name
// in a map, it was a tenth of the decision: BenchmarkDecisionKVAware64/adapters.)
func (k *KVAware) homesOf(a string) int {
	for _, h := range k.homes {
		if h.adapter == a {
			return h.n
		}
	}
	n := 0
	for i := range k.viewCands {
		c := &k.viewCands[i]
		l := c.Load.LoRA
		if l != nil {
			for _, r := range l.Running {
				if r == a {
					n++
				}
			}
		}
		es := k.c[i].es // the stats Pick found, for a healthy candidate
		if !c.Healthy {
			es = k.eps[endpointID(c)]
		}
		if es.loraOf().flying(a) && !l.Runs(a) {
			n++
		}
	}
	k.homes = append(k.homes, adapterCount{adapter: a, n: n})
	return n
}

// decodeStepMs is the step time, in milliseconds, the request of P prompt
// tokens will decode at on an endpoint of load l: its batch once every
// request the router holds open there decodes (InFlight, or the engine's
// Running when larger, plus this one) over the context they will hold
// (the prompts already decoding, DecodeTokens, those still waiting for a
// first token, InFlightTokens, and this one). The step the queue estimate
// uses is the batch as it is now; in a burst most of an endpoint's
// requests are still queued, so that step said nothing of where their
// contexts would land, and affinity piled long cached prompts onto one
// engine whose decode then ended the burst last (rag at 420 req/s, seed
// 1: one engine held 1.5 times the others' prompt tokens, decoded at 49
// ms per token against 35-41 and finished 3 s after them).
func decodeStepMs(p *KVAwareParams, l *kvroute.Load, P int) float64 {
	batch := max(l.InFlight, l.Running, 0) + 1
	ctx := max(l.DecodeTokens, 0) + max(l.InFlightTokens, 0) + P
	return (p.StepOverheadUs + float64(batch)*p.DecodeUsPerToken + float64(ctx)/1000*p.DecodeUsPerCtxKTok) / 1000
}

// estimateMemo keeps, for one candidate position, terms of estimate that
// cost a division or two and depend on few of the candidate's inputs, as
// computed for the inputs it had last: a caller such as the router passes
// the same endpoints in the same order every time, and an endpoint's load
// changes far less often than it is a candidate, so they are mostly the
// same. Without it estimate made seven divisions per candidate, and was
// 6.5% of BenchmarkDecisionKVAware64's profile; with it, 3%. The same
// inputs, bit for bit, give the same terms, so the estimate is what it
// would be without (TestEstimateMemo); the params, which the terms depend
// on too, never change.
type estimateMemo struct {
	// stepMs and budget, for a Load's Running and DecodeTokens (clamped
	// at 0).
	running, decodeTokens int
	stepMs, budget        float64
	stepOK                bool
	// sizeAttn, the queued prompts' attention factor for their mean size
	// (its bits).
	size     uint64
	sizeAttn float64
	sizeOK   bool
	// ceilX and ceilB are the bits of ceilDiv's last arguments, ceilV its
	// answer.
	ceilX, ceilB uint64
	ceilV        float64
	ceilOK       bool
}

// ceilDiv returns math.Ceil(x / b), remembering the last answer.
func (m *estimateMemo) ceilDiv(x, b float64) float64 {
	bx, bb := math.Float64bits(x), math.Float64bits(b)
	if !m.ceilOK || bx != m.ceilX || bb != m.ceilB {
		m.ceilX, m.ceilB, m.ceilV, m.ceilOK = bx, bb, math.Ceil(x/b), true
	}
	return m.ceilV
}

// attnMemo is estimate's attention factor for a candidate credited credit
// tokens of a prompt of prompt tokens, as computed for the last candidate:
// most candidates of a Pick cache the same (nothing, or a shared system
// prompt).
type attnMemo struct {
	credit, prompt int
	attn           float64
	ok             bool
}

// queuedTokens estimates the uncached prompt tokens queued ahead on an
// endpoint: the router's own in-flight prefill, or the engine's waiting
// queue at the mean uncached size, whichever is larger. s is c's stats
// (nil: none).
//
// The second overstates a queue of cache hits, whose sizes the router
// knows. Counting the policy's own queued prefill plus only the waiting
// requests beyond its own (other routers' work) brought the estimates
// closer to the TTFTs (the chosen candidate's root-mean-square error at
// seed 1: sysprompt at 130 req/s 378 -> 291 ms, chat at 550 req/s 173 ->
// 160 ms), and on 2026-12-06 moved the mean p99 TTFT of the bursts over
// seeds 1-40 by -1.5% (chat at 550 req/s, standard error 0.3 points),
// -3.7% (rag at 420, 1.4), -1.5% (storm at 320, 0.6), -1.0% (sysprompt at
// 1000, 0.2) and +1.1% (tenants at 650, 2.7); of the steady rows over
// seeds 1-8 sysprompt at 130 req/s by -3.8% (0.3), tenants at 200 by
// -4.0% (1.1) and rag at 180 by -1.6% (0.2), but sysprompt at 100 by
// +1.6% (0.2; at seed 1 59.4 -> 60.2 ms, round-robin's 59.7) and the others by
// at most 1%; and the trace at four times its rate by +7.1% (16.11 -> 17.26
// s over 32 runs paired with the decode weight perturbed, standard error
// 0.23 s; -0.8% at its own rate). Pricing the waiting requests beyond
// its own at the larger of the mean uncached size and the mean context of
// its requests decoding there (a request the engine preempted waits to
// compute its context again; that trace row preempts about 1,000 times in
// its 3,000 requests) halved that loss (+4.0%, standard error 0.28 s) and
// moved no other row. So it was not changed: that trace row, where
// kv-aware leads the best baseline by 16%, lost more than the others
// gained.
func (k *KVAware) queuedTokens(c *kvroute.Candidate, s *epStats) float64 {
	l := &c.Load
	if k.firstTokens {
		// Exact for the policy's own dispatches; the engine's queue covers
		// work other routers sent.
		own := 0.0
		if s != nil {
			own = s.pendTok
			if k.p.ProgressTokPerMs > 0 && own > 0 {
				done := k.now.Sub(s.progressAt).Seconds() * 1000 * k.p.ProgressTokPerMs
				own -= min(max(done, 0), min(own, s.headMax)) // math.Min and math.Max inline (see estimate)
			}
		}
		return max(own, float64(max(l.Waiting, 0))*k.meanUncached)
	}
	frac := k.uncachedFrac
	if s != nil && s.sumPrompt > 0 {
		// The uncached share of what the policy itself routed here: a
		// holder's queue of cache hits is short even when their prompts
		// are long (the fleet-wide share overstated it and spread a hot
		// prefix's burst onto cold endpoints that then prefilled it again).
		frac = s.sumTok / s.sumPrompt
	}
	return max(float64(max(l.InFlightTokens, 0))*frac, float64(max(l.Waiting, 0))*k.meanUncached)
}

// rates returns ms per uncached token and ms per queued request for the
// endpoint whose stats are s (nil: none), and whether the latter was
// learned.
func (k *KVAware) rates(s *epStats) (tok, req float64, learned bool) {
	tok, req = k.p.PrefillUsPerToken/1000, k.p.QueuedRequestMs
	if !k.p.Learn {
		return tok, req, false
	}
	min := k.p.LearnMinSamples
	if k.all.nTok >= min {
		tok = k.all.tokMs
	}
	if k.all.nReq >= min {
		req, learned = k.all.reqMs, true
	}
	if s != nil && k.p.LearnPerEndpoint {
		if s.nTok >= min {
			tok = s.tokMs
		}
		if s.nReq >= min {
			req, learned = s.reqMs, true
		}
	}
	return
}

// lessLoaded orders candidates i and j for tie breaks for a request of P
// prompt tokens (first: i goes first; byRoom: cmpRoom decided): one
// without capFull (SpareFull) first; then, where
// neither caches a quarter of the prompt, the one whose cache its blocks
// push less out of (cmpRoom); then fewer in-flight per unit of weight,
// then a lower estimate. Fewer queued prefill tokens before the in-flight
// count, or the lower estimate alone, balanced the cold chat burst (550
// req/s) better (mean p99 TTFT over seeds 1-8 -1.8% and -1.4%), but put
// tenants at 650 req/s 5.7% and 5.4% higher (its throughput 11-12% lower
// at one seed), and the first rag at 180 req/s 231% higher at seed 6.
// Over seeds 1-40 (2026-12-06; eight seeds of a burst leave a standard
// error of 2-5 points) the two gave chat at 550 req/s -1.9% and -1.7%
// (standard errors 0.2 points), sysprompt at 1000 req/s +0.9% and +0.8%
// (0.3), and rag at 420, storm at 320 and tenants at 650 req/s within
// their noise (tenants +2.4% and +1.2%, 1.8 and 1.5), with tenants'
// throughput 12% lower at a seed under each.
//
// cmpRoom keeps a cold prompt off the cache that turns over fastest: on
// the conversation trace a cold 100k-token prompt fills a fifth of an
// engine's cache, and the engine that already takes most of the new
// blocks (the shortest Horizon) is where the next turns of the
// conversations it holds lose their prefixes. Over the README's rows at
// seeds 1-8 it moved only the trace (at its own rate a mean p99 4.68 ->
// 4.59 s over 32 runs paired with the decode weight perturbed, standard
// error 0.016; at four times it 16.16 -> 16.01 s, standard error 0.25)
// and chat at 100 and 140 req/s (under 1.5% at any seed). Ordering two
// caches with room by the room left (the least prefilled first, as
// sglang-cache-aware sends a miss to its smallest tree) took chat at 550
// req/s 2.6% lower but tenants at 650 req/s 4.4% higher (+36% at seed 6).
// Over seeds 1-40 (2026-12-06) it was chat -2.4% (standard error 0.2
// points), tenants +1.1% (1.8) and the other rows within 1%, but rag at
// 180 req/s went from 579 ms to 2.40 s at seed 38 (2.18-3.52 s against
// 0.50-1.06 s with the decode term perturbed six ways): hit rate 97.6 ->
// 97.3% in the run's 60-80 s, then 105 preemptions on one engine.
func (k *KVAware) lessLoaded(cands []kvroute.Candidate, i, j, P int) (first, byRoom bool) {
	if a, b := k.c[i].flags&capFull != 0, k.c[j].flags&capFull != 0; a != b {
		return b, false
	}
	if underQuarter(int(max(k.c[i].credit, k.c[j].credit)), P) {
		if c := cmpRoom(&cands[i], &cands[j]); c != 0 {
			return c < 0, true
		}
	}
	if c := cmpPerWeight(cands[i].Load.InFlight, weight(&cands[i]), cands[j].Load.InFlight, weight(&cands[j])); c != 0 {
		return c < 0, false
	}
	return k.c[i].score < k.c[j].score, false
}

// cmpRoom orders two candidates by what a request's blocks would push out
// of their caches (the router's record of them, kvroute.Candidate.Evicts):
// nothing before something, and of two that evict, the one whose least
// recent block is older (the longer Horizon) first. 0 when neither evicts.
func cmpRoom(a, b *kvroute.Candidate) int {
	switch {
	case a.Evicts != b.Evicts:
		if a.Evicts {
			return 1
		}
		return -1
	case !a.Evicts:
		return 0
	}
	return cmp.Compare(b.Horizon, a.Horizon)
}

// trimReplicas applies the replica set of the hot prefix key, held to depth
// d, given one endpoint's share of its demand (see the type doc).
func (k *KVAware) trimReplicas(cands []kvroute.Candidate, key uint64, d int, share float64) {
	k.holders = k.holders[:0]
	for i := range cands {
		if cands[i].Healthy && cands[i].CachedBlocks == d && !k.c[i].affinityCapped() {
			k.holders = append(k.holders, i)
		}
	}
	r := int(math.Ceil(float64(k.prefixInflight[key].n+1) / share))
	if len(k.holders) <= r {
		return
	}
	// Keep the r holders with the highest rendezvous weight; the rest lose
	// affinity for this prefix. Insertion sort: holders are few.
	h := k.holders
	w := func(i int) uint64 { return hrw(key, endpointID(&cands[i])) }
	for a := 1; a < len(h); a++ {
		for b := a; b > 0 && w(h[b]) > w(h[b-1]); b-- {
			h[b], h[b-1] = h[b-1], h[b]
		}
	}
	for _, i := range h[r:] {
		if cands[i].Load.KVUsage >= k.p.TrimKVUsage {
			k.c[i].flags |= capTrimmed
		}
	}
}

// hotKey returns the request's hot prefix key (its block hash at deepest,
// the deepest depth any healthy candidate caches; never 0) and that depth,
// or 0, 0 when no candidate caches a prefix.
func hotKey(req *kvroute.Request, deepest int) (uint64, int) {
	d := deepest
	if d <= 0 || d > len(req.BlockHashes) {
		return 0, 0
	}
	key := req.BlockHashes[d-1]
	if key == 0 {
		key = 1
	}
	return key, d
}

// explain fills the scores from the candidate states c of a decision over
// cands (nil scores: nothing to do).
func explain(c []candState, cands []kvroute.Candidate, scores []kvroute.Score) {
	if scores == nil {
		return
	}
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		st := &c[i]
		s := &scores[i]
		s.Value = round3(st.score)
		s.Parts = append(s.Parts,
			kvroute.Part{Name: "queue_ms", Value: round3(st.queueMs)},
			kvroute.Part{Name: "prefill_ms", Value: round3(st.prefMs)},
			kvroute.Part{Name: "work_ms", Value: round3(st.work)},
			kvroute.Part{Name: "decode_ms", Value: round3(st.decode)},
			kvroute.Part{Name: "cached_tokens", Value: float64(st.credit)},
			kvroute.Part{Name: "queued_tokens", Value: round3(st.queued)},
			kvroute.Part{Name: "in_flight", Value: float64(cands[i].Load.InFlight)},
		)
		if st.stepWaitMs != 0 { // in queue_ms
			s.Parts = append(s.Parts, kvroute.Part{Name: "step_wait_ms", Value: round3(float64(st.stepWaitMs))})
		}
		if w := weight(&cands[i]); w != 1 {
			s.Parts = append(s.Parts, kvroute.Part{Name: "weight", Value: float64(w)})
		}
		if st.adapter != 0 {
			// adapter_ms is in queue_ms; the state says why.
			s.Parts = append(s.Parts, kvroute.Part{Name: "adapter_ms", Value: round3(float64(st.adapterMs))})
			switch st.adapter &^ adapterFlags {
			case adapterActive:
				s.Parts = append(s.Parts, kvroute.Part{Name: "adapter_active", Value: 1})
			case adapterSlot:
				s.Parts = append(s.Parts, kvroute.Part{Name: "adapter_slots_full", Value: 1})
			}
			switch {
			case st.adapter&adapterHomeWait != 0:
				s.Parts = append(s.Parts, kvroute.Part{Name: "adapter_home_wait", Value: 1})
			case st.adapter&adapterHomeSettled != 0:
				s.Parts = append(s.Parts, kvroute.Part{Name: "adapter_home_settled", Value: 1})
			}
		}
		sat := ""
		switch {
		case st.flags&capSaturated == 0:
		case st.elig:
			sat = " (as every candidate is; affinity kept)"
		default: // shed: none was chosen
			sat = " (as every candidate is; request shed)"
		}
		switch {
		case st.flags&capQueue != 0:
			s.Why = "capped: waiting queue" + sat
		case st.flags&capKV != 0:
			s.Why = "capped: kv usage" + sat
		case st.flags&capInflight != 0:
			s.Why = "capped: in-flight above bound"
		case st.flags&capTenant != 0:
			s.Why = "capped: tenant over fair share"
		case st.flags&capTrimmed != 0:
			s.Why = "outside hot prefix replica set"
		case st.flags&capFull != 0:
			s.Why = "small hit on a thrashing cache: credited only what a candidate with room caches"
		}
		if st.effFlags()&(capQueue|capKV|capInflight|capTenant) != 0 {
			s.Parts = append(s.Parts, kvroute.Part{Name: "capped", Value: 1})
		}
		if st.flags&capTrimmed != 0 {
			s.Parts = append(s.Parts, kvroute.Part{Name: "replica_trimmed", Value: 1})
		}
		if st.flags&capFull != 0 {
			s.Parts = append(s.Parts, kvroute.Part{Name: "thrashing", Value: 1})
		}
		if st.flags&decodeKVFull != 0 {
			s.Parts = append(s.Parts, kvroute.Part{Name: "decode_kv_full", Value: 1})
		}
		s.Eligible = st.elig
	}
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// markTarget marks candidate t of an explanation as the session's target.
func markTarget(scores []kvroute.Score, t int) {
	scores[t].Parts = append(scores[t].Parts, kvroute.Part{Name: "session_target", Value: 1})
}

// DeferExplanations makes Pick leave Decision.Scores nil from now on: the
// caller keeps each decision's explanation with KeepExplanation and
// renders it with Explain only when someone reads it (router.DeferredExplainer:
// the router's decision log). Building the 64 candidates' scores of a
// decision nobody reads was about a tenth of a routing decision.
func (k *KVAware) DeferExplanations() { k.deferred = true }

// keptExplanation is one decision's explanation as KeepExplanation keeps
// it: the candidate states it was decided from (none when Explain is
// off), its session target and its reason's figures.
type keptExplanation struct {
	c      []candState
	target int // -1: none
	why    reasonFigures
}

// KeepExplanation returns what rendering the last Pick's explanation
// takes and takes recycled, a value it returned before that the caller no
// longer keeps (or nil), as storage for the next Picks: the candidate
// states change hands instead of being copied. With Explain off it keeps
// the reason's figures alone.
func (k *KVAware) KeepExplanation(recycled any) any {
	x, _ := recycled.(*keptExplanation)
	if x == nil {
		x = &keptExplanation{}
	}
	if k.p.Explain {
		x.c, k.c = k.c, x.c[:0]
	} else {
		x.c = x.c[:0]
	}
	x.target, x.why = k.target, k.why
	return x
}

// Explain renders a decision's explanation kept by KeepExplanation, for
// the candidates it was made over, as Pick would have set Decision.Scores
// (explain, as Pick calls it), and its whole reason ("" when the
// decision's own is whole: it chose no endpoint). It only reads kept:
// safe to call while other Picks run.
func (k *KVAware) Explain(kept any, cands []kvroute.Candidate) ([]kvroute.Score, string) {
	x, _ := kept.(*keptExplanation)
	if x == nil {
		return nil, ""
	}
	reason := ""
	if x.why.head != "" {
		reason = x.why.String()
	}
	if len(x.c) != len(cands) {
		return nil, reason
	}
	var b scoreBuf
	scores := b.get(cands, kvAwareParts)
	explain(x.c, cands, scores)
	if x.target >= 0 {
		markTarget(scores, x.target)
	}
	return scores, reason
}

// reasonFigures is a decision's one-line reason in parts: how the
// endpoint was chosen (head) and the chosen candidate's figures.
type reasonFigures struct {
	head                 string
	est, queueMs, prefMs float64
	credit, P            int
	adapter              uint8 // the LoRA adapter's state (0: a base-model request)
	adapterMs            float64
}

// reasonHead names how a candidate with credit cached tokens was chosen.
func reasonHead(how string, credit int) string {
	switch how {
	case "session":
		return "session affinity"
	case "tie":
		if credit > 0 {
			return "affinity, tie broken by load"
		}
		return "miss, least loaded of two tied"
	case "tie-room":
		if credit > 0 {
			return "affinity, tie broken by cache room"
		}
		return "miss, tie broken by cache room"
	}
	if credit > 0 {
		return "affinity"
	}
	return "lowest estimate"
}

// overloadedHead is reasonHead's when every healthy candidate is over its
// queue or KV cap and Overload is least-loaded: the pick is made as usual.
// Constants, so that the decision does not allocate its reason.
var overloadedHead = map[string]string{
	"session affinity":                   "overloaded, session affinity",
	"affinity, tie broken by load":       "overloaded, affinity, tie broken by load",
	"miss, least loaded of two tied":     "overloaded, miss, least loaded of two tied",
	"affinity, tie broken by cache room": "overloaded, affinity, tie broken by cache room",
	"miss, tie broken by cache room":     "overloaded, miss, tie broken by cache room",
	"affinity":                           "overloaded, affinity",
	"lowest estimate":                    "overloaded, lowest estimate",
}

// String renders the reason: its head, then the estimate and its parts,
// then the cached share of the prompt.
func (r reasonFigures) String() string {
	b := make([]byte, 0, 96)
	b = append(b, r.head...)
	b = append(b, ": est "...)
	b = strconv.AppendFloat(b, r.est, 'f', 1, 64)
	b = append(b, " ms (queue "...)
	b = strconv.AppendFloat(b, r.queueMs, 'f', 1, 64)
	b = append(b, " + prefill "...)
	b = strconv.AppendFloat(b, r.prefMs, 'f', 1, 64)
	b = append(b, "), "...)
	b = strconv.AppendInt(b, int64(r.credit), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(r.P), 10)
	b = append(b, " tokens cached"...)
	switch r.adapter &^ adapterFlags {
	case adapterActive:
		b = append(b, ", adapter active"...)
	case adapterLoad:
		b = append(b, ", adapter load "...)
		b = strconv.AppendFloat(b, r.adapterMs, 'f', 1, 64)
		b = append(b, " ms"...)
	case adapterSlot:
		b = append(b, ", adapter load and slot wait "...)
		b = strconv.AppendFloat(b, r.adapterMs, 'f', 1, 64)
		b = append(b, " ms"...)
		switch {
		case r.adapter&adapterHomeWait != 0:
			b = append(b, " (with the wait of the adapters at home there)"...)
		case r.adapter&adapterHomeSettled != 0:
			b = append(b, " (at its home, demands alike: home wait not charged)"...)
		}
	}
	return string(b)
}

// record updates the moving averages and the in-flight accounting for a
// dispatched request.
func (k *KVAware) record(now time.Time, req *kvroute.Request, prefix uint64, endpoint string, st *candState, P int) {
	if req.Adapter != "" {
		el := k.stat(endpoint).loraFor()
		el.last = el.last.noted(now, k.adapter) // interned, as flights' (pr.adapter)
		k.adapterHome.Note(now, endpoint, req.Adapter)
	}
	const a = 0.05
	if P > 0 {
		own := float64(P - int(st.credit))
		k.meanUncached += a * (own - k.meanUncached)
		k.uncachedFrac += a * (own/float64(P) - k.uncachedFrac)
		// A run of fully cached requests decays both geometrically: below
		// these they are zero. Left alone they would sink to a denormal
		// (~4e-323, where x0.95 rounds back to itself), which halves the
		// speed of every Pick's arithmetic on common CPUs.
		if k.meanUncached < 1e-6 {
			k.meanUncached = 0
		}
		if k.uncachedFrac < 1e-9 {
			k.uncachedFrac = 0
		}
	}
	k.picks++
	key := reqKey(req)
	if old, ok := k.pending[key]; ok { // a retry of the same request: replace
		k.untrack(old)
	}
	pr := pendingReq{prefix: prefix, tenant: req.Tenant, endpoint: endpoint, size: float64(P - int(st.credit)), prompt: float64(P), at: now, prefill: true,
		adapter: k.adapter}
	k.pending[key] = pr
	k.track(pr)
	if k.picks%4096 == 0 || len(k.pending) > max(k.sweepAt, pendingSweepMin) {
		k.sweep(now)
	}
}

func (k *KVAware) track(pr pendingReq) {
	k.tracked++
	s := k.stat(pr.endpoint)
	s.sumTok += pr.size
	s.sumSq += pr.size * pr.size
	s.sumPrompt += pr.prompt
	if pr.prefill {
		if s.pendTok < 0.5 {
			s.progressAt, s.headMax = pr.at, pr.size
		}
		s.pendTok += pr.size
		s.pendSq += pr.size * pr.size
	}
	if pr.prefix != 0 {
		d := k.prefixInflight[pr.prefix]
		if d.n == 0 {
			d.since = pr.at
		}
		d.n++
		k.prefixInflight[pr.prefix] = d
	}
	if k.tenantInflight[pr.tenant]++; k.tenantInflight[pr.tenant] == 1 {
		k.tenantsActive++
	}
	if pr.adapter != "" {
		el := s.loraFor()
		if i := slices.IndexFunc(el.flights, func(f adapterCount) bool { return f.adapter == pr.adapter }); i >= 0 {
			el.flights[i].n++
		} else {
			el.flights = append(el.flights, adapterCount{adapter: pr.adapter, n: 1})
		}
	}
}

func (k *KVAware) untrack(pr pendingReq) {
	k.tracked--
	if s := k.eps[pr.endpoint]; s != nil {
		s.sumTok -= pr.size
		s.sumSq -= pr.size * pr.size
		s.sumPrompt -= pr.prompt
		if s.sumPrompt < 0.5 { // no drift from float subtraction
			s.sumTok, s.sumSq, s.sumPrompt = 0, 0, 0
		}
		if pr.prefill {
			s.donePrefill(pr.size)
		}
		if el := s.lora; pr.adapter != "" && el != nil {
			if i := slices.IndexFunc(el.flights, func(f adapterCount) bool { return f.adapter == pr.adapter }); i >= 0 {
				if el.flights[i].n--; el.flights[i].n == 0 {
					el.flights = slices.Delete(el.flights, i, i+1)
				}
			}
		}
	}
	if pr.prefix != 0 {
		if d := k.prefixInflight[pr.prefix]; d.n <= 1 {
			delete(k.prefixInflight, pr.prefix)
		} else {
			d.n--
			k.prefixInflight[pr.prefix] = d
		}
	}
	if k.tenantInflight[pr.tenant]--; k.tenantInflight[pr.tenant] <= 0 {
		delete(k.tenantInflight, pr.tenant)
		k.tenantsActive--
	}
}

// sweep drops per-request state older than PendingTTL. The next sweep for
// pending's size waits until it doubles (see pendingSweepMin).
func (k *KVAware) sweep(now time.Time) {
	k.sweeps++
	for key, pr := range k.pending {
		if now.Sub(pr.at) > k.p.PendingTTL {
			k.untrack(pr)
			delete(k.pending, key)
		}
	}
	k.sweepAt = 2 * len(k.pending)
}

// tenantOver reports whether tenant holds more than C x its fair share of the
// tracked in-flight requests (counting the new one).
func (k *KVAware) tenantOver(tenant string) bool {
	active := k.tenantsActive
	if k.tenantInflight[tenant] == 0 {
		active++
	}
	if active < 2 {
		return false
	}
	fair := float64(k.tracked+1) / float64(active)
	return float64(k.tenantInflight[tenant]+1) > k.p.C*fair
}

// donePrefill removes one request of size uncached tokens from the queued
// prefill sums.
func (s *epStats) donePrefill(size float64) {
	s.pendTok -= size
	s.pendSq -= size * size
	if s.pendTok < 0.5 { // no drift from float subtraction
		s.pendTok, s.pendSq = 0, 0
	}
}

// FirstToken implements router.FirstTokenObserver: req produced its first
// token, so its uncached tokens are no longer prefill work queued on the
// endpoint, and the next one in its queue starts. From the first call on,
// the queued prefill the estimate uses is the policy's own count rather
// than the router's in-flight prompt tokens scaled by the uncached share.
func (k *KVAware) FirstToken(now time.Time, req *kvroute.Request, _ string) {
	if req == nil {
		return
	}
	k.firstTokens = true
	key := reqKey(req)
	pr, ok := k.pending[key]
	if !ok || !pr.prefill {
		return
	}
	if s := k.eps[pr.endpoint]; s != nil {
		s.donePrefill(pr.size)
		s.progressAt, s.headMax, s.stepAt = now, float64(k.p.MaxBatchedTokens), now.UnixNano()
	}
	pr.prefill = false
	k.pending[key] = pr
}

// RecycleScores implements router.ScoreRecycler: it hands over the
// buffers behind its last decision's Scores and their Parts (it will not
// touch them again) and takes scores and parts as the buffers of its next
// explanations, so that a decision log can keep explanations without
// copying them.
func (k *KVAware) RecycleScores(scores []kvroute.Score, parts []kvroute.Part) ([]kvroute.Score, []kvroute.Part) {
	return k.buf.swap(scores, parts)
}

// Release implements kvroute.Releaser: the request ended (any outcome).
func (k *KVAware) Release(_ time.Time, req *kvroute.Request, _ string) {
	if req == nil {
		return
	}
	key := reqKey(req)
	if pr, ok := k.pending[key]; ok {
		k.untrack(pr)
		delete(k.pending, key)
	}
}

// Observe implements kvroute.Learner: it updates the learned rates from an
// observed TTFT. Requests that met an empty queue measure ms per uncached
// token; the others measure ms per queued request (what is left of the TTFT
// after the request's own prefill, divided by the queue it met). A decode
// leg's outcome (Outcome.Decode) times a KV pull, not a prefill: skipped.
func (k *KVAware) Observe(_ time.Time, o kvroute.Outcome) {
	if !k.p.Learn || o.Failed || o.Decode || o.TTFT <= 0 || o.PromptTokens <= 0 {
		return
	}
	ttft := float64(o.TTFT) / float64(time.Millisecond)
	own := float64(o.PromptTokens)
	if o.CachedTokens >= 0 {
		own = float64(max(o.PromptTokens-o.CachedTokens, 0))
	} else {
		own *= k.uncachedFrac
	}
	stepMs := k.p.StepOverheadUs / 1000
	s := k.stat(o.Endpoint)
	prior := k.p.PrefillUsPerToken / 1000
	// The learned rate is the linear one: divide out the attention over the
	// context, as estimate multiplies it back in.
	cached := float64(max(o.PromptTokens, 0)) - own
	attn := 1 + k.p.AttnUsPerTokenPerKTok/k.p.PrefillUsPerToken*(cached+own/2)/1000
	if o.QueueDepth == 0 {
		if own < 16 {
			return // too little prefill to measure a rate
		}
		// Clamp to a sane band around the prior so one outlier cannot wreck it.
		x := math.Min(math.Max((ttft-stepMs)/(own*attn), prior/10), prior*10)
		ewma(&s.tokMs, &s.nTok, x, k.p.LearnAlpha)
		ewma(&k.all.tokMs, &k.all.nTok, x, k.p.LearnAlpha)
		return
	}
	tok := prior
	switch {
	case s.nTok >= k.p.LearnMinSamples:
		tok = s.tokMs
	case k.all.nTok >= k.p.LearnMinSamples:
		tok = k.all.tokMs
	}
	x := math.Max(ttft-own*tok*attn-stepMs, 0) / float64(o.QueueDepth)
	ewma(&s.reqMs, &s.nReq, x, k.p.LearnAlpha)
	ewma(&k.all.reqMs, &k.all.nReq, x, k.p.LearnAlpha)
}

// ewma folds x into the average v with weight alpha; the first sample seeds
// it.
func ewma(v *float64, n *int, x, alpha float64) {
	if *n == 0 {
		*v = x
	} else {
		*v += alpha * (x - *v)
	}
	*n++
}

// Package planner is kvroute's capacity planner (kvroute plan): given a model
// deployment (an engine.Profile, built in or from a HuggingFace config.json),
// a workload (a trace or a Summary), latency SLOs and optionally a GPU-hour
// price, it finds the cheapest fleet that meets the SLOs, aggregated and
// disaggregated (prefill:decode) side by side.
//
// # Method
//
// Closed-form bounds come first, from the engine's own cost model
// (engine.Profile.PrefillTime, DecodeTime, KVCapacityTokens) and the
// workload's demand after the oracle prefix hit rate:
//
//   - compute: prefill tokens/s per engine at full chunks and decode
//     tokens/s per engine at the largest batch meeting the TPOT target,
//     against the demand (rate x uncached prompt, rate x output);
//   - memory: the KV working set by Little's law against one engine's
//     capacity;
//   - bandwidth: the KV handoff bytes/s of a disaggregated fleet against a
//     decode node's link (package disagg's KVShape and Link), a handoff
//     moving only the prompt blocks its decode node lacks
//     (disagg.PulledTokens): at least every distinct block of the prompts
//     once and each prompt's partial last block, whatever the order. In
//     conditional mode it counts only the requests the router's rule
//     (disagg.Planner.WhatIf) hands off whatever the load (with the prefill
//     node saturated: with its default thresholds, an uncached prompt over
//     max_local_tokens), and only the blocks no request run whole on a
//     decode node has;
//   - latency floors: the TTFT of the SLO's quantile request on an idle
//     engine with every shared prefix cached, and one decode step of a single
//     sequence. An SLO below them is infeasible for any fleet (ErrInfeasible,
//     with the numbers);
//   - slots, when requests name LoRA adapters: an engine batches at most
//     Input.MaxLoRAs adapters (vLLM's --max-loras) and a request holds its
//     adapter's slot from its first step to its last, so one that meets a
//     TTFT limit L surely runs from arrival + L - its prefill floor to
//     arrival + prefill floor + (output-1) one-sequence decode steps (on a
//     decode node, from arrival + L - min(prefill floor, one step)); the
//     adapter-seconds these stretches cover (each adapter's union, less the
//     longest ones of the share the SLO lets miss) over the span they cover
//     are the adapters resident at once, over MaxLoRAs the engines
//     (Bounds.Slots; DecodeSlots for the decode pool). Waiting is what lets
//     a fleet take turns between adapters, so with no TTFT target there is
//     no bound, and the plan says so.
//
// Each bound carries its arithmetic (Bound.Explain). Then the fleet
// simulator (package sim: the router's own policy, prefix-index,
// stale-signal and P/D placement code over modelled engines, the profile
// passed as a value so a config.json model runs too) searches on a window
// of the workload, its first Input.SimRequests requests with one seed:
//
//   - aggregated fleet sizes from the bound: grow by doubling steps until a
//     fleet meets the SLO, bisect, or step down while the bound itself
//     passes (the bound is not strict);
//   - prefill:decode fleets in the simulator's P/D mode (a disagg.Planner
//     routes, Input.PDMode conditional or always; KV handoffs cross a
//     disagg.Fabric of Input.Fabric links with queueing), from the
//     analytical estimate below: a fleet that misses grows the pool its
//     misses point at (decode for TPOT; for TTFT the side where the slow
//     requests spent their time: queue and prefill on a prefill engine, or
//     the handoff and the decode node; at the search's size cap, twice the
//     aggregated fleet, an engine moves to that pool from the other), then
//     each pool shrinks by bisection while the fleet still passes.
//
// The chosen fleets are then confirmed on the whole workload (its first
// Input.ConfirmRequests requests) with Input.Seeds seeds: a window is not the
// workload (on the conversation trace the first 2,500 requests put TTFT p90
// 10% above the whole trace's, while seeds move it by about 1%), so every
// predicted figure (TTFT, TPOT, throughput, hit rate, utilisation, and for
// P/D the fabric bandwidth: total, and mean, p99 and largest per decode node
// over one-second windows, from the simulated transfers) is the mean over the
// seeds, with their spread (Fleet.Spread). A confirmed fleet one engine
// smaller that passes with the first seed is taken instead (an aggregated
// one never below the closed-form bound), and one that misses grows. The burst (Input.Burst) and one node lost (the worse pool
// for P/D) are confirming runs too. Verify simulates the whole workload on
// each planned fleet with seed Seed+Seeds, which the plan did not use, and
// reports predicted against simulated TTFT (at the SLO quantile, p90, p99)
// and throughput.
//
// The analytical fleets (Result.AggregatedModel, DisaggregatedModel) are
// shown next to the simulated ones, on the same cost model, each request's
// prefix hit taken from the simulated search window, the workload's
// requests replayed in arrival order on the fleet's nodes (the workload's
// own bursts, where an Erlang C queue assumes Poisson arrivals). The
// aggregated one puts each request on the engine with the fewest prompt
// tokens in flight, as the router's kv-aware estimate does: it waits there
// for the engine's earlier prefills, first come first served, and decodes
// a token a step, a decode step of the batch or, while its engine
// prefills, a chunk step (a short output decoding through a long prompt's
// prefill pays a chunk step a token: the TPOT tail); utilisation is the
// share of the engines' time with a request on them, as the simulator
// counts it. It is checked against the simulated aggregated fleet in a
// note, and at the oracle hit rate it starts the aggregated search. On the
// conversation trace it sizes 6 engines for the 8B plan of docs/PLANNING.md where
// the simulation needs 5 (an M/G/c queue with a Poisson count of the
// prefills met sized 3), and 10 for the 70B (tp4) one where the simulation
// needs 17: that TTFT target sits on the plateau the prefix hit rate sets,
// which grows with the fleet, and the model takes every request's hit from
// the chosen simulated fleet. The disaggregated model starts the P/D
// search:
// the router hands a request off (prefill pool: queue + chunked prefill +
// KV handoff of the prompt past the prefix hit + first decode step) or, in
// conditional mode, runs it whole on its decode node as the same
// disagg.Planner rule (Planner.WhatIf) decides (short, mostly cached and
// cheaper-locally requests stay there), on the nodes' queues as the router
// sees them (their in-flight prompt tokens), which the rule's own choices
// and the arrivals' bursts make: the requests are replayed in arrival
// order on the fleet's prefill and decode nodes. The prefill pool queues only the handed-off requests; the decode
// pool decodes every request and prefills the others as an aggregated
// engine does (their prefills share its steps with the requests decoding:
// TPOT counts the chunk steps of the prefills each request's decode node
// runs in that replay while it decodes, as the aggregated model does);
// each request waits for its prefill as it does in that replay (first come
// first served on the node that runs it), so TTFT is its wait plus its
// prefill, handoff and first decode step or its local prefill; only the
// handoffs load the fabric. Utilisation is, as in the simulator, each
// pool's busy time over the replay's wall time (a prefill node busy with
// its prefills, a decode node with its own prefills and its requests from
// first to last token), the fleet's the mean over its nodes; the search
// keeps each pool's load (offered work over capacity) under the target
// utilisation. The decode pool starts at the
// smallest meeting TPOT, KV capacity and link ingress with no prefill, the
// prefill pool at its load at the target utilisation (always mode) or one;
// the pool the misses point at grows until the fleet meets the SLO, then
// each shrinks while it still does.
//
// # LoRA adapters
//
// A workload's requests may name LoRA adapters of the base model
// (workload.Request.Adapter): a trace's adapter field, or a Summary with
// Adapters, which draws adapter-0..adapter-N-1 by the lora generator's law
// (workload.AdapterMix: adapter i's share proportional to
// 1/(i+1)^AdapterSkew), each adapter with its own hot prefixes (none
// shared across adapters, as the engine keys an adapter's blocks with its
// name). The simulated engines then run with LoRA enabled and
// Input.MaxLoRAs slots (sim.Config.MaxLoRAs: a request of another adapter
// waits for one, and a running adapter's requests keep joining its batch),
// and the router's kv-aware policy prices the slots from the scraped
// vllm:lora_requests_info, as in kvroute sim; the oracle and hot prefixes
// key an adapter's prompts apart; the slots bound joins the aggregated
// search's start (max of compute, memory, slots) and the decode slots
// bound the P/D start's decode pool. The analytical replay books each
// node's slots (a request waits until enough running adapters leave, each
// staying while its requests keep arriving, see replay): a prefill node's
// for the prefill alone, a decode-capable node's to the last token. A P/D
// fleet's decode node is the router's decode picker's
// (disagg.DecodePicker), fed the nodes' booked loads (the adapters
// running and waiting there, which the router learns from its own
// placements for AdapterHold before the signals show them); the P/D rule
// sees the decode node's adapters (disagg.Scenario.Adapter). On
// docs/PLANNING.md's LoRA example (8 adapters of the 8B profile at 20 req/s,
// --max-loras 1, TTFT p99 2s) the analytical P/D fleet is 2:8, where the
// simulated one is 1:9 (TestModelPDAdapterSlots: at 1:7 the simulator's
// TTFT p99 is 2.6s and the model's 4.8s, at 2:10 0.32s and 0.31s). Before
// the router's decode picker held the adapters it placed, no simulated
// prefill:decode fleet up to 18 engines met that target, and the model,
// its decode legs kept on the nodes their adapter ran on, sized 1:7. The chosen
// fleets are confirmed on 4 seeds by default, not 2: with few slots the
// tail turns on the router's first placements (8 adapters of the 8B
// profile at 20 req/s, --max-loras 1, TTFT p99 2s: 9 engines met it with
// seeds 1 and 2 and missed it with seed 3, 2.23s; 10 meet it with all
// four and the verifying seed). On 4 adapters
// at 10 req/s of 1000-token prompts and 200-token outputs, TTFT p99 2s
// (TestPlanAdapters), the simulated fleet is 4 engines at --max-loras 1
// and 1 at --max-loras 4, as without adapters; the analytical one 5 and 1.
//
// Input.Validate reports the first invalid field (ErrBadInput), among
// them a fabric slower than the simulator models (sim.MinLinkGbps), a
// NaN SLO quantile, burst factor or utilisation target, MaxLoRAs below
// one, and a request
// with an empty prompt (every engine refuses it, so no fleet would meet
// the SLO).
//
// Plans are deterministic for Input.Seed whatever Input.Parallel (the
// simulations are independent runs keyed by fleet, seed and rate scale).
// Nothing here does I/O except Result.WriteDir; Plan is safe to call
// concurrently with different Inputs.
package planner

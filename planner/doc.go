// Package planner is kvroute's capacity planner (kvroute plan): given a model
// deployment (an engine.Profile), a workload (a trace or a Summary), latency
// SLOs and optionally a GPU-hour price, it finds the cheapest fleet that meets
// the SLOs, aggregated and disaggregated (prefill:decode) side by side.
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
//     decode node's link (package disagg's KVShape and Link);
//   - latency floors: the TTFT of the SLO's quantile request on an idle
//     engine with every shared prefix cached, and one decode step of a single
//     sequence. An SLO below them is infeasible for any fleet (ErrInfeasible,
//     with the numbers).
//
// Each bound carries its arithmetic (Bound.Explain). Then a search over
// aggregated fleet sizes runs the fleet simulator (package sim: the router's
// own policy, prefix-index and stale-signal code over modelled engines) on
// the workload, or its first Input.SimRequests requests: it starts at the
// bound, grows by doubling steps until a fleet meets the SLO, bisects, and
// steps down while the bound itself passes (the bound is not strict). The
// chosen fleet is re-simulated at the burst factor and with one engine lost.
// Verify re-simulates the whole workload on the chosen fleet with another
// seed and reports the prediction error.
//
// The disaggregated fleet cannot be simulated whole (the simulator has no P/D
// mode). Its decode pool is analytical: sized for TPOT (the batch is the fixed
// point of Little's law and the decode step time), KV capacity and link
// ingress. Its prefill pool is sized first with an M/G/c queue (Erlang C with
// the Allen-Cunneen correction) on the same cost model, where TTFT = queue +
// chunked prefill + KV handoff + first decode step, each request's prefix hit
// taken from the simulated aggregated fleet and the queue's variability term
// calibrated against the simulation when the uncalibrated model is more than
// 10% off (as NVIDIA Dynamo's planner corrects its profile with
// observed/expected TTFT); then, for built-in profiles, the prefill pool is
// re-sized with the simulator: the workload's requests as prefill-only
// requests through the router's policy on the prefill engines, plus each
// request's handoff and first decode step. Every output says which figures
// are simulated and which analytical.
//
// Plans are deterministic for Input.Seed. Nothing here does I/O except
// Result.WriteDir; Plan is safe to call concurrently with different Inputs.
package planner

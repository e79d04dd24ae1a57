// Package policy holds kvroute's routing policies: implementations of
// kvroute.Picker chosen by name with New.
//
//   - kv-aware (the default, KVAware): lowest estimated time to first token
//     (queue wait + prefill of the uncached tokens), per-candidate load caps,
//     session affinity by consistent hashing with bounded loads, hot-prefix
//     replica sets, tenant fairness, shed/queue on overload; a request for
//     a LoRA adapter pays its load (adapter_load) where the engine does not
//     hold it, and a slot wait where other adapters hold every slot; with
//     few slots adapters keep engines of their own (adapter_hold).
//   - Baselines: round_robin, random, least_request, power_of_two.
//
// Weights (kvroute.Endpoint.Weight): round_robin is nginx's smooth weighted
// round robin, random draws by weight, least_request compares in-flight
// per weight, power_of_two draws two by weight and compares in-flight per
// weight; kv-aware scales its in-flight bounds and its session ring by
// weight (see KVAware, Weights), not its TTFT estimate. The peers are
// weight-blind, as their published algorithms are. With equal weights
// every policy decides as without them.
//   - The peers, as faithful selectable baselines with their published
//     defaults: sglang-cache-aware, llm-d, dynamo, kubeai-chwbl, preble-e2.
//     Each type's doc cites its source.
//
// Pickers are pure: no I/O, no goroutines, no wall clock. The caller (package
// router, shared by the proxy and the simulator) fills each Candidate with
// health, load and the prefix-index match, passes now in, and serialises
// calls per model. Pickers keep state (positions, learned rates, routing
// history, scratch buffers) without locks, so a Picker is not safe for
// concurrent use: one Picker per model, called under the router's lock.
// Optional interfaces: KVAware implements kvroute.Learner (Observe an
// outcome), kvroute.Releaser (Release when a request ends) and
// router.FirstTokenObserver (FirstToken: its prompt is no longer queued).
//
// Every decision explains itself: Decision.Scores holds each candidate's
// score and its named parts, and Decision.Reason a one-line summary, both
// produced by the code that decides. Scores and their Parts live in buffers
// the picker reuses: they are valid until its next Pick call, so a caller
// that keeps decisions (a debug log) copies them, as package router does.
// With that, a decision costs one allocation (its Reason) on the hot path,
// and none under the router, which defers kv-aware's explanations to its
// decision log (router.DeferredExplainer): Pick then leaves Scores nil and
// Reason says how it chose ("affinity", "lowest estimate", ...), and the
// log renders the scores and the whole reason, with its figures, from the
// state Pick kept, when someone reads it.
package policy

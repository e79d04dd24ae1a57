// Package sim is kvroute's discrete-event fleet simulator: it replays a
// workload (a trace or a generator, package workload) through N modelled
// engines (package engine) and the router's own decision code (package
// router with the policies of package policy, the approximate and precise
// prefix indexes of package kvindex and the stale-signal model of package
// signals), on a virtual clock.
//
// # Model
//
// Time is virtual: an agenda (a binary heap) holds the events, ordered by
// time and then by the order they were scheduled, so a run is deterministic
// for a seed. The clock starts at the workload's time 0, or, when its first
// request arrives more than a minute later (a trace with absolute
// timestamps), on a whole number of scrape intervals a minute or so before
// it, rather than scrape idle engines until then; records keep the
// workload's clock. The events are
//
//   - arrival: the router routes the request (router.Route) at its arrival
//     time, scaled by Config.RateScale; a shed request (429) or a pool with
//     no endpoint (503) is a rejection;
//   - hold: a request the policy sheds with the "queue" action (kv-aware's
//     overload: queue), or arriving while others are held, waits in its
//     router replica's line (router.Line) for at most Config.QueueWait, as
//     kvroute serve's proxy holds it; the line's head routes again after a
//     pause or when a flight gets its first token or ends (hold.go);
//   - delivery: the request reaches its engine NetLatency later (engine.Add);
//   - engine step: an engine that has work runs one scheduler iteration
//     (engine.Step); its outputs and KV events are released when the step's
//     modelled duration has passed, and the next step starts at once;
//   - first token and done: reach the router NetLatency after the engine
//     produced them (router.FirstToken, router.Done), which is when TTFT and
//     end-to-end latency are measured, as the live router would;
//   - scrape: every ScrapeInterval, with a per-engine phase, the engine's
//     engine.Stats are turned into signals.Metrics (what its /metrics page
//     would say: during a step, the engine as the step found it, since the
//     emulator and vLLM publish a step's stats when it ends) and reach the
//     router's signals.View NetLatency later, so the router routes on
//     signals as stale as in production. While the fleet is idle (no
//     request in flight, nothing on the agenda but the next arrival and the
//     periodic events) the engines and views cannot change, so an engine's
//     scrapes up to that arrival all read the same metrics: the first of
//     them records them all at once (signals.View.ObserveRepeat, which
//     leaves the view as the separate observations would), after the
//     scrapes still in flight to the router (a network latency longer than
//     the interval), and a run at a low rate costs about its requests, not
//     its span over the interval;
//   - KV events (with Config.KVEvents): the engine's BlockStored/BlockRemoved
//     events reach the precise index KVEventDelay after their step;
//   - sample: four times per timeline bucket, each engine's KV usage and
//     queue are recorded for the utilisation charts.
//
// The run ends when every request has completed or been rejected. Requests
// still open when only periodic events (scrapes, samples) remain could never
// finish; they are reported as failed (504) rather than looping forever.
//
// # Router fidelity
//
// Config.Routers runs several router replicas (independent kvroute serve
// processes behind a load balancer that alternates between them): each has
// its own views, indexes and policy state and scrapes every engine itself,
// so between scrapes it sees only its own dispatches.
//
// Prompts are handled in the simulator's fast path: the engines and the
// router get chained block hashes of the workload's synthetic segments
// (workload.Request.BlockHashes) instead of token ids. The router's blocks
// are Config.RouterBlockTokens long (32 by default, like kvroute serve's
// default 128-character blocks); since the hashes are chained, a router
// block's key is the engine hash of its last engine block, so nothing is
// hashed twice. With Config.KVEvents the prompts are materialised as tokens
// instead, as in production: the engines hash them and report them in their
// KV events, and the router hashes them with kvindex.HashTokens at the
// engines' block size, which the precise index needs.
//
// # LoRA adapters
//
// A request for a LoRA adapter (workload.Request.Adapter) is routed in the
// base model's pool (kvroute.Request.Model is Config.Model) with
// kvroute.Request.Adapter set, to the engines that serve it: every engine
// serves every adapter unless its group lists the ones it serves
// (Group.Adapters; none serves it: 503, a rejection). The
// engine gets it as engine.Request.LoRA: its blocks are keyed with the
// adapter's name (in the fast path by the workload's hashes, whose chain
// an adapter roots in its name; with KV events by the engine's own keyed
// hash, which the router matches with kvindex.HashTokensKeyed and the
// precise index stores with the adapter's key as each block's salt, as
// the KV-event subscriber does with vLLM's extra_keys), so adapters share
// no cached block. The engines batch at most Config.MaxLoRAs distinct
// adapters a step (vLLM's --max-loras, default 1). When the workload
// names an adapter, each scrape carries vllm:lora_requests_info as vLLM
// sets it with each step's stats: the running and waiting adapters when
// the engine's last step started (or when it went idle), and max_lora;
// none before an engine's first step has ended. The router's
// kvroute.Load.LoRA, which kv-aware prices (policy.KVAwareParams.
// AdapterLoad), follows. The engine model charges no time to load an
// adapter (see package engine), so kv-aware's AdapterLoad prices a cost
// the simulated engines do not pay; the wait for a batch slot they do.
//
// # Results
//
// Run returns a Result: one Record per request (TTFT split into network,
// queue, prefill and first decode step; TPOT; end-to-end; cached tokens;
// status), per-engine totals, a utilisation timeline and the oracle bound on
// the prefix-cache hit rate (an infinite cache shared by the fleet: every
// block seen before anywhere is a hit; see OracleHitRate), and a lower bound
// on each request's TTFT under the cost model (Record.TTFTBound, its
// percentiles over the completed requests in Result.TTFTBound; see
// TTFTBounds): its prompt's oracle misses prefilled with no queueing, which
// no router can beat. Result.Row reports the oracle over the completed
// requests too (Result.CompletedOracleHitRate), the population of its hit
// rate. A P/D fabric link below MinLinkGbps (0.01 Gbps effective) is a
// Config error, and a run whose virtual time would pass workload.MaxSpan
// (a rate scale near zero stretching the arrivals, a transfer or step too
// long for the clock) ends in an error instead of a result. The
// utilisation timeline doubles its bucket width rather than grow past
// 4,096 buckets. Result.Row,
// Result.Samples and Result.Utilisation convert it to package report, the
// format `kvroute bench` also writes, so simulated and measured runs compare
// directly; WriteRecordsCSV writes the per-request records. A P/D run also
// lists every KV handoff (Result.Transfers: bytes, ready, wire start, end;
// the bytes are the prompt's past the decode engine's own prefix-cache hit,
// disagg.PulledTokens, as vLLM's NixlConnector pulls);
// Result.FabricLoad turns them into the fabric bandwidth the fleet used
// (total, and mean, p99 and peak per decode engine over one-second windows).
//
// Engines come from built-in profiles by name (Group.Profile) or from a
// profile value (Group.Spec), e.g. a model read from a HuggingFace
// config.json with engine.ProfileFromHFConfig.
//
// When no workload is given, `kvroute sim` replays the embedded Mooncake
// conversation trace (DefaultWorkload; see data/README.md).
//
// Run is single-threaded and does no I/O; separate Runs share nothing and
// may run in parallel (a Config's Picker, if set, must not be shared).
package sim

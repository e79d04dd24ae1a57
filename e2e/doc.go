// Package e2e holds kvroute's end-to-end tests: emulated engines (package
// emulator, in process, each on its own loopback HTTP listener, publishing
// KV-cache events over ZMQ) behind the routing proxy (package proxy) served
// on loopback, exactly as `kvroute engine` and `kvroute serve` run them.
//
// The tests check what no unit test can: that the engines' metrics reach
// the routers through the scrape loops within a few intervals; that the
// engines' KV events, in both of vLLM's encodings, build a precise prefix
// index that agrees with what each engine reports cached; that an engine
// restart drops its entries; that the kv-aware policy sends a repeated long
// prefix back to the engine caching it while cold prompts spread; that
// failing scrapes mark an endpoint stale without stopping routing; and
// that LoRA adapters are routed, cached and (on a prefill/decode pool,
// NixlConnector handoff) prefilled and decoded only where they are served,
// on llama.cpp-flavoured engines too, named by each engine's own ids in
// its /lora-adapters.
//
// Every wait polls with a deadline; nothing sleeps to assert. The package
// has no exported API: run it with `go test ./e2e` (about 25 seconds, 20 of
// them TestFidelity's real traffic, which -short skips).
//
// Two long runs are opt-in: KVROUTE_FIDELITY=1 (the simulator against a
// live fleet at full scale) and KVROUTE_CHAOS=1 (TestChaos, about two
// minutes: the real `kvroute engine` and `kvroute serve` binaries under
// load while engines are killed, stopped, restarted one by one and their
// metrics fail; every answer must be complete or a clear error).
package e2e

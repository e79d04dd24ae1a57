// Package kvroute holds the vocabulary shared by every part of kvroute, the
// KV-cache-aware load balancer for LLM inference fleets: endpoints and their
// roles, the routing view of a request, the per-endpoint load view at decision
// time, candidates, decisions and the Picker interface that every routing
// policy implements.
//
// The package depends on the standard library only. It does no I/O and starts
// no goroutines. The router (package proxy) and the fleet simulator (package
// sim) are two drivers of the same decision code: both build a Request and a
// slice of Candidates and call a Picker, passing the current time in, so what
// the simulator predicts is what the router does.
//
// An Endpoint whose DataParallelSize is above 1 is one rank of a
// data-parallel engine (several engine cores, each with its own KV cache,
// behind one URL): to the router and the policies it is an endpoint like
// any other, with an ID of its own (DataParallelID); the proxy pins its
// requests with HeaderDataParallelRank. The zero value is a plain endpoint.
//
// Import direction:
//
//	cmd -> {proxy, sim, planner, emulator, signals} -> {router, policy, kvindex, engine, workload, openai} -> kvroute
package kvroute

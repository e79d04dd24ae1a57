// Package router is the pure routing core for one model's pool, shared by
// the live proxy (package proxy) and the fleet simulator (package sim): the
// two are drivers of this same code, so what the simulator predicts is what
// the router does.
//
// For each request Route builds one kvroute.Candidate per endpoint from
//
//   - health: active checks reported with SetActiveHealth and passive
//     ejection (consecutive failures reported with ReportResult eject an
//     endpoint with exponential back-off); an endpoint that does not serve
//     the request's LoRA adapter (kvroute.Endpoint.ServesAdapter), or whose
//     llama.cpp server did not list it at its last GET /lora-adapters
//     (signals.View.LlamaAdapters; a server whose list is not known yet
//     stays a candidate), is offered as not healthy (the decision log's
//     explanation says which of the two of it), and with none left Route
//     answers 503 no_adapter_endpoint (in a P/D pool its message counts
//     the endpoints that decode, where a request ends: an adapter only
//     prefill endpoints serve has none), or 404 model_not_found, naming
//     what each lists, when every endpoint that would serve it is a
//     llama.cpp server that does not list it,
//   - load: each endpoint's signals.View (scraped engine signals corrected
//     by the router's own dispatches; see package signals),
//   - cache: the prefix indexes. The approximate index (kvindex.Approx)
//     remembers what the router routed where; the precise index
//     (kvindex.Index, fed by the engines' KV events) wins for endpoints that
//     publish events, and the approximate entries then only cover the gap
//     between routing and the engine's event (a second approximate index,
//     the gap index); for those endpoints a write log (the blocks each
//     dispatch brought that the engine did not hold) tells their caches'
//     room and turnover (Candidate.Evicts and Horizon),
//
// calls the configured kvroute.Picker, records the dispatch, and keeps the
// decision for /debug/decisions. The caller reports the first token and the
// end of each request (FirstToken, Done) so in-flight counts stay exact;
// pickers hear of them through the optional kvroute.Learner and
// kvroute.Releaser (at Done) and FirstTokenObserver (at FirstToken). A
// decision Route refuses (the picker chose an ineligible endpoint) is
// released to a Releaser at once. Drained returns a channel signalled
// (never blocking, one deep) at each FirstToken and Done, when the load
// the router counts went down, and when an endpoint joins the candidates
// (added, present again, passing its health checks again): a request the
// policy shed may fit now (the proxy's queue routes the head of its line
// again on it).
//
// The pool can change while the router runs: SetEndpoints takes the new
// endpoint list and keeps the state of every endpoint that stays (health,
// signals, in-flight counts, approximate-index entries, the picker's
// learned state); removed endpoints are never chosen again, while their
// flights end normally; added ones start as at New. An ID whose URL (or
// data-parallel place) changed is another engine: removed and added.
// Pickers keeping per-endpoint state forget removed endpoints through
// EndpointForgetter.
//
// Router does no I/O, starts no goroutines and never reads the wall clock:
// every method takes now. A Router is safe for concurrent use; calls into
// the Picker are serialised by the Router's mutex, so pickers need no locks.
package router

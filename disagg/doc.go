// Package disagg is kvroute's prefill/decode disaggregation: where a
// request's prompt is computed, where its tokens are generated, whether
// splitting the two pays at all, what the KV handoff between them costs on
// the cluster fabric, and the handoff itself in the engines' own protocols.
//
// # Cost model (cost.go, fabric.go)
//
// KVShape sizes a handoff: bytes = tokens x TP x what one decode rank
// holds, layers x max(1, KV heads / TP) x head dim x 2 x bytes per element
// (or layers x latent dim x bytes for MLA models, whose latent every rank
// holds whole), from an engine.Profile or a HuggingFace config.json: as
// vLLM's NixlConnector, each decode rank reads its own share, so KV that
// TP replicates (more ranks than KV heads, or any MLA latent) crosses the
// wire once per copy. The tokens
// are the prompt's past what the decode node's prefix cache holds
// (PulledTokens of its Candidate.CachedTokens: whole blocks, never the last
// prompt token), as vLLM's NixlConnector pulls only those; with
// Config.Protocol sglang, the whole prompt (SGLang's decode engines keep no
// radix cache in P/D by default). A Link's
// time is setup + bytes / effective bandwidth; Links picks the link between
// two endpoints by their labels (default: same "node" NVLink 450 GB/s, same
// "rack" or "zone" RDMA 400 Gb/s, else TCP 100 Gb/s). The Fabric books the
// transfers the router planned and charges each new one the queueing they
// imply on the sending and receiving ports (worked examples in
// cost_test.go: 8B at 8k tokens is 1.07 GB, 21.5 ms at 400 Gb/s, 85.9 ms
// at 100 Gb/s; a second such handoff into the same node waits 21.5 ms).
//
// # Placement (plan.go, decode.go, estimate.go)
//
// Planner is a kvroute.Picker for a router.Router over a pool with prefill,
// decode and both endpoints, so the proxy and the simulator run the same
// placement. For each request it
//
//   - places the prefill stage with a cache- and load-aware picker (the
//     kv-aware policy, parameters derived from the engine profile) over the
//     prefill-capable candidates;
//   - places the decode stage with DecodePicker, which weighs KV
//     headroom, the running batch (the decode step time with the request
//     in it) and the transfer from the chosen prefill node, fabric
//     queueing included, of the prompt KV the decode node does not hold
//     (a node with the conversation's earlier turns pulls only the new
//     turn: it wins when the fabric is slow), and, for a LoRA adapter's
//     request on an engine that does not hold the adapter, the last free
//     max_lora slot's price or the wait for a slot where other adapters
//     hold every one (adapter_ms); an engine holds the adapters its
//     signals show and, for AdapterHold, those the picker placed there,
//     so that one adapter's legs keep to its engines before the signals
//     show them (a decode leg reaches its engine after its prefill);
//   - decides, in ModeConditional, whether to run aggregated on the decode
//     node instead: short uncached prompts, Dynamo's isl_bounding rule, or
//     an estimated TTFT aggregated (queue + prefill, plus a charge for
//     stalling the decode node's batch) that beats the disaggregated one
//     (prefill queue + prefill + transfer + first decode step). A LoRA
//     adapter's request waits on either side for a max_lora slot where
//     other adapters' running requests hold them all: run whole, the
//     decode node's wait before its prefill; disaggregated, the prefill
//     node's before its prefill (a "both" node's: a prefill-only node's
//     running prefill legs end within its queue), then what is left of the
//     decode node's when the decode leg reaches it, so a prompt whose
//     decode node has no slot free is prefilled elsewhere meanwhile. Every
//     decision carries its estimates as Parts (queue_ms, prefill_ms,
//     transfer_ms, aggregated_ttft_ms, disaggregated_ttft_ms, ..., and the
//     slot waits adapter_ms, prefill_adapter_ms and decode_adapter_ms when
//     not zero) and a one-line Reason, in the router's decision log.
//
// A request for a LoRA adapter (kvroute.Request.Adapter) is placed as any
// other over the endpoints that serve it: the router offers the others to
// the Planner as not healthy, so both stages are limited to them; the
// prefix matches the candidates carry are the adapter's (the router keys
// its blocks with the adapter's name, as the engines do), and so are the
// transfer sizes priced from them. A plan run whole because no prefill
// endpoint serving the adapter is available says so, as does the decode
// stage finding no decode endpoint that serves it. The legs' bodies name
// the adapter as their model, unchanged (the proxy hands Serve a body in
// vLLM's form, a client's SGLang form rewritten): vLLM's
// kv_transfer_params carry no adapter; each engine keys the prompt's
// blocks with it. SGLang's legs name it in lora_path too (the client's own
// replaced, and a model with a colon replaced by the base model's name):
// an SGLang engine reads an adapter from lora_path or a "<base>:<adapter>"
// model (the model's winning), never from a model naming the adapter
// alone, which it would run as the base model.
//
// The Planner's decisions name policy "pd" (PolicyName); the configured
// policy is the prefill stage's. When a plan does not send the request to
// the prefill picker's node (aggregated on the decode node, or no decode
// node found), the Planner releases that pick at once (kvroute.Releaser),
// so the node is not charged the request's prefill until the request ends.
// A handoff pins the Route of its decode leg to the planned node
// (PinEndpoint: that engine in that role, or none; PinDecode when a failed
// decode leg is retried elsewhere); the next Pick for the request consumes
// the pin, and Unpin drops one that no Pick consumed (a Route that failed
// before the picker ran, a client gone), so a pin never outlives its
// request.
//
// The pool's endpoints may change while it serves (the router's
// SetEndpoints: a reload, a discovery). The Planner is a
// router.EndpointForgetter: an endpoint removed, or whose ID now names
// another engine or role, is forgotten by the prefill picker (if it keeps
// per-endpoint state) and its bookings on its own GPU links leave the
// fabric. A handoff checks before each leg that its endpoint is still in
// the pool as routed (HandoffConfig.Live) and places the request again if
// not.
//
// The estimates use engine.Profile.StepTime, the step-time model the
// simulator's engines run on (through engine.StepCost). A queue or a
// prefill of many budget-sized steps is priced in closed form
// (StepCost.ChunkedPrefill, within half a nanosecond a step of pricing
// each step), so a candidate with millions of tokens queued costs no more
// to place than an idle one. Planning does no I/O and never reads the
// clock.
//
// # Handoff (handoff.go, wire.go, metrics.go)
//
// Handoff serves one P/D model's requests over HTTP through a Doer passed
// in: vLLM's NixlConnector (a prefill request with max_tokens=1, stream
// false and kv_transfer_params.do_remote_decode, then the original request
// to the decode engine with the returned kv_transfer_params, the same
// X-Request-Id on both: the request's ID with a random suffix, new at each
// placement, so that a re-planned request never reaches a prefill engine
// under the id of a prefill it still holds; a prefill reply without
// kv_transfer_params whose one token ended the request, finish_reason
// "stop", is no failure: vLLM hands over only what its length cap ended,
// and the original request runs whole on the decode engine) or SGLang's
// bootstrap form (bootstrap_host, port
// and a random 63-bit room, lists of one per item for a batched request;
// both legs at once; the decode reply returned). Once an SGLang decode leg
// has answered the client in full, the prefill leg's reply is awaited for
// HandoffConfig.PrefillGrace (default 5s) at most, then the leg is
// cancelled and counted done (the decode's answer means the KV arrived),
// so a stuck prefill engine cannot hold the end of the response. A decode
// answer that is a 200 whose stream opens with an error event (SGLang's
// refusal of a streamed request after its response started, an adapter
// its decode engine does not serve: the stream is that event and [DONE])
// is passed on as it is, nothing placed again, and the prefill leg is
// cancelled as soon as it ended: the decode engine will not take the KV,
// and an SGLang prefill engine keeps the leg in its bootstrap queue,
// uncomputed, until a decode engine does.
// HandoffConfig.Admit routes a request's first placement in place of
// Router.Route: the proxy's queue escape hatch (in line behind the
// requests held, or held when the prefill policy sheds it with "queue").
// It recovers from failed legs (see Handoff), rejects client requests that
// carry handoff fields or endpoint-naming headers, and records Prometheus
// metrics on a registry passed in. An answer's status and headers reach
// the client with its first body byte, as on the aggregated proxy path:
// a leg whose answer breaks before it is a failed leg, placed again (a
// decode leg with its prefill: the decode engine may have pulled the KV
// cache already), or answered 504 if it went silent (Silence). An answer
// that breaks after its first byte ends as the aggregated path ends it:
// an event stream with its broken event terminated, vLLM's error event
// and "data: [DONE]"; any other body, a content-encoded stream too (an
// event appended to it would be corrupt), is left for the caller to abort
// (Result.Abort). Such a break counts against the answering endpoint's
// passive health (the router's fail_threshold consecutive failures eject
// it), and an answer counts as its success only once it has ended whole
// (or its client left, or the drain deadline came), so an engine whose
// streams all break midway is ejected like one that fails before its
// first byte. A stream passed on whole that ends with the engine's own
// error event under a 5xx code (vLLM's 500 for a request its engine
// failed after the 200) counts as its failure too; one with a 4xx code,
// a request it refused, as its success.
//
// Data-parallel endpoints (vLLM --data-parallel-size, SGLang DP
// attention: each rank an endpoint of its own, kvroute.Endpoint
// DataParallelRank) take P/D legs like any other endpoint: every leg, the
// "run whole" fallback too, carries kvroute.HeaderDataParallelRank for its
// rank (a client's copy is refused). vLLM's prefill rank answers with
// kv_transfer_params naming its own engine (remote_engine_id
// <engine_id>_dp<rank>, its own side-channel port), which the handoff
// copies verbatim, so the decode rank pulls from the rank that holds the
// KV; an SGLang handoff picks bootstrap_room so that its remainder modulo
// the prefill's DataParallelSize is the prefill rank (the DP group an
// SGLang decode engine reads from), a batch's rooms DataParallelSize
// apart. The ranks of one URL are one fabric node (NodeOf).
//
// Planner, Fabric and Handoff are safe for concurrent use (Planner.Pick,
// like every Picker, is serialised by its router); DecodePicker is not.
package disagg

// Package bench is kvroute's open-loop HTTP load generator for any
// OpenAI-compatible endpoint: kvroute serve, a bare vLLM or SGLang engine,
// kvroute engine, or anything else that streams chat or text completions.
//
// Run replays a workload (package workload): request i is sent at the run's
// start plus its arrival offset whatever happened to earlier requests, so
// queueing in the server shows up in the measurements instead of slowing the
// client down (open loop). Each request is a streaming POST with
// stream_options.include_usage; bench measures the time to the first content
// chunk (TTFT; a stream that completes without one, its answer empty but
// finished or reported in usage only, has TTFT = E2E), the gaps between content chunks
// (inter-token latency), the end-to-end latency to the end of the stream
// (data: [DONE]), and reads prompt, completion and cached tokens
// (usage.prompt_tokens_details.cached_tokens) from the usage chunk: a
// usage without cached_tokens is 0 cached from an engine that has
// reported the field in the run (vLLM leaves it out when nothing was
// cached), else unknown. The
// X-Kvroute-Endpoint response header, when the router sends it, names the
// engine that served the request.
//
// Every failure is recorded on the request's report.Sample and never stops
// the run: connect (refused or unreachable), dns, timeout, transport,
// http_<status>, midstream (an error event: data: {"error": ...}, an
// event of type error, or llama.cpp's old "error:" line; a choice finished
// with finish_reason "abort" as vLLM ends a request its engine aborted; a
// stream that ends without an answer, no content, no finish_reason and no
// completion tokens, as vLLM ends one that failed before its first token;
// or a broken stream after a 200) and bad_response (also a 200 with a JSON body:
// a server that does not stream, or a body of another type holding no event,
// such as a web page at the URL); a 429 counts as a rejection.
// Result.ErrorExamples keeps, per kind, what the first such failure got (the
// server's error message or the transport error). Run returns an error only for a bad Config (a
// URL that is not http(s), has no host or a port out of 1-65535, a missing
// model) or requests out of arrival order.
//
// Concurrency: Run starts one goroutine per in-flight request, at most
// Config.MaxInFlight at once; when the cap is reached the next request waits
// for a slot (Result.Delayed counts those). Run waits for every goroutine it
// started before it returns, also when its context is cancelled (or its
// deadline passes, which is no request's timeout): in-flight
// requests are then cancelled, and recorded apart in Result.Interrupted
// (kind interrupted), not in Samples: cut short, they have no outcome, and
// counted as failures they would distort the run's error rate.
//
// Config.Collector receives each sample as its request finishes, for
// figures while the run goes on (kvroute demo's live line). Oracle is the
// bound on a row's hit rate (the oracle% column) over the same requests the
// hit rate counts, carried over consecutive runs against one server.
//
// Results feed the shared report format: Result.Summary gives a report.Row,
// report.Occupancy the in-flight requests over time per engine; the command
// (kvroute bench) prints the same table, JSON, CSV and HTML as kvroute sim.
package bench

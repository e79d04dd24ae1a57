// Package config holds the configuration of kvroute's router (kvroute serve)
// as plain structs.
//
// The life cycle follows provision -> validate -> use: the caller (cmd/kvroute,
// which owns file and flag parsing) fills a Config, calls ApplyDefaults to
// replace zero values by the documented defaults, then Validate, which reports
// every problem with the field path and the bad value, e.g.
//
//	models[0].endpoints[2].url: "htp://x" is not an http(s) URL
//
// Field paths use the YAML names of the fields. Struct tags give those names;
// this package does not read files. Parse decodes YAML bytes strictly, and its
// decoding errors name the line, on one line (line 3: unknown field "modelz"),
// then applies the defaults and validates; Decode stops after the decoding,
// the configuration as written (what a reload takes: proxy.Proxy.Reload).
// A field tagged zero:"<hint>" is one whose default replaces 0 where a user
// writing 0 means something else (no limit, none, off): Decode refuses a 0
// written for it (0, 0.0, for a duration 0s or "0", for a string ""),
// naming the field and the hint, what to write instead (timeouts.shutdown:
// 1ms to close at once; retry.attempts: 1 for no retries;
// health_check.interval: disabled to turn checks off). Fields where 0 has
// a meaning of its own document it (kv_capacity_tokens: learnt;
// policy.seed: random; timeouts.upstream_header: no limit;
// kv_events.replay_buffer_steps: vLLM's default).
//
// An endpoint with data_parallel_size N > 1 (one vLLM server in front of N
// data-parallel engine cores) stays one entry here; KVEndpoints expands it
// into N routing endpoints, ID#dp0 ... ID#dp<N-1> (Endpoint.RankID; from
// data_parallel_start_rank S on a node of a multi-node deployment: ID#dp<S>
// ...), and DataParallelAddress gives each rank's KV-event addresses (the
// tcp port plus the rank, as vLLM's publishers bind them). Validate refuses it
// (and a discovery template's data_parallel_size above 1) with non-vLLM
// metrics unless scraping is off, with KV-event addresses vLLM
// cannot offset (ipc://) or whose ports would pass 65535, and, with
// pd.protocol sglang, as a prefill endpoint with a data_parallel_start_rank.
// In a prefill/decode pool its ranks are prefill or decode endpoints like any
// other.
//
// A model's adapters (LoRA adapter names clients send as the model) are
// the whole set its pool serves; an endpoint's adapters pick from them (an
// engine with its own --lora-modules; none: every adapter). Validate
// refuses an adapter name that is empty or is another model's name or
// adapter, an endpoint's adapter not in its model's list, and a model
// adapter no endpoint serves (AdapterModel finds an adapter's model).
//
// Policy names and parameters are checked by whoever builds the pickers
// (package proxy, with policy.New); Validate checks only that a name is set.
//
// A Config is a value: it is not safe to mutate concurrently with its use.
package config

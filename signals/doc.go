// Package signals gives the router its view of each engine: metrics scraped
// from the engine's /metrics (vLLM, vLLM before 0.12, SGLang, llama.cpp,
// TGI), the router's own dispatches layered on top of them (View), and the
// engine's KV-cache events (Subscriber) that feed the precise prefix index.
//
// # The stale-signal model
//
// A scrape is a photograph of the engine taken at some instant S; by the time
// the router decides, the photograph is old and the router has sent more
// requests since. A View keeps the last photograph and the transitions the
// router itself caused or witnessed after S, and adds them up:
//
//	time ──────────────────────────────────────────────────────────────────►
//	        S1 (scrape sent)              S2 (scrape sent)       now
//	        │ engine: W=2 R=5             │ engine: W=3 R=6       │
//	   d1 ──┤   d2    d3   ft1   done4    │   d5    d6   ft2      │ Load(now)
//	        │   └─────┴────┴─────┴─ log ──┼──►dropped (in S2)     │
//	        │                             │   └─────┴────┴─ log ──┤
//	                                        Load = W,R of S2 + transitions after S2
//
// The transitions:
//
//	Dispatch  (d)         waiting +1, KV tokens +prompt
//	FirstToken (ft)       waiting -1, running +1 (the engine moved it to decode)
//	Done before its ft    waiting -1, KV tokens -prompt
//	Done after its ft     running -1, KV tokens -prompt
//
// Reconciliation: when a scrape sampled at S arrives (Observe), every
// transition at or before S is assumed visible in the engine's own numbers
// and dropped from the log; transitions after S stay on top of the new
// numbers. Nothing is counted twice, and a burst of dispatches between two
// scrapes raises the endpoint's Waiting at once, so the burst does not pile
// onto the node that looked emptiest in the last scrape. The scraper passes
// the time the scrape request was sent as S: a dispatch racing the scrape is
// then counted on top until the next scrape, which errs towards over-counting
// load rather than under-counting it. KV usage moves by the prompt tokens of
// the same transitions divided by the KV capacity (from
// vllm:cache_config_info or configuration).
//
// Staleness: once the photograph is older than ViewConfig.StaleAfter
// (default 1s), or MaxConsecutiveErrors scrapes in a row failed, Load
// reports Stale and falls back on router-local counts alone: Waiting =
// requests in flight without a first token, Running = those with one.
// Failed scrapes are counted and reported (Snapshot), never silently
// trusted. InFlight, InFlightTokens and DecodeTokens are always router-local
// and so always fresh.
//
// The prefix-cache hit rate is the rate of the engine's token counters over
// the scrapes of the last ViewConfig.HitRateWindow (a counter going down
// means the engine restarted and starts a new window).
//
// A View never reads the clock: callers (the proxy with time.Now, the
// simulator with virtual time) pass now in. Views are safe for concurrent
// use.
package signals

// Package ui is kvroute's live fleet dashboard: one page, served at /ui from
// assets embedded in the binary (plain HTML, CSS and JavaScript written by
// hand: no CDN, no fonts or scripts from the internet, no build step), that
// shows
//
//   - the fleet: every endpoint's role, health, waiting and running requests,
//     KV-cache usage, prefix hit rate, signal age (stale signals marked;
//     "never" for an endpoint never scraped) and the router's own in-flight
//     requests;
//   - the live decision feed: each request's chosen endpoint and every
//     candidate's score, with the candidates' inputs (their signal age too,
//     "never" where router.CandidateInput.SignalAgeMS is null) and the
//     score's named parts one click away (the explanation the policy itself
//     produced);
//   - charts over time: TTFT p50/p99, throughput, prefix hit rate and the
//     per-endpoint load, drawn as inline SVG by the page's own script, and for
//     a demo run the policy comparison;
//   - the policy switch, which calls the router's admin API (PUT
//     /admin/policy) with the admin token the user types in: the page never
//     holds a privilege of its own, and shows the API's refusal as it is.
//
// The page polls GET <prefix>/api/state once a second. The Dashboard builds
// that state from a Source (the routers: *proxy.Proxy implements it), an
// optional prometheus.Gatherer (the router's kvroute_requests_total gives
// throughput; kvroute_upstream_ttfb_seconds and, for P/D models,
// kvroute_pd_stage_seconds{stage="ttfb"} give TTFT) and, for a demo, the
// run's phases and results. The load chart is kept per model (endpoint IDs
// are unique per model only) and shows the model picked.
//
// Time series: Sample takes one point (at most one per SampleEvery,
// SampleNow one whatever the last one's age); the demo calls it from its
// ticker and `kvroute serve` once a second (the proxy's Serve runs that
// loop), and a poll of the state takes a point when the last one is older
// than that. Each point holds the router's counters' increase since the
// previous one, per series (a removed endpoint's deleted series is no
// reset); the first point only sets their baselines. Endpoints that left
// their pool leave the load chart once their last point is out of the
// History. TTFT quantiles are estimated from the histogram buckets as
// Prometheus' histogram_quantile does (linear within a bucket), and the page
// says so. A demo run (RunState.Current) gives the summary tiles its
// running phase's report row instead, the load generator's own
// measurements, so that the tiles, the comparison and the demo's terminal
// line show one set of figures (the state's totals say which: source
// "router" or "client"). A hit rate that is unknown (the engines report no
// cached tokens) shows "–", as does a comparison row's latency when none of
// its requests completed (never marked the best).
//
// A disaggregated (prefill/decode) pool shows policy "pd", as its decisions
// name it, with the configured policy as the prefill stage's.
//
// A Dashboard is safe for concurrent use and starts no goroutines.
package ui

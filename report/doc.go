// Package report is the one report format of kvroute sim and kvroute bench:
// per-run rows of latency percentiles, throughput, goodput, cache hit rates,
// load balance and errors, rendered as a terminal table, JSON, CSV, and an
// offline HTML page with inline SVG charts (also written as standalone .svg
// files).
//
// # Producing a report
//
// Drivers feed one Sample per request into a Collector (safe for concurrent
// use), then call Collector.Summary(SummaryOptions) to get a Row: exact
// nearest-rank percentiles of TTFT, TPOT (per-request mean time per output
// token after the first), inter-token latency and end-to-end latency;
// throughput and goodput under an SLO; prefix-cache hit rate in tokens; the
// busiest engine's request share over the mean (Imbalance). Fields the
// collector cannot know (OracleHitRate, extra Preemptions, the fleet's
// engine names) come in through SummaryOptions, and a driver may adjust the
// Row afterwards. Rows go into a Report with a title, source ("sim" or
// "bench"), workload name, SLO and settings; several rows with one Name at
// different Load values form a sweep. Utilisation carries per-engine time
// series.
//
//	c := report.NewCollector()
//	c.Add(report.Sample{ID: "r1", Engine: "e0", TTFT: 80 * time.Millisecond, E2E: time.Second,
//		PromptTokens: 900, CachedTokens: 512, OutputTokens: 40})
//	row := c.Summary(report.SummaryOptions{Name: "kv-aware", SLO: report.SLO{TTFT: 2 * time.Second}})
//	rep := &report.Report{Title: "kvroute sim", Source: "sim", Rows: []report.Row{row}}
//	rep.WriteTable(os.Stdout)
//	rep.WriteDir("out") // report.json, report.csv, report.txt, report.html, *.svg
//
// # Outputs
//
// WriteTable aligns columns for a terminal; WriteCSV writes durations in
// milliseconds and rates as fractions; WriteJSON writes durations in
// nanoseconds (ReadJSON reads it back); WriteHTML embeds Charts() as inline
// SVG: the TTFT CDF per row (per name at its highest load in a sweep), p99
// TTFT and goodput against load (sweeps), and per-engine utilisation over
// time. No script, stylesheet or font is fetched.
//
// Progress is a tiny terminal progress bar that draws only when its writer
// is a terminal.
package report

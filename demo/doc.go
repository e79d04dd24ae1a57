// Package demo is `kvroute demo`: the whole system in one process on
// loopback. Run starts N emulated vLLM engines (package emulator, with small
// KV caches so that spreading shared prefixes over every engine thrashes
// them), the router in front of them (package proxy, with its signal scrape
// loops and health checks), the live dashboard (package ui) and a workload
// (multi-turn chat, shared system prompts and a hot-prefix burst from package
// workload) replayed open-loop by package bench. The same workload then
// replays through each comparison policy, on cold caches behind a fresh
// router, and Run prints the side-by-side table and writes the report files
// (package report). The live line each phase prints, the dashboard's
// summary tiles and the table's row come from the same samples, the load
// generator's measurements, computed the same way (report.Summarize): the
// phase's last line shows its row's figures.
//
// One HTTP server serves the dashboard at /ui and the current router
// everywhere else (the OpenAI API, /metrics, /debug/*, PUT /admin/policy).
//
// Every goroutine Run starts belongs to one errgroup and is awaited before
// Run returns; cancelling its context (Ctrl-C) stops the load, the router,
// the server and the engines, and Run returns the policies finished so far.
package demo

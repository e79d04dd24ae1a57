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
// decoding errors name the line, on one line (line 3: unknown field "modelz").
//
// Policy names and parameters are checked by whoever builds the pickers
// (package proxy, with policy.New); Validate checks only that a name is set.
//
// A Config is a value: it is not safe to mutate concurrently with its use.
package config

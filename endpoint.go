package kvroute

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Role is what an endpoint does in a model's pool.
type Role uint8

const (
	// RoleBoth serves whole requests (prefill and decode). It is the zero value.
	RoleBoth Role = iota
	// RolePrefill computes prompts and hands their KV cache to a decode node.
	RolePrefill
	// RoleDecode receives KV caches from prefill nodes and generates tokens.
	RoleDecode
)

// String returns the role's configuration name: both, prefill or decode.
func (r Role) String() string {
	switch r {
	case RoleBoth:
		return "both"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// ParseRole parses a role name; the empty string is RoleBoth.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "both":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return 0, fmt.Errorf("parse role: %q is not one of both, prefill, decode", s)
}

// CanPrefill reports whether the role computes prompts.
func (r Role) CanPrefill() bool { return r == RoleBoth || r == RolePrefill }

// CanDecode reports whether the role generates tokens.
func (r Role) CanDecode() bool { return r == RoleBoth || r == RoleDecode }

// Endpoint is one inference engine serving one model. Endpoints are immutable
// once built; the router replaces them wholesale on reconfiguration.
type Endpoint struct {
	// ID names the endpoint in metrics, logs and decisions. It is unique within
	// a model's pool; by default it is the URL.
	ID string
	// URL is the engine's base URL, e.g. http://10.0.0.7:8000.
	URL string
	// Role is the endpoint's role in the pool; default both.
	Role Role
	// Weight scales the endpoint's share of the load, from 1 to MaxWeight;
	// default 1 (the zero value). Package policy's round_robin, random,
	// least_request, power_of_two and kv-aware honour it (an endpoint of
	// weight 2 takes about twice the requests of one of weight 1, or twice
	// the in-flight load before it counts as loaded); the peers' policies
	// (sglang-cache-aware, llm-d, dynamo, kubeai-chwbl, preble-e2) do not:
	// their published algorithms have no weights.
	Weight int
	// Labels are free-form (zone, node, gpu, link); disaggregation uses them to
	// find the fabric link between two endpoints.
	Labels map[string]string
	// KVCapacityTokens is the engine's KV-cache capacity in tokens when known
	// from config; 0 means learn it from the engine's metrics.
	KVCapacityTokens int
	// DataParallelSize, when above 1, makes the endpoint one rank of a
	// data-parallel engine (vLLM --data-parallel-size): that many engine
	// cores, each with its own KV cache, behind one URL. The zero value (and
	// 1) is a plain endpoint.
	DataParallelSize int
	// DataParallelRank is, when DataParallelSize > 1, the endpoint's place
	// among the ranks behind its URL, 0 to DataParallelSize-1: the value of
	// HeaderDataParallelRank that pins its requests to it (vLLM's server
	// indexes its own engine cores so; with --data-parallel-start-rank S
	// their global ranks are S and up, which the ID names).
	DataParallelRank int
	// Adapters restricts the LoRA adapters of the model the endpoint
	// serves (an engine started with its own --lora-modules), sorted (the
	// router sorts a copy of a list that is not); empty (the default)
	// serves every adapter of the model.
	Adapters []string
}

// ServesAdapter reports whether the endpoint serves LoRA adapter adapter
// of its model; every endpoint serves the base model ("").
func (e *Endpoint) ServesAdapter(adapter string) bool {
	if adapter == "" || len(e.Adapters) == 0 {
		return true
	}
	_, ok := slices.BinarySearch(e.Adapters, adapter)
	return ok
}

// MaxWeight is the largest Endpoint.Weight: far above any real ratio of
// engine sizes, and low enough that weighted sums and products of weights
// and loads stay exact in an int64.
const MaxWeight = 1_000_000

// LabelBootstrapPort is the endpoint label that gives a prefill engine's
// SGLang bootstrap port (the disaggregated handoff reads it; the
// configuration checks it is a port).
const LabelBootstrapPort = "bootstrap_port"

// HeaderDataParallelRank is the request header that pins a request to one
// data-parallel rank of an engine (vLLM's OpenAI server and SGLang read it,
// case-insensitively).
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

// IsDataParallel reports whether e is one rank of a data-parallel engine.
func (e *Endpoint) IsDataParallel() bool { return e.DataParallelSize > 1 }

// SameEngine reports whether e and o, of one ID, name the same engine in
// the same role: the same URL, place among its data-parallel ranks and
// role. An ID whose engine is not the same (an endpoint change put another
// engine, or another role, under it) has learned nothing of the old one:
// health, learned rates and pins do not carry over.
func (e *Endpoint) SameEngine(o *Endpoint) bool {
	return e.URL == o.URL && e.DataParallelSize == o.DataParallelSize && e.DataParallelRank == o.DataParallelRank &&
		e.Role == o.Role
}

// DataParallelID is the ID of data-parallel rank rank of the endpoint
// configured as id: id#dp<rank>, e.g. gpu-0#dp1.
func DataParallelID(id string, rank int) string {
	return id + "#dp" + strconv.Itoa(rank)
}

package kvroute

import (
	"fmt"
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
	// Weight scales the endpoint's share of load for policies that use weights;
	// default 1.
	Weight int
	// Labels are free-form (zone, node, gpu, link); disaggregation uses them to
	// find the fabric link between two endpoints.
	Labels map[string]string
	// KVCapacityTokens is the engine's KV-cache capacity in tokens when known
	// from config; 0 means learn it from the engine's metrics.
	KVCapacityTokens int
}

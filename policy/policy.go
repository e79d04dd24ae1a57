package policy

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// Policy names accepted by New.
const (
	NameKVAware          = "kv-aware"
	NameRoundRobin       = "round_robin"
	NameRandom           = "random"
	NameLeastRequest     = "least_request"
	NamePowerOfTwo       = "power_of_two"
	NameSGLangCacheAware = "sglang-cache-aware"
	NameLLMD             = "llm-d"
	NameDynamo           = "dynamo"
	NameKubeAICHWBL      = "kubeai-chwbl"
	NamePrebleE2         = "preble-e2"
)

// Default is the policy used when none is configured.
const Default = NameKVAware

type constructor func(params map[string]any, seed uint64) (kvroute.Picker, error)

// constructors maps each policy name to its constructor. It is read-only.
var constructors = map[string]constructor{
	NameKVAware:          func(p map[string]any, s uint64) (kvroute.Picker, error) { return NewKVAware(p, s) },
	NameRoundRobin:       func(p map[string]any, s uint64) (kvroute.Picker, error) { return newRoundRobin(p, s) },
	NameRandom:           func(p map[string]any, s uint64) (kvroute.Picker, error) { return newRandom(p, s) },
	NameLeastRequest:     func(p map[string]any, s uint64) (kvroute.Picker, error) { return newLeastRequest(p, s) },
	NamePowerOfTwo:       func(p map[string]any, s uint64) (kvroute.Picker, error) { return newPowerOfTwo(p, s) },
	NameSGLangCacheAware: func(p map[string]any, s uint64) (kvroute.Picker, error) { return newSGLang(p, s) },
	NameLLMD:             func(p map[string]any, s uint64) (kvroute.Picker, error) { return newLLMD(p, s) },
	NameDynamo:           func(p map[string]any, s uint64) (kvroute.Picker, error) { return newDynamo(p, s) },
	NameKubeAICHWBL:      func(p map[string]any, s uint64) (kvroute.Picker, error) { return newKubeAI(p, s) },
	NamePrebleE2:         func(p map[string]any, s uint64) (kvroute.Picker, error) { return newPreble(p, s) },
}

// New builds the named policy with its params (nil or empty = all defaults)
// and a seed for its random choices (the same seed gives the same decisions
// for the same inputs). An unknown name, an unknown param or a param of the
// wrong type or range is an error that names it. The empty name is Default.
func New(name string, params map[string]any, seed uint64) (kvroute.Picker, error) {
	if name == "" {
		name = Default
	}
	c, ok := constructors[name]
	if !ok {
		return nil, fmt.Errorf("policy: unknown policy %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return c(params, seed)
}

// Names returns the policy names New accepts, sorted.
func Names() []string {
	names := make([]string, 0, len(constructors))
	for n := range constructors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newRand returns the deterministic generator every policy draws from.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// scoreBuf holds a picker's explanation buffers, reused across calls: a
// decision's Scores and their Parts stay valid until the picker's next Pick
// (the router copies them into its decision log; copy them to keep them).
type scoreBuf struct {
	scores []kvroute.Score
	parts  []kvroute.Part
}

// get returns one Score per candidate, named and marked eligible when
// healthy, each with room for nparts Parts, all carved from the reused
// buffers: no allocation once the buffers have grown to the fleet's size.
func (b *scoreBuf) get(cands []kvroute.Candidate, nparts int) []kvroute.Score {
	n := len(cands)
	if cap(b.scores) < n {
		b.scores = make([]kvroute.Score, n)
	}
	b.scores = b.scores[:n]
	if need := n * nparts; cap(b.parts) < need {
		b.parts = make([]kvroute.Part, need)
	}
	for i := range cands {
		s := &b.scores[i]
		*s = kvroute.Score{Endpoint: endpointID(&cands[i]), Eligible: cands[i].Healthy}
		if !cands[i].Healthy {
			s.Why = "unhealthy"
		}
		if nparts > 0 {
			s.Parts = b.parts[i*nparts : i*nparts : (i+1)*nparts]
		}
	}
	return b.scores
}

// swap takes scores and parts as the buffers of the next get and returns
// the current ones, which back the last decision's Scores: the caller owns
// them from now on (router.ScoreRecycler).
func (b *scoreBuf) swap(scores []kvroute.Score, parts []kvroute.Part) ([]kvroute.Score, []kvroute.Part) {
	oldScores, oldParts := b.scores, b.parts
	b.scores, b.parts = scores[:0], parts[:0]
	return oldScores, oldParts
}

func endpointID(c *kvroute.Candidate) string {
	if c.Endpoint == nil {
		return ""
	}
	return c.Endpoint.ID
}

// sameString reports whether a == b, without a call when they are the same
// string (same bytes in memory): a candidate's ID is, from one Pick to the
// next, and Pick compares one per candidate (a string comparison calls
// the runtime whenever the lengths are equal).
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// weight returns c's endpoint weight (kvroute.Endpoint.Weight): 1 when it
// is unset (0 or below) or c has no endpoint, as the router defaults it,
// and at most kvroute.MaxWeight (the router refuses more).
func weight(c *kvroute.Candidate) int {
	if c.Endpoint == nil || c.Endpoint.Weight <= 0 {
		return 1
	}
	return min(c.Endpoint.Weight, kvroute.MaxWeight)
}

// equalWeights reports whether every healthy candidate has the same weight:
// the weight-aware policies then decide exactly as if there were none.
func equalWeights(cands []kvroute.Candidate) bool {
	w := 0
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		switch wi := weight(&cands[i]); {
		case w == 0:
			w = wi
		case wi != w:
			return false
		}
	}
	return true
}

// chose returns a decision for candidate i with the given scores.
func chose(policy string, cands []kvroute.Candidate, i int, reason string, scores []kvroute.Score) kvroute.Decision {
	return kvroute.Decision{Index: i, Endpoint: endpointID(&cands[i]), Policy: policy, Reason: reason, Scores: scores}
}

// noneHealthy is the decision when no candidate is healthy.
func noneHealthy(policy string, cands []kvroute.Candidate, scores []kvroute.Score) kvroute.Decision {
	d := kvroute.None(policy, "no healthy candidate")
	if len(cands) == 0 {
		d.Reason = "no candidates"
	}
	d.Scores = scores
	return d
}

// pickTwo returns two distinct random members of idx (idx must hold >= 2).
func pickTwo(r *rand.Rand, idx []int) (int, int) {
	n := len(idx)
	a := r.IntN(n)
	b := r.IntN(n - 1)
	if b >= a {
		b++
	}
	return idx[a], idx[b]
}

// chwblOK is the bounded-load test of consistent hashing with bounded loads
// in the form KubeAI uses (internal/loadbalancer/balance_chwbl.go,
// chwblLoadOK): an endpoint may take one more request when
// load+1 <= (total+1)/n * factor; with no load anywhere every endpoint is OK.
func chwblOK(load, total, n int, factor float64) bool {
	if total == 0 {
		return true
	}
	return float64(load)+1 <= float64(total+1)/float64(n)*factor
}

// pendingSweepMin is the size of a picker's per-request state (requests
// routed and not yet released) above which a Pick sweeps it for entries
// past their TTL at once rather than at its next 4096th Pick; after a
// sweep, the next waits until the state doubles. A sweep is a pass over
// every entry: with more requests than that in flight, each Pick swept
// them all while none was stale (65,536 entries, about a millisecond a
// decision, under the router's lock).
const pendingSweepMin = 1 << 16

// orEmpty returns req, or an empty request for a nil one (a bad call must not
// panic the router).
func orEmpty(req *kvroute.Request) *kvroute.Request {
	if req == nil {
		return &kvroute.Request{}
	}
	return req
}

// OverloadAction returns what a shed decision asks the caller to do: "shed"
// (answer 429 with Retry-After) or "queue" (hold the request for a bounded
// wait and pick again); "" when d is not a shed decision. A policy that sheds
// starts its Reason with the action and a colon (kv-aware's Overload param).
func OverloadAction(d kvroute.Decision) string {
	if !d.Shed {
		return ""
	}
	if strings.HasPrefix(d.Reason, OverloadQueue+":") {
		return OverloadQueue
	}
	return OverloadShed
}

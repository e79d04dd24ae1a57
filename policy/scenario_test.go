package policy

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
)

// scenario is a golden decision test: a policy, and a sequence of steps, each
// a table of endpoint states and a request in.
type scenario struct {
	Policy string         `json:"policy"`
	Params map[string]any `json:"params,omitempty"`
	Seed   uint64         `json:"seed"`
	Steps  []step         `json:"steps"`
}

type step struct {
	// AtMs is the step's time in ms after the scenario's epoch.
	AtMs       int64      `json:"at_ms"`
	Request    reqSpec    `json:"request"`
	Candidates []candSpec `json:"candidates"`
	// Release lists request IDs to Release before this step's pick.
	Release []string `json:"release,omitempty"`
}

type reqSpec struct {
	ID           string   `json:"id"`
	Tenant       string   `json:"tenant,omitempty"`
	SessionKey   string   `json:"session_key,omitempty"`
	Prompt       string   `json:"prompt,omitempty"`
	PromptTokens int      `json:"prompt_tokens"`
	MaxTokens    int      `json:"max_tokens,omitempty"`
	BlockSize    int      `json:"block_size,omitempty"`
	BlockHashes  []uint64 `json:"block_hashes,omitempty"`
	// Blocks and BlockSeed generate BlockHashes seed*1000+1 .. seed*1000+Blocks.
	Blocks    int    `json:"blocks,omitempty"`
	BlockSeed uint64 `json:"block_seed,omitempty"`
	// Adapter is the LoRA adapter requested ("": the base model).
	Adapter string `json:"adapter,omitempty"`
}

type candSpec struct {
	ID             string  `json:"id"`
	Unhealthy      bool    `json:"unhealthy,omitempty"`
	Waiting        int     `json:"waiting,omitempty"`
	Running        int     `json:"running,omitempty"`
	KVUsage        float64 `json:"kv_usage,omitempty"`
	InFlight       int     `json:"in_flight,omitempty"`
	InFlightTokens int     `json:"in_flight_tokens,omitempty"`
	DecodeTokens   int     `json:"decode_tokens,omitempty"`
	CachedBlocks   int     `json:"cached_blocks,omitempty"`
	CachedTokens   int     `json:"cached_tokens,omitempty"`
	Tier           string  `json:"tier,omitempty"`
	// Evicts and HorizonMs are the router's record of its cache: no room
	// for the prompt's uncached blocks, and then the age of its least
	// recent entry.
	Evicts    bool    `json:"evicts,omitempty"`
	HorizonMs float64 `json:"horizon_ms,omitempty"`
	// LoRARunning, LoRAWaiting and MaxLoRA are the engine's adapters
	// (vllm:lora_requests_info); none set: it reports none.
	LoRARunning []string `json:"lora_running,omitempty"`
	LoRAWaiting []string `json:"lora_waiting,omitempty"`
	MaxLoRA     int      `json:"max_lora,omitempty"`
	// Role is the endpoint's P/D role ("": both).
	Role string `json:"role,omitempty"`
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (r reqSpec) build() *kvroute.Request {
	req := &kvroute.Request{ID: r.ID, Tenant: r.Tenant, SessionKey: r.SessionKey, Prompt: r.Prompt,
		PromptTokens: r.PromptTokens, MaxTokens: r.MaxTokens, BlockSize: r.BlockSize, BlockHashes: r.BlockHashes, Adapter: r.Adapter}
	if req.BlockSize == 0 {
		req.BlockSize = 16
	}
	if req.BlockHashes == nil && r.Blocks > 0 {
		for i := 1; i <= r.Blocks; i++ {
			req.BlockHashes = append(req.BlockHashes, r.BlockSeed*1000+uint64(i))
		}
	}
	return req
}

func (c candSpec) build(blockSize, prompt int) (kvroute.Candidate, error) {
	cand := kvroute.Candidate{
		Endpoint: &kvroute.Endpoint{ID: c.ID, URL: "http://" + c.ID},
		Healthy:  !c.Unhealthy,
		Load: kvroute.Load{Waiting: c.Waiting, Running: c.Running, KVUsage: c.KVUsage, InFlight: c.InFlight,
			InFlightTokens: c.InFlightTokens, DecodeTokens: c.DecodeTokens, PrefixHitRate: -1},
		CachedBlocks: c.CachedBlocks,
		CachedTokens: c.CachedTokens,
		Evicts:       c.Evicts,
		Horizon:      time.Duration(c.HorizonMs * float64(time.Millisecond)),
	}
	role, err := kvroute.ParseRole(c.Role)
	if err != nil {
		return kvroute.Candidate{}, err
	}
	cand.Endpoint.Role = role
	if c.LoRARunning != nil || c.LoRAWaiting != nil || c.MaxLoRA > 0 {
		cand.Load.LoRA = &kvroute.LoRALoad{Running: c.LoRARunning, Waiting: c.LoRAWaiting, Max: c.MaxLoRA}
	}
	if cand.CachedTokens == 0 && c.CachedBlocks > 0 {
		cand.CachedTokens = min(c.CachedBlocks*blockSize, prompt)
	}
	switch c.Tier {
	case "", "gpu":
		if cand.CachedBlocks > 0 {
			cand.Tier = kvroute.TierGPU
		}
	case "cpu":
		cand.Tier = kvroute.TierCPU
	default:
		return cand, fmt.Errorf("candidate %s: unknown tier %q", c.ID, c.Tier)
	}
	return cand, nil
}

// run plays the scenario and returns one decision per step.
func (s scenario) run() ([]kvroute.Decision, error) {
	p, err := New(s.Policy, s.Params, s.Seed)
	if err != nil {
		return nil, err
	}
	reqs := map[string]*kvroute.Request{}
	var out []kvroute.Decision
	for _, st := range s.Steps {
		now := epoch.Add(time.Duration(st.AtMs) * time.Millisecond)
		for _, id := range st.Release {
			r, ok := reqs[id]
			if !ok {
				return nil, fmt.Errorf("release of unknown request %q", id)
			}
			if rel, ok := p.(kvroute.Releaser); ok {
				rel.Release(now, r, "")
			}
		}
		req := st.Request.build()
		reqs[req.ID] = req
		cands := make([]kvroute.Candidate, len(st.Candidates))
		for i, c := range st.Candidates {
			if cands[i], err = c.build(req.BlockSize, req.PromptTokens); err != nil {
				return nil, err
			}
		}
		// Scores are valid until the next Pick: keep a copy.
		out = append(out, cloneDecision(p.Pick(now, req, cands)))
	}
	return out, nil
}

func parseScenario(b []byte) (scenario, error) {
	var s scenario
	err := json.Unmarshal(b, &s)
	return s, err
}

func cloneDecision(d kvroute.Decision) kvroute.Decision {
	if d.Scores == nil {
		return d
	}
	scores := make([]kvroute.Score, len(d.Scores))
	for i, sc := range d.Scores {
		sc.Parts = append([]kvroute.Part(nil), sc.Parts...)
		scores[i] = sc
	}
	d.Scores = scores
	return d
}

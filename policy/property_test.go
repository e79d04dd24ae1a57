package policy

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// randomState returns n candidates with random health, load and cache, and a
// request whose blocks they may hold.
func randomState(r *rand.Rand, n int, withCache bool) (*kvroute.Request, []kvroute.Candidate) {
	blocks := 1 + r.IntN(256)
	req := &kvroute.Request{ID: "r" + strconv.Itoa(r.IntN(1<<30)), PromptTokens: blocks*16 - r.IntN(16), BlockSize: 16,
		Prompt: "4:user," + strconv.Itoa(r.IntN(100)) + ","}
	for i := 0; i < blocks; i++ {
		req.BlockHashes = append(req.BlockHashes, uint64(i+1))
	}
	if r.IntN(4) == 0 {
		req.SessionKey = "s" + strconv.Itoa(r.IntN(20))
	}
	if r.IntN(3) == 0 {
		req.Tenant = "t" + strconv.Itoa(r.IntN(3))
	}
	cands := make([]kvroute.Candidate, n)
	for i := range cands {
		run := r.IntN(40)
		l := kvroute.Load{Waiting: r.IntN(20), Running: run, KVUsage: r.Float64(), InFlight: r.IntN(40),
			InFlightTokens: r.IntN(40000), DecodeTokens: run * r.IntN(4000), PrefixHitRate: -1}
		c := kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: "ep" + strconv.Itoa(i)}, Healthy: r.IntN(5) != 0, Load: l}
		if withCache && r.IntN(2) == 0 {
			c.CachedBlocks = r.IntN(blocks + 1)
			c.CachedTokens = min(c.CachedBlocks*16, req.PromptTokens)
			c.Tier = kvroute.TierGPU
			if r.IntN(5) == 0 {
				c.Tier = kvroute.TierCPU
			}
		}
		cands[i] = c
	}
	return req, cands
}

// TestPropertyNeverUnhealthy: no policy ever chooses an unhealthy candidate,
// and every policy chooses someone when a healthy candidate exists.
func TestPropertyNeverUnhealthy(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	for _, name := range Names() {
		p, err := New(name, nil, 1)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 400; k++ {
			req, cands := randomState(r, 1+r.IntN(12), true)
			now := epoch.Add(time.Duration(k) * time.Second)
			d := p.Pick(now, req, cands)
			healthy := false
			for _, c := range cands {
				healthy = healthy || c.Healthy
			}
			switch {
			case d.Index >= 0 && !cands[d.Index].Healthy:
				t.Fatalf("%s chose unhealthy %s", name, d.Endpoint)
			case d.Index < 0 && healthy && !d.Shed:
				t.Fatalf("%s chose nobody with healthy candidates: %s", name, d.Reason)
			case d.Index >= 0 && d.Endpoint != cands[d.Index].Endpoint.ID:
				t.Fatalf("%s: Endpoint %q does not match Index %d", name, d.Endpoint, d.Index)
			case len(d.Scores) != len(cands):
				t.Fatalf("%s: %d scores for %d candidates", name, len(d.Scores), len(cands))
			}
		}
	}
}

// TestPropertyCappedNeverAffinity: kv-aware never gives a capped candidate
// credit for its cache, never picks a queue- or KV-capped candidate while
// another is under those caps, and explains every candidate's cap.
func TestPropertyCappedNeverAffinity(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	k, _ := NewKVAware(map[string]any{"queue_cap": 12, "kv_cap": 0.8}, 1)
	for it := 0; it < 2000; it++ {
		req, cands := randomState(r, 2+r.IntN(10), true)
		d := k.Pick(epoch, req, cands)
		anyUnder := false
		for _, c := range cands {
			if c.Healthy && c.Load.Waiting < 12 && c.Load.KVUsage < 0.8 {
				anyUnder = true
			}
		}
		for i, s := range d.Scores {
			if !cands[i].Healthy {
				continue
			}
			capped := part(s, "capped") == 1 || part(s, "replica_trimmed") == 1
			if capped && part(s, "cached_tokens") != 0 {
				t.Fatalf("capped %s credited %v cached tokens (%s)", s.Endpoint, part(s, "cached_tokens"), s.Why)
			}
			hard := cands[i].Load.Waiting >= 12 || cands[i].Load.KVUsage >= 0.8
			if hard && !strings.HasPrefix(s.Why, "capped") && !strings.HasPrefix(s.Why, "over queue or KV cap") {
				t.Fatalf("%s over a hard cap but Why = %q", s.Endpoint, s.Why)
			}
			if hard && anyUnder && i == d.Index {
				t.Fatalf("chose %s over a hard cap while another is under", s.Endpoint)
			}
		}
		if d.Index >= 0 && part(d.Scores[d.Index], "capped") == 1 && strings.HasPrefix(d.Reason, "affinity") {
			t.Fatalf("capped %s chosen for affinity: %s", d.Endpoint, d.Reason)
		}
		if d.Index >= 0 {
			k.Release(epoch, req, d.Endpoint)
		}
	}
}

// TestPropertyNoPrefixIsLoadBalancing: without prefix information kv-aware
// picks within the tie tolerance of the lowest load estimate, and a stream
// of requests into identical idle endpoints stays balanced.
func TestPropertyNoPrefixIsLoadBalancing(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 15))
	k, _ := NewKVAware(nil, 1)
	for it := 0; it < 1000; it++ {
		req, cands := randomState(r, 2+r.IntN(10), false)
		req.SessionKey = ""
		d := k.Pick(epoch, req, cands)
		best := math.Inf(1)
		for i, s := range d.Scores {
			if s.Eligible && cands[i].Healthy {
				best = math.Min(best, s.Value)
			}
		}
		if d.Index < 0 {
			continue
		}
		if got := d.Scores[d.Index].Value; got > best+math.Max(1, 0.05*best)+1e-6 {
			t.Fatalf("chose estimate %v, best %v", got, best)
		}
		k.Release(epoch, req, d.Endpoint)
	}
	// Stream: 8 identical endpoints, 200 requests, nothing completes.
	k, _ = NewKVAware(nil, 2)
	cands := make([]kvroute.Candidate, 8)
	for i := range cands {
		cands[i] = kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: "e" + strconv.Itoa(i)}, Healthy: true}
	}
	for it := 0; it < 200; it++ {
		d := k.Pick(epoch, &kvroute.Request{ID: strconv.Itoa(it), PromptTokens: 500}, cands)
		c := &cands[d.Index].Load
		c.InFlight++
		c.Running++
		c.InFlightTokens += 500
	}
	lo, hi := math.MaxInt, 0
	for _, c := range cands {
		lo, hi = min(lo, c.Load.InFlight), max(hi, c.Load.InFlight)
	}
	if hi-lo > 2 {
		t.Errorf("in-flight spread %d..%d after 200 requests, want within 2", lo, hi)
	}
}

// TestPropertyBoundedLoad: every pick by kubeai-chwbl, and every session pick
// by kv-aware, respects its bound on in-flight load as requests arrive and
// end at random.
func TestPropertyBoundedLoad(t *testing.T) {
	r := rand.New(rand.NewPCG(16, 17))
	for _, name := range []string{NameKubeAICHWBL, NameKVAware} {
		p, _ := New(name, nil, 3)
		cands := make([]kvroute.Candidate, 8)
		for i := range cands {
			cands[i] = kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: "e" + strconv.Itoa(i)}, Healthy: true}
		}
		type open struct {
			req *kvroute.Request
			ep  int
		}
		var live []open
		sessions := 0
		for it := 0; it < 3000; it++ {
			if len(live) > 0 && r.IntN(2) == 0 { // one ends
				j := r.IntN(len(live))
				cands[live[j].ep].Load.InFlight--
				if rel, ok := p.(kvroute.Releaser); ok {
					rel.Release(epoch, live[j].req, "")
				}
				live = append(live[:j], live[j+1:]...)
				continue
			}
			key := "user-" + strconv.Itoa(r.IntN(5)) // few hot keys
			req := &kvroute.Request{ID: strconv.Itoa(it), SessionKey: key, PromptTokens: 100,
				Prompt: "4:user," + strconv.Itoa(len(key)) + ":" + key + ","}
			total := 0
			for _, c := range cands {
				total += c.Load.InFlight
			}
			d := p.Pick(epoch, req, cands)
			load := float64(cands[d.Index].Load.InFlight + 1)
			mean := float64(total+1) / 8
			switch {
			case name == NameKubeAICHWBL && !strings.HasPrefix(d.Reason, "every") && total > 0 && load > mean*1.25:
				t.Fatalf("%s: load %v over 1.25 x mean %v", name, load, mean)
			case name == NameKVAware && strings.HasPrefix(d.Reason, "session") && load > math.Max(1.25*mean, mean+DefaultKVAwareParams().InflightSlack):
				t.Fatalf("%s: session pick load %v over its cap (mean %v)", name, load, mean)
			}
			if strings.HasPrefix(d.Reason, "session") {
				sessions++
			}
			cands[d.Index].Load.InFlight++
			live = append(live, open{req, d.Index})
		}
		if name == NameKVAware && sessions < 100 {
			t.Errorf("kv-aware made only %d session picks: the bound is not exercised", sessions)
		}
	}
}

// TestPropertyHotPrefixSpreads: one prefix for every request; the router
// records where it routed, so a chosen endpoint then caches it. kv-aware
// must spread the prefix over several endpoints and keep in-flight load
// within its cap instead of piling everything on the first holder.
func TestPropertyHotPrefixSpreads(t *testing.T) {
	k, _ := NewKVAware(nil, 4)
	const n = 8
	cands := make([]kvroute.Candidate, n)
	for i := range cands {
		cands[i] = kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: "e" + strconv.Itoa(i)}, Healthy: true}
	}
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	type open struct {
		req *kvroute.Request
		ep  int
	}
	var live []open
	got := map[int]int{}
	for it := 0; it < 2000; it++ {
		if len(live) >= 40 { // keep 40 in flight: the oldest ends
			o := live[0]
			live = live[1:]
			cands[o.ep].Load.InFlight--
			cands[o.ep].Load.Running--
			k.Release(epoch, o.req, "")
		}
		req := &kvroute.Request{ID: strconv.Itoa(it), PromptTokens: 1024, BlockSize: 16, BlockHashes: hashes}
		d := k.Pick(epoch, req, cands)
		c := &cands[d.Index]
		c.Load.InFlight++
		c.Load.Running++
		c.CachedBlocks, c.CachedTokens, c.Tier = 64, 1024, kvroute.TierGPU // the router records the route
		live = append(live, open{req, d.Index})
		got[d.Index]++
		total := 0
		for _, c := range cands {
			total += c.Load.InFlight
		}
		// Hits cost no prefill here, so nothing is congested: the bound that
		// holds is twice the in-flight bound.
		if mx := maxInflight(cands); float64(mx) > 2*math.Max(1.25*float64(total)/n, float64(total)/n+k.Params().InflightSlack)+1 {
			t.Fatalf("step %d: an endpoint holds %d of %d in flight", it, mx, total)
		}
	}
	// 40 in flight under a bound of 2 x max(1.25 x 5, 5 + 4) = 18 per node
	// need at least 3 nodes.
	if len(got) < 3 {
		t.Errorf("hot prefix served by %d endpoints (%v), want it spread over at least 3", len(got), got)
	}
}

func maxInflight(cands []kvroute.Candidate) int {
	m := 0
	for _, c := range cands {
		m = max(m, c.Load.InFlight)
	}
	return m
}

// TestKVAwareLearns: observed TTFTs move the learned rates, and a slow
// endpoint is avoided once learned.
func TestKVAwareLearns(t *testing.T) {
	k, _ := NewKVAware(map[string]any{"learn": true, "learn_per_endpoint": true}, 1)
	// TTFT = step overhead (6 ms) + uncached x rate x attention factor
	// (1 + 0.7/20 x 0.5 ktok of context = 1.0175).
	for i := 0; i < 30; i++ {
		// "slow" prefills at 0.1 ms/token, "fast" at 0.01 ms/token.
		k.Observe(epoch, kvroute.Outcome{Endpoint: "slow", PromptTokens: 1000, CachedTokens: 0, TTFT: 107750 * time.Microsecond})
		k.Observe(epoch, kvroute.Outcome{Endpoint: "fast", PromptTokens: 1000, CachedTokens: 0, TTFT: 16175 * time.Microsecond})
	}
	for i := 0; i < 30; i++ {
		// 4 queued requests added 58.825 ms: 14.706 ms each.
		k.Observe(epoch, kvroute.Outcome{Endpoint: "fast", PromptTokens: 1000, CachedTokens: 0, QueueDepth: 4, TTFT: 75 * time.Millisecond})
	}
	if s := k.eps["slow"]; s == nil || math.Abs(s.tokMs-0.1) > 0.001 {
		t.Fatalf("slow tokMs = %+v, want 0.1", s)
	}
	if s := k.eps["fast"]; math.Abs(s.tokMs-0.01) > 0.0001 || math.Abs(s.reqMs-14.706) > 0.01 {
		t.Fatalf("fast rates = %+v, want tok 0.01 ms, req 14.706 ms", s)
	}
	cands := []kvroute.Candidate{
		cand("slow", kvroute.Load{}, 0, 0),
		cand("fast", kvroute.Load{InFlight: 1, Running: 1}, 0, 0),
	}
	d := k.Pick(epoch, &kvroute.Request{ID: "x", PromptTokens: 2000}, cands)
	if d.Endpoint != "fast" {
		t.Errorf("chose %q (%s), want the fast endpoint", d.Endpoint, d.Reason)
	}
}

// TestKVAwareTenantFairness: a tenant over its fair share loses affinity
// where others keep it.
func TestKVAwareTenantFairness(t *testing.T) {
	k, _ := NewKVAware(nil, 1)
	for i := 0; i < 9; i++ { // tenant "big" holds 9 in flight, "small" 1
		k.Pick(epoch, &kvroute.Request{ID: "b" + strconv.Itoa(i), Tenant: "big", PromptTokens: 10}, []kvroute.Candidate{cand("x", kvroute.Load{}, 0, 0)})
	}
	k.Pick(epoch, &kvroute.Request{ID: "s0", Tenant: "small", PromptTokens: 10}, []kvroute.Candidate{cand("x", kvroute.Load{}, 0, 0)})
	cands := []kvroute.Candidate{
		// The holder is congested (more prefill queued than one step takes),
		// which is when fairness applies.
		cand("holder", kvroute.Load{InFlight: 8, Running: 8, InFlightTokens: 9000}, 512, 8192),
		cand("other", kvroute.Load{InFlight: 2, Running: 2}, 0, 0),
	}
	for _, tt := range []struct{ tenant, want string }{{"small", "holder"}, {"big", "other"}} {
		d := k.Pick(epoch, &kvroute.Request{ID: "q" + tt.tenant, Tenant: tt.tenant, PromptTokens: 8192, BlockSize: 16,
			BlockHashes: make([]uint64, 512)}, cands)
		if d.Endpoint != tt.want {
			t.Errorf("tenant %s: chose %q (%s), want %q", tt.tenant, d.Endpoint, d.Reason, tt.want)
		}
		k.Release(epoch, &kvroute.Request{ID: "q" + tt.tenant}, "")
	}
}

// TestKVAwareObserveSkipsDecodeLeg: a decode leg's outcome
// (kvroute.Outcome.Decode) times a KV pull and a decode step, not a
// prefill, so a learner of prefill rates must skip it (the field's doc):
// kv-aware learned from it as from a prefill.
func TestKVAwareObserveSkipsDecodeLeg(t *testing.T) {
	k, _ := NewKVAware(map[string]any{"learn": true, "learn_per_endpoint": true}, 1)
	for i := 0; i < 30; i++ {
		k.Observe(epoch, kvroute.Outcome{Endpoint: "d", PromptTokens: 1000, CachedTokens: 0, TTFT: 900 * time.Millisecond, Decode: true})
		k.Observe(epoch, kvroute.Outcome{Endpoint: "d", PromptTokens: 1000, CachedTokens: 0, QueueDepth: 3, TTFT: 900 * time.Millisecond, Decode: true})
	}
	if s := k.eps["d"]; s != nil && (s.nTok != 0 || s.nReq != 0) {
		t.Fatalf("learned from decode legs: %+v", *s)
	}
	if k.all.nTok != 0 || k.all.nReq != 0 {
		t.Fatalf("fleet rates learned from decode legs: %+v", k.all)
	}
}

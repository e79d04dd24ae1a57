package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute"
)

func cand(id string, l kvroute.Load, cachedBlocks, cachedTokens int) kvroute.Candidate {
	return kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: id}, Healthy: true, Load: l,
		CachedBlocks: cachedBlocks, CachedTokens: cachedTokens, Tier: kvroute.TierGPU}
}

func part(s kvroute.Score, name string) float64 {
	for _, p := range s.Parts {
		if p.Name == name {
			return p.Value
		}
	}
	return -1
}

// TestDynamoWorkedExample reproduces the example of Dynamo's
// docs/architecture/kv_cache_routing.md: prefill blocks 8/5/2 and decode
// blocks 10/5/9 give costs 18/10/11 and worker 2 wins. The current formula
// adds the request's own blocks to every worker's decode blocks, the same
// constant for all, so the ranking is the documented one.
func TestDynamoWorkedExample(t *testing.T) {
	p, _ := New(NameDynamo, nil, 1)
	req := &kvroute.Request{ID: "r", PromptTokens: 160, BlockSize: 16}
	cands := []kvroute.Candidate{
		cand("worker-1", kvroute.Load{DecodeTokens: 10 * 16}, 2, 2*16),
		cand("worker-2", kvroute.Load{DecodeTokens: 5 * 16}, 5, 5*16),
		cand("worker-3", kvroute.Load{DecodeTokens: 9 * 16}, 8, 8*16),
	}
	d := p.Pick(epoch, req, cands)
	if d.Endpoint != "worker-2" {
		t.Fatalf("chose %q, want worker-2 (%s)", d.Endpoint, d.Reason)
	}
	wantPrefill, wantDecode, wantCost := []float64{8, 5, 2}, []float64{10, 5, 9}, []float64{18, 10, 11}
	for i, s := range d.Scores {
		if got := part(s, "prefill_blocks"); got != wantPrefill[i] {
			t.Errorf("%s prefill_blocks = %v, want %v", s.Endpoint, got, wantPrefill[i])
		}
		if got := part(s, "active_decode_blocks"); got != wantDecode[i] {
			t.Errorf("%s active decode blocks = %v, want %v", s.Endpoint, got, wantDecode[i])
		}
		if got := s.Value - 10; got != wantCost[i] { // minus the request's own 10 blocks
			t.Errorf("%s legacy cost = %v, want %v", s.Endpoint, got, wantCost[i])
		}
	}
}

// TestDynamoTemperature checks the softmax: a very low temperature is argmin,
// equal costs are uniform.
func TestDynamoTemperature(t *testing.T) {
	p, _ := New(NameDynamo, map[string]any{"temperature": 0.001}, 1)
	req := &kvroute.Request{ID: "r", PromptTokens: 160, BlockSize: 16}
	cands := []kvroute.Candidate{cand("a", kvroute.Load{}, 0, 0), cand("b", kvroute.Load{}, 5, 80)}
	for k := 0; k < 50; k++ {
		if d := p.Pick(epoch, req, cands); d.Endpoint != "b" {
			t.Fatalf("T=0.001 chose %q, want b", d.Endpoint)
		}
	}
	p, _ = New(NameDynamo, map[string]any{"temperature": 1}, 1)
	count := map[string]int{}
	cands[1].CachedBlocks, cands[1].CachedTokens = 0, 0
	for k := 0; k < 2000; k++ {
		count[p.Pick(epoch, req, cands).Endpoint]++
	}
	if count["a"] < 800 || count["b"] < 800 {
		t.Errorf("equal costs at T=1 split %v, want about even", count)
	}
}

// TestSGLangRules reproduces cache_aware.rs's rules: the imbalance test needs
// both abs and rel thresholds exceeded, the cache threshold is strict, and a
// miss goes to the smallest tree.
func TestSGLangRules(t *testing.T) {
	tests := []struct {
		name    string
		loads   []int
		prompts []string // routed before, to w0
		prompt  string
		want    string
		reason  string
	}{
		{"abs exceeded but not rel", []int{140, 205}, []string{"abcdefghij"}, "abcdefghij", "w0", "cache hit"},
		{"abs and rel exceeded", []int{100, 165, 30}, []string{"abcdefghij"}, "abcdefghij", "w2", "imbalanced"},
		{"rel exceeded but not abs", []int{1, 60}, []string{"abcdefghij"}, "abcdefghij", "w0", "cache hit"},
		// "abc" of "abcXXXXXXX" is exactly 0.3: not above the threshold, a miss.
		{"match rate at threshold", []int{0, 0}, []string{"abcdefghij"}, "abcXXXXXXX", "w1", "cache miss"},
		{"match rate above threshold", []int{0, 0}, []string{"abcdefghij"}, "abcdXXXXXX", "w0", "cache hit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newSGLang(nil, 1)
			for _, s := range tt.prompts {
				p.tree.insert(s, "w0")
			}
			var cands []kvroute.Candidate
			for i, l := range tt.loads {
				cands = append(cands, cand("w"+strconv.Itoa(i), kvroute.Load{InFlight: l}, 0, 0))
			}
			d := p.Pick(epoch, &kvroute.Request{ID: "r", Prompt: tt.prompt}, cands)
			if d.Endpoint != tt.want || !strings.HasPrefix(d.Reason, tt.reason) {
				t.Errorf("chose %q (%s), want %q (%s...)", d.Endpoint, d.Reason, tt.want, tt.reason)
			}
		})
	}
}

// TestLLMDWorkedExample: 3 x prefix + 2 x queue + 2 x (1 - kv), by hand.
func TestLLMDWorkedExample(t *testing.T) {
	p, _ := New(NameLLMD, nil, 1)
	req := &kvroute.Request{ID: "r", PromptTokens: 1024, BlockSize: 64, BlockHashes: make([]uint64, 16)}
	cands := []kvroute.Candidate{
		cand("a", kvroute.Load{Waiting: 4, KVUsage: 0.5}, 16, 1024), // 3*1 + 2*0 + 2*0.5 = 4
		cand("b", kvroute.Load{Waiting: 0, KVUsage: 0.2}, 4, 256),   // 3*.25 + 2*1 + 2*.8 = 4.35
		cand("c", kvroute.Load{Waiting: 2, KVUsage: 0.9}, 0, 0),     // 0 + 2*.5 + 2*.1 = 1.2
	}
	d := p.Pick(epoch, req, cands)
	want := []float64{4, 4.35, 1.2}
	for i, s := range d.Scores {
		if s.Value != want[i] {
			t.Errorf("%s score %v, want %v", s.Endpoint, s.Value, want[i])
		}
	}
	if d.Endpoint != "b" {
		t.Errorf("chose %q, want b", d.Endpoint)
	}
}

// TestPrebleE2: exploit when cached > new tokens, explore otherwise.
func TestPrebleE2(t *testing.T) {
	tests := []struct {
		name   string
		cached int
		want   string
	}{
		{"exploit 600 cached > 400 new, despite load", 600, "a"},
		{"explore 500 cached = 500 new", 500, "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := New(NamePrebleE2, nil, 1)
			cands := []kvroute.Candidate{
				cand("a", kvroute.Load{InFlight: 4}, 0, tt.cached),
				cand("b", kvroute.Load{InFlight: 0}, 0, 0),
			}
			d := p.Pick(epoch, &kvroute.Request{ID: "r", PromptTokens: 1000, MaxTokens: 50}, cands)
			if d.Endpoint != tt.want {
				t.Errorf("chose %q (%s), want %q", d.Endpoint, d.Reason, tt.want)
			}
		})
	}
}

// kubeaiReference is KubeAI's chwblGetAddr written out naively: every
// virtual node, sorted, walked from the key with chwblLoadOK.
func kubeaiReference(key string, names []string, loads []int, factor float64) string {
	type pt struct {
		h    uint64
		name string
	}
	var pts []pt
	load := map[string]int{}
	total := 0
	for i, n := range names {
		for r := 0; r < 256; r++ {
			pts = append(pts, pt{xxhash.Sum64String(fmt.Sprintf("%s%d", n, r)), n})
		}
		load[n] = loads[i]
		total += loads[i]
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].h < pts[j].h })
	h := xxhash.Sum64String(key)
	i0 := sort.Search(len(pts), func(i int) bool { return pts[i].h >= h })
	if i0 == len(pts) {
		i0 = 0
	}
	for k := 0; k < len(pts); k++ {
		n := pts[(i0+k)%len(pts)].name
		if total == 0 || float64(load[n])+1 <= float64(total+1)/float64(len(names))*factor {
			return n
		}
	}
	return pts[i0].name
}

func TestKubeAIMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	p, _ := New(NameKubeAICHWBL, nil, 1)
	names := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.5:8000"}
	walked := 0
	for k := 0; k < 300; k++ {
		loads := make([]int, len(names))
		var cands []kvroute.Candidate
		for i, n := range names {
			loads[i] = r.IntN(6)
			cands = append(cands, cand(n, kvroute.Load{InFlight: loads[i]}, 0, 0))
		}
		user := fmt.Sprintf("question %d about something long enough", r.IntN(50))
		prompt := string(kvroute.AppendChatMessage(kvroute.AppendChatMessage(nil, []byte("system"), []byte("Hi.")), []byte("user"), []byte(user)))
		want := kubeaiReference(user, names, loads, 1.25)
		if want != kubeaiReference(user, names, make([]int, len(names)), 1.25) {
			walked++
		}
		d := p.Pick(epoch, &kvroute.Request{ID: "r", Prompt: prompt}, cands)
		if d.Endpoint != want {
			t.Fatalf("loads %v key %q: chose %q, reference %q", loads, user, d.Endpoint, want)
		}
	}
	if walked == 0 {
		t.Error("no case walked past an overloaded owner: the test exercises nothing")
	}
}

func TestKubeAIKey(t *testing.T) {
	long := strings.Repeat("é", 150)
	chat := func(roleContent ...string) string {
		var b []byte
		for i := 0; i+1 < len(roleContent); i += 2 {
			b = kvroute.AppendChatMessage(b, []byte(roleContent[i]), []byte(roleContent[i+1]))
		}
		return string(b)
	}
	tests := []struct {
		prompt, want string
	}{
		{chat("system", "Be brief.", "user", "hello", "assistant", "hi", "user", "bye"), "hello"},
		{chat("system", "Be brief."), ""}, // no user message
		{chat("user", long), strings.Repeat("é", 100)},
		{chat("user", "a\x00b"), "a\x00b"}, // escaped content is unescaped
		{"plain completion prompt", "plain completion prompt"},
		{"5:first,6:second,", "first"}, // a batch of completion prompts
		{"3:abc", "3:abc"},             // not a netstring sequence
		{string(kvroute.PrependChatTools([]byte(chat("user", "with tools")), []byte(`[{"type":"function"}]`))), "with tools"},
	}
	for _, tt := range tests {
		if got := KubeAIKey(tt.prompt, 100); got != tt.want {
			t.Errorf("KubeAIKey(%q) = %q, want %q", tt.prompt, got, tt.want)
		}
	}
}

func FuzzKubeAIKey(f *testing.F) {
	f.Add("6:system,Be brief.\x00\x004:user,hello\x00\x00", 100)
	f.Add("4:user,a\x00\x01b\x00\x00", 100)
	f.Add("5:first,6:second,", 3)
	f.Add("999999999999:x,", 10)
	f.Add("0:,0:,", 1)
	f.Fuzz(func(t *testing.T, prompt string, n int) {
		if n < 0 || n > 1000 {
			return
		}
		got := KubeAIKey(prompt, n)
		if !strings.Contains(prompt, got) && !strings.Contains(prompt, "\x00\x01") {
			t.Fatalf("key %q is not part of the prompt %q", got, prompt)
		}
		if len([]rune(got)) > n {
			t.Fatalf("key %q longer than %d characters", got, n)
		}
	})
}

// TestLLMDNaNKVUsage: a candidate whose KV usage is NaN (a driver without
// the signals package's filtering) scores as a full cache, 0 for the
// kv-cache-utilization scorer: Pick must not panic with no candidate at
// the (NaN) best score, and must still choose.
func TestLLMDNaNKVUsage(t *testing.T) {
	p, _ := New(NameLLMD, nil, 1)
	req := &kvroute.Request{ID: "r", PromptTokens: 1024, BlockSize: 64, BlockHashes: make([]uint64, 16)}
	cands := []kvroute.Candidate{
		cand("a", kvroute.Load{KVUsage: math.NaN()}, 0, 0), // 0 + 2*1 + 2*0 = 2
		cand("b", kvroute.Load{KVUsage: 0.5}, 0, 0),        // 0 + 2*1 + 2*0.5 = 3
	}
	d := p.Pick(epoch, req, cands)
	if d.Endpoint != "b" {
		t.Fatalf("chose %q, want b (%s)", d.Endpoint, d.Reason)
	}
	if got := d.Scores[0].Value; got != 2 {
		t.Errorf("a score %v, want 2", got)
	}
}

// TestDynamoActivePrefillIsUncached: Dynamo counts a worker's active
// prefill as the uncached tokens of its requests without a first token
// (ActiveSequences: new_tokens = isl - overlap x block_size, removed by
// mark_prefill_completed), not their whole prompts. A second cache hit on
// the holder of a 100-block prompt (96 blocks cached) costs 8 + 100 there
// and 100 + 100 on an idle worker without the prefix: it stays on the
// holder. Counting the first hit's whole prompt (Load.InFlightTokens) as
// prefill made the holder cost 104 + 100 and sent it away.
func TestDynamoActivePrefillIsUncached(t *testing.T) {
	p, _ := New(NameDynamo, nil, 1)
	dy := p.(*Dynamo)
	req := func(id string) *kvroute.Request {
		return &kvroute.Request{ID: id, PromptTokens: 1600, BlockSize: 16, BlockHashes: make([]uint64, 100)}
	}
	holder := cand("holder", kvroute.Load{}, 96, 96*16)
	idle := cand("idle", kvroute.Load{}, 0, 0)
	r1 := req("r1")
	if d := p.Pick(epoch, r1, []kvroute.Candidate{holder, idle}); d.Endpoint != "holder" {
		t.Fatalf("r1 chose %q (%s), want holder", d.Endpoint, d.Reason)
	}
	// The router now counts r1's prompt in the holder's in-flight tokens.
	holder.Load = kvroute.Load{InFlight: 1, InFlightTokens: 1600}
	d := p.Pick(epoch, req("r2"), []kvroute.Candidate{holder, idle})
	if got := part(d.Scores[0], "prefill_blocks"); got != 8 {
		t.Errorf("holder prefill_blocks = %v, want 8 (r1's 4 uncached + r2's 4)", got)
	}
	if d.Endpoint != "holder" {
		t.Fatalf("r2 chose %q (%s), want holder", d.Endpoint, d.Reason)
	}
	// r1's first token and r2's end take their cached tokens off again.
	dy.FirstToken(epoch, r1, "holder")
	dy.Release(epoch, req("r2"), "holder")
	if len(dy.pending) != 0 || len(dy.cached) != 0 {
		t.Errorf("after first token and release: pending %v, cached %v, want none", dy.pending, dy.cached)
	}
}

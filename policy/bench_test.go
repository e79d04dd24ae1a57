package policy

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// benchState is the decision benchmark: a 32 KiB prompt (8192
// tokens, 512 blocks of 16) over 64 endpoints with mixed load and cache.
func benchState() (*kvroute.Request, []kvroute.Candidate) {
	r := rand.New(rand.NewPCG(1, 1))
	var sb strings.Builder
	sb.WriteString("6:system,")
	for sb.Len() < 32<<10 {
		sb.WriteString("lorem ipsum dolor sit amet ")
	}
	req := &kvroute.Request{ID: "bench", Tenant: "t1", Prompt: sb.String()[:32<<10], PromptTokens: 8192,
		BlockSize: 16, MaxTokens: 256}
	for i := 0; i < 512; i++ {
		req.BlockHashes = append(req.BlockHashes, uint64(i+1)*0x9e3779b97f4a7c15)
	}
	cands := make([]kvroute.Candidate, 64)
	for i := range cands {
		run := r.IntN(32)
		cands[i] = kvroute.Candidate{
			Endpoint: &kvroute.Endpoint{ID: "http://10.0.0." + strconv.Itoa(i) + ":8000"},
			Healthy:  i%17 != 5,
			Load: kvroute.Load{Waiting: r.IntN(8), Running: run, KVUsage: r.Float64() * 0.9, InFlight: run + r.IntN(4),
				InFlightTokens: r.IntN(20000), DecodeTokens: run * 3000, PrefixHitRate: -1},
		}
		if r.IntN(3) == 0 {
			cands[i].CachedBlocks = r.IntN(513)
			cands[i].CachedTokens = cands[i].CachedBlocks * 16
			cands[i].Tier = kvroute.TierGPU
		}
	}
	return req, cands
}

// BenchmarkPick measures one decision per policy and reports the p50 and
// p99 latency of single decisions alongside ns/op and allocs/op.
func BenchmarkPick(b *testing.B) {
	type variant struct {
		label, name string
		params      map[string]any
	}
	var vs []variant
	for _, name := range Names() {
		vs = append(vs, variant{name, name, nil})
	}
	vs = append(vs, variant{"kv-aware-noexplain", NameKVAware, map[string]any{"explain": false}})
	for _, v := range vs {
		b.Run(v.label, func(b *testing.B) {
			p, err := New(v.name, v.params, 1)
			if err != nil {
				b.Fatal(err)
			}
			req, cands := benchState()
			rel, _ := p.(kvroute.Releaser)
			// kv-aware hears of first tokens (as under the router), which
			// switches its queue estimate to the exact per-request count.
			ft, _ := p.(interface {
				FirstToken(time.Time, *kvroute.Request, string)
			})
			lat := make([]time.Duration, 0, min(b.N, 1<<20))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				p.Pick(epoch, req, cands)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
				if ft != nil {
					ft.FirstToken(epoch, req, "")
				}
				if rel != nil {
					rel.Release(epoch, req, "")
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			}
		})
	}
}

// BenchmarkPickLoRAShared measures kv-aware's decision for a request for a
// LoRA adapter when adapters share engines: 8 adapters on 6 engines at
// max_lora 1, each engine running one and its slot wanted by the others
// (the adapter terms, adapterCost and homeWait, priced on every
// candidate), with homes and demand from 400 earlier requests.
func BenchmarkPickLoRAShared(b *testing.B) {
	p, err := New(NameKVAware, map[string]any{"explain": false}, 1)
	if err != nil {
		b.Fatal(err)
	}
	rel := p.(kvroute.Releaser)
	adapters := make([]string, 8)
	for i := range adapters {
		adapters[i] = "adapter-" + strconv.Itoa(i)
	}
	cands := make([]kvroute.Candidate, 6)
	for i := range cands {
		cands[i] = kvroute.Candidate{
			Endpoint: &kvroute.Endpoint{ID: "e" + strconv.Itoa(i)},
			Healthy:  true,
			Load: kvroute.Load{Running: 4, InFlight: 4, DecodeTokens: 8000, PrefixHitRate: -1,
				LoRA: &kvroute.LoRALoad{Max: 1, Running: []string{adapters[i]}, Waiting: []string{adapters[(i+6)%8]}}},
		}
	}
	reqs := make([]kvroute.Request, 64)
	for i := range reqs {
		reqs[i] = kvroute.Request{ID: "r" + strconv.Itoa(i), Adapter: adapters[i%8], PromptTokens: 1600, BlockSize: 16, MaxTokens: 200}
	}
	now := epoch
	pick := func(i int) {
		r := &reqs[i%len(reqs)]
		p.Pick(now, r, cands)
		rel.Release(now, r, "")
		now = now.Add(50 * time.Millisecond)
	}
	for i := range 400 {
		pick(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pick(i)
	}
}

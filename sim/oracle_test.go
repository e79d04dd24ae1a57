package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workload"
)

func TestOracle(t *testing.T) {
	o := newOracle()
	steps := []struct {
		hashes    []uint64
		promptLen int
		want      int
	}{
		{[]uint64{1, 2, 3}, 50, 0},      // cold
		{[]uint64{1, 2, 3}, 50, 48},     // all three blocks (48 <= 49)
		{[]uint64{1, 2, 3}, 48, 32},     // exact fit: the last token is recomputed, so only 2 blocks
		{[]uint64{1, 2, 9, 10}, 64, 32}, // diverges at block 2
		{[]uint64{1, 2, 9, 10}, 70, 64}, // now seen
		{[]uint64{7}, 10, 0},            // partial block only, nothing hashed beyond
		{nil, 5, 0},
	}
	for i, s := range steps {
		if got := o.observe(s.hashes, 16, s.promptLen); got != s.want {
			t.Errorf("step %d: got %d hit tokens, want %d", i, got, s.want)
		}
	}
}

func TestU64Set(t *testing.T) {
	// Differential test against a map.
	var s u64set
	ref := map[uint64]bool{}
	x := uint64(1)
	for i := range 20000 {
		x = x*6364136223846793005 + 1442695040888963407
		k := x >> (i % 50) // some small keys, including 0 eventually
		if i%5 == 0 {
			k = uint64(i % 7) // repeats and zero
		}
		if s.has(k) != ref[k] {
			t.Fatalf("has(%d) before add: got %v, want %v", k, s.has(k), ref[k])
		}
		s.add(k)
		ref[k] = true
	}
	for k := range ref {
		if !s.has(k) {
			t.Fatalf("has(%d): got false after add", k)
		}
	}
	if s.has(0xdeadbeefcafe) {
		t.Fatal("has(absent key): got true")
	}
}

func TestOracleHitRateMatchesRun(t *testing.T) {
	reqs := smallChat(t, 200, 30, 3)
	res := mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin"}, reqs)
	if got := OracleHitRate(reqs, 16); got != res.OracleHitRate || got <= 0 {
		t.Fatalf("OracleHitRate: got %g, want the run's %g (> 0)", got, res.OracleHitRate)
	}
	want := 0.25
	res = mustRun(t, Config{Fleet: tinyFleet(2), Policy: "round_robin", OracleHitRate: &want}, reqs)
	if res.OracleHitRate != want {
		t.Fatalf("given oracle: got %g, want %g", res.OracleHitRate, want)
	}
}

// TestSegOracleMatchesBlockOracle checks the segment oracle against the
// block-hash oracle on every generator and a slice of the Mooncake trace.
func TestSegOracleMatchesBlockOracle(t *testing.T) {
	sets := map[string][]workload.Request{}
	for _, name := range workload.GeneratorNames() {
		w, err := workload.Generate(name, workload.Options{Seed: 3, Requests: 400})
		if err != nil {
			t.Fatal(err)
		}
		sets[name] = w.Requests
	}
	tr, err := DefaultWorkload()
	if err != nil {
		t.Fatal(err)
	}
	sets["mooncake[:1500]"] = tr.Requests[:1500]
	// The same prompts under three LoRA adapters: an adapter's blocks are
	// keyed by its name, so no adapter hits another's.
	lora := slices.Clone(tr.Requests[:1500])
	for i := range lora {
		lora[i].Adapter = []string{"", "a", "b"}[i%3]
	}
	sets["mooncake[:1500], 3 adapters"] = lora
	for name, reqs := range sets {
		for _, bs := range []int{16, 32, 512} {
			so, bo := newSegOracle(), newOracle()
			var buf []uint64
			for i := range reqs {
				r := &reqs[i]
				buf = r.BlockHashes(bs, buf[:0])
				if got, want := so.observe(r.Segments, r.Adapter, bs, r.PromptLen), bo.observe(buf, bs, r.PromptLen); got != want {
					t.Fatalf("%s, block %d, request %d (%s): segment oracle %d hit tokens, block oracle %d", name, bs, i, r.ID, got, want)
				}
			}
		}
	}
}

func TestU64Max(t *testing.T) {
	var m u64max
	ref := map[uint64]int64{}
	x := uint64(7)
	for i := range 30000 {
		x = x*6364136223846793005 + 1442695040888963407
		k := x
		if i%4 == 0 {
			k = uint64(i % 11) // repeats and zero
		}
		v := int64(x>>40) % 1000
		if got, want := m.update(k, v), ref[k]; got != want {
			t.Fatalf("update(%d, %d): got old %d, want %d", k, v, got, want)
		}
		ref[k] = max(ref[k], v)
	}
	for k, want := range ref {
		if got := m.update(k, -1); got != want {
			t.Fatalf("final %d: got %d, want %d", k, got, want)
		}
	}
}

// TestOracleHits: per-request hits in workload order, requests taken in
// arrival order, for segment prompts and token prompts; OracleHitRate is
// their total over the prompt tokens.
func TestOracleHits(t *testing.T) {
	tok := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(i)
		}
		return out
	}
	seg := func(id string, at time.Duration, key uint64, n int) workload.Request {
		return workload.Request{ID: id, Arrival: at, PromptLen: n, Segments: []workload.Segment{{Key: key, Len: n}}}
	}
	tokens := func(id string, at time.Duration, n int) workload.Request {
		return workload.Request{ID: id, Arrival: at, PromptLen: n, Tokens: tok(n)}
	}
	for _, c := range []struct {
		name string
		reqs []workload.Request
		want []int
	}{
		{"segments", []workload.Request{
			seg("a", 0, 1, 40),           // cold
			seg("b", time.Second, 1, 50), // after a and c: 40 shared tokens, 2 blocks
			seg("c", time.Second/2, 1, 40),
			seg("d", 2*time.Second, 1, 48), // b's 50: all 3 blocks, but at most (48-1)/16 = 2
			seg("e", 2*time.Second, 2, 48), // another prefix: cold
		}, []int{0, 32, 32, 32, 0}},
		{"tokens", []workload.Request{
			tokens("a", time.Second, 100), // after b's 20: 1 block
			tokens("b", 0, 20),
			tokens("c", 2*time.Second, 120), // a's 100: 6 blocks
		}, []int{16, 0, 96}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := oracleHits(c.reqs, 16)
			if !slices.Equal(got, c.want) {
				t.Fatalf("hits: got %v, want %v", got, c.want)
			}
			var q, h int
			for i, r := range c.reqs {
				q += r.PromptLen
				h += c.want[i]
			}
			if got, want := OracleHitRate(c.reqs, 16), float64(h)/float64(q); got != want {
				t.Errorf("OracleHitRate: got %g, want %g", got, want)
			}
			if got := oracleHits(c.reqs, 0); slices.ContainsFunc(got, func(n int) bool { return n != 0 }) {
				t.Errorf("block size 0: got %v, want zeros", got)
			}
		})
	}
}

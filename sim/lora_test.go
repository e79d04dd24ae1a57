package sim

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/signals"
	"github.com/kvroute/kvroute/workload"
)

// samePrompt returns requests with one prompt, for the adapters given
// ("" the base model), a second apart: each runs alone.
func samePrompt(adapters ...string) []workload.Request {
	var reqs []workload.Request
	for i, a := range adapters {
		reqs = append(reqs, workload.Request{ID: "r" + string(rune('0'+i)), Arrival: time.Duration(i) * time.Second,
			PromptLen: 100, OutputLen: 4, Adapter: a, Segments: []workload.Segment{{Key: 42, Len: 100}}})
	}
	return reqs
}

// TestLoRAAdaptersShareNoBlocks: on one engine, requests with the same
// prompt for two adapters and the base model hit only the blocks an
// earlier request of their own adapter left, in the fast path (the
// workload's keyed hashes) and with KV events (the engine hashes the
// tokens with the adapter's key, the router with HashTokensKeyed).
func TestLoRAAdaptersShareNoBlocks(t *testing.T) {
	reqs := samePrompt("a", "b", "a", "", "b", "")
	want := []int{0, 0, 96, 0, 96, 96} // the tiny profile's 16-token blocks; the last token is computed
	wantAdapters := []string{"sim/a", "sim/b", "sim/a", "sim/", "sim/b", "sim/"}
	for _, kv := range []bool{false, true} {
		p := &cachedLog{}
		res := mustRun(t, Config{Fleet: tinyFleet(1), KVEvents: kv, Picker: p}, reqs)
		// The router routes in the base model's pool with the adapter
		// named, and its prefix index (the approximate one, or the
		// precise one fed by the engine's events) expects what the engine
		// has.
		if !slices.Equal(p.adapters, wantAdapters) {
			t.Errorf("kv events %v: the router saw model/adapter %q, want %q", kv, p.adapters, wantAdapters)
		}
		if !slices.Equal(p.cached, want) {
			t.Errorf("kv events %v: the router expected %v tokens cached, want %v", kv, p.cached, want)
		}
		var got []int
		for _, r := range res.Records {
			if !r.OK() {
				t.Fatalf("kv events %v: %s failed: %s", kv, r.ID, r.Error)
			}
			got = append(got, r.CachedTokens)
		}
		if !slices.Equal(got, want) {
			t.Errorf("kv events %v: cached tokens %v, want %v", kv, got, want)
		}
		// requests.csv names each request's adapter.
		var buf bytes.Buffer
		if err := WriteRecordsCSV(&buf, []string{"run"}, []*Result{res}); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&buf).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		col := slices.Index(rows[0], "adapter")
		for k, r := range reqs {
			if col < 0 || rows[k+1][col] != r.Adapter {
				t.Fatalf("requests.csv: %s's adapter (column %d) is not %q: %v", r.ID, col, r.Adapter, rows[k+1])
			}
		}
	}
}

// cachedLog picks the first candidate and logs the tokens the router
// expects it to have cached, and the requests' models and adapters.
type cachedLog struct {
	cached   []int
	adapters []string
}

func (p *cachedLog) Pick(_ time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.cached = append(p.cached, cands[0].CachedTokens)
	p.adapters = append(p.adapters, req.Model+"/"+req.Adapter)
	return kvroute.Decision{Index: 0}
}

// TestLoRAEventsKeyed: an adapter's BlockStored events reach the precise
// index keyed as kvindex.HashTokensKeyed keys the adapter's prompt, which
// the router matches, and not as the base model's prompt.
func TestLoRAEventsKeyed(t *testing.T) {
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Profile: prof, NumGPUBlocks: 64, MaxLoRAs: 1})
	if err != nil {
		t.Fatal(err)
	}
	prompt := workload.AppendSegmentTokens(nil, workload.Segment{Key: 5, Len: 70})
	if err := e.Add(0, &engine.Request{ID: "1", Prompt: prompt, MaxTokens: 1, LoRA: "a"}); err != nil {
		t.Fatal(err)
	}
	x := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: prof.BlockSize})
	var salts []uint64
	var res engine.StepResult
	for now := time.Duration(0); e.HasWork(); now += time.Millisecond {
		e.StepInto(now, &res)
		applyEvents(x, "e0", res.Events, &salts)
	}
	match := func(h []uint64) int {
		for _, hit := range x.Match(h, nil) {
			if hit.Endpoint == "e0" {
				return hit.Blocks
			}
		}
		return 0
	}
	if got := match(kvindex.HashTokensKeyed(prompt, "a", "", prof.BlockSize, nil)); got != 4 {
		t.Errorf("adapter a's prompt matches %d blocks, want 4", got)
	}
	if got := match(kvindex.HashTokens(prompt, prof.BlockSize, nil)); got != 0 {
		t.Errorf("the base model's prompt matches %d blocks of adapter a's, want 0", got)
	}
}

// TestMaxLoRAsHonoured: with MaxLoRAs 1, one engine never has requests of
// two adapters in its batch: in the records, the time each request spends
// in the batch (from its first scheduled step to its last) never overlaps
// another adapter's. With MaxLoRAs 2 they do overlap (the check sees it).
func TestMaxLoRAsHonoured(t *testing.T) {
	var reqs []workload.Request
	for i := range 40 {
		a := []string{"a", "b"}[i%2]
		reqs = append(reqs, workload.Request{ID: "r" + string(rune('A'+i)), Arrival: time.Duration(i) * 5 * time.Millisecond,
			PromptLen: 40, OutputLen: 20, Adapter: a, Segments: []workload.Segment{{Key: uint64(i), Len: 40}}})
	}
	overlaps := func(maxLoRAs int) int {
		res := mustRun(t, Config{Fleet: tinyFleet(1), MaxLoRAs: maxLoRAs}, reqs)
		type span struct{ start, end time.Duration }
		spans := make([]span, len(res.Records))
		for i, r := range res.Records {
			if !r.OK() || r.Preemptions > 0 {
				t.Fatalf("max loras %d: %s: status %d, %d preemptions", maxLoRAs, r.ID, r.Status, r.Preemptions)
			}
			net := r.Network / 2
			spans[i] = span{r.Arrival + r.Held + net + r.Queue, r.Arrival + r.E2E - net}
		}
		n := 0
		for i := range spans {
			for j := range i {
				if reqs[i].Adapter != reqs[j].Adapter && spans[i].start < spans[j].end && spans[j].start < spans[i].end {
					n++
				}
			}
		}
		return n
	}
	if n := overlaps(1); n != 0 {
		t.Errorf("max loras 1: %d pairs of requests of two adapters in one batch", n)
	}
	if n := overlaps(2); n == 0 {
		t.Error("max loras 2: no request of one adapter ran with one of the other (the check sees nothing)")
	}
}

// TestScrapeLoRA: with adapters in the workload, an engine's scrape gives
// vllm:lora_requests_info's fields as the engine stood when its step
// started (running and waiting adapters, sorted, their union, max_lora),
// none before its first step ended, and the router's Load.LoRA follows;
// a workload without adapters gives none.
func TestScrapeLoRA(t *testing.T) {
	reqs := []workload.Request{
		{ID: "b", PromptLen: 40, OutputLen: 30, Adapter: "b", Segments: []workload.Segment{{Key: 1, Len: 40}}},
		{ID: "a", Arrival: time.Millisecond, PromptLen: 40, OutputLen: 30, Adapter: "a", Segments: []workload.Segment{{Key: 2, Len: 40}}},
		{ID: "c", Arrival: time.Millisecond, PromptLen: 40, OutputLen: 30, Adapter: "c", Segments: []workload.Segment{{Key: 3, Len: 40}}},
	}
	cfg := Config{Fleet: tinyFleet(1), ScrapeInterval: -1, MaxLoRAs: 1}
	cfg.applyDefaults()
	s, err := newSimulation(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	s.schedule(reqs[0].Arrival, evArrival, -1, 0)
	s.next = 1
	for e.steps == 0 && s.q.Len() > 0 {
		s.handle(s.q.pop())
	}
	if m := metricsOf(e); m.Has(signals.HasLoRA) {
		t.Errorf("scrape during the first step: %+v, want no LoRA series", m)
	}
	// Run until a and c wait behind b.
	for s.q.Len() > 0 && (e.steps < 2 || len(e.loraWaiting) < 2) {
		s.handle(s.q.pop())
	}
	m := metricsOf(e)
	if !m.Has(signals.HasLoRA) || !slices.Equal(m.LoRARunning, []string{"b"}) || !slices.Equal(m.LoRAWaiting, []string{"a", "c"}) ||
		!slices.Equal(m.LoRAAdapters, []string{"a", "b", "c"}) || m.MaxLoRA != 1 {
		t.Errorf("scrape: running %v, waiting %v, adapters %v, max %d (lora %v); want [b], [a c], [a b c], 1",
			m.LoRARunning, m.LoRAWaiting, m.LoRAAdapters, m.MaxLoRA, m.Has(signals.HasLoRA))
	}
	s.rts[0].View(e.id).Observe(wall(s.now), m)
	l := s.rts[0].View(e.id).Load(wall(s.now))
	if want := (&kvroute.LoRALoad{Running: []string{"b"}, Waiting: []string{"a", "c"}, Max: 1}); l.LoRA == nil ||
		!slices.Equal(l.LoRA.Running, want.Running) || !slices.Equal(l.LoRA.Waiting, want.Waiting) || l.LoRA.Max != 1 {
		t.Errorf("router's Load.LoRA %+v, want %+v", l.LoRA, want)
	}

	base := smallChat(t, 20, 50, 1)
	cfg = Config{Fleet: tinyFleet(1), ScrapeInterval: -1}
	cfg.applyDefaults()
	if s, err = newSimulation(cfg, base); err != nil {
		t.Fatal(err)
	}
	s.schedule(base[0].Arrival, evArrival, -1, 0)
	s.next = 1
	for s.q.Len() > 0 && s.engines[0].steps < 5 {
		s.handle(s.q.pop())
	}
	if m := metricsOf(s.engines[0]); m.Has(signals.HasLoRA) || m.LoRARunning != nil || m.MaxLoRA != 0 {
		t.Errorf("a workload without adapters: scrape %+v, want no LoRA series", m)
	}
}

// TestGroupAdapters: a group that lists its adapters gets only their
// requests (and the base model's); a request for an adapter no engine
// serves is rejected (503). A fleet file reads the list.
func TestGroupAdapters(t *testing.T) {
	fleet, err := ParseFleetFile([]byte("engines:\n" +
		"  - {count: 1, profile: tiny, num_gpu_blocks: 256, adapters: [a]}\n" +
		"  - {count: 1, profile: tiny, num_gpu_blocks: 256, adapters: [b, c]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fleet[1].Adapters; !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("group 1's adapters %v, want [b c]", got)
	}
	reqs := samePrompt("a", "b", "c", "a", "b", "d", "", "")
	res := mustRun(t, Config{Fleet: fleet, Policy: "round_robin"}, reqs)
	want := []string{"e0", "e1", "e1", "e0", "e1", "", "", ""}
	for i, r := range res.Records {
		switch {
		case reqs[i].Adapter == "d":
			if r.Status != 503 || r.Engine != "" {
				t.Errorf("%s (adapter d, served nowhere): status %d on %q, want 503", r.ID, r.Status, r.Engine)
			}
		case reqs[i].Adapter == "":
			if !r.OK() {
				t.Errorf("%s (base model): status %d", r.ID, r.Status)
			}
		case !r.OK() || r.Engine != want[i]:
			t.Errorf("%s (adapter %s): status %d on %s, want 200 on %s", r.ID, reqs[i].Adapter, r.Status, r.Engine, want[i])
		}
	}
	if _, err := ParseFleetFile([]byte("engines:\n  - {count: 1, profile: tiny, adapters: [\"\"]}\n")); err == nil {
		t.Error("an empty adapter name: no error")
	}
}

// TestPDAdapters: on a P/D fleet whose groups serve some adapters, the
// simulator's handoff runs the same placement as kvroute serve's: an
// adapter's request is prefilled on a prefill engine serving it and
// decoded on a decode engine serving it; an adapter only a prefill engine
// serves is a 503 that says no decode engine serves it; the base model's
// requests go anywhere.
func TestPDAdapters(t *testing.T) {
	fleet, err := ParseFleetFile([]byte("engines:\n" +
		"  - {count: 1, profile: tiny, num_gpu_blocks: 256, role: prefill, adapters: [a, solo]}\n" +
		"  - {count: 1, profile: tiny, num_gpu_blocks: 256, role: prefill, adapters: [b]}\n" +
		"  - {count: 1, profile: tiny, num_gpu_blocks: 256, role: decode, adapters: [a]}\n" +
		"  - {count: 1, profile: tiny, num_gpu_blocks: 256, role: decode, adapters: [b]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	reqs := samePrompt("a", "b", "a", "b", "solo", "", "")
	for i := range reqs {
		reqs[i].PromptLen, reqs[i].Segments = 600, []workload.Segment{{Key: 42, Len: 600}}
	}
	res := mustRun(t, Config{Fleet: fleet, PD: PDConfig{Mode: disagg.ModeAlways}}, reqs)
	where := map[string][2]string{"a": {"e0", "e2"}, "b": {"e1", "e3"}}
	for i, r := range res.Records {
		a := reqs[i].Adapter
		switch a {
		case "solo":
			if r.Status != 503 || !strings.Contains(r.Error, "no decode endpoint") {
				t.Errorf("%s (solo, no decode engine serves it): status %d %q, want 503 no decode endpoint", r.ID, r.Status, r.Error)
			}
		case "":
			if !r.OK() {
				t.Errorf("%s (base model): status %d %s", r.ID, r.Status, r.Error)
			}
		default:
			if w := where[a]; !r.OK() || r.PrefillEngine != w[0] || r.Engine != w[1] {
				t.Errorf("%s (adapter %s): status %d, prefill %s, decode %s; want 200, %s, %s", r.ID, a, r.Status, r.PrefillEngine, r.Engine, w[0], w[1])
			}
		}
	}
}

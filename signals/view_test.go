package signals

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func vllmMetrics(w, r, kv float64) Metrics {
	return Metrics{Flavor: FlavorVLLM, Have: HasWaiting | HasRunning | HasKVUsage | HasKVCapacity,
		Waiting: w, Running: r, KVUsage: kv, BlockSize: 16, NumGPUBlocks: 100, KVCapacityTokens: 1600}
}

func TestViewNeverObserved(t *testing.T) {
	v := NewView(ViewConfig{})
	a := v.Dispatch(at(0), 100)
	v.Dispatch(at(1), 50)
	v.FirstToken(at(2), a)
	l := v.Load(at(3))
	if !l.Stale || !l.ObservedAt.IsZero() {
		t.Fatalf("Stale=%v ObservedAt=%v, want stale and zero", l.Stale, l.ObservedAt)
	}
	if l.Waiting != 1 || l.Running != 1 || l.InFlight != 2 || l.InFlightTokens != 50 || l.DecodeTokens != 100 {
		t.Fatalf("got %+v, want waiting 1 running 1 inflight 2 tokens 50 decode 100", l)
	}
	if l.PrefixHitRate != -1 {
		t.Fatalf("PrefixHitRate = %v, want -1", l.PrefixHitRate)
	}
}

// TestViewReconcile walks the timeline of doc.go: dispatches between scrapes
// are added on top, and a scrape sampled after them absorbs them.
func TestViewReconcile(t *testing.T) {
	type step struct {
		name         string
		do           func(v *View, tk map[string]Ticket)
		now          int
		wantW, wantR int
		wantStale    bool
	}
	steps := []step{
		{"scrape S1", func(v *View, _ map[string]Ticket) { v.Observe(at(0), vllmMetrics(2, 5, 0.5)) }, 0, 2, 5, false},
		{"burst of 3 after S1", func(v *View, tk map[string]Ticket) {
			tk["a"] = v.Dispatch(at(10), 160)
			tk["b"] = v.Dispatch(at(11), 160)
			tk["c"] = v.Dispatch(at(12), 160)
		}, 12, 5, 5, false},
		{"a first token", func(v *View, tk map[string]Ticket) { v.FirstToken(at(20), tk["a"]) }, 20, 4, 6, false},
		{"b fails before first token", func(v *View, tk map[string]Ticket) { v.Done(at(30), tk["b"]) }, 30, 3, 6, false},
		{"d dispatched after S2 was sent", func(v *View, tk map[string]Ticket) { tk["d"] = v.Dispatch(at(45), 16) }, 45, 4, 6, false},
		// S2 sampled at 40: a, b, c are in it, d (45) is not.
		{"scrape S2 arrives", func(v *View, _ map[string]Ticket) { v.Observe(at(40), vllmMetrics(3, 6, 0.6)) }, 50, 4, 6, false},
		{"a done", func(v *View, tk map[string]Ticket) { v.Done(at(60), tk["a"]) }, 60, 4, 5, false},
		{"repeated done ignored", func(v *View, tk map[string]Ticket) { v.Done(at(61), tk["a"]) }, 61, 4, 5, false},
		{"stale: router-local only", func(v *View, _ map[string]Ticket) {}, 1041, 2, 0, true},
		{"scrape S3 after all", func(v *View, _ map[string]Ticket) { v.Observe(at(1100), vllmMetrics(0, 1, 0.1)) }, 1100, 0, 1, false},
	}
	v := NewView(ViewConfig{StaleAfter: time.Second})
	tk := map[string]Ticket{}
	for _, s := range steps {
		s.do(v, tk)
		l := v.Load(at(s.now))
		if l.Waiting != s.wantW || l.Running != s.wantR || l.Stale != s.wantStale {
			t.Fatalf("%s: got waiting=%d running=%d stale=%v, want %d %d %v", s.name, l.Waiting, l.Running, l.Stale, s.wantW, s.wantR, s.wantStale)
		}
	}
}

func TestViewKVUsage(t *testing.T) {
	v := NewView(ViewConfig{})
	v.Observe(at(0), vllmMetrics(0, 0, 0.25)) // 1600 tokens capacity
	tk := v.Dispatch(at(1), 400)
	if got, want := v.Load(at(2)).KVUsage, 0.5; got != want {
		t.Fatalf("after dispatch KVUsage = %v, want %v", got, want)
	}
	v.Observe(at(3), vllmMetrics(1, 0, 0.5))
	if got, want := v.Load(at(4)).KVUsage, 0.5; got != want {
		t.Fatalf("after scrape KVUsage = %v, want %v (no double count)", got, want)
	}
	v.Done(at(5), tk)
	if got, want := v.Load(at(6)).KVUsage, 0.25; got != want {
		t.Fatalf("after done KVUsage = %v, want %v", got, want)
	}
	if got, want := v.Load(at(6)).KVCapacityTokens, 1600; got != want {
		t.Fatalf("KVCapacityTokens = %v, want %v", got, want)
	}
	// Configured capacity wins.
	v2 := NewView(ViewConfig{KVCapacityTokens: 800})
	v2.Dispatch(at(0), 400)
	if got, want := v2.Load(at(1)).KVUsage, 0.5; got != want {
		t.Fatalf("never observed, configured capacity: KVUsage = %v, want %v", got, want)
	}
}

func TestViewErrors(t *testing.T) {
	v := NewView(ViewConfig{StaleAfter: time.Second, MaxConsecutiveErrors: 2})
	v.Observe(at(0), vllmMetrics(4, 4, 0))
	v.ObserveError(at(100), errors.New("connection refused"))
	if l := v.Load(at(150)); l.Stale || l.Waiting != 4 {
		t.Fatalf("one error: got stale=%v waiting=%d, want false 4", l.Stale, l.Waiting)
	}
	v.ObserveError(at(200), errors.New("timeout"))
	if l := v.Load(at(250)); !l.Stale || l.Waiting != 0 {
		t.Fatalf("two errors: got stale=%v waiting=%d, want true 0", l.Stale, l.Waiting)
	}
	s := v.Snapshot()
	if s.Errors != 2 || s.ConsecutiveErrors != 2 || s.LastError != "timeout" || !s.LastErrorAt.Equal(at(200)) || s.Scrapes != 1 {
		t.Fatalf("snapshot %+v, want 2 errors, last timeout at 200ms, 1 scrape", s)
	}
	v.Observe(at(300), vllmMetrics(1, 1, 0))
	if l := v.Load(at(300)); l.Stale {
		t.Fatalf("after recovery: stale")
	}
	if s := v.Snapshot(); s.ConsecutiveErrors != 0 || s.Errors != 2 {
		t.Fatalf("after recovery: %+v", s)
	}
}

func TestViewOutOfOrder(t *testing.T) {
	v := NewView(ViewConfig{})
	v.Observe(at(100), vllmMetrics(1, 1, 0))
	v.Observe(at(50), vllmMetrics(9, 9, 0))
	if l := v.Load(at(110)); l.Waiting != 1 || !l.ObservedAt.Equal(at(100)) {
		t.Fatalf("got %+v, want the newer observation kept", l)
	}
	if s := v.Snapshot(); s.OutOfOrder != 1 {
		t.Fatalf("OutOfOrder = %d, want 1", s.OutOfOrder)
	}
}

func TestViewHitRate(t *testing.T) {
	v := NewView(ViewConfig{HitRateWindow: 10 * time.Second})
	m := vllmMetrics(0, 0, 0)
	m.Have |= HasPrefixCounters
	obs := func(sec int, q, h float64) {
		m.PrefixQueries, m.PrefixHits = q, h
		v.Observe(t0.Add(time.Duration(sec)*time.Second), m)
	}
	cases := []struct {
		sec  int
		q, h float64
		want float64
	}{
		{0, 1000, 500, 0.5},   // one sample: lifetime ratio 500/1000
		{5, 2000, 500, 0},     // window 0..5: (500-500)/(2000-1000)
		{10, 3000, 1500, 0.5}, // window 0..10: (1500-500)/(3000-1000)
		{15, 4000, 2500, 1},   // window 5..15: (2500-500)/(4000-2000)
		{16, 100, 100, 1},     // counter reset: new window, lifetime 100/100
	}
	for _, c := range cases {
		obs(c.sec, c.q, c.h)
		if got := v.Load(t0.Add(time.Duration(c.sec) * time.Second)).PrefixHitRate; got != c.want {
			t.Errorf("at %ds: PrefixHitRate = %v, want %v", c.sec, got, c.want)
		}
	}
	// Once the scrapes stop (the engine stopped answering), the signals go
	// stale and so does the last window's rate: unknown, not 1 for ever.
	if got := v.Load(t0.Add(16*time.Second + v.cfg.StaleAfter + time.Millisecond)).PrefixHitRate; got != -1 {
		t.Errorf("stale: PrefixHitRate = %v, want -1", got)
	}
	// An engine-computed gauge is used when there are no counters.
	v2 := NewView(ViewConfig{})
	v2.Observe(t0, Metrics{Have: HasWaiting | HasCacheHitRate, CacheHitRate: 0.3})
	if got := v2.Load(t0).PrefixHitRate; got != 0.3 {
		t.Errorf("gauge hit rate = %v, want 0.3", got)
	}
}

func TestViewTicketsIgnored(t *testing.T) {
	v := NewView(ViewConfig{})
	v.FirstToken(at(0), Ticket{})
	v.Done(at(0), Ticket{})
	other := NewView(ViewConfig{}).Dispatch(at(0), 10)
	v.Dispatch(at(0), 5)
	v.Done(at(1), Ticket{seq: 99})
	if l := v.Load(at(1)); l.InFlight != 1 || l.InFlightTokens != 5 {
		t.Fatalf("got %+v, want 1 in flight with 5 tokens", l)
	}
	if !other.Valid() || (Ticket{}).Valid() {
		t.Fatalf("Valid: got %v %v, want true false", other.Valid(), (Ticket{}).Valid())
	}
}

// TestViewSlotReuse checks that a ticket whose request ended is ignored
// after Dispatch gave its slot to another request: a late FirstToken or a
// repeated Done of the first must not move the second.
func TestViewSlotReuse(t *testing.T) {
	v := NewView(ViewConfig{})
	a := v.Dispatch(at(0), 5)
	v.Done(at(1), a)
	b := v.Dispatch(at(2), 7) // takes a's slot
	if b.slot != a.slot {
		t.Fatalf("b got slot %d, want a's %d (the free list is not reused)", b.slot, a.slot)
	}
	v.FirstToken(at(3), a)
	v.Done(at(3), a)
	if l := v.Load(at(3)); l.InFlight != 1 || l.InFlightTokens != 7 {
		t.Fatalf("after a's stale ticket: got %+v, want b alone in flight, waiting for its first token with 7 tokens", l)
	}
	v.FirstToken(at(4), b)
	if l := v.Load(at(4)); l.InFlight != 1 || l.InFlightTokens != 0 {
		t.Fatalf("after b's first token: got %+v, want 1 in flight, 0 tokens waiting", l)
	}
	v.Done(at(5), b)
	if l := v.Load(at(5)); l.InFlight != 0 {
		t.Fatalf("after b done: got %+v, want none in flight", l)
	}
}

// TestViewSteadyStateAllocs checks that Dispatch, FirstToken and Done
// allocate nothing once the View holds as many requests as the load keeps
// in flight (the router calls them under its lock for every request).
func TestViewSteadyStateAllocs(t *testing.T) {
	v := NewView(ViewConfig{})
	v.Observe(at(0), vllmMetrics(0, 0, 0))
	var window [8]Ticket
	i := 0
	step := func() {
		slot := i % len(window)
		v.FirstToken(at(1), window[slot])
		v.Done(at(1), window[slot])
		window[slot] = v.Dispatch(at(1), 100)
		i++
	}
	for range 64 {
		step()
	}
	v.Observe(at(1), vllmMetrics(0, 0, 0)) // empties the transition log
	if n := testing.AllocsPerRun(1000, step); n != 0 {
		t.Fatalf("Dispatch+FirstToken+Done allocated %v times per request, want 0", n)
	}
}

// TestViewLogBound checks that the transition log stays bounded without
// scrapes and that folding keeps the sums.
func TestViewLogBound(t *testing.T) {
	v := NewView(ViewConfig{})
	v.Observe(at(0), vllmMetrics(0, 0, 0))
	n := 3 * maxLog
	for i := 0; i < n; i++ {
		v.Dispatch(at(1+i), 1)
	}
	v.mu.Lock()
	logLen, dW := len(v.log), v.dW
	v.mu.Unlock()
	if logLen > maxLog || dW != n {
		t.Fatalf("log len %d (max %d), dW %d (want %d)", logLen, maxLog, dW, n)
	}
	if l := v.Load(at(2)); l.Waiting != n {
		t.Fatalf("Waiting = %d, want %d", l.Waiting, n)
	}
}

func TestViewConcurrent(t *testing.T) {
	v := NewView(ViewConfig{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				tk := v.Dispatch(at(i), 10)
				v.FirstToken(at(i), tk)
				_ = v.Load(at(i))
				v.Done(at(i), tk)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 500; i++ {
			v.Observe(at(i), vllmMetrics(1, 1, 0.1))
			_ = v.Snapshot()
		}
	}()
	wg.Wait()
	if l := v.Load(at(600)); l.InFlight != 0 || l.InFlightTokens != 0 || l.DecodeTokens != 0 {
		t.Fatalf("after all done: %+v", l)
	}
}

// TestViewGenCachesLoad keeps a Load as the router does (recomputed only
// when Gen changed or now left [from, until] of LoadUntil) through random
// observations (fresh, late and out of order), scrape errors, dispatches,
// first tokens and completions at random times, and checks that it is
// always the Load computed afresh.
func TestViewGenCachesLoad(t *testing.T) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 11))
		v := NewView(ViewConfig{StaleAfter: 300 * time.Millisecond})
		var (
			cached          kvroute.Load
			gen             uint64
			from, until     time.Time
			valid           bool
			tickets         []Ticket
			now             = t0
			recomputed, hit int
		)
		for step := range 20000 {
			now = now.Add(time.Duration(r.IntN(60)) * time.Millisecond)
			switch r.IntN(8) {
			case 0:
				m := vllmMetrics(float64(r.IntN(20)), float64(r.IntN(20)), r.Float64())
				if r.IntN(2) == 0 {
					m.Have |= HasPrefixCounters
					m.PrefixQueries, m.PrefixHits = float64(1000*step), float64(500*step)
				}
				v.Observe(now.Add(-time.Duration(r.IntN(200))*time.Millisecond), m) // scraped a while ago
			case 1:
				v.ObserveError(now, errors.New("scrape failed"))
			case 2, 3:
				tickets = append(tickets, v.Dispatch(now, r.IntN(4000)))
			case 4:
				if len(tickets) > 0 {
					v.FirstToken(now, tickets[r.IntN(len(tickets))])
				}
			case 5:
				if len(tickets) > 0 {
					i := r.IntN(len(tickets))
					v.Done(now, tickets[i])
					tickets = append(tickets[:i], tickets[i+1:]...)
				}
			}
			g := v.Gen()
			if !valid || g != gen || now.Before(from) || now.After(until) {
				cached, until = v.LoadUntil(now)
				gen, from, valid = g, now, true
				recomputed++
			} else {
				hit++
			}
			if want := v.Load(now); !reflect.DeepEqual(cached, want) {
				t.Fatalf("seed %d step %d: kept Load %+v, Load %+v", seed, step, cached, want)
			}
		}
		if hit < 2000 || recomputed < 2000 {
			t.Errorf("seed %d: %d Loads kept, %d recomputed: the test should exercise both", seed, hit, recomputed)
		}
	}
}

// TestViewStatusJSON: /debug/endpoints shows a ViewStatus (and its last
// Metrics) in the snake_case of the router's other debug output.
func TestViewStatusJSON(t *testing.T) {
	st := ViewStatus{
		Last:    Metrics{Flavor: FlavorVLLM, Have: HasWaiting | HasRunning, Waiting: 1, Running: 2, BlockSize: 16},
		Scrapes: 7, ConsecutiveErrors: 1, InFlight: 3,
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"last":{"flavor":"vllm","have":"waiting|running","waiting":1,"running":2,"kv_usage":0,` +
		`"prefix_queries":0,"prefix_hits":0,"cache_hit_rate":0,"preemptions":0,"prompt_tokens":0,"generation_tokens":0,` +
		`"block_size":16,"num_gpu_blocks":0,"kv_capacity_tokens":0},"scrapes":7,"errors":0,"consecutive_errors":1,` +
		`"out_of_order":0,"in_flight":3,"in_flight_tokens":0}`
	if string(b) != want {
		t.Errorf("Marshal:\n got %s\nwant %s", b, want)
	}
}

// TestViewStaleKVUsage: once the signals are stale, KV usage is the
// router's own in-flight tokens over the capacity, as Waiting and Running
// fall back on router-local counts; a fresh scrape brings the engine's
// figure back.
func TestViewStaleKVUsage(t *testing.T) {
	v := NewView(ViewConfig{StaleAfter: time.Second})
	v.Observe(at(0), vllmMetrics(0, 0, 0.95)) // 1600 tokens capacity
	if got, want := v.Load(at(500)).KVUsage, 0.95; got != want {
		t.Fatalf("fresh: KVUsage = %v, want %v", got, want)
	}
	l := v.Load(at(1500))
	if !l.Stale || l.KVUsage != 0 {
		t.Fatalf("stale, nothing in flight: stale=%v KVUsage=%v, want true 0", l.Stale, l.KVUsage)
	}
	v.Dispatch(at(1600), 400)
	if got, want := v.Load(at(1700)).KVUsage, 0.25; got != want {
		t.Fatalf("stale, 400 tokens in flight: KVUsage = %v, want %v", got, want)
	}
	v.Observe(at(1800), vllmMetrics(1, 0, 0.5))
	if got, want := v.Load(at(1900)).KVUsage, 0.5; got != want {
		t.Fatalf("fresh again: KVUsage = %v, want %v", got, want)
	}
}

// TestViewLoRA: the adapters a scrape reports reach the Load (running and
// waiting apart, with max_lora) until the signals go stale or a scrape
// reports none; the Load's LoRALoad answers Active and Runs from them.
func TestViewLoRA(t *testing.T) {
	v := NewView(ViewConfig{StaleAfter: time.Second})
	m := vllmMetrics(1, 2, 0.5)
	m.Have |= HasLoRA
	m.LoRARunning, m.LoRAWaiting, m.MaxLoRA = []string{"a", "b"}, []string{"c"}, 2
	v.Observe(at(0), m)
	l := v.Load(at(10)).LoRA
	want := &kvroute.LoRALoad{Running: []string{"a", "b"}, Waiting: []string{"c"}, Max: 2}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("LoRA = %+v, want %+v", l, want)
	}
	for name, active := range map[string]bool{"a": true, "b": true, "c": true, "d": false} {
		if got := l.Active(name); got != active {
			t.Errorf("Active(%q) = %v, want %v", name, got, active)
		}
	}
	if !l.Runs("a") || l.Runs("c") {
		t.Errorf("Runs(a) = %v, Runs(c) = %v; want a running, c only waiting", l.Runs("a"), l.Runs("c"))
	}
	if got := v.Load(at(1500)).LoRA; got != nil {
		t.Errorf("stale: LoRA = %+v, want nil", got)
	}
	v.Observe(at(2000), vllmMetrics(0, 0, 0))
	if got := v.Load(at(2010)).LoRA; got != nil {
		t.Errorf("scrape without the metric: LoRA = %+v, want nil", got)
	}
	var none *kvroute.LoRALoad
	if none.Active("a") || none.Runs("a") {
		t.Errorf("nil LoRALoad: Active or Runs true")
	}
}

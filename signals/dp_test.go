package signals

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/kvindex"
)

func readDPFixture(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/vllm-dp2.prom")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseMetricsRanks(t *testing.T) {
	body := readDPFixture(t)
	ms, err := ParseMetricsRanks(strings.NewReader(string(body)), "", FlavorAuto, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		waiting, running, kv, queries, hits, preempt float64
	}{
		{1, 3, 0.25, 4096, 2048, 0},
		{4, 7, 0.75, 8192, 1024, 2},
	}
	for r, w := range want {
		m := ms[r]
		got := []float64{m.Waiting, m.Running, m.KVUsage, m.PrefixQueries, m.PrefixHits, m.Preemptions}
		exp := []float64{w.waiting, w.running, w.kv, w.queries, w.hits, w.preempt}
		if fmt.Sprint(got) != fmt.Sprint(exp) {
			t.Errorf("rank %d: got waiting, running, kv, queries, hits, preemptions %v, want %v", r, got, exp)
		}
		// One rank's KV cache, not the sum of both.
		if m.Flavor != FlavorVLLM || m.BlockSize != 16 || m.NumGPUBlocks != 1000 || m.KVCapacityTokens != 16000 {
			t.Errorf("rank %d: got flavor %s, block size %d, blocks %d, capacity %d; want vllm, 16, 1000, 16000",
				r, m.Flavor, m.BlockSize, m.NumGPUBlocks, m.KVCapacityTokens)
		}
	}
	// The whole page still reads as the sum (a server routed as one).
	all, err := ParseMetrics(strings.NewReader(string(body)), "", FlavorAuto)
	if err != nil {
		t.Fatal(err)
	}
	if all.Waiting != 5 || all.Running != 10 || all.KVCapacityTokens != 32000 {
		t.Errorf("ParseMetrics: got waiting %v, running %v, capacity %d; want 5, 10, 32000", all.Waiting, all.Running, all.KVCapacityTokens)
	}
}

func TestParseMetricsRanksErrors(t *testing.T) {
	body := string(readDPFixture(t))
	t.Run("missing rank", func(t *testing.T) {
		ms, err := ParseMetricsRanks(strings.NewReader(body), "", FlavorVLLM, 0, 3)
		if err == nil || !strings.Contains(err.Error(), `engine="2"`) {
			t.Fatalf("got error %v, want one naming engine=\"2\"", err)
		}
		if ms[0].Waiting != 1 || ms[1].Waiting != 4 || ms[2].Have != 0 {
			t.Errorf("got waiting %v, %v and rank 2 have %v; want 1, 4 and none", ms[0].Waiting, ms[1].Waiting, ms[2].Have)
		}
	})
	t.Run("not vllm", func(t *testing.T) {
		sg, err := os.ReadFile("testdata/sglang.prom")
		if err != nil {
			t.Fatal(err)
		}
		_, err = ParseMetricsRanks(strings.NewReader(string(sg)), "", FlavorAuto, 0, 2)
		if err == nil || !strings.Contains(err.Error(), "need vLLM metrics") {
			t.Fatalf("got error %v, want one saying the ranks need vLLM metrics", err)
		}
	})
	t.Run("start rank", func(t *testing.T) {
		// A node of a multi-node deployment (--data-parallel-start-rank 1)
		// labels its ranks from 1.
		ms, err := ParseMetricsRanks(strings.NewReader(body), "", FlavorAuto, 1, 2)
		if err == nil || !strings.Contains(err.Error(), `engine="2"`) || strings.Contains(err.Error(), `engine="1"`) {
			t.Fatalf("got error %v, want one naming engine=\"2\" only", err)
		}
		if ms[0].Waiting != 4 || ms[1].Have != 0 {
			t.Errorf("got waiting %v and rank 2 have %v; want engine 1's 4 and none", ms[0].Waiting, ms[1].Have)
		}
	})
	t.Run("single engine page", func(t *testing.T) {
		// A server without data parallelism labels its series engine="0":
		// rank 0 reads it whole, rank 1 has nothing.
		single := strings.ReplaceAll(body, `engine="1"`, `engine="0"`)
		ms, err := ParseMetricsRanks(strings.NewReader(single), "", FlavorAuto, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		all, _ := ParseMetrics(strings.NewReader(single), "", FlavorAuto)
		if fmt.Sprint(ms[0]) != fmt.Sprint(all) {
			t.Errorf("got %+v, want ParseMetrics' %+v", ms[0], all)
		}
	})
}

func FuzzParseMetricsRanks(f *testing.F) {
	f.Add(string(readDPFixture(f)), uint8(2))
	f.Add("vllm:num_requests_waiting{engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"01\"} 2\n", uint8(2))
	f.Add("vllm:num_requests_running{engine=\"-1\"} 1\nvllm:num_requests_running 3\n", uint8(1))
	f.Add("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"1\"} NaN\n", uint8(3))
	f.Add("sglang:num_queue_reqs 1\n", uint8(2))
	f.Fuzz(func(t *testing.T, page string, n uint8) {
		ranks, first := int(n%8)+1, int(n/8%4)
		ms, err := ParseMetricsRanks(strings.NewReader(page), "", FlavorAuto, first, ranks)
		if len(ms) != ranks {
			t.Fatalf("got %d ranks, want %d", len(ms), ranks)
		}
		for r, m := range ms {
			if m.Have != 0 && m.Have&(HasWaiting|HasRunning) == 0 {
				t.Errorf("rank %d: has %v but no queue metrics", r, m.Have)
			}
			if m.KVUsage < 0 || m.KVUsage > 1 {
				t.Errorf("rank %d: KV usage %v outside 0..1", r, m.KVUsage)
			}
		}
		if err == nil {
			for r, m := range ms {
				if m.Have&(HasWaiting|HasRunning) == 0 {
					t.Errorf("rank %d: no error and no queue metrics", r)
				}
			}
		}
		// Differential: without engine labels every rank reads the whole
		// page, as ParseMetrics does.
		all, aerr := ParseMetrics(strings.NewReader(page), "", FlavorAuto)
		if aerr == nil && (all.Flavor == FlavorVLLM || all.Flavor == FlavorVLLMLegacy) && !strings.Contains(page, EngineLabel) {
			if err != nil {
				t.Fatalf("ParseMetrics read the page, ParseMetricsRanks failed: %v", err)
			}
			for r, m := range ms {
				if fmt.Sprint(m) != fmt.Sprint(all) {
					t.Errorf("rank %d: got %+v, want ParseMetrics' %+v", r, m, all)
				}
			}
		}
	})
}

// consecutiveTCPAddrs returns n tcp:// addresses on 127.0.0.1 with
// consecutive ports, free when it looked: a data-parallel engine's
// publishers (base port + rank).
func consecutiveTCPAddrs(t *testing.T, n int) []string {
	t.Helper()
	base := freeport.Consecutive(t, n)
	out := make([]string, n)
	for r := range out {
		out[r] = "tcp://127.0.0.1:" + strconv.Itoa(base+r)
	}
	return out
}

// TestManagerDataParallel runs a data-parallel target of two ranks: one
// scrape of the server's metrics split by engine label, and each rank's
// KV events read from the configured port plus its rank into the rank's
// endpoint.
func TestManagerDataParallel(t *testing.T) {
	page := readDPFixture(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(page)
	}))
	t.Cleanup(srv.Close)

	addrs := consecutiveTCPAddrs(t, 2)
	var engines []*fakeEngine
	for r, a := range addrs {
		e := newFakeEngineAt(t, a, "", EventEncoding{MapEvents: true})
		e.dpRank = r
		engines = append(engines, e)
	}
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	views := []*View{NewView(ViewConfig{}), NewView(ViewConfig{})}
	target := Target{Endpoint: "e", MetricsURL: srv.URL + "/metrics"}
	for r := range 2 {
		addr, err := config.DataParallelAddress(addrs[0], r) // the configured address is rank 0's
		if err != nil {
			t.Fatal(err)
		}
		target.Ranks = append(target.Ranks, RankTarget{Endpoint: fmt.Sprintf("e#dp%d", r), View: views[r],
			KVEvents: &KVEventsTarget{Address: addr, Topic: testTopic, Sink: idx, DataParallel: true, DataParallelRank: r}})
	}
	mg, err := NewManager(ManagerConfig{Scrape: ScrapeConfig{Interval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mg.Close)
	if err := mg.Sync([]Target{target}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both ranks scraped", func() bool { return views[0].Snapshot().Scrapes > 0 && views[1].Snapshot().Scrapes > 0 })
	if w0, w1 := views[0].Snapshot().Last.Waiting, views[1].Snapshot().Last.Waiting; w0 != 1 || w1 != 4 {
		t.Errorf("got waiting %v and %v, want rank 0's 1 and rank 1's 4", w0, w1)
	}

	for _, e := range engines {
		e.waitSubscribed()
	}
	engines[0].publish(false, stored(0, 2)) // rank 0 holds 2 blocks of the prompt
	engines[1].publish(false, stored(0, 6)) // rank 1 holds all 6
	status := func(ep string) SubscriberStatus {
		for _, st := range mg.Status() {
			if st.Endpoint == ep && st.KVEvents != nil {
				return *st.KVEvents
			}
		}
		return SubscriberStatus{LastSeq: -2}
	}
	waitFor(t, "both ranks' batches", func() bool { return status("e#dp0").LastSeq == 0 && status("e#dp1").LastSeq == 0 })
	hits := idx.Match(kvindex.HashTokens(prompt, 4, nil), nil)
	got := map[string]int{}
	for _, h := range hits {
		got[h.Endpoint] = h.Blocks
	}
	if fmt.Sprint(got) != fmt.Sprint(map[string]int{"e#dp0": 2, "e#dp1": 6}) {
		t.Errorf("got hits %v, want e#dp0: 2 blocks, e#dp1: 6", got)
	}

	// A batch naming another rank (a publisher on the wrong port) is not
	// applied to this rank, and is counted.
	engines[1].dpRank = 0
	engines[1].publish(false, removed(0, 1, 2, 3, 4, 5))
	waitFor(t, "the mismatched batch", func() bool { return status("e#dp1").LastSeq == 1 })
	if st := status("e#dp1"); st.RankMismatches != 1 || st.Batches != 1 {
		t.Errorf("got %d rank mismatches and %d batches applied, want 1 and 1", st.RankMismatches, st.Batches)
	}
	if n := idx.Match(kvindex.HashTokens(prompt, 4, nil), nil); len(n) != 2 {
		t.Errorf("got hits %+v after the mismatched batch, want both ranks' still", n)
	}
	// A batch without a rank is applied.
	engines[1].noRank = true
	engines[1].publish(false, removed(5))
	waitFor(t, "the batch without a rank", func() bool { return status("e#dp1").LastSeq == 2 })
	if st := status("e#dp1"); st.RankMismatches != 1 || st.Batches != 2 {
		t.Errorf("got %d rank mismatches and %d batches applied, want 1 and 2", st.RankMismatches, st.Batches)
	}

	// Status names the ranks, never the engine.
	var names []string
	for _, st := range mg.Status() {
		names = append(names, st.Endpoint)
		if st.Flavor != FlavorVLLM {
			t.Errorf("%s: got flavor %q, want vllm", st.Endpoint, st.Flavor)
		}
	}
	if fmt.Sprint(names) != "[e#dp0 e#dp1]" {
		t.Errorf("got Status endpoints %v, want [e#dp0 e#dp1]", names)
	}

}

// dpPage is a data-parallel vLLM server's metrics page with queue metrics
// for the given engine labels (a page without labels when none).
func dpPage(engines ...int) string {
	var b strings.Builder
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
		fmt.Fprintf(&b, "# TYPE %s gauge\n", name)
		if len(engines) == 0 {
			fmt.Fprintf(&b, "%s{model_name=\"tiny\"} 1\n", name)
		}
		for _, e := range engines {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"tiny\"} %d\n", name, e, e+1)
		}
	}
	b.WriteString("# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"0\"} 1\n")
	return b.String()
}

// TestScrapeRanksAbsent: a four-rank target in front of a server whose page
// has engine="0" and "1" only reports ranks 2 and 3 absent (once, with an
// ERROR naming the page's labels and the configured ranks), and present
// again when the page grows; a failed scrape or an unreadable page tells
// nothing, a page without engine labels is every rank's, and one whose
// labels name none of the configured ranks takes none out.
func TestScrapeRanksAbsent(t *testing.T) {
	var mu sync.Mutex
	page, status := dpPage(0, 1), http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		p, st := page, status
		mu.Unlock()
		w.WriteHeader(st)
		_, _ = io.WriteString(w, p)
	}))
	t.Cleanup(srv.Close)
	serve := func(p string, st int) {
		mu.Lock()
		page, status = p, st
		mu.Unlock()
	}

	var calls []string // "dp2=absent"
	var logs bytes.Buffer
	target := Target{Endpoint: "dp", MetricsURL: srv.URL + "/metrics"}
	for r := range 4 {
		id := fmt.Sprintf("dp#dp%d", r)
		target.Ranks = append(target.Ranks, RankTarget{Endpoint: id, View: NewView(ViewConfig{}),
			OnAbsent: func(_ time.Time, absent bool) {
				calls = append(calls, fmt.Sprintf("%s=%v", id, map[bool]string{true: "absent", false: "present"}[absent]))
			}})
	}
	s, err := NewScraper(ScrapeConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, target)
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string, want string) {
		t.Helper()
		calls = nil
		s.ScrapeOnce(context.Background())
		if got := strings.Join(calls, " "); got != want {
			t.Errorf("%s: got calls %q, want %q", what, got, want)
		}
	}
	errorLines := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "level=ERROR") {
				out = append(out, l)
			}
		}
		return out
	}

	step("first page, two ranks", "dp#dp0=present dp#dp1=present dp#dp2=absent dp#dp3=absent")
	errs := errorLines()
	if len(errs) != 2 {
		t.Fatalf("got ERROR lines %q, want one for each of dp#dp2 and dp#dp3", errs)
	}
	for i, l := range errs {
		for _, want := range []string{fmt.Sprintf("endpoint=dp#dp%d", i+2), fmt.Sprintf("rank=%d", i+2), "engines=0,1", "configured_ranks=0-3"} {
			if !strings.Contains(l, want) {
				t.Errorf("ERROR line %q does not say %s", l, want)
			}
		}
	}
	if v := target.Ranks[2].View.Snapshot(); v.Scrapes != 0 || v.Errors == 0 {
		t.Errorf("absent rank's view: %d scrapes, %d errors; want its signals failing", v.Scrapes, v.Errors)
	}
	step("same page again", "") // no change, no call
	if n := len(errorLines()); n != 2 || strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("after a second scrape: %d ERROR lines (want still 2), log:\n%s", n, logs.String())
	}

	serve("", http.StatusInternalServerError)
	step("failed scrape", "")
	serve("garbage{{{\n", http.StatusOK)
	step("unreadable page", "")
	serve("sglang:num_queue_reqs 1\nsglang:num_running_reqs 1\n", http.StatusOK)
	step("not vLLM's metrics", "")

	serve(dpPage(0, 1, 2, 3), http.StatusOK)
	step("the page grows", "dp#dp2=present dp#dp3=present")
	if !strings.Contains(logs.String(), "data-parallel rank back") {
		t.Errorf("no INFO line for the ranks back; log:\n%s", logs.String())
	}
	if v := target.Ranks[3].View.Snapshot(); v.Scrapes == 0 || v.Last.Waiting != 4 {
		t.Errorf("rank 3's view: %d scrapes, waiting %v; want its own series (4)", v.Scrapes, v.Last.Waiting)
	}

	serve(dpPage(0, 1, 2), http.StatusOK)
	step("scaled down to three", "dp#dp3=absent")
	serve(dpPage(), http.StatusOK)
	step("no engine labels", "dp#dp3=present")
	serve(dpPage(0, 1), http.StatusOK)
	step("two again", "dp#dp2=absent dp#dp3=absent")
	logs.Reset()
	serve(dpPage(7, 8), http.StatusOK)
	step("labels of none of the configured ranks", "dp#dp2=present dp#dp3=present")
	if errs := errorLines(); len(errs) != 1 || !strings.Contains(errs[0], "engines=7,8") {
		t.Errorf("got ERROR lines %q, want one naming the page's engines 7,8", errs)
	}
}

// TestManagerRanksAbsent: the Manager's loop of a data-parallel target
// calls each rank's OnAbsent, and restates the ranks' presence when a Sync
// replaces the loop.
func TestManagerRanksAbsent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, dpPage(0, 1))
	}))
	t.Cleanup(srv.Close)
	var mu sync.Mutex
	state := map[string]bool{}
	target := Target{Endpoint: "dp", MetricsURL: srv.URL + "/metrics"}
	for r := range 3 {
		id := fmt.Sprintf("dp#dp%d", r)
		target.Ranks = append(target.Ranks, RankTarget{Endpoint: id, View: NewView(ViewConfig{}),
			OnAbsent: func(_ time.Time, absent bool) {
				mu.Lock()
				state[id] = absent
				mu.Unlock()
			}})
	}
	mg, err := NewManager(ManagerConfig{Scrape: ScrapeConfig{Interval: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mg.Close)
	if err := mg.Sync([]Target{target}); err != nil {
		t.Fatal(err)
	}
	got := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(state)
	}
	waitFor(t, "rank 2 absent", func() bool { return got() == "map[dp#dp0:false dp#dp1:false dp#dp2:true]" })
	// A new loop (another flavour setting) tells again from scratch.
	mu.Lock()
	clear(state)
	mu.Unlock()
	target.Flavor = FlavorVLLM
	if err := mg.Sync([]Target{target}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new loop's verdict", func() bool { return got() == "map[dp#dp0:false dp#dp1:false dp#dp2:true]" })
}

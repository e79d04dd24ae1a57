package proxy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/signals"
)

// rankRecorder is a data-parallel engine's HTTP side: it records the
// X-Data-Parallel-Rank values of every request it serves.
type rankRecorder struct {
	mu   sync.Mutex
	got  [][]string // each request's values of the header
	fail string     // a rank whose requests get a 500
}

func (rr *rankRecorder) handler(name string) http.HandlerFunc {
	ok := okHandler(name)
	return func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Values(kvroute.HeaderDataParallelRank)
		rr.mu.Lock()
		rr.got = append(rr.got, v)
		fail := rr.fail
		rr.mu.Unlock()
		if fail != "" && len(v) == 1 && v[0] == fail {
			statusHandler(http.StatusInternalServerError)(w, r)
			return
		}
		ok(w, r)
	}
}

func (rr *rankRecorder) take() [][]string {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	out := rr.got
	rr.got = nil
	return out
}

// dpConfig is a one-model config over a data-parallel endpoint "dp" of
// size ranks and, unless plain is "", a plain one: debug on (the response
// names the endpoint), signals and active health checks off.
func dpConfig(policy, dpURL string, ranks int, plain string) config.Config {
	cfg := testConfig(policy, dpURL)
	m := &cfg.Models[0]
	m.Endpoints[0].ID, m.Endpoints[0].DataParallelSize = "dp", ranks
	if plain != "" {
		m.Endpoints = append(m.Endpoints, config.Endpoint{ID: "plain", URL: plain})
	}
	m.Signals.Disabled = true
	cfg.Debug.Enabled = true
	return cfg
}

// TestDataParallelRankHeader: every request to a rank endpoint carries
// X-Data-Parallel-Rank with its rank, once, whatever the client sent (any
// case, trusted or not); a plain endpoint gets no such header.
func TestDataParallelRankHeader(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			dp, plain := &rankRecorder{}, &rankRecorder{}
			bdp, bplain := newBackend(t, "dp", dp.handler("dp")), newBackend(t, "plain", plain.handler("plain"))
			cfg := dpConfig("rr", bdp.URL, 3, bplain.URL)
			if trusted {
				cfg.TrustedClients = []string{"127.0.0.1"}
			}
			tp := newTestProxy(t, cfg)
			seen := map[string]int{}
			for i := range 8 {
				req, err := http.NewRequest(http.MethodPost, tp.srv.URL+PathCompletions,
					strings.NewReader(`{"model":"m","prompt":"hello `+strconv.Itoa(i)+`","stream":`+strconv.FormatBool(i%2 == 0)+`}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(kvroute.HeaderDataParallelRank, "2")
				req.Header["x-data-parallel-rank"] = []string{"7"} // sent as written: not canonical
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				readAll(t, resp)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				ep := resp.Header.Get(HeaderEndpoint)
				seen[ep]++
				var got [][]string
				want := [][]string{nil}
				switch {
				case ep == "plain":
					got = plain.take()
				case strings.HasPrefix(ep, "dp#dp"):
					got = dp.take()
					want = [][]string{{strings.TrimPrefix(ep, "dp#dp")}}
				default:
					t.Fatalf("request %d went to %q", i, ep)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("request %d to %s: the engine got %s %q, want %q", i, ep, kvroute.HeaderDataParallelRank, got, want)
				}
			}
			// Round robin over four endpoints: the three ranks and the plain one.
			if fmt.Sprint(seen) != "map[dp#dp0:2 dp#dp1:2 dp#dp2:2 plain:2]" {
				t.Errorf("got requests per endpoint %v, want 2 on each rank and the plain endpoint", seen)
			}
		})
	}
}

// TestDataParallelRetryPinsRank: a retry after a rank's 5xx goes to another
// rank of the same server, pinned to that rank.
func TestDataParallelRetryPinsRank(t *testing.T) {
	dp := &rankRecorder{fail: "0"}
	b := newBackend(t, "dp", dp.handler("dp"))
	cfg := dpConfig("first", b.URL, 2, "")
	cfg.Models[0].Router.FailThreshold = 1
	tp := newTestProxy(t, cfg)
	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderEndpoint) != "dp#dp1" {
		t.Fatalf("got status %d from %q (%s), want 200 from dp#dp1", resp.StatusCode, resp.Header.Get(HeaderEndpoint), body)
	}
	if got := dp.take(); fmt.Sprint(got) != "[[0] [1]]" {
		t.Errorf("got ranks %v over the attempts, want [[0] [1]]", got)
	}
	// The failure ejects rank 0 only: the other rank of the server serves.
	st := tp.Router("m").Status(tp.clock.Now())
	if len(st) != 2 || st[0].ID != "dp#dp0" || st[1].ID != "dp#dp1" {
		t.Fatalf("got endpoints %+v, want dp#dp0 and dp#dp1", st)
	}
	if st[0].Healthy || !st[1].Healthy {
		t.Errorf("got dp#dp0 healthy %v, dp#dp1 healthy %v; want rank 0 ejected, rank 1 not", st[0].Healthy, st[1].Healthy)
	}
	resp = tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
	if readAll(t, resp); resp.Header.Get(HeaderEndpoint) != "dp#dp1" || fmt.Sprint(dp.take()) != "[[1]]" {
		t.Errorf("while rank 0 is ejected: got %q, want dp#dp1 pinned to rank 1", resp.Header.Get(HeaderEndpoint))
	}
}

// rankPublisher is one data-parallel rank's KV-event publisher, as vLLM's
// rank r binds it: the configured port plus r.
type rankPublisher struct {
	t    *testing.T
	pub  zmq4.Socket
	rank int
	seq  uint64
}

// newRankPublisher binds rank rank's publisher, whose configured (rank 0)
// port is port.
func newRankPublisher(t *testing.T, port, rank int) *rankPublisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	if err := pub.Listen("tcp://127.0.0.1:" + strconv.Itoa(port+rank)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); pub.Close() })
	return &rankPublisher{t: t, pub: pub, rank: rank}
}

func (p *rankPublisher) waitSubscribed() {
	p.t.Helper()
	tp := p.pub.(interface{ Topics() []string })
	waitFor(p.t, "rank "+strconv.Itoa(p.rank)+"'s subscriber", func() bool { return slices.Contains(tp.Topics(), "") })
}

// store publishes a batch storing tokens' full blocks of 16.
func (p *rankPublisher) store(tokens []uint32) {
	p.t.Helper()
	ev := signals.KVEvent{Kind: signals.EventBlockStored, BlockSize: 16, Medium: "GPU", TokenIDs: tokens}
	for i := range len(tokens) / 16 {
		ev.BlockHashes = append(ev.BlockHashes, uint64(1000*(p.rank+1)+i))
	}
	b := signals.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []signals.KVEvent{ev}, DPRank: p.rank, HasDPRank: true}
	payload, err := signals.EncodeEventBatch(nil, &b, signals.EventEncoding{MapEvents: true})
	if err != nil {
		p.t.Fatal(err)
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	p.seq++
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(""), seq[:], payload)); err != nil {
		p.t.Fatal(err)
	}
}

func tokenRange(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func tokensJSON(ids []uint32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(int(id))
	}
	return "[" + strings.Join(s, ",") + "]"
}

// TestDataParallelSignals: one scrape of a data-parallel vLLM server gives
// each rank its own engine label's load, and each rank's KV events, read
// at the configured port plus the rank, feed that rank's entries in the
// precise index; kv-aware then routes a prompt to the rank that holds it.
func TestDataParallelSignals(t *testing.T) {
	t.Run("ranks 0 and 1", func(t *testing.T) { testDataParallelSignals(t, 0) })
	// A node of a multi-node deployment (--data-parallel-start-rank 3).
	t.Run("ranks 3 and 4", func(t *testing.T) { testDataParallelSignals(t, 3) })
}

func testDataParallelSignals(t *testing.T, start int) {
	id0, id1 := kvroute.DataParallelID("dp", start), kvroute.DataParallelID("dp", start+1)
	page, err := os.ReadFile("../signals/testdata/vllm-dp2.prom")
	if err != nil {
		t.Fatal(err)
	}
	page = []byte(strings.ReplaceAll(string(page), `engine="1"`, `engine="`+strconv.Itoa(start+1)+`"`))
	page = []byte(strings.ReplaceAll(string(page), `engine="0"`, `engine="`+strconv.Itoa(start)+`"`))
	dp := &rankRecorder{}
	ok := dp.handler("dp")
	b := newBackend(t, "dp", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			_, _ = w.Write(page)
			return
		}
		ok(w, r)
	})
	port := freeport.Consecutive(t, 2) - start // the port vLLM is configured with
	pubs := []*rankPublisher{newRankPublisher(t, port, start), newRankPublisher(t, port, start+1)}

	cfg := dpConfig(policy.Default, b.URL, 2, "")
	m := &cfg.Models[0]
	m.Signals = config.Signals{ScrapeInterval: 10 * time.Millisecond}
	m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
	m.Endpoints[0].KVEvents = config.KVEvents{Address: "tcp://127.0.0.1:" + strconv.Itoa(port)}
	m.Endpoints[0].DataParallelStartRank = start
	tp := newTestProxyWith(t, cfg, policy.New)
	runSignals(t, tp)

	r := tp.Router("m")
	waitFor(t, "both ranks scraped", func() bool {
		st := r.Status(time.Now())
		return st[0].Signals.Scrapes > 0 && st[1].Signals.Scrapes > 0
	})
	st := r.Status(time.Now())
	for i, want := range []struct{ waiting, running float64 }{{1, 3}, {4, 7}} {
		if got := st[i].Signals.Last; got.Waiting != want.waiting || got.Running != want.running || got.KVCapacityTokens != 16000 {
			t.Errorf("%s: got waiting %v, running %v, capacity %d; want %v, %v, 16000 (its own engine label's)",
				st[i].ID, got.Waiting, got.Running, got.KVCapacityTokens, want.waiting, want.running)
		}
		if !st[i].Precise {
			t.Errorf("%s: its KV events do not feed the precise index", st[i].ID)
		}
	}

	for _, p := range pubs {
		p.waitSubscribed()
	}
	hot := tokenRange(100, 64)  // 4 blocks, cached by rank 1
	cold := tokenRange(900, 32) // 2 blocks, cached by rank 0
	pubs[1].store(hot)
	pubs[0].store(cold)
	idx := tp.pools["m"].precise.index
	hits := func(tokens []uint32) string {
		return fmt.Sprint(idx.Match(kvindex.HashTokens(tokens, 16, nil), nil))
	}
	// The index holds a batch's blocks a moment before its subscriber's
	// status counts it: wait for both.
	waitFor(t, "both ranks' events", func() bool {
		ev := tp.sig.kvEvents("m")
		return hits(hot) != "[]" && hits(cold) != "[]" && ev[id0].Batches > 0 && ev[id1].Batches > 0
	})
	if got := hits(hot); !strings.Contains(got, id1) || strings.Contains(got, id0) {
		t.Errorf("hot prompt: got hits %s, want %s's only", got, id1)
	}
	if got := hits(cold); !strings.Contains(got, id0) || strings.Contains(got, id1) {
		t.Errorf("cold prompt: got hits %s, want %s's only", got, id0)
	}
	ev := tp.sig.kvEvents("m")
	if ev[id0].Batches != 1 || ev[id1].Batches != 1 || ev[id0].RankMismatches+ev[id1].RankMismatches != 0 {
		t.Errorf("got subscriber status %+v, want one batch on each rank", ev)
	}
	// The router's own metrics name the ranks.
	mfs, err := tp.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, mf := range mfs {
		if n := mf.GetName(); n == "kvroute_endpoint_waiting" || n == "kvroute_endpoint_kv_event_rank_mismatches_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" {
						series = append(series, fmt.Sprintf("%s{%s} %v", n, l.GetValue(), m.GetGauge().GetValue()+m.GetCounter().GetValue()))
					}
				}
			}
		}
	}
	slices.Sort(series)
	want := strings.NewReplacer("ID0", id0, "ID1", id1).Replace("[kvroute_endpoint_kv_event_rank_mismatches_total{ID0} 0 " +
		"kvroute_endpoint_kv_event_rank_mismatches_total{ID1} 0 kvroute_endpoint_waiting{ID0} 1 kvroute_endpoint_waiting{ID1} 4]")
	if fmt.Sprint(series) != want {
		t.Errorf("got router metrics %v, want %s", series, want)
	}
	// Every subscriber counter the signals package exports (orphans,
	// replays, ...) is on the router's page too, per model and endpoint.
	byName := map[string]map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && m.GetCounter() != nil {
					if byName[mf.GetName()] == nil {
						byName[mf.GetName()] = map[string]float64{}
					}
					byName[mf.GetName()][l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, c := range signals.KVEventCounters() {
		for _, id := range []string{id0, id1} {
			st := ev[id]
			if got, ok := byName[c.Name][id]; !ok || got != float64(c.Value(&st)) {
				t.Errorf("%s{endpoint=%q}: got %v (present %v), want %d", c.Name, id, got, ok, c.Value(&st))
			}
		}
	}
}

// TestDataParallelAffinity: kv-aware sends a prompt to the rank whose KV
// cache holds it (precise index, from the rank's own KV events), and a
// repeated prompt to the rank it went to before (the router's own record),
// each request pinned to its rank. The server is a node of a multi-node
// deployment, fronting ranks 5 to 8: they publish on the configured port
// plus their rank, and are pinned as the server's engine cores 0 to 3.
func TestDataParallelAffinity(t *testing.T) {
	const start = 5
	dp := &rankRecorder{}
	b := newBackend(t, "dp", dp.handler("dp"))
	port := freeport.Consecutive(t, 4) - start // the port vLLM is configured with
	var pubs []*rankPublisher
	for i := range 4 {
		pubs = append(pubs, newRankPublisher(t, port, start+i))
	}
	cfg := dpConfig(policy.Default, b.URL, 4, "")
	m := &cfg.Models[0]
	m.Endpoints[0].DataParallelStartRank = start
	m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
	m.Endpoints[0].KVEvents = config.KVEvents{Address: "tcp://127.0.0.1:" + strconv.Itoa(port)}
	tp := newTestProxyWith(t, cfg, policy.New)
	runSignals(t, tp)
	for _, p := range pubs {
		p.waitSubscribed()
	}
	long := tokenRange(100, 512) // 32 blocks
	pubs[2].store(long)
	idx := tp.pools["m"].precise.index
	waitFor(t, "rank 2's events", func() bool { return len(idx.Match(kvindex.HashTokens(long, 16, nil), nil)) > 0 })

	post := func(tokens []uint32) string {
		t.Helper()
		tp.clock.Advance(time.Second)
		resp := tp.post(t, PathCompletions, `{"model":"m","prompt":`+tokensJSON(tokens)+`,"max_tokens":1}`)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		ep := resp.Header.Get(HeaderEndpoint)
		rank, err := strconv.Atoi(strings.TrimPrefix(ep, "dp#dp"))
		if err != nil || rank < start || rank >= start+4 {
			t.Fatalf("routed to %q, want one of dp#dp5 ... dp#dp8", ep)
		}
		if got := dp.take(); fmt.Sprint(got) != fmt.Sprint([][]string{{strconv.Itoa(rank - start)}}) {
			t.Errorf("request to %s: the engine got ranks %v, want [[%d]] (its place behind the URL)", ep, got, rank-start)
		}
		return ep
	}
	for i := range 3 {
		if ep := post(long); ep != "dp#dp7" {
			d, _ := json.Marshal(tp.Router("m").Decisions(1))
			t.Errorf("cached prompt, request %d: routed to %s, want dp#dp7 (holds its blocks); the decision: %s", i, ep, d)
		}
	}
	other := tokenRange(5000, 512)
	first := post(other)
	for i := range 3 {
		if ep := post(other); ep != first {
			t.Errorf("repeated prompt, request %d: routed to %s, want %s (where it went first)", i+2, ep, first)
		}
	}
}

// TestDataParallelHealthCheck: one probe of a data-parallel server's URL
// stands for all its ranks: when it fails they all leave the rotation, and
// the plain endpoint next to them stays.
func TestDataParallelHealthCheck(t *testing.T) {
	var probes atomic.Int32
	dp := newBackend(t, "dp", okHandler("dp"))
	plain := newBackend(t, "plain", okHandler("plain"))
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			probes.Add(1)
		}
		dp.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(counted.Close)
	cfg := dpConfig("first", counted.URL, 3, plain.URL)
	cfg.HealthCheck = config.HealthCheck{Interval: 20 * time.Millisecond, Timeout: 20 * time.Millisecond, UnhealthyThreshold: 1, HealthyThreshold: 1}
	tp := newTestProxy(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- tp.RunHealthChecks(ctx) }()
	healthy := func() string {
		var s []string
		for _, st := range tp.Router("m").Status(tp.clock.Now()) {
			s = append(s, fmt.Sprintf("%s=%v", st.ID, st.Healthy))
		}
		return strings.Join(s, " ")
	}
	dp.down.Store(true)
	waitFor(t, "the ranks to fail their health checks", func() bool {
		return healthy() == "dp#dp0=false dp#dp1=false dp#dp2=false plain=true"
	})
	dp.down.Store(false)
	waitFor(t, "the ranks to pass again", func() bool { return healthy() == "dp#dp0=true dp#dp1=true dp#dp2=true plain=true" })
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := recv(t, "health checks to stop", done); err != nil {
		t.Errorf("RunHealthChecks: %v", err)
	}
	// One probe loop for the three ranks: about one probe per interval,
	// not three.
	elapsed := time.Since(start)
	if n, most := int(probes.Load()), int(elapsed/(20*time.Millisecond))+2; n > most {
		t.Errorf("got %d probes of the URL in %v, want at most %d (one loop at a 20ms interval)", n, elapsed, most)
	}
}

// shrunkVLLM is a vLLM server with --data-parallel-size 2 behind a config
// that says more: /metrics has engine="0" and "1" only, and a request
// pinned to a rank it does not have gets vLLM's 400 (a stream: a 200 whose
// one event is that error). It records the ranks of the requests it gets.
func shrunkVLLM(t *testing.T, dp *rankRecorder) *backend {
	ok := dp.handler("dp")
	return newBackend(t, "dp", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
				fmt.Fprintf(w, "# TYPE %s gauge\n%s{engine=\"0\",model_name=\"m\"} 0\n%s{engine=\"1\",model_name=\"m\"} 0\n", name, name, name)
			}
			return
		}
		rank, err := strconv.Atoi(r.Header.Get(kvroute.HeaderDataParallelRank))
		if err != nil || rank < 2 {
			ok(w, r)
			return
		}
		dp.mu.Lock()
		dp.got = append(dp.got, r.Header.Values(kvroute.HeaderDataParallelRank))
		dp.mu.Unlock()
		msg := fmt.Sprintf(`{"error":{"message":"data_parallel_rank %d is out of range [0, 2).","type":"BadRequestError","param":null,"code":400}}`, rank)
		if strings.Contains(dpRequestBody(r), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\n\n", msg)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(msg))
	})
}

func dpRequestBody(r *http.Request) string {
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestDataParallelAbsentRanks: data_parallel_size 4 in front of a server
// with two ranks. Once its metrics were scraped, ranks 2 and 3 (no
// engine="2" or "3" series) are out of rotation, whatever the policy (for
// kv-aware their stale signals look idle) and though the URL's health
// probe passes: every request succeeds on rank 0 or 1. /debug/endpoints,
// kvroute_endpoint_absent and kvroute_endpoint_healthy say so. A reload
// down to two ranks and back re-adds them present, and the next scrape
// takes them out again.
func TestDataParallelAbsentRanks(t *testing.T) {
	for _, name := range []string{policy.Default, "rr"} {
		t.Run(name, func(t *testing.T) {
			dp := &rankRecorder{}
			b := shrunkVLLM(t, dp)
			cfg := dpConfig(name, b.URL, 4, "")
			cfg.Models[0].Signals = config.Signals{ScrapeInterval: 10 * time.Millisecond}
			cfg.HealthCheck = config.HealthCheck{Interval: 50 * time.Millisecond, Timeout: 50 * time.Millisecond, UnhealthyThreshold: 5, HealthyThreshold: 1}
			newPicker := testPickers
			if name == policy.Default {
				newPicker = policy.New
			}
			tp := newTestProxyWith(t, cfg, newPicker)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 2)
			go func() { done <- tp.RunSignals(ctx) }()
			go func() { done <- tp.RunHealthChecks(ctx) }()
			t.Cleanup(func() {
				cancel()
				for range 2 {
					if err := <-done; err != nil {
						t.Errorf("RunSignals or RunHealthChecks: %v", err)
					}
				}
			})
			r := tp.Router("m")
			outs := func() string {
				var s []string
				for _, st := range r.Status(tp.clock.Now()) {
					s = append(s, fmt.Sprintf("%s=%v/%s", st.ID, st.Healthy, st.Out))
				}
				return strings.Join(s, " ")
			}
			absent := func() bool {
				st := r.Status(tp.clock.Now())
				return len(st) == 4 && st[2].Absent && st[3].Absent
			}
			const want = "dp#dp0=true/ dp#dp1=true/ dp#dp2=false/absent_rank dp#dp3=false/absent_rank"
			waitFor(t, "the first scrape", func() bool { return r.Status(tp.clock.Now())[0].Signals.Scrapes > 0 })
			if !absent() {
				waitFor(t, "ranks 2 and 3 absent", absent)
			}
			time.Sleep(150 * time.Millisecond) // health probes pass meanwhile: they do not bring them back
			if got := outs(); got != want {
				t.Errorf("after passing health probes: got %s, want %s", got, want)
			}

			post := func(n int) {
				t.Helper()
				for i := range n {
					tp.clock.Advance(10 * time.Millisecond)
					resp := tp.post(t, PathCompletions, fmt.Sprintf(`{"model":"m","prompt":"hello %d","stream":%v}`, i, i%2 == 0))
					body := readAll(t, resp)
					if resp.StatusCode != http.StatusOK || strings.Contains(body, "out of range") {
						t.Fatalf("request %d: status %d from %s: %s", i, resp.StatusCode, resp.Header.Get(HeaderEndpoint), body)
					}
				}
				for _, got := range dp.take() {
					if len(got) != 1 || (got[0] != "0" && got[0] != "1") {
						t.Errorf("a request went to rank %v, which the server does not have", got)
					}
				}
			}
			post(40)

			// What an operator sees.
			resp, err := http.Get(tp.srv.URL + PathEndpoints)
			if err != nil {
				t.Fatal(err)
			}
			var eps map[string]struct {
				Endpoints []struct {
					ID      string
					Healthy bool
					Absent  bool
					Out     string
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&eps); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := fmt.Sprintf("%+v", eps["m"].Endpoints); got != "[{ID:dp#dp0 Healthy:true Absent:false Out:} {ID:dp#dp1 Healthy:true Absent:false Out:} "+
				"{ID:dp#dp2 Healthy:false Absent:true Out:absent_rank} {ID:dp#dp3 Healthy:false Absent:true Out:absent_rank}]" {
				t.Errorf("%s: got %s", PathEndpoints, got)
			}
			gauges := map[string]float64{}
			mfs, err := tp.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					var ep, kind string
					for _, l := range m.GetLabel() {
						switch l.GetName() {
						case "endpoint":
							ep = l.GetValue()
						case "kind":
							kind = l.GetValue()
						}
					}
					switch n := mf.GetName(); n {
					case "kvroute_endpoint_absent", "kvroute_endpoint_healthy":
						gauges[n+"{"+ep+"}"] = m.GetGauge().GetValue()
					case "kvroute_ejections_total":
						gauges[n+"{"+ep+","+kind+"}"] = m.GetCounter().GetValue()
					}
				}
			}
			for k, v := range map[string]float64{
				"kvroute_endpoint_absent{dp#dp1}": 0, "kvroute_endpoint_absent{dp#dp2}": 1, "kvroute_endpoint_absent{dp#dp3}": 1,
				"kvroute_endpoint_healthy{dp#dp1}": 1, "kvroute_endpoint_healthy{dp#dp2}": 0,
				"kvroute_ejections_total{dp#dp2,absent}": 1, "kvroute_ejections_total{dp#dp3,absent}": 1,
			} {
				if got, ok := gauges[k]; !ok || got != v {
					t.Errorf("%s: got %v (present %v), want %v", k, got, ok, v)
				}
			}

			// A reload down to the server's two ranks, then back to four:
			// the ranks added again start present, and the next scrape
			// takes them out.
			two := cfg
			two.Models = slices.Clone(cfg.Models)
			two.Models[0].Endpoints = slices.Clone(cfg.Models[0].Endpoints)
			two.Models[0].Endpoints[0].DataParallelSize = 2
			if _, err := tp.Reload(func() (config.Config, error) { return two, nil }); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "two ranks", func() bool { return outs() == "dp#dp0=true/ dp#dp1=true/" })
			post(10)
			if _, err := tp.Reload(func() (config.Config, error) { return cfg, nil }); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "ranks 2 and 3 absent again", absent)
			if got := outs(); got != want {
				t.Errorf("after the reload: got %s, want %s", got, want)
			}
			post(20)
		})
	}
}

// runSignals runs tp's engine signals (RunSignals) until the test ends.
func runSignals(t *testing.T, tp *testProxy) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunSignals(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunSignals: %v", err)
		}
	})
}

package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/openai"
	dto "github.com/prometheus/client_model/go"
	"github.com/vmihailenco/msgpack/v5"
)

// testDP runs a data-parallel server of size ranks (the tiny profile at
// speed 100 unless cfg says otherwise) behind an httptest server.
func testDP(t testing.TB, cfg Config, size int) (*DP, *httptest.Server) {
	t.Helper()
	testDefaults(t, &cfg)
	d, err := NewDP(cfg, size)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(d.Handler())
	host, port := splitHostPort(t, hs.URL)
	d.SetAdvertise(host, port)
	runUntilCleanup(t, hs, d.Run)
	return d, hs
}

// postRank posts body with the header X-data-parallel-rank: rank (spelled
// in lower case, as a proxy may send it) unless rank is "".
func postRank(t testing.TB, url, rank, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if rank != "" {
		req.Header["x-data-parallel-rank"] = []string{rank}
	}
	return roundTrip(t, req)
}

// sample is the value of the series of family name whose labels include
// want, and whether there is one.
func sample(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// TestDPHeaderPinsRank: a long prompt sent twice to rank 1 is cached on
// rank 1 only; the header's name is case-insensitive and its value read
// as Python's int() reads it.
func TestDPHeaderPinsRank(t *testing.T) {
	_, hs := testDP(t, Config{}, 2)
	prompt := strings.Repeat("A long shared document about data parallel ranks. ", 12)
	body := fmt.Sprintf(`{"prompt":%q,"max_tokens":2}`, prompt)
	cached := func(rank string) (prompt, cached int) {
		t.Helper()
		code, _, b := postRank(t, hs.URL+"/v1/completions", rank, body)
		if code != 200 {
			t.Fatalf("rank %q: got %d %s", rank, code, b)
		}
		var c openai.Completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return c.Usage.PromptTokens, c.Usage.CachedTokens()
	}
	if _, got := cached("1"); got != 0 {
		t.Errorf("first request on rank 1: got cached_tokens %d, want 0", got)
	}
	n, got := cached(" +0_1 ") // int(" +0_1 ") == 1
	if got == 0 || got > n {
		t.Errorf("second request on rank 1: got cached_tokens %d of %d, want the prompt's full blocks", got, n)
	}
	if _, got := cached("0"); got != 0 {
		t.Errorf("the same prompt on rank 0: got cached_tokens %d, want 0 (rank 1's cache is its own)", got)
	}
	mfs := scrape(t, hs.URL)
	for rank, want := range map[string]float64{"0": 1, "1": 2} {
		if got, ok := sample(mfs, "vllm:request_success_total", map[string]string{"engine": rank, "finished_reason": "length"}); !ok || got != want {
			t.Errorf("engine %s: got %v requests (found %v), want %v", rank, got, ok, want)
		}
	}
	if hits, _ := sample(mfs, "vllm:prefix_cache_hits_total", map[string]string{"engine": "1"}); hits == 0 {
		t.Error("engine 1 reports no prefix-cache hits")
	}
	if hits, _ := sample(mfs, "vllm:prefix_cache_hits_total", map[string]string{"engine": "0"}); hits != 0 {
		t.Errorf("engine 0 reports %v prefix-cache hits, want 0", hits)
	}
}

// TestDPBadRankHeader: a rank out of range is vLLM's 400 error (a stream:
// a 200 whose one event is that error); a value that is not an integer is
// ignored, as vLLM's _get_data_parallel_rank ignores it.
func TestDPBadRankHeader(t *testing.T) {
	_, hs := testDP(t, Config{}, 2)
	const errBody = `{"error":{"message":"data_parallel_rank %s is out of range [0, 2).","type":"BadRequestError","param":null,"code":400}}`
	for _, tc := range []struct {
		rank, body string
		wantCode   int
		want       string // the body, or a prefix of it ("" = a completion)
	}{
		{"2", `{"prompt":"hi","max_tokens":1}`, 400, fmt.Sprintf(errBody, "2") + "\n"},
		{"-1", `{"prompt":"hi","max_tokens":1}`, 400, fmt.Sprintf(errBody, "-1") + "\n"},
		{"007", `{"prompt":"hi","max_tokens":1}`, 400, fmt.Sprintf(errBody, "7") + "\n"},
		{"99999999999999999999", `{"prompt":"hi","max_tokens":1}`, 400, fmt.Sprintf(errBody, "99999999999999999999") + "\n"},
		{"2", `{"prompt":"hi","max_tokens":1,"stream":true}`, 200, "data: " + fmt.Sprintf(errBody, "2") + "\n\ndata: [DONE]\n\n"},
		{"2", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":true}`, 200, "data: " + fmt.Sprintf(errBody, "2") + "\n\ndata: [DONE]\n\n"},
		// The body is validated first, as in vLLM.
		{"2", `{"prompt":"hi","max_tokens":-1}`, 400, `{"error":{"message":"max_tokens`},
		{"abc", `{"prompt":"hi","max_tokens":1}`, 200, ""},
		{"1.0", `{"prompt":"hi","max_tokens":1}`, 200, ""},
		{"1__0", `{"prompt":"hi","max_tokens":1}`, 200, ""},
		{"", `{"prompt":"hi","max_tokens":1}`, 200, ""},
	} {
		url := hs.URL + "/v1/completions"
		if strings.Contains(tc.body, "messages") {
			url = hs.URL + "/v1/chat/completions"
		}
		code, hdr, b := postRank(t, url, tc.rank, tc.body)
		switch {
		case code != tc.wantCode:
			t.Errorf("rank %q %s: got %d %s, want %d", tc.rank, tc.body, code, b, tc.wantCode)
		case tc.want == "" && !strings.Contains(string(b), `"finish_reason":"length"`):
			t.Errorf("rank %q: got %s, want a completion", tc.rank, b)
		case tc.want != "" && !strings.HasPrefix(string(b), tc.want):
			t.Errorf("rank %q %s: got %q, want %q", tc.rank, tc.body, b, tc.want)
		case strings.Contains(tc.body, "stream") && !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream"):
			t.Errorf("rank %q stream: got Content-Type %q", tc.rank, hdr.Get("Content-Type"))
		}
	}
}

// TestDPSpreads: requests without the header go to every rank, and
// /metrics has each rank's series labelled with its engine.
func TestDPSpreads(t *testing.T) {
	for _, flavor := range []string{FlavorVLLM, FlavorVLLMLegacy} {
		t.Run(flavor, func(t *testing.T) {
			const size = 3
			_, hs := testDP(t, Config{MetricsFlavor: flavor}, size)
			for i := range 2 * size {
				if code, _, b := postRank(t, hs.URL+"/v1/completions", "", fmt.Sprintf(`{"prompt":"request %d","max_tokens":2}`, i)); code != 200 {
					t.Fatalf("got %d %s", code, b)
				}
			}
			mfs := scrape(t, hs.URL)
			var total float64
			for k := range size {
				engine := fmt.Sprint(k)
				n, ok := sample(mfs, "vllm:request_success_total", map[string]string{"engine": engine, "finished_reason": "length"})
				if !ok || n == 0 {
					t.Errorf("engine %s: got %v requests (found %v), want some", engine, n, ok)
				}
				total += n
				if v, ok := sample(mfs, "vllm:cache_config_info", map[string]string{"engine": engine}); !ok || v != 1 {
					t.Errorf("engine %s: no vllm:cache_config_info", engine)
				}
			}
			if total != 2*size {
				t.Errorf("got %v requests in all, want %d", total, 2*size)
			}
			// Every family with an engine label has a series per rank.
			for name, mf := range mfs {
				engines := map[string]bool{}
				for _, m := range mf.Metric {
					for _, l := range m.Label {
						if l.GetName() == "engine" {
							engines[l.GetValue()] = true
						}
					}
				}
				if len(engines) != 0 && len(engines) != size {
					t.Errorf("%s: got engines %v, want 0..%d", name, engines, size-1)
				}
			}
		})
	}
}

// TestDPBalancer checks pick against vLLM's rule, worked by hand.
func TestDPBalancer(t *testing.T) {
	d := &DP{ranks: make([]*Server, 3), lb: make([]lbCounts, 3), inflight: make([]int, 3), refreshed: time.Now().Add(time.Hour)}
	pick := func() int {
		t.Helper()
		k, aerr := d.pick(http.Header{})
		if aerr != nil {
			t.Fatal(aerr)
		}
		return k
	}
	// Idle ranks: in turn, each pick counted as waiting on its rank.
	for i, want := range []int{0, 1, 2, 0} {
		if got := pick(); got != want {
			t.Errorf("idle pick %d: got rank %d, want %d", i, got, want)
		}
	}
	// lb now [2,0],[1,0],[1,0]; start 1. Rank 2 busy: max(inflight, w+r).
	d.lb = []lbCounts{{0, 4, 0}, {0, 1, 0}, {0, 0, 0}}
	d.inflight = []int{0, 3, 0}
	// Scores from start 1: rank 1 = max(3, 1) = 3, rank 2 = 0, rank 0 = 4.
	if got := pick(); got != 2 {
		t.Errorf("got rank %d, want 2 (score 0)", got)
	}
	// Waiting requests on a full KV cache weigh 1 + 6 x 0.5 = 4 each.
	d.lb = []lbCounts{{1, 2, 1.0}, {0, 5, 1.0}, {0, 6, 0.4}}
	d.inflight = []int{0, 0, 0}
	d.start = 0
	// rank 0: 3 + 1*6*0.5 = 6; rank 1: 5; rank 2: 6.
	if got := pick(); got != 1 {
		t.Errorf("got rank %d, want 1 (score 5 against 6 and 6)", got)
	}
	// The header pins, and counts in flight.
	h := http.Header{}
	h.Set(HeaderDataParallelRank, "2")
	if k, aerr := d.pick(h); k != 2 || aerr != nil || d.inflight[2] != 1 {
		t.Errorf("pinned: got rank %d %v, in flight %v", k, aerr, d.inflight)
	}
	d.release(2)
	if d.inflight[2] != 0 {
		t.Errorf("release: got in flight %v", d.inflight)
	}
}

func TestParseRank(t *testing.T) {
	for _, tc := range []struct {
		in     string
		digits string
		neg    bool
		ok     bool
	}{
		{"1", "1", false, true},
		{"0", "0", false, true},
		{"-0", "0", false, true},
		{"+3", "3", false, true},
		{"-12", "12", true, true},
		{" \t7\xa0", "7", false, true},
		{"1_000", "1000", false, true},
		{"000", "0", false, true},
		{"0_0", "0", false, true},
		{"", "", false, false},
		{"-", "", false, false},
		{"_1", "", false, false},
		{"1_", "", false, false},
		{"1__0", "", false, false},
		{"+-1", "", false, false},
		{"0x1", "", false, false},
		{"1.0", "", false, false},
		{"1 2", "", false, false},
		{"١", "", false, false}, // Arabic-Indic one, as Latin-1 bytes: not digits
	} {
		digits, neg, ok := parseRank(tc.in)
		if digits != tc.digits || neg != tc.neg || ok != tc.ok {
			t.Errorf("parseRank(%q) = %q, %v, %v; want %q, %v, %v", tc.in, digits, neg, ok, tc.digits, tc.neg, tc.ok)
		}
	}
}

// FuzzParseRank checks parseRank against a plain reading of Python's
// int(): the sign and digits once the whitespace and underscores are
// gone.
func FuzzParseRank(f *testing.F) {
	for _, s := range []string{"1", " -0_7 ", "+12", "1__2", "_1", "\xa05\x85", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		digits, neg, ok := parseRank(s)
		if !ok {
			if digits != "" || neg {
				t.Fatalf("parseRank(%q) = %q, %v, false", s, digits, neg)
			}
			return
		}
		if digits == "" || digits != "0" && digits[0] == '0' || digits == "0" && neg {
			t.Fatalf("parseRank(%q) = %q, %v: not canonical", s, digits, neg)
		}
		plain := strings.Map(func(r rune) rune {
			if r == '_' || r == '+' || r == '-' {
				return -1
			}
			return r
		}, trimLatin1Space(s))
		if strings.TrimLeft(plain, "0") != strings.TrimPrefix(digits, "0") {
			t.Fatalf("parseRank(%q) = %q, want the digits of %q", s, digits, plain)
		}
		if k, in := rankIndex(digits, neg, 4); in && (k < 0 || k >= 4) {
			t.Fatalf("rankIndex(%q) = %d", digits, k)
		}
	})
}

// TestDPHealthModelsReset: the whole server's /health, /v1/models,
// /version, /detokenize and /reset_prefix_cache (every rank's cache).
func TestDPHealthModelsReset(t *testing.T) {
	d, hs := testDP(t, Config{}, 2)
	for _, path := range []string{"/health", "/v1/models", "/version"} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: got %d", path, resp.StatusCode)
		}
	}
	if code, b := post(t, hs.URL+"/detokenize", `{"tokens":[1,2]}`); code != 200 || !strings.HasPrefix(string(b), `{"prompt":`) {
		t.Errorf("POST /detokenize: got %d %s, want rank 0's answer", code, b)
	}
	prompt := strings.Repeat("Reset me on every rank, please. ", 12)
	for _, rank := range []string{"0", "1"} {
		postRank(t, hs.URL+"/v1/completions", rank, fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt))
	}
	if code, _, b := postRank(t, hs.URL+"/reset_prefix_cache", "", ""); code != 200 {
		t.Fatalf("reset: got %d %s", code, b)
	}
	for _, rank := range []string{"0", "1"} {
		_, _, b := postRank(t, hs.URL+"/v1/completions", rank, fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt))
		var c openai.Completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		if got := c.Usage.CachedTokens(); got != 0 {
			t.Errorf("rank %s after the reset: got cached_tokens %d, want 0", rank, got)
		}
	}
	if err := d.Rank(1).Close(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(hs.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("health with rank 1 stopped: got %d, want 503", resp.StatusCode)
	}
}

// TestDPSizeOneIsTheServer: a DP of one rank serves what its Server does
// (engine="0"), and like vLLM with a data parallel size of 1 it accepts
// the rank header for rank 0 only.
func TestDPSizeOneIsTheServer(t *testing.T) {
	_, hs := testDP(t, Config{}, 1)
	for _, tc := range []struct {
		rank string
		code int
		want string
	}{
		{"0", 200, `"finish_reason":"length"`},
		{"x", 200, `"finish_reason":"length"`},
		{"1", 400, `{"error":{"message":"data_parallel_rank 1 is out of range [0, 1).","type":"BadRequestError","param":null,"code":400}}`},
	} {
		code, _, b := postRank(t, hs.URL+"/v1/completions", tc.rank, `{"prompt":"hi","max_tokens":1}`)
		if code != tc.code || !strings.Contains(string(b), tc.want) {
			t.Errorf("rank %q: got %d %s, want %d %s", tc.rank, code, b, tc.code, tc.want)
		}
	}
	if _, ok := sample(scrape(t, hs.URL), "vllm:num_requests_running", map[string]string{"engine": "0"}); !ok {
		t.Error(`no vllm:num_requests_running{engine="0"}`)
	}
}

func TestNewDPErrors(t *testing.T) {
	p, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Model: "m", Engine: engine.Config{Profile: p}}
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		size int
		want string
	}{
		{"size 0", func(*Config) {}, 0, "at least 1"},
		{"sglang", func(c *Config) { c.MetricsFlavor = FlavorSGLang }, 2, "metrics flavour"},
		{"ipc events", func(c *Config) { c.KVEvents.Endpoint = "ipc:///tmp/kvroute-dp-test" }, 2, "tcp or inproc"},
		{"rank set", func(c *Config) { c.DataParallelRank = 1 }, 2, "leave it 0"},
	} {
		c := base
		tc.cfg(&c)
		if _, err := NewDP(c, tc.size); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 2, "tcp://*:5559"},
		{"tcp://127.0.0.1:41000", 1, "tcp://127.0.0.1:41001"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"inproc://kv", 3, "inproc://kv_dp3"},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv"},
		{"", 1, ""},
	} {
		got, err := offsetEndpoint(tc.in, tc.rank)
		if err != nil || got != tc.want {
			t.Errorf("offsetEndpoint(%q, %d) = %q, %v; want %q", tc.in, tc.rank, got, err, tc.want)
		}
	}
	if _, err := offsetEndpoint("ipc:///tmp/kv", 1); err == nil {
		t.Error("ipc at rank 1: got no error, want vLLM's refusal")
	}
}

// subPair binds two SUB sockets on consecutive tcp ports (rank 0's and
// rank 1's) and returns the first port.
func subPair(t *testing.T, ctx context.Context) (int, [2]zmq4.Socket) {
	t.Helper()
	for range 50 {
		port := freeport.Consecutive(t, 1)
		var subs [2]zmq4.Socket
		ok := true
		for r := range subs {
			subs[r] = zmq4.NewSub(ctx)
			if err := subs[r].Listen(fmt.Sprintf("tcp://127.0.0.1:%d", port+r)); err != nil {
				ok = false
				break
			}
			if err := subs[r].SetOption(zmq4.OptionSubscribe, ""); err != nil {
				t.Fatal(err)
			}
		}
		if ok {
			t.Cleanup(func() {
				subs[0].Close()
				subs[1].Close()
			})
			return port, subs
		}
		for _, s := range subs {
			if s != nil {
				s.Close()
			}
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0, [2]zmq4.Socket{}
}

// TestDPKVEventsPerRank: rank r publishes on the endpoint's port + r, each
// batch with data_parallel_rank r, in both encodings, and answers replay
// on the replay endpoint's port + r.
func TestDPKVEventsPerRank(t *testing.T) {
	for _, encoding := range []string{EncodingArray, EncodingMap} {
		t.Run(encoding, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			port, subs := subPair(t, ctx)
			replay := freeport.Consecutive(t, 2) // rank r replays on replay+r
			_, hs := testDP(t, Config{Speed: 1000, KVEvents: KVEventsConfig{
				Endpoint:       fmt.Sprintf("tcp://127.0.0.1:%d", port),
				ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", replay), Encoding: encoding}}, 2)
			for rank := range 2 {
				got := make(chan [][]byte, 64)
				go func() {
					for {
						m, err := subs[rank].Recv()
						if err != nil {
							return
						}
						got <- m.Frames
					}
				}()
				// Subscriptions take effect asynchronously: send requests
				// (new blocks each time) until a batch arrives.
				var frames [][]byte
				for i := 0; frames == nil; i++ {
					p := fmt.Sprintf("rank %d request %d: %s", rank, i, strings.Repeat("Events of one rank only. ", 10))
					if code, _, b := postRank(t, hs.URL+"/v1/completions", fmt.Sprint(rank), fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, p)); code != 200 {
						t.Fatalf("got %d %s", code, b)
					}
					select {
					case frames = <-got:
					case <-time.After(200 * time.Millisecond):
						if ctx.Err() != nil {
							t.Fatalf("rank %d: no KV event on port %d", rank, port+rank)
						}
					}
				}
				if len(frames) != 3 {
					t.Fatalf("rank %d: got %d frames, want 3", rank, len(frames))
				}
				var batch []any
				if err := msgpack.Unmarshal(frames[2], &batch); err != nil {
					t.Fatal(err)
				}
				if len(batch) != 3 || toU64(t, batch[2]) != uint64(rank) {
					t.Errorf("rank %d: got batch %v, want data_parallel_rank %d", rank, batch, rank)
				}
				if _, evs := decodeBatch(t, frames[2], encoding); len(evs) == 0 || evs[0].Type != "BlockStored" {
					t.Errorf("rank %d: got events %+v, want BlockStored", rank, evs)
				}
				// Replay on the rank's own ROUTER socket.
				dealer := zmq4.NewDealer(ctx)
				defer dealer.Close()
				if err := dealer.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", replay+rank)); err != nil {
					t.Fatal(err)
				}
				var start [8]byte
				if err := dealer.Send(zmq4.NewMsgFrom(nil, start[:])); err != nil {
					t.Fatal(err)
				}
				m, err := dealer.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if len(m.Frames) != 3 {
					t.Fatalf("rank %d replay: got frames %q", rank, m.Frames)
				}
				var rb []any
				if err := msgpack.Unmarshal(m.Frames[2], &rb); err != nil || len(rb) != 3 || toU64(t, rb[2]) != uint64(rank) {
					t.Errorf("rank %d replay: got batch %v (%v), want data_parallel_rank %d", rank, rb, err, rank)
				}
			}
		})
	}
}

// TestDPStreamsOnEveryRank: streams pinned to each rank run to their end.
func TestDPStreamsOnEveryRank(t *testing.T) {
	_, hs := testDP(t, Config{}, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(
				`{"messages":[{"role":"user","content":"hi"}],"max_tokens":20,"stream":true}`))
			req.Header.Set(HeaderDataParallelRank, fmt.Sprint(rank))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			var last string
			for sc.Scan() {
				if sc.Text() != "" {
					last = sc.Text()
				}
			}
			if last != "data: [DONE]" {
				t.Errorf("rank %d: stream ended with %q", rank, last)
			}
		})
	}
	wg.Wait()
}

// TestDPPrefillLegOnRank: a DP server (role both) serves a NixlConnector
// prefill leg on the rank the header names; its kv_transfer_params carry
// that rank's engine id (vLLM suffixes it with _dp<rank>), and a decode
// engine's pull through the server's side channel reaches the rank that
// holds the lease.
func TestDPPrefillLegOnRank(t *testing.T) {
	_, ps := testDP(t, Config{}, 2)
	_, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})
	code, _, body := postRank(t, ps.URL+"/v1/completions", "1", fmt.Sprintf(`{"prompt":%q,"max_tokens":1,
		"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`, pdPrompt))
	if code != 200 {
		t.Fatalf("prefill: got %d %s", code, body)
	}
	var pr openai.Completion
	if err := json.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	kv := pr.KVTransferParams
	if id, _ := kv["remote_engine_id"].(string); !strings.HasSuffix(id, "_dp1") {
		t.Errorf("got remote_engine_id %v, want rank 1's (_dp1)", kv["remote_engine_id"])
	}
	b, _ := json.Marshal(map[string]any{"prompt": pdPrompt, "max_tokens": 3, "kv_transfer_params": kv})
	if code, body := post(t, ds.URL+"/v1/completions", string(b)); code != 200 {
		t.Fatalf("decode (its pull fails the request): got %d %s", code, body)
	}
	waitFor(t, "rank 1 to release the pulled blocks", func() bool {
		u, _ := sample(scrape(t, ps.URL), "vllm:kv_cache_usage_perc", map[string]string{"engine": "1"})
		return u == 0
	})
}

// trimLatin1Space removes the bytes str.isspace is true for, read as
// Latin-1 (\t\n\v\f\r, \x1c-\x1f, space, NEL, NBSP), from both ends of s:
// byte by byte, as strings.Trim would decode s as UTF-8.
func trimLatin1Space(s string) string {
	const spaces = " \t\n\v\f\r\x1c\x1d\x1e\x1f"
	space := func(c byte) bool { return strings.IndexByte(spaces, c) >= 0 || c == 0x85 || c == 0xa0 }
	for s != "" && space(s[0]) {
		s = s[1:]
	}
	for s != "" && space(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

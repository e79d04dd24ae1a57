package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/policy"
)

// reloadTo returns a Reload loader of cfg.
func reloadTo(cfg config.Config) func() (config.Config, error) {
	return func() (config.Config, error) { return cfg, nil }
}

func endpointIDs(tp *testProxy, model string) []string {
	var out []string
	for _, e := range tp.Router(model).Endpoints() {
		out = append(out, e.ID)
	}
	return out
}

// TestReloadAddsEndpoint: an engine added by a reload takes traffic.
func TestReloadAddsEndpoint(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	tp := newTestProxy(t, testConfig("rr", a.URL))
	res, err := tp.Reload(reloadTo(testConfig("rr", a.URL, b.URL)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Models) != 1 || !slices.Equal(res.Models[0].Added, []string{b.URL}) || len(res.Models[0].Removed) != 0 || len(res.Restart) != 0 {
		t.Fatalf("got result %+v, want %s added and nothing to restart", res, b.URL)
	}
	tp.postOK(t, 4, PathCompletions, `{"model":"m","prompt":"hi"}`)
	if a.hits.Load() != 2 || b.hits.Load() != 2 {
		t.Fatalf("got a %d, b %d requests; want 2 each (round robin over both)", a.hits.Load(), b.hits.Load())
	}
	if got := tp.metric(t, tp.metrics.requests, "m", b.URL, "200"); got != 2 {
		t.Errorf("kvroute_requests_total of b: got %v, want 2", got)
	}
	if got := tp.metric(t, tp.metrics.reloads, "success"); got != 1 {
		t.Errorf("successful reloads: got %v, want 1", got)
	}
}

// TestReloadRemovesEndpoint: a removed engine gets no new requests, the
// stream it is serving completes, and its metric series are gone.
func TestReloadRemovesEndpoint(t *testing.T) {
	release := make(chan struct{})
	a := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		flushEvents(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a-0\"}]}\n\n")
		<-release
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a-1\"}]}\n\ndata: [DONE]\n\n")
	})
	b := newBackend(t, "b", okHandler("b"))
	tp := newTestProxy(t, testConfig("first", a.URL, b.URL))

	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi","stream":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "a-0") {
		t.Fatalf("first event: got %q, %v", line, err)
	}
	if _, err := tp.Reload(reloadTo(testConfig("first", b.URL))); err != nil {
		t.Fatal(err)
	}
	if got := endpointIDs(tp, "m"); !slices.Equal(got, []string{b.URL}) {
		t.Fatalf("endpoints: got %v, want [%s]", got, b.URL)
	}
	for range 3 {
		readAll(t, tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`))
	}
	if a.hits.Load() != 1 || b.hits.Load() != 3 {
		t.Fatalf("got a %d, b %d requests; want 1 (the stream), 3", a.hits.Load(), b.hits.Load())
	}
	close(release)
	rest := events(t, rd)
	resp.Body.Close()
	if len(rest) != 2 || !strings.Contains(rest[0], "a-1") || rest[1] != "[DONE]" {
		t.Fatalf("the rest of the stream: got %q, want a-1 and [DONE]", rest)
	}
	waitFor(t, "the stream's end counted", func() bool { return tp.metric(t, tp.metrics.requests, "m", "", "200") == 1 })
	if got := tp.Router("m").View(a.URL); got != nil {
		t.Error("the removed endpoint still has a View")
	}
	if out := gather(t, tp); strings.Contains(out, a.URL) {
		t.Errorf("/metrics still names the removed endpoint:\n%s", grepLines(out, a.URL))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestReloadUpstreamGone: a request routed to an endpoint just before a
// reload removed it (or put another engine under its ID) finds no
// reverse proxy for it, and is retried elsewhere.
func TestReloadUpstreamGone(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	cfg := testConfig("first", a.URL, b.URL)
	cfg.Models[0].Endpoints[1].ID = "b"
	tp := newTestProxy(t, cfg)
	pl := tp.pools["m"]
	old := tp.Router("m").Endpoints()
	next := testConfig("first", b.URL, a.URL)
	next.Models[0].Endpoints[0].ID = "b"
	next.Models[0].Endpoints[1].ID = "a2"
	c := newBackend(t, "c", okHandler("c"))
	next.Models[0].Endpoints[0].URL = c.URL // "b" is another engine now
	if _, err := tp.Reload(reloadTo(next)); err != nil {
		t.Fatal(err)
	}
	for _, e := range old {
		if pl.upstream(&e) != nil {
			t.Errorf("%s (%s): still has a reverse proxy after the reload", e.ID, e.URL)
		}
	}
	for _, e := range tp.Router("m").Endpoints() {
		if pl.upstream(&e) == nil {
			t.Errorf("%s: no reverse proxy", e.ID)
		}
	}
	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
	if got := readAll(t, resp); !strings.Contains(got, "from c") {
		t.Errorf("got %q, want c's answer (b's new engine)", got)
	}
}

// TestReloadStopsAndStartsLoops: the scrape loop, KV-event subscription
// (and its precise-index entries) and health probe of a removed endpoint
// stop; an added endpoint's start.
func TestReloadStopsAndStartsLoops(t *testing.T) {
	var waiting, running atomic.Int32
	type engine struct {
		*backend
		scrapes atomic.Int32
	}
	newEngine := func(name string) *engine {
		e := &engine{}
		metrics := vllmMetrics(&waiting, &running)
		e.backend = newBackend(t, name, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				e.scrapes.Add(1)
				metrics(w, r)
				return
			}
			okHandler(name)(w, r)
		})
		return e
	}
	a, b, c := newEngine("a"), newEngine("b"), newEngine("c")
	port := freeport.Consecutive(t, 1)
	pub := newRankPublisher(t, port, 0)

	cfg := testConfig(policy.Default, a.URL, b.URL)
	cfg.HealthCheck = config.HealthCheck{Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond}
	m := &cfg.Models[0]
	m.Endpoints[0].ID, m.Endpoints[1].ID = "a", "b"
	m.Signals = config.Signals{ScrapeInterval: 10 * time.Millisecond}
	m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
	m.Endpoints[1].KVEvents = config.KVEvents{Address: "tcp://127.0.0.1:" + strconv.Itoa(port)}
	tp := newTestProxyWith(t, cfg, policy.New)
	ctx, cancel := context.WithCancel(context.Background())
	sigDone, healthDone := make(chan error, 1), make(chan error, 1)
	go func() { sigDone <- tp.RunSignals(ctx) }()
	go func() { healthDone <- tp.RunHealthChecks(ctx) }()
	t.Cleanup(func() {
		cancel()
		for _, ch := range []chan error{sigDone, healthDone} {
			if err := recv(t, "a loop's end", ch); err != nil {
				t.Error(err)
			}
		}
	})
	statusIDs := func() []string {
		var out []string
		for _, st := range tp.sig.status("m") {
			out = append(out, st.Endpoint)
		}
		slices.Sort(out)
		return out
	}
	probeURLs := func() []string {
		var out []string
		for _, k := range tp.health.running("m") {
			out = append(out, k.url)
		}
		slices.Sort(out)
		return out
	}
	waitFor(t, "a and b scraped", func() bool { return a.scrapes.Load() > 0 && b.scrapes.Load() > 0 })
	if got := statusIDs(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("signal loops: got %v, want [a b]", got)
	}
	if got := probeURLs(); len(got) != 2 {
		t.Fatalf("health probes: got %v, want 2", got)
	}
	pub.waitSubscribed()
	pub.store(tokenRange(100, 32))
	idx := tp.PreciseIndex("m")
	hashes := kvindex.HashTokens(tokenRange(100, 32), 16, nil)
	waitFor(t, "b's KV events in the index", func() bool { return len(idx.Match(hashes, nil)) > 0 })
	bView := tp.Router("m").View("b")
	observed := func() uint64 { st := bView.Snapshot(); return st.Scrapes + st.Errors }

	next := testConfig(policy.Default, a.URL, c.URL)
	next.HealthCheck = cfg.HealthCheck
	next.Models[0].Signals, next.Models[0].Precise = m.Signals, m.Precise
	next.Models[0].Endpoints[0].ID, next.Models[0].Endpoints[1].ID = "a", "c"
	res, err := tp.Reload(reloadTo(next))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Restart) != 0 {
		t.Errorf("restart fields: got %v, want none", res.Restart)
	}
	// Sync waits for the loops to return: from here nothing observes b.
	// (b's server may still see a scrape that was on its way.)
	bScrapes := observed()
	if got := statusIDs(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("signal loops after the reload: got %v, want [a c]", got)
	}
	if got, want := probeURLs(), []string{a.URL + "/health", c.URL + "/health"}; !slices.Equal(got, want) {
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("health probes after the reload: got %v, want %v", got, want)
		}
	}
	if hits := idx.Match(hashes, nil); len(hits) != 0 {
		t.Errorf("precise index after b's removal: got %v, want no hits", hits)
	}
	if ev := tp.sig.kvEvents("m"); ev != nil {
		t.Errorf("KV-event subscribers after the reload: got %v, want none", ev)
	}
	waitFor(t, "c scraped", func() bool { return c.scrapes.Load() > 0 })
	aScrapes := a.scrapes.Load()
	waitFor(t, "a scraped a few more times", func() bool { return a.scrapes.Load() > aScrapes+3 })
	if got := observed(); got != bScrapes {
		t.Errorf("b scraped %d times after its removal", got-bScrapes)
	}
}

// TestReloadHealthProbeStops: a removed endpoint's health probe stops (no
// more GET /health), an added one's starts.
func TestReloadHealthProbeStops(t *testing.T) {
	ok := func() string {
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	aURL, bURL := ok(), ok()
	// The probes are counted as they are sent (a probe's loop sends them),
	// not as the engines receive them: one on its way may arrive after
	// its loop returned.
	var aProbes, bProbes atomic.Int32
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		switch "http://" + r.URL.Host {
		case aURL:
			aProbes.Add(1)
		case bURL:
			bProbes.Add(1)
		}
		return http.DefaultTransport.RoundTrip(r)
	})
	cfg := testConfig("first", aURL, bURL)
	cfg.HealthCheck = config.HealthCheck{Interval: 5 * time.Millisecond, Timeout: 5 * time.Millisecond}
	cfg.Models[0].Signals.Disabled = true
	p, err := New(Options{Config: cfg, NewPicker: testPickers, Transport: rt})
	if err != nil {
		t.Fatal(err)
	}
	tp := &testProxy{Proxy: p}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunHealthChecks(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := recv(t, "health checks' end", done); err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "both probed", func() bool { return aProbes.Load() > 0 && bProbes.Load() > 0 })
	next := testConfig("first", aURL)
	next.HealthCheck, next.Models[0].Signals = cfg.HealthCheck, cfg.Models[0].Signals
	if _, err := tp.Reload(reloadTo(next)); err != nil {
		t.Fatal(err)
	}
	n := bProbes.Load()
	seen := aProbes.Load()
	waitFor(t, "a probed a few more times", func() bool { return aProbes.Load() > seen+3 })
	if got := bProbes.Load(); got != n {
		t.Errorf("b probed %d times after its removal", got-n)
	}
	if got := tp.health.running("m"); len(got) != 1 || got[0].url != aURL+"/health" {
		t.Errorf("probes running: got %v, want a's only", got)
	}
}

// TestReloadInvalidChangesNothing: a configuration that does not load or
// validate changes nothing, and the reload metrics say so.
func TestReloadInvalidChangesNothing(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	for _, tc := range []struct {
		name string
		load func() (config.Config, error)
		want string
	}{
		{"load error", func() (config.Config, error) {
			return config.Config{}, errors.New("config: line 3: unknown field \"x\"")
		}, `unknown field "x"`},
		{"bad url", reloadTo(testConfig("first", a.URL, "ftp://b")), "models[0].endpoints[1].url"},
		{"duplicate", reloadTo(testConfig("first", a.URL, a.URL)), "models[0].endpoints[1]"},
		{"no endpoints", reloadTo(testConfig("first")), "models[0].endpoints"},
		{"bad kv_events", func() (config.Config, error) {
			c := testConfig("first", a.URL, b.URL)
			c.Models[0].Precise.Tokenizer = config.BuiltinTokenizer
			c.Models[0].Endpoints[1].KVEvents = config.KVEvents{Address: "udp://x:1"}
			return c, nil
		}, "models[0].endpoints[1].kv_events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestProxy(t, testConfig("first", a.URL))
			_, err := tp.Reload(tc.load)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
			if got := endpointIDs(tp, "m"); !slices.Equal(got, []string{a.URL}) {
				t.Errorf("endpoints after the failed reload: got %v, want [%s]", got, a.URL)
			}
			if got := tp.pools["m"].set.Load().eps; len(got) != 1 || got[0].URL != a.URL {
				t.Errorf("reverse proxies after the failed reload: got %v", got)
			}
			if got := tp.metric(t, tp.metrics.reloads, "failure"); got != 1 {
				t.Errorf("failed reloads: got %v, want 1", got)
			}
			if out := gather(t, tp); !strings.Contains(out, "kvroute_config_last_reload_successful 0") {
				t.Errorf("/metrics: want kvroute_config_last_reload_successful 0, got\n%s", grepLines(out, "kvroute_config"))
			}
			if _, err := tp.Reload(reloadTo(testConfig("first", a.URL, b.URL))); err != nil {
				t.Fatal(err)
			}
			if out := gather(t, tp); !strings.Contains(out, "kvroute_config_last_reload_successful 1") {
				t.Errorf("/metrics after a good reload: want kvroute_config_last_reload_successful 1, got\n%s", grepLines(out, "kvroute_config"))
			}
		})
	}
}

// TestReloadRestartFields: changes other than the endpoint lists are not
// applied, and named; the endpoints are.
func TestReloadRestartFields(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	tp := newTestProxy(t, testConfig("first", a.URL))
	next := testConfig("rr", a.URL, b.URL)
	next.Listen = "127.0.0.1:1"
	next.Retry.Attempts = 7
	other := next.Models[0]
	other.Name = "other"
	next.Models = append(next.Models, other)
	res, err := tp.Reload(reloadTo(next))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"listen", "retry", "models[0].policy", `models: model "other" added`}
	if !slices.Equal(res.Restart, want) {
		t.Errorf("restart fields: got %q, want %q", res.Restart, want)
	}
	if got := tp.Router("m").Policy(); got != "first" {
		t.Errorf("policy: got %s, want first (not applied)", got)
	}
	if tp.Router("other") != nil {
		t.Error("model other is served")
	}
	if got := endpointIDs(tp, "m"); !slices.Equal(got, []string{a.URL, b.URL}) {
		t.Errorf("endpoints: got %v, want both", got)
	}
	// Reloading the same file again changes nothing and names the same.
	res, err = tp.Reload(reloadTo(next))
	if err != nil || len(res.Models) != 0 || !slices.Equal(res.Restart, want) {
		t.Errorf("the same again: got %+v, %v; want no change, the same restart fields", res, err)
	}
}

// TestReloadDataParallel: a data-parallel engine's ranks are endpoints; a
// reload adding ranks adds endpoints with their rank header.
func TestReloadDataParallel(t *testing.T) {
	dp := &rankRecorder{}
	b := newBackend(t, "dp", dp.handler("dp"))
	cfg := dpConfig("rr", b.URL, 2, "")
	tp := newTestProxy(t, cfg)
	next := dpConfig("rr", b.URL, 3, "")
	res, err := tp.Reload(reloadTo(next))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := endpointIDs(tp, "m"), []string{"dp#dp0", "dp#dp1", "dp#dp2"}; !slices.Equal(got, want) {
		t.Fatalf("endpoints: got %v, want %v", got, want)
	}
	if c := res.Models[0]; !slices.Equal(c.Added, []string{"dp#dp2"}) || !slices.Equal(c.Changed, []string{"dp#dp0", "dp#dp1"}) {
		t.Errorf("change: got %+v, want dp#dp2 added, dp#dp0 and dp#dp1 changed (another size)", c)
	}
	for range 3 {
		readAll(t, tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`))
	}
	var ranks []string
	for _, v := range dp.take() {
		ranks = append(ranks, v...)
	}
	if !slices.Contains(ranks, "2") {
		t.Errorf("rank headers: got %v, want rank 2 among them", ranks)
	}
}

// reloadWhileRouting serves one request through a proxy of start whose
// picker, having chosen the endpoint at trigger (the first healthy), makes
// the clock's next reading (before the request is sent) reload next. It
// returns the proxy (with its registry) and the response's status and body.
func reloadWhileRouting(t *testing.T, start, next config.Config, trigger string) (tp *testProxy, status int, body string) {
	t.Helper()
	tp, status, body, _ = reloadWhileRoutingHeader(t, start, next, trigger)
	return tp, status, body
}

// reloadWhileRoutingHeader is reloadWhileRouting that also returns the
// response's header.
func reloadWhileRoutingHeader(t *testing.T, start, next config.Config, trigger string) (tp *testProxy, status int, body string, header http.Header) {
	t.Helper()
	var armed atomic.Bool // set by the picker: the clock's next reading reloads
	var p *Proxy
	clock := newFakeClock()
	now := func() time.Time {
		if armed.CompareAndSwap(true, false) {
			if _, err := p.Reload(reloadTo(next)); err != nil {
				t.Error(err)
			}
		}
		return clock.Now()
	}
	pickers := func(string, map[string]any, uint64) (kvroute.Picker, error) {
		return kvroute.PickerFunc(func(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
			d := firstHealthy(now, req, cands)
			if d.Index >= 0 && cands[d.Index].Endpoint.URL == trigger {
				armed.Store(true)
			}
			return d
		}), nil
	}
	reg := prometheus.NewRegistry()
	var err error
	p, err = New(Options{Config: start, NewPicker: pickers, Registerer: reg, Gatherer: reg, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+PathCompletions, "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, resp)
	return &testProxy{Proxy: p, reg: reg, clock: clock}, resp.StatusCode, body, resp.Header
}

// TestReloadBetweenRouteAndDispatch: a request routed to an endpoint that
// a reload removes before the request is sent is retried on another
// endpoint, and the removed one sees nothing.
func TestReloadBetweenRouteAndDispatch(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	tp, status, body := reloadWhileRouting(t, testConfig("first", a.URL, b.URL), testConfig("first", b.URL), a.URL)
	if status != http.StatusOK || !strings.Contains(body, "from b") {
		t.Fatalf("got %d %q, want b's answer", status, body)
	}
	if a.hits.Load() != 0 {
		t.Errorf("the removed endpoint got %d requests", a.hits.Load())
	}
	if got := tp.metric(t, tp.metrics.retries, "m", "", "endpoint_removed"); got != 1 {
		t.Errorf("retries for a removed endpoint: got %v, want 1", got)
	}
	if got := tp.Router("m").View(b.URL).Load(tp.clock.Now()).InFlight; got != 0 {
		t.Errorf("b in flight at the end: %d", got)
	}
}

// TestReloadKeepsActiveHealth: an endpoint failing its health checks that
// stays in the pool stays out of rotation across a reload, and its probe,
// kept running, brings it back when it recovers.
func TestReloadKeepsActiveHealth(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	b := newBackend(t, "b", okHandler("b"))
	c := newBackend(t, "c", okHandler("c"))
	a.down.Store(true)
	cfg := testConfig("first", a.URL, b.URL)
	cfg.HealthCheck = config.HealthCheck{Interval: 5 * time.Millisecond, Timeout: 5 * time.Millisecond, HealthyThreshold: 1, UnhealthyThreshold: 1}
	cfg.Models[0].Signals.Disabled = true
	tp := newTestProxy(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.RunHealthChecks(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := recv(t, "health checks' end", done); err != nil {
			t.Error(err)
		}
	})
	healthy := func(id string) bool {
		for _, st := range tp.Router("m").Status(tp.clock.Now()) {
			if st.ID == id {
				return st.Healthy
			}
		}
		return false
	}
	waitFor(t, "a failing its checks", func() bool { return !healthy(a.URL) })
	next := testConfig("first", a.URL, b.URL, c.URL)
	next.HealthCheck, next.Models[0].Signals = cfg.HealthCheck, cfg.Models[0].Signals
	if _, err := tp.Reload(reloadTo(next)); err != nil {
		t.Fatal(err)
	}
	if healthy(a.URL) {
		t.Fatal("a is healthy right after the reload")
	}
	a.down.Store(false)
	waitFor(t, "a back in rotation", func() bool { return healthy(a.URL) })
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

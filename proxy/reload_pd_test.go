package proxy

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// pdPrompt is a prompt long enough to be worth a prefill leg.
const pdPrompt = `{"model":"tiny","prompt":"The router places the prompt on a compute-heavy prefill node, then a memory-heavy decode node.","max_tokens":4}`

// decodeLegs counts the nixl decode legs among an engine's bodies (those
// carrying the prefill's kv_transfer_params with do_remote_prefill).
func decodeLegs(bodies []map[string]any) int {
	n := 0
	for _, b := range bodies {
		if kv, ok := b["kv_transfer_params"].(map[string]any); ok && kv["do_remote_prefill"] == true {
			n++
		}
	}
	return n
}

// pdEndpoints returns a P/D config's endpoints as "id=url role".
func pdEndpoints(tp *testProxy) []string {
	var out []string
	for _, e := range tp.Router("tiny").Endpoints() {
		out = append(out, e.ID+"="+e.URL+" "+e.Role.String())
	}
	return out
}

// withEndpoints returns cfg with model 0's endpoints replaced.
func withEndpoints(cfg config.Config, eps ...config.Endpoint) config.Config {
	cfg.Models = slices.Clone(cfg.Models)
	cfg.Models[0].Endpoints = eps
	return cfg
}

// TestReloadPDAddsDecode: a reload adding a decode endpoint to a running
// P/D model: the decode legs of the requests that follow reach it.
func TestReloadPDAddsDecode(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	d0, d0bodies := pdEngine(t, kvroute.RoleDecode, "nixl")
	d1, d1bodies := pdEngine(t, kvroute.RoleDecode, "nixl")
	cfg := pdTestConfig("first", "nixl", ps.URL, d0.URL)
	tp := newTestProxy(t, cfg)
	next := withEndpoints(cfg, append(slices.Clone(cfg.Models[0].Endpoints), config.Endpoint{ID: "d1", URL: d1.URL, Role: "decode"})...)
	res, err := tp.Reload(reloadTo(next))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Models) != 1 || !slices.Equal(res.Models[0].Added, []string{"d1"}) {
		t.Fatalf("got %+v, want d1 added", res)
	}
	tp.postOK(t, 4, PathCompletions, pdPrompt)
	if n0, n1 := decodeLegs(d0bodies()), decodeLegs(d1bodies()); n1 == 0 || n0+n1 != 4 {
		t.Errorf("decode legs: d0 %d, d1 %d; want 4 in all, some on the added d1", n0, n1)
	}
}

// TestReloadPDRemovedMidFlight: a reload removes the endpoint a request's
// leg is running on. The leg in progress runs to its end (or, when its
// engine fails, the request is placed again on what remains); the client
// gets its answer; later requests go to the endpoints left; and no metric
// series names the removed endpoint afterwards (the decode endpoint's
// request count is written after the reload deleted its series).
func TestReloadPDRemovedMidFlight(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leg    kvroute.Role // the removed endpoint's
		fail   bool         // its engine fails the leg after the reload
		remove string
	}{
		{"prefill answers", kvroute.RolePrefill, false, "p0"},
		{"prefill fails", kvroute.RolePrefill, true, "p0"},
		{"decode answers", kvroute.RoleDecode, false, "d0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tp *testProxy
			var next config.Config
			var once sync.Once
			hook := func(w http.ResponseWriter, r *http.Request) bool {
				reloaded := false
				once.Do(func() {
					reloaded = true
					if _, err := tp.Reload(reloadTo(next)); err != nil {
						t.Errorf("reload: %v", err)
					}
				})
				if reloaded && tc.fail {
					statusHandler(http.StatusInternalServerError)(w, r)
					return true
				}
				return false
			}
			hookOn := func(r kvroute.Role) func(http.ResponseWriter, *http.Request) bool {
				if r == tc.leg {
					return hook
				}
				return nil
			}
			p0, p0bodies := pdEngineHook(t, kvroute.RolePrefill, "nixl", hookOn(kvroute.RolePrefill))
			p1, p1bodies := pdEngine(t, kvroute.RolePrefill, "nixl")
			d0, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", hookOn(kvroute.RoleDecode))
			d1, d1bodies := pdEngine(t, kvroute.RoleDecode, "nixl")
			all := []config.Endpoint{
				{ID: "p0", URL: p0.URL, Role: "prefill"}, {ID: "p1", URL: p1.URL, Role: "prefill"},
				{ID: "d0", URL: d0.URL, Role: "decode"}, {ID: "d1", URL: d1.URL, Role: "decode"},
			}
			// The first healthy prefill node takes the prefill stage: p0.
			// Decode starts on d0 alone; the reload adds d1 with the removal.
			cfg := withEndpoints(pdTestConfig("first", "nixl", "", ""), all[0], all[1], all[2])
			var keep []config.Endpoint
			for _, e := range all {
				if e.ID != tc.remove {
					keep = append(keep, e)
				}
			}
			next = withEndpoints(cfg, keep...)
			tp = newTestProxy(t, cfg)
			resp := tp.post(t, PathCompletions, pdPrompt)
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("the request in flight: got %d %s, want 200", resp.StatusCode, body)
			}
			if got := pdEndpoints(tp); slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, tc.remove+"=") }) {
				t.Fatalf("endpoints after the reload: %v, want %s gone", got, tc.remove)
			}
			np0 := len(p0bodies())
			tp.postOK(t, 2, PathCompletions, pdPrompt)
			if tc.leg == kvroute.RolePrefill {
				if n := len(p0bodies()); n != np0 || len(p1bodies()) == 0 {
					t.Errorf("after the reload: p0 got %d more legs, p1 %d; want none on p0", n-np0, len(p1bodies()))
				}
			} else if decodeLegs(d1bodies()) != 2 {
				t.Errorf("after the reload: d1 got %d decode legs, want 2", decodeLegs(d1bodies()))
			}
			if out := gather(t, tp); strings.Contains(out, `endpoint="`+tc.remove+`"`) {
				t.Errorf("/metrics names the removed endpoint:\n%s", grepLines(out, `endpoint="`+tc.remove+`"`))
			}
		})
	}
}

// TestReloadPDRefused: a reload that would leave a P/D pool unusable, or
// change whether a model is disaggregated, is refused whole with an error
// naming the field, and nothing changes; a valid one is then applied.
func TestReloadPDRefused(t *testing.T) {
	cfg := pdTestConfig("first", "nixl", "http://127.0.0.1:1", "http://127.0.0.1:2")
	tp := newTestProxy(t, cfg)
	before := pdEndpoints(tp)
	p0, d0 := cfg.Models[0].Endpoints[0], cfg.Models[0].Endpoints[1]
	bad := d0
	bad.Role = "encode"
	both := d0
	both.Role = "both"
	for _, tc := range []struct {
		name string
		eps  []config.Endpoint
		want []string // in the error
	}{
		{"no decode endpoint", []config.Endpoint{p0}, []string{"models[0].endpoints", "role both or decode"}},
		{"no prefill or decode role", []config.Endpoint{both}, []string{"models[0].endpoints", "disaggregated"}},
		{"unknown role", []config.Endpoint{p0, bad}, []string{"models[0].endpoints[1].role"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tp.Reload(reloadTo(withEndpoints(cfg, tc.eps...)))
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Fatalf("got %v, want an error with %q", err, w)
				}
			}
			if got := pdEndpoints(tp); !slices.Equal(got, before) {
				t.Errorf("endpoints: got %v, want unchanged %v", got, before)
			}
		})
	}
	d1 := config.Endpoint{ID: "d1", URL: "http://127.0.0.1:3", Role: "decode"}
	if _, err := tp.Reload(reloadTo(withEndpoints(cfg, p0, d0, d1))); err != nil {
		t.Fatalf("a valid reload after the refused ones: %v", err)
	}
	if got := len(pdEndpoints(tp)); got != 3 {
		t.Errorf("got %d endpoints, want 3", got)
	}

	// An aggregated model does not turn disaggregated live.
	agg := testConfig("rr", "http://127.0.0.1:1")
	ta := newTestProxy(t, agg)
	next := withEndpoints(agg, config.Endpoint{URL: "http://127.0.0.1:1", Role: "decode"})
	if _, err := ta.Reload(reloadTo(next)); err == nil || !strings.Contains(err.Error(), "models[0].endpoints[0].role") {
		t.Errorf("aggregated model given a decode endpoint: got %v, want a refusal naming models[0].endpoints[0].role", err)
	}
}

// forgetRecorder is firstHealthy that records the endpoints its router
// tells it to forget.
type forgetRecorder struct {
	mu     sync.Mutex
	forgot []string
}

func (f *forgetRecorder) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	return firstHealthy(now, req, cands)
}

func (f *forgetRecorder) ForgetEndpoint(id string) {
	f.mu.Lock()
	f.forgot = append(f.forgot, id)
	f.mu.Unlock()
}

// TestReloadPDRoleChange: an endpoint turned from prefill to decode under
// its ID is another engine: the prefill policy forgets it, its ejection
// as a prefill node does not carry over, and decode legs reach it.
func TestReloadPDRoleChange(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	xs, xbodies := pdEngine(t, kvroute.RoleBoth, "nixl") // an engine that can serve either role
	ds, _ := pdEngine(t, kvroute.RoleDecode, "nixl")
	fr := &forgetRecorder{}
	pickers := func(name string, params map[string]any, seed uint64) (kvroute.Picker, error) {
		if name == "forget" {
			return fr, nil
		}
		return testPickers(name, params, seed)
	}
	cfg := withEndpoints(pdTestConfig("forget", "nixl", "", ""),
		config.Endpoint{ID: "p0", URL: ps.URL, Role: "prefill"},
		config.Endpoint{ID: "x", URL: xs.URL, Role: "prefill"},
		config.Endpoint{ID: "d0", URL: ds.URL, Role: "decode"})
	tp := newTestProxyWith(t, cfg, pickers)
	r := tp.Router("tiny")
	ejected := false
	for i := 0; i < 100 && !ejected; i++ {
		ejected = r.ReportResult(tp.clock.Now(), "x", false)
	}
	if !ejected {
		t.Fatal("x was not ejected")
	}
	next := slices.Clone(cfg.Models[0].Endpoints)
	next[1].Role = "decode"
	res, err := tp.Reload(reloadTo(withEndpoints(cfg, next[0], next[1]))) // x decodes; d0 leaves
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Models[0]; !slices.Equal(c.Changed, []string{"x"}) || !slices.Equal(c.Removed, []string{"d0"}) {
		t.Errorf("change: got %+v, want x changed, d0 removed", c)
	}
	fr.mu.Lock()
	forgot := slices.Clone(fr.forgot)
	fr.mu.Unlock()
	slices.Sort(forgot)
	if !slices.Equal(forgot, []string{"d0", "x"}) {
		t.Errorf("the prefill policy forgot %v, want [d0 x]", forgot)
	}
	tp.postOK(t, 2, PathCompletions, pdPrompt)
	if n := decodeLegs(xbodies()); n != 2 {
		t.Errorf("decode legs on x: got %d, want 2 (its ejection as a prefill node forgotten)", n)
	}
}

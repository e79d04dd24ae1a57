package disagg

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
)

// removeOnFirstLeg makes f's handoff see the pool change between a leg's
// routing and its sending, as the proxy's reload does: the first time it
// asks whether a leg's endpoint of role role is live, that endpoint is
// removed from the router (with add appended), and Live then answers from
// the router's endpoints. It returns the ID removed (once removed).
func removeOnFirstLeg(t *testing.T, f *pdFixture, role kvroute.Role, add ...kvroute.Endpoint) func() string {
	var mu sync.Mutex
	removed := ""
	f.h.cfg.Live = func(e *kvroute.Endpoint) bool {
		mu.Lock()
		defer mu.Unlock()
		eps := f.r.Endpoints()
		if removed == "" && e.Role == role {
			removed = e.ID
			eps = slices.DeleteFunc(eps, func(c kvroute.Endpoint) bool { return c.ID == e.ID })
			if err := f.r.SetEndpoints(time.Now(), append(eps, add...), nil); err != nil {
				t.Error(err)
			}
		}
		return slices.ContainsFunc(f.r.Endpoints(), func(c kvroute.Endpoint) bool {
			return c.ID == e.ID && c.URL == e.URL && c.Role == e.Role
		})
	}
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return removed
	}
}

// TestPDLegEndpointRemoved: a leg routed to an endpoint that leaves the
// pool before the leg is sent (HandoffConfig.Live) is not sent: the
// request is placed again over the pool as it is now and answered, and
// the removed endpoint gets nothing. A decode leg's replacement pulls the
// same prefill's KV (one prefill leg in all).
func TestPDLegEndpointRemoved(t *testing.T) {
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		p1 := emu(t, kvroute.RolePrefill, proto)
		p2 := emu(t, kvroute.RolePrefill, proto)
		d1 := emu(t, kvroute.RoleDecode, proto)
		d2 := emu(t, kvroute.RoleDecode, proto)
		urls := map[string]string{"p1": p1.URL, "p2": p2.URL, "d1": d1.URL, "d2": d2.URL}
		prefill := func(id, u string) kvroute.Endpoint {
			_, port := hostPort(t, u)
			return endpoint(id, u, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port))
		}
		for _, role := range []kvroute.Role{kvroute.RolePrefill, kvroute.RoleDecode} {
			t.Run(proto+"/"+role.String(), func(t *testing.T) {
				f := newPD(t, proto, ModeAlways, prefill("p1", p1.URL), prefill("p2", p2.URL), endpoint("d1", d1.URL, kvroute.RoleDecode))
				removed := removeOnFirstLeg(t, f, role, endpoint("d2", d2.URL, kvroute.RoleDecode))
				code, body := f.post(t, completion(false, 3))
				if code != http.StatusOK {
					t.Fatalf("got %d %s, want 200", code, body)
				}
				id := removed()
				if id == "" {
					t.Fatal("no leg asked about")
				}
				if n := len(f.rec.to(urls[id])); n != 0 {
					t.Errorf("the removed endpoint %s got %d legs, want 0", id, n)
				}
				// One prefill and one decode leg: a nixl decode leg's
				// replacement pulls the KV of the prefill already done;
				// an SGLang pair is sent together, so neither was.
				if n := f.rec.count(); n != 2 {
					t.Errorf("got %d legs, want 2 (the removed endpoint's not sent)", n)
				}
				if got := counter(t, f.h.cfg.Metrics.failures, "tiny", role.String(), ReasonRemoved); got != 1 {
					t.Errorf("failures{leg=%s, reason=%s}: got %v, want 1", role, ReasonRemoved, got)
				}
			})
		}
	}
}

// TestPDEveryLegEndpointRemoved: when every placement's endpoint has left
// the pool by the time its leg would be sent, the client gets a 503 in
// the OpenAI error shape with code endpoint_removed, as on the proxy's
// aggregated path, and no engine gets a leg.
func TestPDEveryLegEndpointRemoved(t *testing.T) {
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode))
	f.h.cfg.Live = func(*kvroute.Endpoint) bool { return false }
	code, body := f.post(t, completion(false, 3))
	var e struct {
		Error struct {
			Type, Code string
		}
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || code != http.StatusServiceUnavailable || e.Error.Code != ReasonRemoved {
		t.Fatalf("got %d %s, want 503 with code %s", code, body, ReasonRemoved)
	}
	if n := f.rec.count(); n != 0 {
		t.Errorf("engines got %d legs, want 0", n)
	}
}

// TestPDOnlyDecodeRemoved: the only decode endpoint leaves the pool while
// the prefill leg runs, so no decode leg can be routed: both protocols
// answer 503 endpoint_removed (the pool changed under the request), not
// no_healthy_endpoint.
func TestPDOnlyDecodeRemoved(t *testing.T) {
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		t.Run(proto, func(t *testing.T) {
			p := emu(t, kvroute.RolePrefill, proto)
			d := emu(t, kvroute.RoleDecode, proto)
			_, port := hostPort(t, p.URL)
			f := newPD(t, proto, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port)),
				endpoint("d", d.URL, kvroute.RoleDecode))
			var once sync.Once
			f.h.cfg.Live = func(e *kvroute.Endpoint) bool {
				if e.Role == kvroute.RolePrefill {
					once.Do(func() {
						eps := slices.DeleteFunc(f.r.Endpoints(), func(c kvroute.Endpoint) bool { return c.ID == "d" })
						if err := f.r.SetEndpoints(time.Now(), eps, nil); err != nil {
							t.Error(err)
						}
					})
				}
				return slices.ContainsFunc(f.r.Endpoints(), func(c kvroute.Endpoint) bool { return c.ID == e.ID && c.SameEngine(e) })
			}
			code, body := f.post(t, completion(false, 3))
			var e struct{ Error struct{ Code string } }
			if err := json.Unmarshal([]byte(body), &e); err != nil || code != http.StatusServiceUnavailable || e.Error.Code != ReasonRemoved {
				t.Fatalf("got %d %s, want 503 with code %s", code, body, ReasonRemoved)
			}
		})
	}
}

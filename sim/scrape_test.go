package sim

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/workload"
)

// TestScrapeDuringStepSeesStateBeforeIt: a scrape taken while an engine's
// step is in progress reports the engine as it was when the step started,
// as the emulator's /metrics does (and vLLM's, whose stats are logged after
// each step): the step's outcome (the request admitted and running, its KV
// blocks allocated) is released when the step ends, like its outputs.
func TestScrapeDuringStepSeesStateBeforeIt(t *testing.T) {
	reqs := smallChat(t, 1, 1, 1)
	cfg := Config{Fleet: tinyFleet(1), ScrapeInterval: -1}
	cfg.applyDefaults()
	s, err := newSimulation(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	s.schedule(reqs[0].Arrival, evArrival, -1, 0)
	s.next = 1
	for !e.inStep && s.q.Len() > 0 {
		s.handle(s.q.pop())
	}
	if !e.inStep {
		t.Fatal("the engine never started a step")
	}
	m := metricsOf(e)
	if m.Waiting != 1 || m.Running != 0 || m.KVUsage != 0 {
		t.Errorf("scrape during the first step: waiting %v, running %v, kv usage %v; want 1, 0, 0 (the state before the step)",
			m.Waiting, m.Running, m.KVUsage)
	}
	// At the step's end the scrape sees its outcome.
	for s.q.Len() > 0 {
		ev := s.q.pop()
		s.handle(ev)
		if ev.kind == evStep {
			break
		}
	}
	if m := metricsOf(e); m.Running != 1 || m.Waiting != 0 || m.KVUsage == 0 {
		t.Errorf("scrape after the first step: waiting %v, running %v, kv usage %v; want 0, 1, > 0", m.Waiting, m.Running, m.KVUsage)
	}
}

// loadLog is a Picker that logs the candidates' loads (every field the
// policies read: the router's view of each engine, staleness, observation
// time and hit rate included) and its inner picker's choice, at each pick.
type loadLog struct {
	inner kvroute.Picker
	log   []string
}

func (l *loadLog) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	d := l.inner.Pick(now, req, cands)
	line := fmt.Sprintf("%v %s -> %d:", now, req.ID, d.Index)
	for i := range cands {
		line += fmt.Sprintf(" %s %+v;", cands[i].Endpoint.ID, cands[i].Load)
	}
	l.log = append(l.log, line)
	return d
}

// runRef runs cfg over reqs with idle fast-forwarding on, and off (every
// scrape an event: the reference). With one router replica, the policy
// runs behind a loadLog, whose logs it returns. The views are every
// replica's view of every engine at the end of the run (its Snapshot and
// Gen): the same in both when the fast run recorded the same observations.
func runRef(t *testing.T, cfg Config, reqs []workload.Request) (fast, ref *Result, fastLog, refLog, fastViews, refViews []string) {
	t.Helper()
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, every := range []bool{false, true} {
		c := cfg
		var ll *loadLog
		if c.Routers == 1 {
			p, err := policy.New(c.Policy, nil, c.Seed)
			if err != nil {
				t.Fatal(err)
			}
			ll = &loadLog{inner: p}
			c.Picker = ll
		}
		s, err := newSimulation(c, reqs)
		if err != nil {
			t.Fatal(err)
		}
		s.everyScrape = every
		if err := s.run(t.Context()); err != nil {
			t.Fatal(err)
		}
		var log, views []string
		if ll != nil {
			log = ll.log
		}
		for k, rt := range s.rts {
			for _, e := range s.engines {
				v := rt.View(e.id)
				views = append(views, fmt.Sprintf("replica %d, %s: %+v, gen %d", k, e.id, v.Snapshot(), v.Gen()))
			}
		}
		if every {
			ref, refLog, refViews = s.result(), log, views
		} else {
			fast, fastLog, fastViews = s.result(), log, views
		}
	}
	return fast, ref, fastLog, refLog, fastViews, refViews
}

// TestIdleScrapesFastForward: at a low request rate the fleet is idle
// most of the time, and the scrapes of its idle engines, which all read
// the same metrics, are recorded at once up to the next arrival instead of
// one event each: a run at 0.02 requests per second takes a small part of
// the events, with a result identical to the reference's (every scrape an
// event) in everything but the event count, the same loads (staleness,
// observation times, hit rates) before every pick and the same views at
// the end (scrapes counted, none out of order), for one or several router
// replicas, KV events, no network latency, one as long as the scrape
// interval or several intervals long (scrapes still in flight when the
// fleet goes idle), a scrape interval shorter than the staleness limit or
// longer, a drain, and a P/D fleet.
func TestIdleScrapesFastForward(t *testing.T) {
	reqs := smallChat(t, 40, 0.02, 3)
	pd := Fleet{{Count: 1, Profile: "tiny", NumGPUBlocks: 256, Role: "prefill"}, {Count: 2, Profile: "tiny", NumGPUBlocks: 256, Role: "decode"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		cut  int // the run takes at most 1/cut of the reference's events
	}{
		{"kv-aware", Config{Fleet: tinyFleet(3), Policy: "kv-aware", Seed: 1}, 5},
		{"least_request, 2 routers", Config{Fleet: tinyFleet(3), Policy: "least_request", Seed: 2, Routers: 2}, 5},
		{"kv events", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, KVEvents: true}, 5},
		{"no network latency", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, NetLatency: -1}, 5},
		{"latency equal to the interval", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, NetLatency: DefaultScrapeInterval}, 5},
		{"latency above the interval", Config{Fleet: tinyFleet(2), Policy: "least_request", Seed: 1, NetLatency: 300 * time.Millisecond}, 5},
		{"latency of many intervals, 2 routers, kv events", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 3, Routers: 2, KVEvents: true,
			NetLatency: 130 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond}, 5},
		{"latency above the interval, drain", Config{Fleet: tinyFleet(1), Policy: "kv-aware", Seed: 1, NetLatency: 150 * time.Millisecond, Drain: time.Millisecond}, 5},
		{"latency above the interval, p/d", Config{Fleet: pd, Policy: "kv-aware", Seed: 1, NetLatency: 250 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond}, 5},
		{"interval past staleness", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, ScrapeInterval: 2 * time.Second, StaleAfter: 500 * time.Millisecond}, 2},
		{"short interval", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, ScrapeInterval: 7 * time.Millisecond}, 5},
		{"drain", Config{Fleet: tinyFleet(1), Policy: "kv-aware", Seed: 1, Drain: time.Millisecond}, 5},
		{"p/d", Config{Fleet: pd, Policy: "kv-aware", Seed: 1}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, ref, fastLog, refLog, fastViews, refViews := runRef(t, tc.cfg, reqs)
			t.Logf("%d events, %d without fast-forwarding; %d picks logged", fast.Events, ref.Events, len(refLog))
			if fast.Events*tc.cut > ref.Events {
				t.Errorf("%d events, %d without fast-forwarding: want at most 1/%d of them", fast.Events, ref.Events, tc.cut)
			}
			for i := range min(len(fastLog), len(refLog)) {
				if fastLog[i] != refLog[i] {
					t.Fatalf("pick %d saw\n%s\nwant\n%s", i, fastLog[i], refLog[i])
				}
			}
			if len(fastLog) != len(refLog) {
				t.Fatalf("%d picks, want %d", len(fastLog), len(refLog))
			}
			if !slices.Equal(fastViews, refViews) {
				t.Errorf("views at the end:\n%s\nwant\n%s", strings.Join(fastViews, "\n"), strings.Join(refViews, "\n"))
			}
			fast.Events = ref.Events
			if !reflect.DeepEqual(fast, ref) {
				for i := range ref.Records {
					if fast.Records[i] != ref.Records[i] {
						t.Fatalf("record %d: %+v, want %+v", i, fast.Records[i], ref.Records[i])
					}
				}
				t.Fatalf("result differs from the reference's")
			}
		})
	}
}

package sim

import (
	"fmt"
	"reflect"
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
// runs behind a loadLog, whose logs it returns.
func runRef(t *testing.T, cfg Config, reqs []workload.Request) (fast, ref *Result, fastLog, refLog []string) {
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
		var log []string
		if ll != nil {
			log = ll.log
		}
		if every {
			ref, refLog = s.result(), log
		} else {
			fast, fastLog = s.result(), log
		}
	}
	return fast, ref, fastLog, refLog
}

// TestIdleScrapesFastForward: at a low request rate the fleet is idle
// most of the time, and the scrapes of its idle engines, which all read
// the same metrics, are recorded at once up to the next arrival instead of
// one event each: a run at 0.02 requests per second takes a small part of
// the events, with a result identical to the reference's (every scrape an
// event) in everything but the event count, and the same loads (staleness,
// observation times, hit rates) before every pick, for one or several
// router replicas, KV events, no or a long network latency, a scrape
// interval shorter than the staleness limit or longer, a drain, and a P/D
// fleet.
func TestIdleScrapesFastForward(t *testing.T) {
	reqs := smallChat(t, 40, 0.02, 3)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"kv-aware", Config{Fleet: tinyFleet(3), Policy: "kv-aware", Seed: 1}},
		{"least_request, 2 routers", Config{Fleet: tinyFleet(3), Policy: "least_request", Seed: 2, Routers: 2}},
		{"kv events", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, KVEvents: true}},
		{"no network latency", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, NetLatency: -1}},
		{"latency above the interval", Config{Fleet: tinyFleet(2), Policy: "least_request", Seed: 1, NetLatency: 300 * time.Millisecond}},
		{"interval past staleness", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, ScrapeInterval: 2 * time.Second, StaleAfter: 500 * time.Millisecond}},
		{"short interval", Config{Fleet: tinyFleet(2), Policy: "kv-aware", Seed: 1, ScrapeInterval: 7 * time.Millisecond}},
		{"drain", Config{Fleet: tinyFleet(1), Policy: "kv-aware", Seed: 1, Drain: time.Millisecond}},
		{"p/d", Config{Fleet: Fleet{{Count: 1, Profile: "tiny", NumGPUBlocks: 256, Role: "prefill"}, {Count: 2, Profile: "tiny", NumGPUBlocks: 256, Role: "decode"}}, Policy: "kv-aware", Seed: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, ref, fastLog, refLog := runRef(t, tc.cfg, reqs)
			t.Logf("%d events, %d without fast-forwarding; %d picks logged", fast.Events, ref.Events, len(refLog))
			if tc.name == "kv-aware" && fast.Events*5 > ref.Events {
				t.Errorf("%d events, %d without fast-forwarding: want fewer than a fifth", fast.Events, ref.Events)
			}
			for i := range min(len(fastLog), len(refLog)) {
				if fastLog[i] != refLog[i] {
					t.Fatalf("pick %d saw\n%s\nwant\n%s", i, fastLog[i], refLog[i])
				}
			}
			if len(fastLog) != len(refLog) {
				t.Fatalf("%d picks, want %d", len(fastLog), len(refLog))
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

package signals

import (
	"testing"
	"time"
)

// TestManagerChangedURLResetsView: a target whose MetricsURL changes
// (a reload fixing an endpoint's signals.metrics_url) keeps its View, but
// what the View observed came from the old URL: it is forgotten, so that
// the View is stale (router-local counts) until the new URL's first
// scrape, and the hit rate is not computed from one source's counters to
// the other's. (The old observation passed for the new source's until
// then, and the first scrape of the new one took the difference of two
// engines' counters for 10s of hits.) A change of Flavor alone keeps it;
// so does a data-parallel target's unless its URL or FirstRank changes.
func TestManagerChangedURLResetsView(t *testing.T) {
	const interval = time.Hour // no scrape during the test: the Views are fed by hand
	if o := Offset("e", interval); o < time.Minute {
		t.Fatalf("Offset(e, 1h) = %v: the loop would scrape during the test", o)
	}
	if o := Offset("dp", interval); o < time.Minute {
		t.Fatalf("Offset(dp, 1h) = %v: the loop would scrape during the test", o)
	}
	m, err := NewManager(ManagerConfig{Scrape: ScrapeConfig{Interval: interval}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v, r0, r1 := NewView(ViewConfig{}), NewView(ViewConfig{}), NewView(ViewConfig{})
	target := func(url string, f Flavor) Target {
		return Target{Endpoint: "e", MetricsURL: url, Flavor: f, View: v}
	}
	dp := func(url string, first int) Target {
		return Target{Endpoint: "dp", MetricsURL: url, FirstRank: first,
			Ranks: []RankTarget{{Endpoint: "dp#0", View: r0}, {Endpoint: "dp#1", View: r1}}}
	}
	now := time.Now()
	old := Metrics{Flavor: FlavorVLLM, Have: HasWaiting | HasRunning | HasPrefixCounters, Waiting: 7, Running: 3,
		PrefixQueries: 1000, PrefixHits: 100}
	observe := func() {
		for _, view := range []*View{v, r0, r1} {
			view.Observe(now, old)
		}
	}
	fresh := func(view *View) bool { return !view.Load(now).Stale && view.Load(now).Waiting == 7 }

	if err := m.Sync([]Target{target("http://a/metrics", ""), dp("http://d/metrics", 0)}); err != nil {
		t.Fatal(err)
	}
	observe()
	if err := m.Sync([]Target{target("http://a/metrics", FlavorVLLM), dp("http://d/metrics", 0)}); err != nil {
		t.Fatal(err)
	}
	if !fresh(v) || !fresh(r0) || !fresh(r1) {
		t.Fatalf("a Flavor change dropped the observation: %+v", v.Load(now))
	}

	if err := m.Sync([]Target{target("http://b/metrics", FlavorVLLM), dp("http://d/metrics", 2)}); err != nil {
		t.Fatal(err)
	}
	for name, view := range map[string]*View{"e": v, "dp#0": r0, "dp#1": r1} {
		if l := view.Load(now); !l.Stale || l.Waiting != 0 || !view.Snapshot().ObservedAt.IsZero() {
			t.Errorf("%s after its source changed: load %+v, observed at %v; want stale, router-local, nothing observed",
				name, l, view.Snapshot().ObservedAt)
		}
	}
	// The new source's first scrape: its lifetime ratio, not the
	// difference from the old source's counters ((2000-100)/(10000-1000)).
	v.Observe(now.Add(time.Second), Metrics{Flavor: FlavorVLLM, Have: HasWaiting | HasRunning | HasPrefixCounters,
		PrefixQueries: 10000, PrefixHits: 2000})
	if got := v.Load(now.Add(time.Second)).PrefixHitRate; got != 0.2 {
		t.Errorf("hit rate after the new source's first scrape: got %v, want 0.2", got)
	}
	if st := v.Snapshot(); st.Scrapes != 2 {
		t.Errorf("scrapes %d, want 2 (the count is kept)", st.Scrapes)
	}
}

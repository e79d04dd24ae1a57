package signals

import (
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
)

// TestManagerChangedTargetKeepsSubscription: a Sync that changes only an
// endpoint's scraping (here its metrics URL) restarted its KV-event
// subscriber too, whose catch-up then replayed the engine's history on top
// of the entries the old one had applied: every block held was counted as
// a second copy, so the engine's BlockRemoved no longer removed it and the
// index kept routing to blocks the engine had evicted. The subscriber now
// keeps running.
func TestManagerChangedTargetKeepsSubscription(t *testing.T) {
	m, idx, eng, target, held := managedWithBlocks(t)
	before := eng.replayCount()

	// Only the scraping changes (no server: its scrapes just fail).
	target.MetricsURL = "http://127.0.0.1:1/metrics"
	target.KVEvents = &KVEventsTarget{Address: eng.pubAddr, ReplayAddress: eng.replayAddr, Topic: testTopic, Sink: idx}
	if err := m.Sync([]Target{target}); err != nil {
		t.Fatal(err)
	}
	// Whatever subscriber runs now has caught up before it reads this
	// batch: its removal must take block 2 out.
	eng.waitSubscribed()
	eng.publish(false, removed(2))
	waitFor(t, "block 2 removed", func() bool { return held() == 2 })
	if n := eng.replayCount() - before; n != 0 {
		t.Errorf("%d replays: the subscription was restarted", n)
	}
}

// TestManagerChangedKVEventsDropsEntries: when an endpoint's KV events come
// from another address (the endpoint's engine was replaced, e.g. a pod
// rescheduled under the same endpoint ID), the entries of the old engine
// stayed in the index (the Sink was the same, so they were kept) and drew
// requests to a cache that was gone. They are removed, and the new
// subscription indexes its own engine's blocks.
func TestManagerChangedKVEventsDropsEntries(t *testing.T) {
	m, idx, _, target, held := managedWithBlocks(t)

	eng := newFakeEngine(t, true, EventEncoding{})
	target.KVEvents = &KVEventsTarget{Address: eng.pubAddr, ReplayAddress: eng.replayAddr, Topic: testTopic, Sink: idx}
	if err := m.Sync([]Target{target}); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Fatalf("%d blocks of the old engine still indexed after its subscription ended", n)
	}
	eng.waitSubscribed()
	eng.publish(false, stored(0, 1))
	waitFor(t, "the new engine's block indexed", func() bool { return held() == 1 })
}

// sliceSink is a Sink of a type == cannot compare.
type sliceSink []string

func (sliceSink) Store(string, kvindex.Stored) (int, error) { return 0, nil }
func (sliceSink) Evict(string, []uint64, kvroute.Tier)      {}
func (sliceSink) Clear(string)                              {}
func (sliceSink) Remove(string)                             {}

func TestSameKVEvents(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{})
	other := kvindex.NewIndex(kvindex.IndexConfig{})
	at := func(addr string, s Sink) *KVEventsTarget { return &KVEventsTarget{Address: addr, Sink: s} }
	for _, tc := range []struct {
		name string
		a, b *KVEventsTarget
		want bool
	}{
		{"both nil", nil, nil, true},
		{"one nil", at("tcp://h:1", idx), nil, false},
		{"same", at("tcp://h:1", idx), at("tcp://h:1", idx), true},
		{"other address", at("tcp://h:1", idx), at("tcp://h:2", idx), false},
		{"other sink", at("tcp://h:1", idx), at("tcp://h:1", other), false},
		{"uncomparable sink", at("tcp://h:1", sliceSink{"a"}), at("tcp://h:1", sliceSink{"a"}), false},
	} {
		if got := sameKVEvents(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// managedWithBlocks starts a Manager with one endpoint, e1, subscribed to a
// fake engine's KV events into an index, and waits until the engine's
// first three blocks of prompt are indexed; held reports how many of them
// the index holds. The Manager is closed when the test ends.
func managedWithBlocks(t *testing.T) (m *Manager, idx *kvindex.Index, eng *fakeEngine, target Target, held func() int) {
	t.Helper()
	idx = kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})
	m, err := NewManager(ManagerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	eng = newFakeEngine(t, true, EventEncoding{})
	target = Target{Endpoint: "e1", View: NewView(ViewConfig{}),
		KVEvents: &KVEventsTarget{Address: eng.pubAddr, ReplayAddress: eng.replayAddr, Topic: testTopic, Sink: idx}}
	if err := m.Sync([]Target{target}); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed()
	eng.publish(false, stored(0, 3))
	q := kvindex.HashTokens(prompt, 4, nil)
	held = func() int {
		if hits := idx.Match(q, nil); len(hits) == 1 {
			return hits[0].Blocks
		}
		return 0
	}
	waitFor(t, "3 blocks indexed", func() bool { return held() == 3 })
	return m, idx, eng, target, held
}

// TestManagerReplayBound: a target's MaxReplayBatches (an engine's
// kv_events.replay_buffer_steps) bounds its subscriber's replay answers,
// and a change of it restarts the subscription.
func TestManagerReplayBound(t *testing.T) {
	m, err := NewManager(ManagerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4})
	sub := func(n int) *Subscriber {
		t.Helper()
		target := Target{Endpoint: "e1", View: NewView(ViewConfig{}),
			KVEvents: &KVEventsTarget{Address: "tcp://127.0.0.1:1", Sink: idx, MaxReplayBatches: n}}
		if err := m.Sync([]Target{target}); err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.targets["e1"].sub
	}
	first := sub(0)
	if got := first.cfg.MaxReplayBatches; got != DefaultMaxReplayBatches {
		t.Errorf("default bound: got %d, want %d", got, DefaultMaxReplayBatches)
	}
	second := sub(20000)
	if got := second.cfg.MaxReplayBatches; got != 20000 || second == first {
		t.Errorf("bound 20000: got %d (same subscriber: %v)", got, second == first)
	}
}

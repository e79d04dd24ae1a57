package signals

import (
	"bytes"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestManagerExportsOrphans: the Manager's collector exports a KV-event
// subscriber's orphans (BlockStored events whose parent the index did not
// know: the router missed the events that stored it) per endpoint, with a
// HELP that says what to do, and the subscriber's other counters an
// operator needs (replays, reconnects, decode and store errors, skipped
// events, rank mismatches, stored blocks). Only batches, gaps, resyncs and
// restarts were exported: an index that stayed empty because every block
// was an orphan looked healthy on /metrics.
func TestManagerExportsOrphans(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewManager(ManagerConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng := newFakeEngine(t, false, EventEncoding{}) // no replay: what was missed stays missed
	if err := m.Sync([]Target{{Endpoint: "e1", View: NewView(ViewConfig{}),
		KVEvents: &KVEventsTarget{Address: eng.pubAddr, Topic: testTopic, Sink: kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4, Shards: 4})}}}); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed()
	eng.publish(false, stored(2, 4)) // the batch storing blocks 0-1 was never seen
	waitFor(t, "an orphan", func() bool {
		st := m.Status()
		return len(st) == 1 && st[0].KVEvents != nil && st[0].KVEvents.Orphans == 1
	})

	// The registry's page, in the text format a scrape reads, parsed back.
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	enc := expfmt.NewEncoder(&page, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range gathered {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	text := page.String()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(&page)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	orphans := fams["kvroute_endpoint_kv_event_orphans_total"]
	wantHelp := "BlockStored events dropped because the index did not know their parent block (or, without token ids, " +
		"the blocks they name): the router missed the events that stored it (published before it subscribed, or lost " +
		"in a gap), and the endpoint's blocks after it are not matched. Set the endpoint's kv_events.replay_address " +
		"(vLLM's replay_endpoint) so that missed events are replayed."
	switch {
	case orphans == nil:
		t.Fatalf("no kvroute_endpoint_kv_event_orphans_total in\n%s", text)
	case orphans.GetType() != dto.MetricType_COUNTER || len(orphans.GetMetric()) != 1:
		t.Fatalf("got %v, want one counter", orphans)
	case orphans.GetHelp() != wantHelp:
		t.Errorf("got HELP %q, want %q", orphans.GetHelp(), wantHelp)
	}
	if m := orphans.GetMetric()[0]; len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "endpoint" ||
		m.GetLabel()[0].GetValue() != "e1" || m.GetCounter().GetValue() != 1 {
		t.Errorf("got %v, want {endpoint=\"e1\"} 1", m)
	}
	for _, name := range []string{"batches", "gaps", "resyncs", "restarts", "replays", "reconnects", "orphans",
		"decode_errors", "store_errors", "skipped", "rank_mismatches", "stored_blocks"} {
		name = "kvroute_endpoint_kv_event_" + name + "_total"
		if f := fams[name]; f == nil || f.GetType() != dto.MetricType_COUNTER || len(f.GetMetric()) != 1 || f.GetHelp() == "" {
			t.Errorf("%s: got %v, want one counter of endpoint e1, with a HELP", name, f)
		}
	}
}

package kvroute

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestLoadJSON: /debug/endpoints and the dashboard show a Load as JSON in
// the snake_case of the router's other debug output.
func TestLoadJSON(t *testing.T) {
	b, err := json.Marshal(Load{Waiting: 2, Running: 3, KVUsage: 0.5, InFlight: 1, PrefixHitRate: -1,
		ObservedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"waiting":2,"running":3,"kv_usage":0.5,"kv_capacity_tokens":0,"in_flight":1,"in_flight_tokens":0,` +
		`"decode_tokens":0,"prefix_hit_rate":-1,"observed_at":"2026-01-02T03:04:05Z","stale":false}`
	if string(b) != want {
		t.Errorf("Marshal:\n got %s\nwant %s", b, want)
	}
	if b, _ := json.Marshal(Load{}); strings.Contains(string(b), "observed_at") {
		t.Errorf("a never-observed Load has observed_at: %s", b)
	}
}

package emulator

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestPDDecodePullsOnlyMissingBlocks: a decode engine that caches a
// conversation's first turn pulls only the second turn's new tokens from
// the prefill engine (their transfer time), as vLLM's NixlConnector reads
// only the blocks past the decode engine's local prefix-cache hit. The
// prefill side is a fake side channel that records each pull.
func TestPDDecodePullsOnlyMissingBlocks(t *testing.T) {
	var mu sync.Mutex
	var pulls []PullRequest
	side := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var pr PullRequest
		if err := json.NewDecoder(r.Body).Decode(&pr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		pulls = append(pulls, pr)
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(PullResponse{EngineID: "p"})
	}))
	defer side.Close()
	host, port := splitHostPort(t, side.URL)
	s, ds := testServer(t, Config{Role: kvroute.RoleDecode, LoadFailure: LoadFailureFail})

	const first, added = 256, 100 // 16 blocks, then 100 more tokens
	prompt := make([]int, first+added)
	for k := range prompt {
		prompt[k] = 1 + k%900
	}
	turn := func(id string, tokens []int) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"prompt": tokens, "max_tokens": 4, "kv_transfer_params": map[string]any{
			"do_remote_prefill": true, "remote_request_id": id, "remote_host": host, "remote_port": port}})
		if code, body := post(t, ds.URL+"/v1/completions", string(b)); code != 200 {
			t.Fatalf("%s: got %d %s", id, code, body)
		}
	}
	turn("turn1", prompt[:first])
	turn("turn2", prompt)

	mu.Lock()
	defer mu.Unlock()
	if len(pulls) != 2 {
		t.Fatalf("got %d pulls, want 2: %+v", len(pulls), pulls)
	}
	for i, want := range []struct {
		id     string
		tokens int
	}{{"turn1", first}, {"turn2", added}} {
		got := pulls[i]
		if w := s.transferTime(want.tokens).Seconds(); got.RemoteRequestID != want.id || got.TransferSeconds != w {
			t.Errorf("pull %d: got %s for %v s, want %s for %v s (%d tokens; the whole prompt's would be %v s)", i, got.RemoteRequestID,
				got.TransferSeconds, want.id, w, want.tokens, s.transferTime(first+added*i).Seconds())
		}
	}
}

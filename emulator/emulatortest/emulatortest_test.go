package emulatortest

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/emulator"
)

func TestStartServesAndWraps(t *testing.T) {
	var seen atomic.Int64
	_, hs := Start(t, emulator.Config{Model: "m"}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen.Add(1)
			h.ServeHTTP(w, r)
		})
	})
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":3`) {
		t.Fatalf("got %d %s, want 200 with 3 completion tokens", resp.StatusCode, body)
	}
	if seen.Load() != 1 {
		t.Fatalf("the wrapper saw %d requests, want 1", seen.Load())
	}
}

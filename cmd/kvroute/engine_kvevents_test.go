package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// TestEngineKVEventsAddressInUse: a KV-event endpoint that cannot be bound
// stops `kvroute engine` before it serves, with an error naming the flag
// and the endpoint. The engine used to log "engine listening" and serve
// first: Run bound the sockets after the HTTP server had started, and the
// failure came after the engine had answered.
func TestEngineKVEventsAddressInUse(t *testing.T) {
	held, err := net.Listen("tcp", ":0") // every interface: tcp://*:port
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldLocal, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer heldLocal.Close()
	pubInUse := fmt.Sprintf("tcp://*:%d", held.Addr().(*net.TCPAddr).Port)
	replayInUse := "tcp://" + heldLocal.Addr().String()
	ipc := "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	rank0 := fmt.Sprintf("tcp://*:%d", held.Addr().(*net.TCPAddr).Port-1) // rank 1's is in use
	for _, tc := range []struct {
		name, flag, endpoint string
		args                 []string
	}{
		{"pub", "--kv-events-endpoint", pubInUse, []string{"--kv-events-endpoint", pubInUse}},
		{"replay", "--kv-events-replay", replayInUse, []string{"--kv-events-endpoint", ipc, "--kv-events-replay", replayInUse}},
		{"rank 1", "--kv-events-endpoint", rank0 + ": data-parallel rank's endpoint " + pubInUse,
			[]string{"--kv-events-endpoint", rank0, "--data-parallel-size", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out syncbuf.Buffer
			args := append([]string{"engine", "--model", "m", "--listen", freeAddr(t), "--speed", "20"}, tc.args...)
			err := run(ctx, args, &out, &out)
			if tc.name == "rank 1" && err != nil && strings.HasPrefix(err.Error(), "engine: --kv-events-endpoint "+rank0+": listen") {
				t.Skipf("rank 0's port is taken: %v", err)
			}
			if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.flag+" "+tc.endpoint) ||
				!strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("got %v, want an error (not a usage error) naming %s %s, address already in use\n%s", err, tc.flag, tc.endpoint, out.String())
			}
			if strings.Contains(out.String(), "engine listening") {
				t.Errorf("the engine started serving before it failed:\n%s", out.String())
			}
		})
	}
}

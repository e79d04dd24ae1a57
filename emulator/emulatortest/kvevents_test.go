package emulatortest

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/internal/freeport"
)

// TestStartBindsKVEvents: when Start returns, the engine's KV-event PUB
// and replay sockets are bound: each accepts a connection at the first
// dial, without retries. They used to be bound by Run in a goroutine of
// its own, which could come after the test's first requests: a subscriber
// dialled on Start's return found nothing, and the first request's events
// went to nobody.
func TestStartBindsKVEvents(t *testing.T) {
	for _, dp := range []int{1, 2} {
		t.Run(fmt.Sprintf("dp%d", dp), func(t *testing.T) {
			ports := freeport.ConsecutiveAny(t, 2*dp) // the PUB socket binds tcp://*
			pubPort, replayPort := ports, ports+dp
			cfg := emulator.Config{Model: "m", KVEvents: emulator.KVEventsConfig{
				Endpoint: fmt.Sprintf("tcp://*:%d", pubPort), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)}}
			if dp == 1 {
				Start(t, cfg, nil)
			} else {
				StartDP(t, cfg, dp, nil)
			}
			for r := range dp {
				for _, ep := range []struct {
					addr string
					sock func(context.Context, ...zmq4.Option) zmq4.Socket
				}{
					{fmt.Sprintf("tcp://127.0.0.1:%d", pubPort+r), zmq4.NewSub},
					{fmt.Sprintf("tcp://127.0.0.1:%d", replayPort+r), zmq4.NewDealer},
				} {
					s := ep.sock(context.Background(), zmq4.WithDialerMaxRetries(0))
					err := s.Dial(ep.addr)
					s.Close()
					if err != nil {
						t.Errorf("rank %d: %s not bound when Start returned: %v", r, ep.addr, err)
					}
				}
			}
		})
	}
}
